"""``lunasol show RUN ID``: one whole weakness, proposal, cell, pattern, pattern group, event or ref.

:func:`find_item` looks the id up in the run's artifacts and IR and returns everything about it,
with the raw lines (and context) of the refs it cites when asked; :func:`render_item` turns that
into terminal text with human labels. Nothing is cut: reading the whole card before deciding is
the point of the verb.
"""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.artifacts.run_info import run_pilot
from pipeline.artifacts.rundir import SMALL, Row, RunArtifacts, RunDir
from pipeline.core.errors import BadInput
from pipeline.diff.compare import validation_by_id
from pipeline.diff.match import cited_ids
from pipeline.report import data
from pipeline.report.evidence import CONTEXT_LINES, Evidence, EvidenceReader
from pipeline.report.labels import PATTERN_ORDER, PROPOSAL_ORDER, WEAKNESS_ORDER, label, ordered

_EVENT = re.compile(r"^[A-Za-z0-9_.:/-]+-e\d{4,}$")


@dataclass
class Item:
    """One thing of a run, whole, and the raw evidence behind what it cites."""

    kind: str  # weakness | dropped_weakness | proposal | cell | pattern | group | event | ref
    item_id: str
    item: dict[str, Any]
    evidence: list[dict[str, Any]] = field(default_factory=list)
    pilot: str | None = None  # the run is a pilot on a subset of the cells: its label (counts are over it)

    def to_json(self) -> dict[str, Any]:
        """Machine-readable form (``--json``)."""
        out = {"kind": self.kind, "id": self.item_id, "item": self.item, "evidence": self.evidence}
        return {**out, "pilot": self.pilot} if self.pilot else out


def _evidence(run_dir: Path, keys: set[str], context: int) -> list[dict[str, Any]]:
    with EvidenceReader(run_dir) as reader:  # it keeps its IR connection for a report's many shards
        ev: Evidence = reader.resolve(keys)
    out = []
    for key in sorted(keys):
        s = ev.snippets[key]
        lines = ev.lines.get(s.lines_key or "", {})
        rows = []
        if s.status == "verified" and s.line_start is not None and s.line_end is not None:
            lo, hi = s.line_start - min(context, CONTEXT_LINES), s.line_end + min(context, CONTEXT_LINES)
            rows = [
                {"line": n, "text": lines[n], "cited": s.line_start <= n <= s.line_end}
                for n in range(lo, hi + 1)
                if n in lines
            ]
        out.append({**s.to_json(), "lines": rows})
    return out


def _card(arts: RunArtifacts, item_id: str) -> tuple[str, dict[str, Any]] | None:
    # Weaknesses and proposals: in the small artifacts (the shortlist, proposals.yaml, validation.json).
    for w in arts.weaknesses or []:
        if w.get("weakness_id") == item_id:
            return "weakness", w
    for w in arts.dropped_weaknesses:
        if w.get("weakness_id") == item_id:
            return "dropped_weakness", w
    vals = validation_by_id(arts.validation)
    for p in arts.proposals or []:
        if p.get("proposal_id") == item_id:
            v = vals.get(item_id)
            return "proposal", {**p, **({"validation": v} if v is not None else {})}
    return None


def _event_or_ref(ir: data.IR, item_id: str) -> tuple[str, dict[str, Any]] | None:
    # By shape: an event id is '<cell>-e<seq>' and a ref 'PATH#L..', which no group or pattern id is.
    if _EVENT.match(item_id):
        rows = ir.rows("SELECT * EXCLUDE (text_truncated) FROM events WHERE event_id = ?", [item_id])
        if rows:
            return "event", rows[0]
    if "#L" in item_id:
        return "ref", {"ref": item_id}
    return None


def _matching_rows(path: Path, key: str, value: str) -> list[Row]:
    """Rows of a JSONL artifact whose ``key`` is ``value``: only the lines holding the value are parsed.

    patterns.jsonl is 29 MB at 10,000 cells; one cell's or one pattern's rows are a few lines of it.
    """
    if not path.is_file():
        return []
    needle = json.dumps(value, ensure_ascii=False).encode("utf-8")
    out: list[Row] = []
    with path.open("rb") as fh:
        for n, line in enumerate(fh, start=1):
            if needle not in line:
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError alike
                raise BadInput(f"{path}:{n}: not valid JSON ({exc})") from None
            if isinstance(row, dict) and row.get(key) == value:
                out.append(row)
    return out


def _grouped(run_dir: Path, ir: data.IR, item_id: str) -> tuple[str, dict[str, Any]] | None:
    # Pattern groups, patterns and cells: the artifacts that grow with the batch, read as little as can be.
    has_table = bool(ir.rows("SELECT 1 FROM information_schema.tables WHERE table_name = 'pattern_groups'"))
    if not has_table or ir.rows("SELECT 1 FROM pattern_groups WHERE group_id = ?", [item_id]):
        for g in RunDir(run_dir).read(frozenset({"groups"})).groups or []:
            if g.get("group_id") == item_id:
                return "group", g
    patterns = RunDir(run_dir).patterns
    found = _matching_rows(patterns, "pattern_id", item_id)
    if found:
        return "pattern", found[0]
    cells = data.cells(ir, item_id)
    if cells:
        return "cell", {**cells[0], "patterns": _matching_rows(patterns, "cell_id", item_id)}
    return None


