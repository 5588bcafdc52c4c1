"""Sol's reduce step: merge the map calls' drafts into the shortlist, with counter-evidence from the WHOLE batch.

A map call only sees its partition, so the reduce call gets, per draft, batch-wide DuckDB counts of
the same concerns in successful cells (the draft's pattern groups' concern keys, and the kinds of
the events it cites) with citable samples, preferring cells outside the draft's own partition. The
merged weakness cites the drafts it merges; its support is the union of their checked support
(cells and refs that resolved), never a count the model writes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pipeline.core import duck
from pipeline.sol.cards import MergedWeakness, SupportDraft, WeaknessCard, WeaknessDraft
from pipeline.sol.checks import EVENT_ID_RE, answer_errors
from pipeline.sol.corpus import FETCH_ROWS, Batch
from pipeline.sol.families import TOP_K, bounded_by_task, bounded_list
from pipeline.sol.partition import outcome_of
from pipeline.sol.timeline import TIMELINE_KINDS
from pipeline.sol.timeline_cache import capped

COUNTER_SAMPLES = 4
SIGNATURES = 3
SAMPLE_REFS = 4
_T = TypeVar("_T")
EXCLUDED_SHOWN = 50


@dataclass
class Draft:
    """A checked weakness of a map (or earlier reduce) call, known by a batch-unique id."""

    draft_id: str  # e.g. M03/W-01
    call_id: str
    card: WeaknessCard
    seen_cells: list[str]  # the cells the call that made it saw
    absorbed: list[str] = field(default_factory=list)  # drafts pre-merged into this one (same groups or divergence)
    sources: list[str] = field(default_factory=list)  # the map calls behind it (its own call's when empty)

    @property
    def map_calls(self) -> list[str]:
        """The map calls whose drafts this one carries."""
        return self.sources or [self.call_id]


def _in_list(values: list[str]) -> str:
    return "[" + duck.literals(values) + "]"


Found = tuple[str, str]  # (cell id, event id): the first event of a signature in one successful cell


def _found_cell(row: Found) -> str:
    return row[0]


def _batch_id(by_cell: dict[str, dict[str, Any]], cell: str) -> str:
    """The batch's own string for ``cell`` (its row's): rows of a query hold one per cell, not one per row."""
    row = by_cell.get(cell)
    return str(row["cell_id"]) if row is not None else cell


def _samples(by_cell: list[_T], own: set[str], cell: Callable[[_T], str]) -> list[_T]:
    """The first :data:`COUNTER_SAMPLES` rows of ``by_cell`` (sorted by cell id) outside ``own``, then inside.

    Cells outside the draft's own partition first: that is what its map call could not see. Equal
    to ``sorted(rows, key=lambda r: (cell(r) in own, cell(r)))[:COUNTER_SAMPLES]`` for
    ``by_cell = sorted(rows, key=cell)`` (both sorts are stable), without a key per row and draft:
    at 10,000 cells a concern's successful occurrences number thousands, for each of ~290 drafts.
    """
    out = list(itertools.islice((r for r in by_cell if cell(r) not in own), COUNTER_SAMPLES))
    if len(out) < COUNTER_SAMPLES:
        out += itertools.islice((r for r in by_cell if cell(r) in own), COUNTER_SAMPLES - len(out))
    return out


Signature = tuple[Any, Any, Any, Any]  # (stage, actor, kind, detail) of an event


@dataclass
class _BatchFacts:
    """Batch-wide lookups for every draft of a reduce round, each kind from ONE query.

    Per-draft queries scanned every event of the batch several times per draft: at 10,000 cells
    and 291 drafts that was over 15 CPU minutes. The texts are the ones per-draft queries gave.
    """

    concerns: dict[str, list[str]]  # draft id -> the concern keys of its pattern groups
    occurrences: dict[str, list[Occurrence]] | None  # concern -> its occurrences in order; None: no table
    signatures: dict[str, list[Signature]]  # draft id -> the first signatures of its cited events
    found: dict[Signature, list[Found]]  # signature -> first such event per successful eligible cell, by cell id
    clean: dict[str, list[str]]  # draft id -> successful cells of its tasks without its concerns
    clean_samples: dict[str, list[str]]  # draft id -> the clean cells shown (outside its partition first)
    last_event: dict[str, str]  # cell -> its last controller-level event (for the sampled clean cells)
    # Drafts share concerns and cited event kinds: what does not depend on the draft is made once.
    # concerns -> (occurrences in order, the same by cell id, number of cells, counts per task and outcome)
    by_concerns: dict[tuple[str, ...], tuple[list[Occurrence], list[Occurrence], int, str]] = field(
        default_factory=dict
    )
    details: dict[str, tuple[str, list[str]]] = field(default_factory=dict)  # the sampled occurrences' (task, events)
    by_signature: dict[Signature, str] = field(default_factory=dict)  # counts per task and outcome


def _group_concerns(batch: Batch, drafts: list[Draft]) -> dict[str, list[str]]:
    by_group: dict[Any, set[str]] = {}
    for g in batch.groups:
        by_group.setdefault(g.get("group_id"), set()).add(str(g.get("concerns")))
    return {
        d.draft_id: sorted(set().union(*(by_group.get(gid, set()) for gid in set(d.card.support.pattern_groups))))
        for d in drafts
    }


def register(con: Any, name: str, columns: dict[str, tuple[str, list[Any]]]) -> None:
    """Python lists registered on ``con`` as view ``name``: columns as ("int" | "str", values)."""
    # An Arrow table registered as a view, as the other stages feed DuckDB lists of rows (executemany
    # inserts row by row); it works on the read-only connection too.
    import pyarrow as pa  # third-party, loaded by the IR export already; kept off Sol's import path

    kinds = {"int": pa.int64(), "str": pa.string()}
    con.register(name, pa.table({c: pa.array(values, kinds[kind]) for c, (kind, values) in columns.items()}))


Occurrence = tuple[int, str, str]  # (place in occurrence id order, occurrence id, cell id)


def _occurrences(con: Any, wanted: list[str], batch: Batch) -> dict[str, list[Occurrence]] | None:
    """Per concern key of ``wanted``: its occurrences in successful cells, in occurrence id order.

    Only the ids: at 100,000 cells these are ~270,000 rows, and with their tasks and events as dicts
    they took ~180 MiB at Sol's peak (the reduce); the few shown as samples are read by :func:`_details`.
    """
    if not duck.has_table(con, "pattern_occurrences"):
        return None
    out: dict[str, list[Occurrence]] = {}
    if wanted:
        by_cell = batch.by_cell
        found = con.execute(
            "SELECT occurrence_id, cell_id, concerns FROM pattern_occurrences "
            f"WHERE successful_cell AND list_contains({_in_list(wanted)}, concerns) ORDER BY occurrence_id"
        ).fetchall()
        for i, (oid, cell, concerns) in enumerate(found):
            out.setdefault(concerns, []).append((i, oid, _batch_id(by_cell, cell)))
    return out


def _occurrence_cell(o: Occurrence) -> str:
    return o[2]


def _details(con: Any, oids: list[str]) -> dict[str, tuple[str, list[str]]]:
    """Occurrence id -> (task id, event ids) of the occurrences shown as samples."""
    if not oids:
        return {}
    register(con, "_shown_occurrences", {"occurrence_id": ("str", oids)})
    found = con.execute(
        "SELECT o.occurrence_id, o.task_id, o.events FROM pattern_occurrences o "
        "SEMI JOIN _shown_occurrences s ON o.occurrence_id = s.occurrence_id"
    ).fetchall()
    return {oid: (task, list(events or [])) for oid, task, events in found}


def _signatures(con: Any, drafts: list[Draft]) -> dict[str, list[Signature]]:
    cited = [
        (i, e) for i, d in enumerate(drafts) for e in dict.fromkeys(d.card.support.event_refs) if EVENT_ID_RE.match(e)
    ]
    register(con, "_cited", {"draft": ("int", [i for i, _ in cited]), "event_id": ("str", [e for _, e in cited])})
    # Sorted by DuckDB (its collation and NULL order, as ORDER BY ALL per draft did), first SIGNATURES
    found = con.execute(
        "SELECT draft, stage, actor, kind, detail FROM ("
        " SELECT *, row_number() OVER (PARTITION BY draft ORDER BY stage, actor, kind, detail) AS n"
        " FROM (SELECT DISTINCT c.draft, e.stage, e.actor, e.kind, e.detail"
        "       FROM _cited c JOIN events e ON e.event_id = c.event_id))"
        f" WHERE n <= {SIGNATURES} ORDER BY draft, n"
    ).fetchall()
    out: dict[str, list[Signature]] = {d.draft_id: [] for d in drafts}
    for draft, stage, actor, kind, detail in found:
        out[drafts[draft].draft_id].append((stage, actor, kind, detail))
    return out


def _found(con: Any, sigs: list[Signature], batch: Batch) -> dict[Signature, list[Found]]:
    """Per signature, its first event in each successful eligible cell, by cell id.

    Pairs that share the batch's cell id strings, read a chunk at a time: at 100,000 cells these are
    ~260,000 rows, which fetched whole and held as dicts added ~90 MiB at the reduce's start.
    """
    out: dict[Signature, list[Found]] = {s: [] for s in sigs}
    if not sigs:
        return out
    by_cell = batch.by_cell
    columns = {name: ("str", [s[i] for s in sigs]) for i, name in enumerate(("stage", "actor", "kind", "detail"))}
    register(con, "_sigs", {"sig": ("int", list(range(len(sigs)))), **columns})
    cur = con.execute(
        "SELECT s.sig, e.cell_id, min(e.event_id) FROM events e JOIN _sigs s ON e.kind = s.kind "
        "AND e.stage IS NOT DISTINCT FROM s.stage AND e.actor IS NOT DISTINCT FROM s.actor "
        "AND e.detail IS NOT DISTINCT FROM s.detail "
        "JOIN outcomes o ON o.cell_id = e.cell_id JOIN cells c ON c.cell_id = e.cell_id "
        "WHERE c.eligibility = 'valid_behavior' AND o.label = 'completed' "
        "GROUP BY s.sig, e.cell_id ORDER BY s.sig, e.cell_id"
    )
    while got := cur.fetchmany(FETCH_ROWS):
        for sig, cell_id, event_id in got:
            out[sigs[sig]].append((_batch_id(by_cell, cell_id), event_id))
    for rows in out.values():
        rows.sort(key=_found_cell)  # DuckDB's order already (cell ids compare as bytes): one pass, kept stable
    return out


def _clean(batch: Batch, drafts: list[Draft], concerns: dict[str, list[str]]) -> dict[str, list[str]]:
    cells_with: dict[str, set[str]] = {}
    wanted = {k for ks in concerns.values() for k in ks}
    for g in batch.groups:  # each group's cells: the index's (the cells of its occurrences)
        if isinstance(g.get("concerns"), str) and g["concerns"] in wanted:
            cells_with.setdefault(g["concerns"], set()).update(batch.index.groups.get(str(g.get("group_id")), ()))
    completed: dict[str, list[str]] = {}
    for c in batch.eligible:
        if c.get("outcome") == "completed":
            completed.setdefault(c["task_id"], []).append(c["cell_id"])
    out: dict[str, list[str]] = {}
    for d in drafts:
        without = set().union(*(cells_with.get(k, set()) for k in concerns[d.draft_id]))
        tasks = set(d.card.support.tasks)
        out[d.draft_id] = [c for t in sorted(tasks) for c in completed.get(t, []) if c not in without]
    return out


def batch_facts(con: Any, batch: Batch, drafts: list[Draft]) -> _BatchFacts:
    """The batch-wide lookups of :func:`counter_evidence` for every draft at once."""
    concerns = _group_concerns(batch, drafts)
    signatures = _signatures(con, drafts)
    clean = _clean(batch, drafts, concerns)
    samples = {d.draft_id: _samples(sorted(clean[d.draft_id]), set(d.seen_cells), str) for d in drafts}
    facts = _BatchFacts(
        concerns=concerns,
        occurrences=_occurrences(con, sorted({k for ks in concerns.values() for k in ks}), batch),
        signatures=signatures,
        found=_found(con, sorted({s for ss in signatures.values() for s in ss}, key=repr), batch),
        clean=clean,
        clean_samples=samples,
        last_event={},
    )
    picks = sorted({c for cells in samples.values() for c in cells})
    if picks:
        kinds = ", ".join(f"'{k}'" for k in TIMELINE_KINDS)
        register(con, "_picks", {"cell_id": ("str", picks)})
        facts.last_event = dict(
            con.execute(
                f"SELECT cell_id, max(event_id) FROM events WHERE kind IN ({kinds}) "
                "AND cell_id IN (SELECT cell_id FROM _picks) GROUP BY cell_id"
            ).fetchall()
        )
    facts.details = _details(con, sorted({o[1] for d in drafts for o in _occurrence_samples(facts, batch, d)}))
    return facts


def _concern_view(
    facts: _BatchFacts, occurrences: dict[str, list[Occurrence]], batch: Batch, concerns: list[str]
) -> tuple[list[Occurrence], list[Occurrence], int, str]:
    key = tuple(concerns)
    view = facts.by_concerns.get(key)
    if view is None:
        occ = sorted(o for k in concerns for o in occurrences.get(k, []))
        cells = sorted({o[2] for o in occ})
        counts = bounded_by_task([batch.by_cell[c] for c in cells if c in batch.by_cell]) if occ else ""
        view = facts.by_concerns[key] = (occ, sorted(occ, key=_occurrence_cell), len(cells), counts)
    return view


def _occurrence_samples(facts: _BatchFacts, batch: Batch, draft: Draft) -> list[Occurrence]:
    """The occurrences of the draft's concerns shown as its samples (outside its partition first)."""
    concerns = facts.concerns[draft.draft_id]
    if not concerns or facts.occurrences is None:
        return []
    _, by_cell, _, _ = _concern_view(facts, facts.occurrences, batch, concerns)
    return _samples(by_cell, set(draft.seen_cells), _occurrence_cell)


