"""Sol's reduce step: merge the map calls' drafts into the shortlist, with counter-evidence from the WHOLE batch.

A map call only sees its partition, so the reduce call gets, per draft, batch-wide DuckDB counts of
the same concerns in successful cells (the draft's pattern groups' concern keys, and the kinds of
the events it cites) with citable samples, preferring cells outside the draft's own partition. The
merged weakness cites the drafts it merges; its support is the union of their checked support
(cells and refs that resolved), never a count the model writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.core import duck
from pipeline.sol.batch import Batch, has_table, rows
from pipeline.sol.cards import MergedWeakness, SupportDraft, WeaknessCard, WeaknessDraft
from pipeline.sol.checks import EVENT_ID_RE, answer_errors
from pipeline.sol.partition import by_task_outcome, outcome_of
from pipeline.sol.timeline import TIMELINE_KINDS

COUNTER_SAMPLES = 4
SIGNATURES = 3
SAMPLE_REFS = 4
EXCLUDED_SHOWN = 50


@dataclass
class Draft:
    """A checked weakness of a map (or earlier reduce) call, known by a batch-unique id."""

    draft_id: str  # e.g. M03/W-01
    call_id: str
    card: WeaknessCard
    seen_cells: list[str]  # the cells the call that made it saw


def _in_list(values: list[str]) -> str:
    return "[" + ", ".join("'" + v.replace("'", "''") + "'" for v in values) + "]" if values else "[]"


def _samples(items: list[dict[str, Any]], own: set[str]) -> list[dict[str, Any]]:
    # Cells outside the draft's own partition first: that is what its map call could not see.
    return sorted(items, key=lambda r: (r["cell_id"] in own, r["cell_id"]))[:COUNTER_SAMPLES]


def counter_evidence(con: Any, batch: Batch, draft: Draft) -> str:
    """Batch-wide counts of the draft's concerns in successful cells, with citable samples (text)."""
    card = draft.card
    own = set(draft.seen_cells)
    out: list[str] = []
    concerns = sorted(
        {str(g.get("concerns")) for g in batch.groups if g.get("group_id") in set(card.support.pattern_groups)}
    )
    if concerns and has_table(con, "pattern_occurrences"):
        occ = rows(
            con,
            "SELECT occurrence_id, cell_id, task_id, events, refs FROM pattern_occurrences "
            f"WHERE successful_cell AND list_contains({_in_list(concerns)}, concerns) ORDER BY occurrence_id",
        )
        cells = sorted({r["cell_id"] for r in occ})
        head = (
            f"- same concerns ({', '.join(concerns)}) in successful cells: "
            f"{len(occ)} occurrence(s) in {len(cells)} cell(s)"
        )
        if occ:
            head += f" [{by_task_outcome([batch.by_cell[c] for c in cells if c in batch.by_cell])}]; samples:"
        out.append(head)
        for r in _samples(occ, own):
            ev = ", ".join(list(r["events"] or [])[:3])
            out.append(f"  {r['occurrence_id']} {r['cell_id']} ({r['task_id']}): events {ev}")
    event_ids = [e for e in card.support.event_refs if EVENT_ID_RE.match(e)]
    if event_ids:
        sigs = rows(
            con,
            "SELECT DISTINCT stage, actor, kind, detail FROM events "
            f"WHERE list_contains({_in_list(event_ids)}, event_id) ORDER BY ALL LIMIT {SIGNATURES}",
        )
        for s in sigs:
            found = rows(
                con,
                "SELECT e.cell_id, min(e.event_id) AS event_id FROM events e JOIN outcomes o USING (cell_id) "
                "JOIN cells c USING (cell_id) WHERE c.eligibility = 'valid_behavior' AND o.label = 'completed' "
                "AND e.stage IS NOT DISTINCT FROM ? AND e.actor IS NOT DISTINCT FROM ? AND e.kind = ? "
                "AND e.detail IS NOT DISTINCT FROM ? GROUP BY e.cell_id ORDER BY e.cell_id",
                [s["stage"], s["actor"], s["kind"], s["detail"]],
            )
            what = f"{s['stage'] or '-'}/{s['actor'] or '-'} {s['detail'] or s['kind']}"
            line = f"- events like the cited {what} in successful cells: {len(found)} cell(s)"
            if found:
                line += " [" + by_task_outcome(
                    [batch.by_cell[r["cell_id"]] for r in found if r["cell_id"] in batch.by_cell]
                )
                line += "]; samples: " + ", ".join(f"{r['event_id']} ({r['cell_id']})" for r in _samples(found, own))
            out.append(line)
    tasks = sorted(card.support.tasks)
    with_concerns = set()
    for g in batch.groups:
        if g.get("concerns") in concerns:
            with_concerns |= {str(o.get("cell_id")) for o in g.get("occurrences") or [] if isinstance(o, dict)}
    clean = [
        c
        for c in batch.eligible
        if c["task_id"] in tasks and c.get("outcome") == "completed" and c["cell_id"] not in with_concerns
    ]
    if tasks:
        line = f"- successful cells of the supporting tasks without these concerns: {len(clean)}"
        picks = _samples([{"cell_id": c["cell_id"]} for c in clean], own)
        if picks:
            kinds = ", ".join(f"'{k}'" for k in TIMELINE_KINDS)
            last = rows(
                con,
                f"SELECT cell_id, max(event_id) AS event_id FROM events WHERE kind IN ({kinds}) "
                f"AND list_contains({_in_list([p['cell_id'] for p in picks])}, cell_id) "
                "GROUP BY cell_id ORDER BY cell_id",
            )
            line += "; samples (last controller-level event): " + ", ".join(
                f"{r['event_id']} ({r['cell_id']})" for r in last
            )
        out.append(line)
    return "\n".join(out) if out else "- no batch-wide query applies (no pattern group or event cited)"