def find_item(run_dir: Path, item_id: str, *, evidence: bool = False, context: int = 2) -> Item:
    """Everything about one id of a run; BadInput naming what exists when the id is unknown.

    The raw lines of cited refs are included for an event or a ref always, for other items when
    ``evidence`` is set (a weakness cites dozens; ``lunasol report`` shows them one click away).
    The pattern groups (54 MB at 10,000 cells) are read only for a group's id, and of the patterns
    only the lines that hold the id.
    """
    arts = RunDir(run_dir).read(SMALL)
    ir = data.IR(arts.ir_path)
    try:
        found = _card(arts, item_id) or _event_or_ref(ir, item_id) or _grouped(run_dir, ir, item_id)
    finally:
        ir.close()
    if found is None:
        known = [str(w.get("weakness_id")) for w in arts.weaknesses or []]
        known += [str(p.get("proposal_id")) for p in arts.proposals or []]
        hint = f"; this run has {', '.join(known)}" if known else ""
        raise BadInput(
            f"no weakness, proposal, cell, pattern, pattern group, event or ref {item_id!r} in {run_dir}"
            f"{hint} (cells, groups and events too: see lunasol report)"
        )
    kind, item = found
    keys = {item_id} if kind in ("event", "ref") else cited_ids(item) if evidence else set()
    pilot = run_pilot(run_dir)
    shown = _evidence(run_dir, keys, context) if keys else []
    return Item(kind, item_id, item, shown, pilot.label() if pilot else None)


_ORDERS = {
    "weakness": WEAKNESS_ORDER,
    "dropped_weakness": WEAKNESS_ORDER,
    "proposal": PROPOSAL_ORDER,
    "pattern": PATTERN_ORDER,
}
_TITLE = {
    "weakness": "Weakness",
    "dropped_weakness": "Dropped weakness",
    "proposal": "Proposal",
    "cell": "Cell",
    "pattern": "Pattern",
    "group": "Pattern group",
    "event": "Event",
    "ref": "Ref",
}


def _inline(v: Any) -> str | None:
    """A value that fits on its label's line: a scalar, or a list of short strings (ids)."""
    if not isinstance(v, dict | list) or not v:
        return _scalar(v)
    if isinstance(v, list) and all(isinstance(x, str) and len(x) < 60 for x in v):
        return ", ".join(v)
    return None


def _wrap(out: list[str], pad: int, head: str, text: str, width: int) -> None:
    # Hanging indent: continuation lines align under the value, so a long statement stays readable.
    # Hyphenated words and long ids are never broken ("task-specific" must not read "task- specific").
    opts = {"break_on_hyphens": False, "break_long_words": False, "subsequent_indent": " " * (pad + 2)}
    lines = text.split("\n")
    first = textwrap.wrap(lines[0], width, initial_indent=" " * pad + head, **opts)  # type: ignore[arg-type]
    out.extend(first or [" " * pad + head.rstrip()])
    for more in lines[1:]:
        out.extend(textwrap.wrap(more, width, initial_indent=" " * (pad + 2), **opts) or [""])  # type: ignore[arg-type]


def _field(out: list[str], pad: int, name: str, value: Any, width: int) -> None:
    inline = _inline(value)
    if inline is not None:
        _wrap(out, pad, f"{name}: " if name else "", inline, width)
        return
    out.append(" " * pad + f"{name}:" if name else " " * pad + "-")
    if isinstance(value, dict):
        for k in sorted(value):
            _field(out, pad + 2, label(k), value[k], width)
    else:
        for x in value:
            if isinstance(x, dict):
                keys = sorted(x)
                if keys:
                    first, rest = keys[0], keys[1:]
                    sub: list[str] = []
                    _field(sub, pad + 4, label(first), x[first], width)
                    sub[0] = " " * (pad + 2) + "- " + sub[0].lstrip()
                    out.extend(sub)
                    for k in rest:
                        _field(out, pad + 4, label(k), x[k], width)
            else:
                _wrap(out, pad + 2, "- ", _inline(x) or str(x), width)


def _scalar(v: Any) -> str:
    if v is None:
        return "—"
    if v is True:
        return "yes"
    if v is False:
        return "no"
    if isinstance(v, list | dict):
        return "(none)"
    return str(v)


def render_item(item: Item, width: int | None = None) -> str:
    """The item as terminal text: a title, every field with its human label (nothing cut), then the evidence."""
    width = width or 100
    it = item.item
    out = [f"{_TITLE.get(item.kind, item.kind)} {item.item_id}", *([item.pilot] if item.pilot else []), ""]
    statement = it.get("statement") if item.kind in ("weakness", "dropped_weakness") else None
    if isinstance(statement, str):
        _wrap(out, 0, "", statement, width)
        out.append("")
    skip = {"statement", "weakness_id", "proposal_id", "pattern_id", "group_id"}
    for key in ordered(list(it), _ORDERS.get(item.kind, ())):
        if key in skip and item.kind != "ref":
            continue
        _field(out, 0, label(key), it[key], width)
    for ev in item.evidence:
        out.append("")
        meta = " · ".join(str(x) for x in (ev.get("event") or {}).values() if x)
        out.append(f"{ev['key']}  [{ev['status']}]" + (f"  {meta}" if meta else ""))
        if ev.get("ref"):
            out.append(f"  ref {ev['ref']}  sha256 {ev.get('sha256')}")
        if ev.get("note"):
            out.append(f"  {ev['note']}")
        for row in ev["lines"]:  # raw lines are never wrapped or cut: they are what the ref names
            out.append(f"{'>' if row['cited'] else ' '}{row['line']:>6}  {row['text']}")
        if ev.get("element"):
            out.append(str(ev["element"]))
    return "\n".join(out) + "\n"
