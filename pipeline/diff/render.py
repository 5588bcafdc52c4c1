"""Text and Markdown renderings of a :class:`~pipeline.diff.compare.RunDiff`."""

from __future__ import annotations

import json
from typing import Any

from pipeline.diff.compare import CallTotals, Item, RunDiff, Section
from pipeline.diff.decisions import render_lines as decision_lines
from pipeline.diff.match import FieldChange
from pipeline.diff.words import Style, inline

MAX_VALUE = 160  # characters of one value shown inline; --json has everything


def _short(v: Any) -> str:
    s = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, sort_keys=True)
    s = " ".join(s.split())
    return s if len(s) <= MAX_VALUE else s[: MAX_VALUE - 1] + "…"


def _as_text(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, sort_keys=True)


def change_line(c: FieldChange, style: Style = "text") -> str:
    """One field change: ``path: a -> b`` for short values, a word diff for longer text, ``+[added] -[removed]``."""
    if c.added is not None or c.removed is not None:
        parts = []
        if c.added:
            parts.append("+" + _short(c.added))
        if c.removed:
            parts.append("-" + _short(c.removed))
        if parts:
            return f"{c.path}: {' '.join(parts)}"
        return f"{c.path}: order {_short(c.a)} -> {_short(c.b)}"
    if c.a is None:
        return f"{c.path}: only in B" if isinstance(c.b, dict) else f"{c.path}: (absent) -> {_short(c.b)}"
    if c.b is None:
        return f"{c.path}: only in A" if isinstance(c.a, dict) else f"{c.path}: {_short(c.a)} -> (absent)"
    a, b = _as_text(c.a), _as_text(c.b)
    if len(a) + len(b) <= 80 and "\n" not in a + b:
        return f"{c.path}: {_short(c.a)} -> {_short(c.b)}"
    # Long text: the words that changed, with context (both sides cut to one prefix would hide them).
    return f"{c.path}: {inline(a, b, style)}"


def _item_head(it: Item, md: bool = False) -> str:
    kind = f" [{it.kind}]" if it.kind else ""
    # In Markdown a leading "-" or "+" after the list bullet would render as a second bullet ("- - W-01").
    mark = {"added": "added", "removed": "removed", "changed": "changed"} if md else {"added": "+", "removed": "-"}
    if it.status == "added":
        return f"{mark['added']} {it.b_id}{kind} only in B"
    if it.status == "removed":
        return f"{mark['removed']} {it.a_id}{kind} only in A"
    ids = it.a_id if it.a_id == it.b_id else f"{it.a_id} ↔ {it.b_id}"
    return f"{mark.get('changed', '~')} {ids}{kind} (match {it.score})"


def _presence(name: str, s: Section) -> str | None:
    if s.present_a and not s.present_b:
        return f"{name}: only in A (B has none)"
    if s.present_b and not s.present_a:
        return f"{name}: only in B (A has none)"
    if not s.present_a and not s.present_b:
        return f"{name}: in neither run"
    return None


def _calls_line(t: CallTotals) -> str:
    cost = f"${t.cost_usd:.4f}" if t.cost_known else f"cost unknown (>= ${t.cost_usd:.4f})"
    return (
        f"{t.calls} calls, {t.prompt_tokens}+{t.completion_tokens} tokens, {cost}, "
        f"{t.attempts} attempts, {t.failures} failures"
    )


def _lines(d: RunDiff, md: bool) -> list[str]:
    h = (lambda s: f"## {s}") if md else (lambda s: s.upper())
    style: Style = "markdown" if md else "text"
    bullet = "- " if md else "  "
    sub = "  - " if md else "      "
    subsub = "    - " if md else "        "
    out: list[str] = []
    title = f"lunasol diff: A={d.a} ({d.a_run_id})  B={d.b} ({d.b_run_id})"
    out.append(f"# {title}" if md else title)
    out.append("")
    out.append("**identical outputs**" if md and d.identical else "identical outputs" if d.identical else "")
    if not d.identical:
        out.pop()
        out.append("outputs differ")

    def section(name: str, changes: list[FieldChange]) -> None:
        out.append("")
        out.append(h(name) + ("" if changes else (" — no differences" if md else ": no differences")))
        out.extend(bullet + change_line(c, style) for c in changes)

    def items_section(name: str, s: Section, extra: list[str] | None = None) -> None:
        out.append("")
        pres = _presence(name, s)
        counts = f"{len(s.items)} differ, {s.unchanged} unchanged"
        out.append(h(name) + (" — " if md else ": ") + (pres or counts))
        out.extend(extra or [])
        for it in s.items:
            out.append(bullet + _item_head(it, md))
            out.extend(sub + change_line(c, style) for c in it.changes)

    # What a reader decides on leads; the evidence detail (pages of event ids at the demo's size) follows.
    out.append("")
    out.extend(decision_lines(d.decisions, md))
    renum = [f"{bullet}renumbered {a} -> {b}" for a, b in sorted(d.weakness_map.items()) if a != b]
    items_section("weaknesses", d.weaknesses, renum)
    items_section("proposals", d.proposals)
    section("gate decisions", d.gates)
    section("inputs (run.json)", d.inputs)
    out.append("")
    n_items = sum(len(c.items) for c in d.cells)  # coverage-only cells count as differing cells too
    pres = _presence("patterns", d.patterns)
    out.append(
        h("patterns per cell")
        + (" — " if md else ": ")
        + (pres or f"{len(d.cells)} cells differ ({n_items} patterns), {d.patterns.unchanged} patterns unchanged")
    )
    for cell in d.cells:
        out.append(bullet + f"cell {cell.cell_id}")
        out.extend(sub + "coverage " + change_line(c, style) for c in cell.coverage)
        for it in cell.items:
            out.append(sub + _item_head(it, md))
            out.extend(subsub + change_line(c, style) for c in it.changes)
    items_section("pattern groups", d.groups)
    section("run state", d.state)
    out.append("")
    out.append(h("model calls") + ("" if d.calls else " — no differences" if md else ": no differences"))
    out.append(bullet + "A: " + _calls_line(d.calls_a))
    out.append(bullet + "B: " + _calls_line(d.calls_b))
    out.extend(bullet + change_line(c, style) for c in d.calls)
    return out


def render_text(d: RunDiff) -> str:
    """Plain text for a terminal."""
    return "\n".join(_lines(d, md=False)).rstrip() + "\n"


def render_markdown(d: RunDiff) -> str:
    """Markdown for a pull request or a review note."""
    return "\n".join(_lines(d, md=True)).rstrip() + "\n"


def diff_json(d: RunDiff) -> dict[str, Any]:
    """The diff as a JSON-ready dict, with ``identical`` spelled out."""
    data = d.model_dump(mode="json")
    # Key order is reading order: the decisions lead, as in the text.
    head = {k: data.pop(k) for k in ("a", "b", "a_run_id", "b_run_id")}
    decisions = data.pop("decisions")
    decisions["counts"] = {k: d.decisions.counts(k) for k in ("weaknesses", "proposals")}
    return {**head, "identical": d.identical, "decisions": decisions, **data}