def _signature_counts(facts: _BatchFacts, batch: Batch, sig: Signature) -> str:
    counts = facts.by_signature.get(sig)
    if counts is None:
        by_cell = batch.by_cell
        counts = facts.by_signature[sig] = bounded_by_task([by_cell[c] for c, _ in facts.found[sig] if c in by_cell])
    return counts


def counter_evidence(facts: _BatchFacts, batch: Batch, draft: Draft) -> str:
    """Batch-wide counts of the draft's concerns in successful cells, with citable samples (text)."""
    own = set(draft.seen_cells)
    out: list[str] = []
    concerns = facts.concerns[draft.draft_id]
    if concerns and facts.occurrences is not None:
        occ, _, n_cells, counts = _concern_view(facts, facts.occurrences, batch, concerns)
        head = (
            f"- same concerns ({', '.join(concerns)}) in successful cells: "
            f"{len(occ)} occurrence(s) in {n_cells} cell(s)"
        )
        if occ:
            head += f" [{counts}]; samples:"
        out.append(head)
        for _, oid, cell in _occurrence_samples(facts, batch, draft):
            task, events = facts.details[oid]
            out.append(f"  {oid} {cell} ({task}): events {', '.join(events[:3])}")
    for s in facts.signatures[draft.draft_id]:
        found = facts.found[s]
        counts = _signature_counts(facts, batch, s)
        what = f"{s[0] or '-'}/{s[1] or '-'} {s[3] or s[2]}"
        line = f"- events like the cited {what} in successful cells: {len(found)} cell(s)"
        if found:
            line += f" [{counts}]; samples: "
            line += ", ".join(f"{event} ({cell})" for cell, event in _samples(found, own, _found_cell))
        out.append(line)
    if draft.card.support.tasks:
        line = f"- successful cells of the supporting tasks without these concerns: {len(facts.clean[draft.draft_id])}"
        picks = [(c, facts.last_event[c]) for c in sorted(facts.clean_samples[draft.draft_id]) if c in facts.last_event]
        if picks:
            line += "; samples (last controller-level event): " + ", ".join(f"{e} ({c})" for c, e in picks)
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
        f"support: {len(cells)} cell(s) [{bounded_by_task(cells)}]; pattern groups "
        f"{', '.join(c.support.pattern_groups) or 'none'}; sample refs {', '.join(c.support.event_refs[:SAMPLE_REFS])}",
        "alternatives: " + " | ".join(c.alternative_explanations),
        f"counter-evidence seen by its map call: {ce}",
        f"prediction: {c.counterfactual_prediction}",
    ]
    if draft.absorbed:
        lines.append(
            f"pre-merged into it (same pattern groups or the same first divergence, before any call): "
            f"{bounded_list(draft.absorbed)}"
        )
    if shares:
        lines.append(f"shares pattern groups with: {bounded_list(shares)}")
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
    # DuckDB's memory capped as for the requests' reads: the batch-wide queries (every event of the batch) kept
    # ~500 MiB of blocks resident under lunasol's shared limit at 100,000 cells, Sol's peak; capped, they spill
    con = capped(duck.connect(batch.ir_path, read_only=True))
    try:
        facts = batch_facts(con, batch, drafts)
        return {d.draft_id: draft_text(d, batch, shares[d.draft_id], counter_evidence(facts, batch, d)) for d in drafts}
    finally:
        con.close()


