"""The Sol stage: one model call over the whole batch, then the deterministic checks, then the shortlist.

Sol sees the pattern groups, the coverage, every eligible cell with its outcome (Sol may see
outcomes; Luna never does), the successful cells as negatives, and a compact timeline of
controller-level events per cell so it can cite refs for counter-evidence. The checks' errors go
back through the model client's ``check`` hook for a re-ask; a weakness that still fails is
dropped with its reasons in the shortlist's ``dropped`` list, never silently.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.canonical import digest, pretty_json, read_json, sha256_file
from pipeline.core.errors import Blocked
from pipeline.models import ModelClient, PlannedCall, template_hash
from pipeline.sol.cards import Dropped, SolAnswer, WeaknessDraft
from pipeline.sol.checks import EvidenceIndex, answer_errors, check_answer, load_index
from pipeline.sol.shortlist import SHORTLIST_FILE, Denominator, Shortlist, write_shortlist
from pipeline.state.ledger import ir_digest

if TYPE_CHECKING:
    from pipeline.core.context import RunContext
    from pipeline.models import PlannedCall

ROLE = "sol"
GROUPS_FILE = "pattern-groups.json"
TIMELINE_KINDS = ("stage", "state_change", "handoff", "obligation", "artifact", "error")
# Messages of checkers and the operator (findings, decisions, new information) and permission requests.
TIMELINE_ACTORS = ("operator", "reviewer", "validator")
TIMELINE_TOOLS = ("request_permission",)
TIMELINE_TEXT = 200
TIMELINE_BUDGET_CHARS = 400_000  # ~100K tokens; larger batches are trimmed visibly (fit_timelines)
LOW_VALUE = frozenset({"stage_started", "handoff", "artifact_written"})
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
OUTPUT_TOKENS = 3000


# -- reading the batch ------------------------------------------------------------------------------


def _group_list(raw: Any) -> list[dict[str, Any]]:
    if isinstance(raw, dict):
        for key in ("pattern_groups", "groups"):
            if isinstance(raw.get(key), list):
                raw = raw[key]
                break
    return [g for g in raw if isinstance(g, dict)] if isinstance(raw, list) else []


def group_id(group: dict[str, Any]) -> str | None:
    """The id of a pattern group (the Coordinator's field name, with tolerant fallbacks)."""
    for key in ("group_id", "pattern_group_id", "id"):
        if isinstance(group.get(key), str):
            return str(group[key])
    return None


def group_cells(group: dict[str, Any]) -> set[str]:
    """The cells a pattern group's occurrences come from."""
    cells = group.get("cells")
    if isinstance(cells, list):
        return {str(c) for c in cells}
    out: set[str] = set()
    for key in ("occurrences", "members", "patterns"):
        for item in group.get(key) or []:
            if isinstance(item, dict) and item.get("cell_id"):
                out.add(str(item["cell_id"]))
    return out


def read_groups(run_dir: Path) -> list[dict[str, Any]]:
    """The Coordinator's pattern groups (empty when the file is absent)."""
    path = run_dir / GROUPS_FILE
    return _group_list(read_json(path)) if path.is_file() else []


def _rows(con: Any, sql: str) -> list[dict[str, Any]]:
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def _has_table(con: Any, name: str) -> bool:
    return bool(
        con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [name]).fetchone()[0]
    )


def timeline_budget() -> int:
    """Characters the timelines may take in Sol's prompt (env ``LUNASOL_SOL_TIMELINE_CHARS``)."""
    return int(os.environ.get("LUNASOL_SOL_TIMELINE_CHARS", TIMELINE_BUDGET_CHARS))