def draft_text(draft: Draft, batch: Batch, shares: list[str], counter: str) -> str:
    """One draft, compact, for the reduce prompt."""
    c = draft.card
    fd = c.first_divergence
    cells = [batch.by_cell[x] for x in c.support.cells if x in batch.by_cell]
    ce = (
        "; ".join(f"{i.cell} ({', '.join(i.refs[:3])}): {i.note}" for i in c.counter_evidence.items)
        if c.counter_evidence.items
        else f"none: {c.counter_evidence.none_reason}"
    )
    lines = [
        f"### {draft.draft_id} (map call {draft.call_id}; confidence {c.confidence})",
        f"statement: {c.statement}",
        f"first divergence: {fd.where.stage}/{fd.where.actor}: {fd.where.what} - cells {', '.join(fd.cells)}; "
        f"refs {', '.join(fd.event_refs[:SAMPLE_REFS])}",
        f"harness attribution: {'yes' if c.harness_attribution.attributed else 'no'} - {c.harness_attribution.why}",
        f"support: {len(cells)} cell(s) [{by_task_outcome(cells)}]; pattern groups "
        f"{', '.join(c.support.pattern_groups) or 'none'}; sample refs {', '.join(c.support.event_refs[:SAMPLE_REFS])}",
        "alternatives: " + " | ".join(c.alternative_explanations),
        f"counter-evidence seen by its map call: {ce}",
        f"prediction: {c.counterfactual_prediction}",
    ]
    if shares:
        lines.append(f"shares pattern groups with: {', '.join(shares)}")
    lines.append("batch-wide counter-evidence (DuckDB over every eligible cell):")
    lines.append(counter)
    return "\n".join(lines)


def shared_groups(drafts: list[Draft]) -> dict[str, list[str]]:
    """Per draft, the other drafts citing one of the same pattern groups (likely the same weakness)."""
    out: dict[str, list[str]] = {}
    for d in drafts:
        mine = set(d.card.support.pattern_groups)
        out[d.draft_id] = [o.draft_id for o in drafts if o is not d and mine & set(o.card.support.pattern_groups)]
    return out