def map_calls_text(drafts: list[Draft], map_calls: list[dict[str, Any]]) -> str:
    """The map calls behind ``drafts`` (at most :data:`TOP_K` lines), and how many there were in all.

    Bounded: a reduce request names the calls its drafts come from, never every call of the batch.
    """
    wanted = {c for d in drafts for c in d.map_calls}
    mine = [m for m in map_calls if m["call_id"] in wanted]
    lines = [
        f"{m['call_id']}: tasks {bounded_list(list(m['tasks']))}; {len(m['cells'])} cell(s); "
        f"drafts {bounded_list(list(m['outputs'])) or 'none'}"
        for m in mine[:TOP_K]
    ]
    if len(mine) > TOP_K:
        lines.append(f"and {len(mine) - TOP_K} more map call(s) behind these drafts")
    if len(map_calls) > len(mine):
        cells = sum(len(m["cells"]) for m in map_calls)
        lines.append(f"({len(map_calls)} map calls in all over {cells} cell(s); the others' drafts merge elsewhere)")
    return "\n".join(lines)


def reduce_context(
    batch: Batch, drafts: list[Draft], blocks: dict[str, str], call_id: str, map_calls: list[dict[str, Any]]
) -> dict[str, Any]:
    """The template context of one reduce call over ``drafts`` (texts from :func:`draft_blocks`).

    What every request shares is bounded (batch-wide counts as aggregates, the map calls of these
    drafts only), so the room left for drafts does not shrink as the batch grows.
    """
    excluded = batch.excluded
    shown = ", ".join(f"{e['cell_id']} ({e['reason'] or '-'})" for e in excluded[:EXCLUDED_SHOWN])
    if len(excluded) > EXCLUDED_SHOWN:
        shown += f", and {len(excluded) - EXCLUDED_SHOWN} more (see the shortlist's denominator)"
    return {
        "call_id": call_id,
        "run_id": batch.run_id,
        "harnesses": batch.harnesses,
        "eligible_count": len(batch.eligible),
        **batch.pilot_context,  # a pilot: the prompt says its cells are a subset of the batch
        "batch_by_task": batch.by_task,
        "negatives_count": len(batch.negatives),
        "excluded_text": shown or "none",
        "map_calls_text": map_calls_text(drafts, map_calls),
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


def reduce_errors(
    answer: list[MergedWeakness], drafts: dict[str, Draft], batch: Batch, shown: set[str] | None = None
) -> list[str]:
    """What goes back to the model on a re-ask: unknown or twice-merged drafts, then every card check.

    ``shown``: the event ids this reduce request showed (a citation of another event is refused).
    """
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
    return errs + answer_errors([assemble(w, drafts) for w in answer], batch.index, shown)


def outcome_cells(batch: Batch, cells: list[str]) -> str:
    """``C001 (task, outcome)`` list (for logs and tests)."""
    return ", ".join(f"{c} ({batch.by_cell[c]['task_id']}, {outcome_of(batch.by_cell[c])})" for c in cells)