def fit_timelines(lines: dict[str, list[tuple[str, str]]], budget: int) -> tuple[dict[str, list[str]], int]:
    """Fit per-cell timelines into ``budget`` characters, never silently.

    First the low-value lines (stage started, handoffs, artifacts written) go; then each cell keeps
    its first and last lines with a marker saying how many were left out in between. Returns the
    timelines and the number of events omitted.
    """

    def size(t: dict[str, list[str]]) -> int:
        return sum(len(x) + 1 for v in t.values() for x in v)

    full = {c: [ln for _, ln in v] for c, v in lines.items()}
    if size(full) <= budget:
        return full, 0
    kept = {c: [ln for d, ln in v if d not in LOW_VALUE] for c, v in lines.items()}
    omitted = sum(len(v) for v in lines.values()) - sum(len(v) for v in kept.values())
    if size(kept) > budget and kept:
        per_cell = max(budget // len(kept), 200)
        for c, v in kept.items():
            if sum(len(x) + 1 for x in v) <= per_cell:
                continue
            head: list[str] = []
            tail: list[str] = []
            used = 0
            i, j = 0, len(v) - 1
            while i <= j:  # alternate from both ends: the start and the end of a cell matter most
                nxt = v[i] if len(head) <= len(tail) else v[j]
                if used + len(nxt) + 1 > per_cell:
                    break
                used += len(nxt) + 1
                if len(head) <= len(tail):
                    head.append(nxt)
                    i += 1
                else:
                    tail.insert(0, nxt)
                    j -= 1
            cut = len(v) - len(head) - len(tail)
            omitted += cut
            kept[c] = [*head, f"[... {cut} events omitted here to fit the prompt ...]", *tail]
    if omitted:
        for c in kept:
            dropped_low = sum(1 for d, _ in lines[c] if d in LOW_VALUE)
            if dropped_low:
                kept[c].insert(0, f"[{dropped_low} stage-start / handoff / artifact lines omitted in this cell]")
    return kept, omitted


def build_context(run_dir: Path, ir_path: Path) -> tuple[dict[str, Any], EvidenceIndex]:
    """The template context for Sol and the evidence index its answer is checked against."""
    import duckdb

    groups = read_groups(run_dir)
    index_groups = {gid: group_cells(g) for g in groups if (gid := group_id(g))}
    index = load_index(ir_path, index_groups)
    con = duckdb.connect(str(ir_path), read_only=True)
    try:
        cells = _rows(
            con,
            "SELECT c.cell_id, c.task_id, c.run_id, c.harness, c.eligibility, c.exclusion_reason, "
            "o.label AS outcome, o.quality, o.completion, o.cost, o.stability "
            "FROM cells c LEFT JOIN outcomes o USING (cell_id) ORDER BY c.cell_id",
        )
        coverage = _rows(con, "SELECT * FROM coverage ORDER BY cell_id") if _has_table(con, "coverage") else []
        doc = read_json(run_dir / GROUPS_FILE) if (run_dir / GROUPS_FILE).is_file() else {}
        if isinstance(doc, dict) and isinstance(doc.get("coverage"), list):
            coverage = doc["coverage"]  # the Coordinator's coverage carries pattern counts per cell
        kinds = ", ".join(f"'{k}'" for k in TIMELINE_KINDS)
        actors = ", ".join(f"'{a}'" for a in TIMELINE_ACTORS)
        tools = ", ".join(f"'{t}'" for t in TIMELINE_TOOLS)
        events = _rows(
            con,
            "SELECT e.event_id, e.cell_id, e.stage, e.actor, e.kind, e.detail, "
            f"substr(coalesce(e.text, ''), 1, {TIMELINE_TEXT}) AS text FROM events e JOIN cells c USING (cell_id) "
            f"WHERE c.eligibility = 'valid_behavior' AND (e.kind IN ({kinds}) OR (e.kind = 'message' AND "
            f"e.actor IN ({actors})) OR e.tool_name IN ({tools})) ORDER BY e.cell_id, e.seq",
        )
    finally:
        con.close()
    eligible = [c for c in cells if c["eligibility"] == "valid_behavior"]
    raw_lines: dict[str, list[tuple[str, str]]] = {}
    for e in events:
        # one compact line per event; digests shortened (8 hex digits are enough to see "unchanged")
        text = _DIGEST.sub(lambda m: m.group(1)[:8], " ".join(str(e["text"] or "").split()))
        line = f"{e['event_id']} {e['stage'] or '-'}/{e['actor'] or '-'} {e['detail'] or e['kind']}: {text}"
        raw_lines.setdefault(e["cell_id"], []).append((str(e["detail"] or e["kind"]), line))
    timelines, omitted = fit_timelines(raw_lines, timeline_budget())
    context: dict[str, Any] = {
        "run_id": run_dir.name,
        "harnesses": sorted({str(c["harness"]) for c in eligible if c["harness"]}),
        "eligible_count": len(eligible),
        "cells": eligible,
        "excluded": [{"cell_id": c["cell_id"], "reason": c["exclusion_reason"]} for c in cells if c not in eligible],
        "negatives": [c["cell_id"] for c in eligible if c["outcome"] == "completed"],
        "coverage": coverage,
        "pattern_groups": groups,
        "timelines": timelines,
        "timelines_note": (
            "complete"
            if not omitted
            else f"trimmed to fit the prompt: {omitted} of {sum(len(v) for v in raw_lines.values())} events "
            "omitted (marked in place); every event id stays citable"
        ),
    }
    # Pre-serialised views: templates embed JSON verbatim (never re-templated, stable bytes).
    for key in ("cells", "excluded", "coverage", "pattern_groups"):
        context[f"{key}_json"] = pretty_json(context[key]).strip()
    outcome = {c["cell_id"]: f"{c['task_id']}, {c['outcome'] or 'no outcome'}" for c in eligible}
    context["timelines_text"] = "\n\n".join(
        f"### {cell} ({outcome.get(cell, '')})\n" + "\n".join(lines) for cell, lines in sorted(timelines.items())
    )
    return context, index


# -- the stage --------------------------------------------------------------------------------------


def _made_from(ctx: RunContext, context: dict[str, Any]) -> dict[str, str | None]:

    groups = ctx.run_dir / GROUPS_FILE
    return {
        "ir": ir_digest(ctx.ir_path),
        "pattern_groups": sha256_file(groups) if groups.is_file() else None,
        "context": digest({k: v for k, v in context.items() if not k.endswith("_json")}),
        "template": template_hash(ROLE),
        "model": ctx.options.models.model,
    }


def make_shortlist(
    run_id: str,
    index: EvidenceIndex,
    drafts: list[WeaknessDraft],
    *,
    made_from: dict[str, str | None],
    call: dict[str, Any],
) -> Shortlist:
    """Check the drafts and assemble the shortlist (cards that pass, the rest dropped with reasons)."""
    cards, failed = check_answer(drafts, index)
    dropped = [
        Dropped(weakness_id=d.weakness_id, statement=d.statement, reasons=failed[d.weakness_id])
        for d in drafts
        if d.weakness_id in failed
    ]
    # a repeated id appears once among the drafts that failed; keep one dropped entry per id
    seen: set[str] = set()
    dropped = [d for d in dropped if not (d.weakness_id in seen or seen.add(d.weakness_id))]  # type: ignore[func-returns-value]
    excluded = {c: info.exclusion_reason for c, info in sorted(index.cells.items()) if not info.eligible}
    return Shortlist(
        run_id=run_id,
        denominator=Denominator(eligible_cells=len(index.denominator), cells=index.denominator, excluded=excluded),
        weaknesses=cards,
        dropped=dropped,
        made_from=made_from,
        call=call,
    )


def mine(ctx: RunContext) -> Shortlist:
    """Ask Sol once over the whole batch, check its answer, and write ``weakness-shortlist.json``."""
    context, index = build_context(ctx.run_dir, ctx.ir_path)
    if not index.denominator:
        raise Blocked("no eligible cell in this run: Sol has nothing to explain", reason="missing_data")
    client = ModelClient(ctx.options.models, ctx.run_dir, log=ctx.log)

    def check(answer: SolAnswer) -> list[str]:
        return answer_errors(answer.weaknesses, index)

    outcome = asyncio.run(client.call(role=ROLE, cell_id=None, context=context, response_model=SolAnswer, check=check))
    if outcome.ok and outcome.value is not None:
        drafts = outcome.value.weaknesses
    elif outcome.last_answer is not None:
        drafts = SolAnswer.model_validate(outcome.last_answer).weaknesses  # failing cards get dropped below
    else:
        raise Blocked(
            f"Sol gave no answer that parses after {outcome.attempts} attempts: {'; '.join(outcome.errors)[:300]}",
            reason="external_system",
            unblock="lunasol run BUNDLE --model OTHER_MODEL --resume  (this model's answers do not parse)",
            tried=[
                {
                    "ladder_step": "alt_path",
                    "action": f"re-asked Sol {max(outcome.attempts - 1, 0)} times with the validation errors",
                    "outcome": "; ".join(outcome.errors)[:500] or "no parseable answer",
                },
            ],
        )
    call = {"ok": outcome.ok, "attempts": outcome.attempts, "errors": list(outcome.errors), "key": outcome.key}
    shortlist = make_shortlist(ctx.run_dir.name, index, drafts, made_from=_made_from(ctx, context), call=call)
    return write_shortlist(ctx.run_dir / SHORTLIST_FILE, shortlist)


def stage(ctx: RunContext) -> str:
    """Runner stage: mine root causes; one-line summary."""
    sl = mine(ctx)
    kept = ", ".join(w.weakness_id for w in sl.weaknesses) or "none"
    return (
        f"{len(sl.weaknesses)} weakness(es) kept ({kept}), {len(sl.dropped)} dropped with reasons; "
        f"shortlist {sl.digest[:19]}"
    )


def plan(ctx: RunContext) -> list[PlannedCall]:
    """For ``--dry-run``: the one Sol call (pattern groups as far as they exist)."""
    if not ctx.ir_path.is_file():
        return []
    context, _ = build_context(ctx.run_dir, ctx.ir_path)
    return [
        PlannedCall(
            role=ROLE, cell_id=None, context=context, response_model=SolAnswer, expected_output_tokens=OUTPUT_TOKENS
        )
    ]