def draft_blocks(batch: Batch, drafts: list[Draft]) -> dict[str, str]:
    """Each draft's text for the reduce prompt, its batch-wide counter-evidence queried once."""
    if not drafts:
        return {}
    shares = shared_groups(drafts)
    con = duck.connect(batch.ir_path, read_only=True)
    try:
        return {d.draft_id: draft_text(d, batch, shares[d.draft_id], counter_evidence(con, batch, d)) for d in drafts}
    finally:
        con.close()


def reduce_context(
    batch: Batch, drafts: list[Draft], blocks: dict[str, str], call_id: str, map_calls: list[dict[str, Any]]
) -> dict[str, Any]:
    """The template context of one reduce call over ``drafts`` (texts from :func:`draft_blocks`)."""
    excluded = batch.excluded
    shown = ", ".join(f"{e['cell_id']} ({e['reason'] or '-'})" for e in excluded[:EXCLUDED_SHOWN])
    if len(excluded) > EXCLUDED_SHOWN:
        shown += f", and {len(excluded) - EXCLUDED_SHOWN} more (see the shortlist's denominator)"
    return {
        "call_id": call_id,
        "run_id": batch.run_id,
        "harnesses": batch.harnesses,
        "eligible_count": len(batch.eligible),
        "batch_by_task": by_task_outcome(batch.eligible),
        "negatives_count": len(batch.negatives),
        "excluded_text": shown or "none",
        "map_calls_text": "\n".join(
            f"{m['call_id']}: tasks {', '.join(m['tasks'])}; {len(m['cells'])} cell(s); "
            f"drafts {', '.join(m['outputs']) or 'none'}"
            for m in map_calls
        ),
        "draft_count": len(drafts),
        "drafts_text": "\n\n".join(blocks[d.draft_id] for d in drafts) or "none",
    }


def assemble(merged: MergedWeakness, drafts: dict[str, Draft]) -> WeaknessDraft:
    """A full weakness draft: the reduce's reasoning over the union of the merged drafts' checked support."""
    cells: list[str] = []
    groups: list[str] = []
    refs: list[str] = []
    for did in merged.merges:
        d = drafts.get(did)
        if d is None:
            continue
        for src, dest in (
            (d.card.support.cells, cells),
            (d.card.support.pattern_groups, groups),
            (d.card.support.event_refs, refs),
        ):
            dest += [x for x in src if x not in dest]
    data = merged.model_dump(exclude={"merges"})
    data["support"] = SupportDraft(cells=sorted(cells), pattern_groups=sorted(groups), event_refs=refs).model_dump()
    return WeaknessDraft.model_validate(data)


def reduce_errors(answer: list[MergedWeakness], drafts: dict[str, Draft], batch: Batch) -> list[str]:
    """What goes back to the model on a re-ask: unknown or twice-merged drafts, then every card check."""
    errs: list[str] = []
    used: dict[str, str] = {}
    for w in answer:
        if not w.merges:
            errs.append(f"{w.weakness_id}: merges: empty: name the drafts this weakness merges")
        for i, did in enumerate(w.merges):
            if did not in drafts:
                errs.append(f"{w.weakness_id}: merges[{i}]: {did} is not a draft shown here")
            elif did in used and used[did] != w.weakness_id:
                errs.append(f"{w.weakness_id}: merges[{i}]: {did} is already merged into {used[did]}")
            else:
                used[did] = w.weakness_id
    return errs + answer_errors([assemble(w, drafts) for w in answer], batch.index)


def outcome_cells(batch: Batch, cells: list[str]) -> str:
    """``C001 (task, outcome)`` list (for logs and tests)."""
    return ", ".join(f"{c} ({batch.by_cell[c]['task_id']}, {outcome_of(batch.by_cell[c])})" for c in cells)
