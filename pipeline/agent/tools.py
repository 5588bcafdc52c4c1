"""The agent tools as plain functions over the served runs: each returns one bounded view (pydantic).

The MCP server (:mod:`pipeline.agent.server`) publishes these; tests call them directly too. Errors
are :class:`~pipeline.core.errors.LunasolError` with one line, which the server hands back as a tool
error. Nothing here writes.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from pipeline.agent import reads
from pipeline.agent.bounds import (
    MAX_CONTEXT_LINES,
    MAX_ITEMS,
    MAX_ROWS,
    MAX_TEXT_CHARS,
    cut_list,
    cut_text,
    frame_log,
    redact_all,
)
from pipeline.agent.views import (
    CardView,
    CellLine,
    CellsView,
    ConditionLine,
    FollowupView,
    GroupView,
    ProposalLine,
    QueryView,
    RefView,
    RunState,
    SourceWeakness,
    WeaknessLine,
    WeaknessView,
)
from pipeline.artifacts.proposal_card import ProposalCard
from pipeline.core.errors import BadInput
from pipeline.gates.gate2 import NOT_AUTHORISATION
from pipeline.sol.cards import WeaknessCard

EVENT_ID = re.compile(r"^[A-Za-z0-9_.:/-]+-e\d{4,}$")
QUERY_SECONDS = 20.0
"""A query still running after this is interrupted (the agent is told to narrow it)."""


class Runs:
    """The run directories one server reads, by run id, in the order given (the first is the default)."""

    def __init__(self, run_dirs: list[Path]) -> None:
        if not run_dirs:
            raise BadInput("give at least one run directory")
        self.dirs: dict[str, Path] = {}
        for d in run_dirs:
            reads.check_run(d)
            rid = reads.run_id_of(d)
            if rid in self.dirs and self.dirs[rid].resolve() != d.resolve():
                raise BadInput(f"two runs with the same id {rid}: {self.dirs[rid]} and {d}")
            self.dirs[rid] = d

    @property
    def ids(self) -> list[str]:
        """The served run ids, the default first."""
        return list(self.dirs)

    def get(self, run: str | None) -> tuple[str, Path]:
        """(run id, directory) of ``run`` (None: the first served run); BadInput naming the served ones."""
        if run is None or run == "":
            rid = self.ids[0]
            return rid, self.dirs[rid]
        if run in self.dirs:
            return run, self.dirs[run]
        for rid, d in self.dirs.items():  # a directory path as given is accepted too
            if run in (str(d), d.name):
                return rid, d
        raise BadInput(f"run {run!r} is not served here; served runs: {', '.join(self.ids)}")


# -- helpers -----------------------------------------------------------------------------------------


def _gate1_decisions(run_dir: Path) -> dict[str, str]:
    receipt = reads.gate_receipts(run_dir).get("gate1") or {}
    decisions = (receipt.get("request") or {}).get("decisions") or {}
    return {str(w): str((d or {}).get("decision")) for w, d in decisions.items() if isinstance(d, dict)}


def _validation_of(run_dir: Path) -> dict[str, dict[str, Any]]:
    raw = reads.validation(run_dir) or {}
    return {str(c.get("proposal_id")): c for c in raw.get("cards") or [] if isinstance(c, dict)}


def _selected(run_dir: Path) -> tuple[str, str | None]:
    sel = reads.selection(run_dir)
    if sel is None:
        return reads.state(run_dir).proposalSelection, None
    chosen = sel.get("proposal_id") if sel.get("proposalSelection") == "selected" else None
    return str(sel.get("proposalSelection")), None if chosen is None else str(chosen)


def _weakness(run_dir: Path, weakness_id: str) -> WeaknessCard | None:
    sl = reads.shortlist(run_dir)
    return next((w for w in sl.weaknesses if w.weakness_id == weakness_id), None) if sl else None


def _cards(run_dir: Path) -> list[ProposalCard]:
    cards, _problems = reads.proposal_cards(run_dir)
    return cards


def followup_command(run_dir: Path, proposal_id: str) -> str:
    """The command that judges ``proposal_id`` on the next generation's run."""
    return f"lunasol followup {shlex.quote(str(run_dir))} --proposal {proposal_id} --child runs/<next generation run>"


# -- tools -------------------------------------------------------------------------------------------


def run_state(runs: Runs, run: str | None = None) -> RunState:
    """The run's state machine, both gates with their receipts, the shortlist, the cards, the next command."""
    rid, d = runs.get(run)
    notes: list[str] = []
    s = reads.run_status(d)
    h = s["handoff"]
    decisions = _gate1_decisions(d)
    gate2, chosen = _selected(d)
    weaknesses = [
        WeaknessLine(
            weakness_id=w["weakness_id"],
            confidence=w["confidence"],
            cells=w["cells"],
            tasks=w["tasks"],
            runs=w["runs"],
            pattern_groups=w["pattern_groups"],
            counter_evidence=w["counter_evidence"],
            gate1_decision=decisions.get(w["weakness_id"]),
            statement=w["statement"],
        )
        for w in s["shortlist"]["weaknesses"]
    ]
    vals = _validation_of(d)
    cards, problems = reads.proposal_cards(d)
    notes.extend(problems)
    proposals = [
        ProposalLine(
            proposal_id=c.proposal_id,
            source_weakness=c.source_weakness,
            validation=str((vals.get(c.proposal_id) or {}).get("status") or "unvalidated"),
            selected=c.proposal_id == chosen,
            proposed_strategy=c.strategy_change.proposed_strategy,
        )
        for c in cards
    ]
    verdict = None
    fu = _find_followup(runs, rid, d)
    if fu is not None:
        verdict = fu[1].verdict.verdict
    receipts = {
        gate: {k: r.get(k) for k in ("path", "by", "decided_at", "request", "result", "subject")}
        for gate, r in reads.gate_receipts(d).items()
    }
    return RunState(
        notes=notes,
        run_id=rid,
        run_dir=str(d),
        served_runs=runs.ids,
        phase=h["phase"],
        revision=h["revision"],
        gate1=h["userRootCauseConfirmation"],
        proposal_generation=h["proposalGeneration"],
        gate2=gate2,
        selected_proposal=chosen,
        selection_meaning=NOT_AUTHORISATION,
        shortlist_digest=h.get("shortlist_digest"),
        proposals_digest=h.get("proposals_digest"),
        receipts=receipts,
        weaknesses=cut_list(weaknesses, MAX_ITEMS, "weaknesses", "get_weakness(weakness_id)", notes),
        dropped_weaknesses=cut_list(s["shortlist"]["dropped"], MAX_ITEMS, "dropped weaknesses", "get_weakness", notes),
        proposals=cut_list(proposals, MAX_ITEMS, "proposals", "get_proposal(proposal_id)", notes),
        followup_verdict=verdict,
        redaction="off" if s.get("redaction") == "off" else "on",
        blocked=s.get("block_receipt"),
        next_command=s["next_command"],
    )


def _source_weakness(d: Path, card: ProposalCard, notes: list[str]) -> SourceWeakness | None:
    w = _weakness(d, card.source_weakness)
    if w is None:
        notes.append(f"source weakness {card.source_weakness} is not in this run's shortlist")
        return None
    support = w.support.model_dump(mode="json")
    for key in ("cells", "tasks", "runs", "pattern_groups", "event_refs"):
        support[key] = cut_list(support[key], MAX_ITEMS, f"support.{key}", "weakness_cells(weakness_id)", notes)
    return SourceWeakness(
        weakness_id=w.weakness_id,
        statement=w.statement,
        confidence=w.confidence,
        gate1_decision=_gate1_decisions(d).get(w.weakness_id),
        first_divergence=w.first_divergence.model_dump(mode="json"),
        support=support,
        counter_evidence=w.counter_evidence.model_dump(mode="json"),
        counterfactual_prediction=w.counterfactual_prediction,
        alternative_explanations=w.alternative_explanations,
    )


def get_proposal(runs: Runs, proposal_id: str | None = None, run: str | None = None) -> CardView:
    """One proposal card (default: the one gate 2 selected) with its source weakness and validation."""
    rid, d = runs.get(run)
    cards = _cards(d)
    gate2, chosen = _selected(d)
    if not cards:
        raise BadInput(f"run {rid} has no proposal cards yet (gate 2 comes after `lunasol propose`)")
    want = proposal_id or chosen
    if want is None:
        ids = ", ".join(c.proposal_id for c in cards)
        raise BadInput(f"run {rid} has no gate-2 selection (gate 2: {gate2}); name a card: one of {ids}")
    card = next((c for c in cards if c.proposal_id == want), None)
    if card is None:
        raise BadInput(f"no proposal {want} in run {rid} (it has {', '.join(c.proposal_id for c in cards)})")
    notes: list[str] = []
    return CardView(
        notes=notes,
        run_id=rid,
        proposal_id=card.proposal_id,
        selected=card.proposal_id == chosen,
        gate2=gate2,
        selection_meaning=NOT_AUTHORISATION,
        card=card.model_dump(mode="json"),
        rejection_conditions=list(card.rejection_conditions),
        validation=_validation_of(d).get(card.proposal_id),
        source_weakness=_source_weakness(d, card, notes),
        followup_command=followup_command(d, card.proposal_id),
    )


def get_weakness(runs: Runs, weakness_id: str, run: str | None = None) -> WeaknessView:
    """One weakness card of the shortlist, whole (a dropped one with the reasons it was dropped)."""
    rid, d = runs.get(run)
    sl = reads.shortlist(d)
    if sl is None:
        raise BadInput(f"run {rid} has no weakness shortlist yet (lunasol run stops at gate 1 with one)")
    notes: list[str] = []
    found: dict[str, Any] | None = None
    dropped = False
    for w in sl.weaknesses:
        if w.weakness_id == weakness_id:
            found = w.model_dump(mode="json")
    for dw in sl.dropped:
        if found is None and dw.weakness_id == weakness_id:
            found, dropped = dw.model_dump(mode="json"), True
    if found is None:
        ids = [w.weakness_id for w in sl.weaknesses] + [f"{w.weakness_id} (dropped)" for w in sl.dropped]
        raise BadInput(f"no weakness {weakness_id} in run {rid} (it has {', '.join(ids) or 'none'})")
    for part in ("support", "first_divergence"):
        block = found.get(part)
        if isinstance(block, dict):
            for key, val in block.items():
                if isinstance(val, list):
                    block[key] = cut_list(val, MAX_ITEMS, f"{part}.{key}", "weakness_cells(weakness_id)", notes)
    return WeaknessView(
        notes=notes,
        run_id=rid,
        weakness_id=weakness_id,
        dropped=dropped,
        gate1_decision=_gate1_decisions(d).get(weakness_id),
        weakness=found,
        proposals=[c.proposal_id for c in _cards(d) if c.source_weakness == weakness_id],
    )


OCCURRENCES = 20
"""Occurrences of a pattern group shown (each with at most ``MAX_ITEMS`` // 5 refs and events)."""


def get_pattern_group(runs: Runs, group_id: str, run: str | None = None) -> GroupView:
    """One pattern group: type, what it concerns, support, negatives and its occurrences per cell."""
    rid, d = runs.get(run)
    groups = reads.groups(d)
    g = next((x for x in groups if x.get("group_id") == group_id), None)
    if g is None:
        some = ", ".join(str(x.get("group_id")) for x in groups[:10])
        more = f" ... ({len(groups)} in all)" if len(groups) > 10 else ""
        raise BadInput(f"no pattern group {group_id} in run {rid} (it has {some or 'none'}{more})")
    notes: list[str] = []
    support = dict(g.get("support") or {})
    for key in ("cells", "runs", "tasks"):
        if isinstance(support.get(key), list):
            support[key] = cut_list(support[key], MAX_ITEMS, f"support.{key}", f"query(sql) on {key}", notes)
    occ_all = [o for o in g.get("occurrences") or [] if isinstance(o, dict)]
    more = 'query("SELECT ... FROM pattern_groups ...") or show_ref on the refs shown'
    occurrences = []
    for o in cut_list(occ_all, OCCURRENCES, "occurrences", more, notes):
        o = dict(o)
        for key in ("refs", "events", "pattern_ids"):
            if isinstance(o.get(key), list) and len(o[key]) > MAX_ITEMS // 5:
                n = len(o[key])
                o[key] = o[key][: MAX_ITEMS // 5]
                notes.append(f"{o.get('occurrence_id')} {key} cut at {MAX_ITEMS // 5} of {n}")
        occurrences.append(o)
    return GroupView(
        notes=notes,
        run_id=rid,
        group_id=group_id,
        type=g.get("type"),
        concerns=g.get("concerns"),
        support=support,
        negatives=g.get("negatives"),
        occurrences=occurrences,
        occurrences_total=len(occ_all),
    )


def _event_ref(d: Path, event_id: str) -> str:
    with reads.ir(d) as con:
        row = con.execute(
            "SELECT source_path, line_start, line_end, json_pointer FROM events WHERE event_id = ?", [event_id]
        ).fetchone()
    if row is None:
        raise BadInput(f"no event {event_id} in this run's IR")
    path, start, end, pointer = row
    return f"{path}#L{start}-L{end}{pointer or ''}"


def show_ref(
    runs: Runs, ref: str, context: int = 2, run: str | None = None, max_chars: int = MAX_TEXT_CHARS
) -> RefView:
    """The raw lines behind a ref (PATH#Lstart-Lend) or an event id, hash-checked, with context, redacted.

    The lines are cut at ``max_chars`` (the cut noted) before they are framed as untrusted log content.
    """
    # startup: the ref resolver reads the bundle's manifest and the adapters' span locator
    from pipeline.ir.refs import show_ref_context

    rid, d = runs.get(run)
    notes: list[str] = []
    ref = ref.strip()
    event_id = None
    if EVENT_ID.match(ref) and "#L" not in ref:
        event_id, ref = ref, _event_ref(d, ref)
    if context > MAX_CONTEXT_LINES:
        notes.append(f"context cut at {MAX_CONTEXT_LINES} lines either side")
    text = show_ref_context(d, ref, max(0, min(context, MAX_CONTEXT_LINES)))  # redacted, as show-ref shows it
    text = cut_text(text, max_chars, "raw lines", "a narrower ref (fewer lines) or context=0", notes)
    return RefView(notes=notes, run_id=rid, ref=ref, event_id=event_id, text=frame_log(text))


def query(runs: Runs, sql: str, max_rows: int = 50, run: str | None = None) -> QueryView:
    """One read-only SQL statement over the run's IR; at most ``max_rows`` rows (up to 200), values cut."""
    # startup: `lunasol query`'s library opens DuckDB
    from pipeline.ir.query import query as run_query

    rid, d = runs.get(run)
    notes: list[str] = []
    n = max(1, min(max_rows, MAX_ROWS))
    if max_rows > MAX_ROWS:
        notes.append(f"max_rows cut at {MAX_ROWS}: page with LIMIT/OFFSET in the SQL")
    result = run_query(d, sql, max_rows=n, timeout_s=QUERY_SECONDS)
    if result.more:
        notes.append(
            f"rows cut at {n}; ask for more with LIMIT {n} OFFSET {n} in the SQL (or max_rows up to {MAX_ROWS})"
        )
    cell_limit = max(200, MAX_TEXT_CHARS // max(1, n))
    rows: list[list[Any]] = []
    cut_cells = 0
    for rec in result.records():
        row = []
        for v in rec.values():
            if isinstance(v, str) and len(v) > cell_limit:
                v, cut_cells = v[:cell_limit] + f" [... cut at {cell_limit:,} characters]", cut_cells + 1
            row.append(redact_all(v))
        rows.append(row)
    if cut_cells:
        notes.append(
            f"{cut_cells} value(s) cut at {cell_limit:,} characters; ask for more with fewer rows or "
            "substr(col, START, LEN) in the SQL"
        )
    return QueryView(notes=notes, run_id=rid, sql=sql, columns=result.columns, rows=rows, more=result.more)


def _cell_rows(d: Path, cells: list[str]) -> dict[str, dict[str, Any]]:
    if not cells:
        return {}
    with reads.ir(d) as con:
        has_outcomes = bool(
            con.execute("SELECT 1 FROM information_schema.tables WHERE table_name = 'outcomes'").fetchall()
        )
        label = "o.label" if has_outcomes else "NULL"
        join = "LEFT JOIN outcomes o USING (cell_id) " if has_outcomes else ""
        rows = con.execute(
            f"SELECT c.cell_id, c.task_id, c.run_id, {label}, c.eligibility FROM cells c {join}"
            "WHERE c.cell_id IN (SELECT unnest(?::VARCHAR[]))",
            [cells],
        ).fetchall()
    return {str(r[0]): {"task_id": r[1], "run_id": r[2], "outcome_label": r[3], "eligibility": r[4]} for r in rows}


def outcome_counts(d: Path) -> dict[str, int]:
    """Eligible cells per outcome label (``unknown``: no label), as the report's summary counts them."""
    with reads.ir(d) as con:
        if not con.execute("SELECT 1 FROM information_schema.tables WHERE table_name = 'outcomes'").fetchall():
            return {}
        rows = con.execute(
            "SELECT coalesce(o.label, 'unknown'), count(*) FROM cells c LEFT JOIN outcomes o USING (cell_id) "
            "WHERE c.eligibility = 'valid_behavior' GROUP BY 1 ORDER BY 1"
        ).fetchall()
    return {str(label): int(n) for label, n in rows}


def _eligible(d: Path) -> list[str]:
    with reads.ir(d) as con:
        return [
            str(r[0])
            for r in con.execute(
                "SELECT cell_id FROM cells WHERE eligibility = 'valid_behavior' ORDER BY cell_id"
            ).fetchall()
        ]


def _ref_cells(d: Path, keys: list[str]) -> dict[str, str]:
    """Cell of each cited event id or ref (refs through the IR's events, by source file and lines)."""
    out = {}
    refs = []
    for k in keys:
        if EVENT_ID.match(k) and "#L" not in k:
            out[k] = k.rsplit("-e", 1)[0]
        else:
            refs.append(k)
    if refs:
        paths = sorted({r.split("#", 1)[0] for r in refs})
        with reads.ir(d) as con:
            by_path = dict(
                con.execute(
                    "SELECT source_path, min(cell_id) FROM events WHERE source_path IN (SELECT unnest(?::VARCHAR[])) "
                    "GROUP BY 1",
                    [paths],
                ).fetchall()
            )
        for r in refs:
            cell = by_path.get(r.split("#", 1)[0])
            if cell is not None:
                out[r] = str(cell)
    return out


def weakness_cells(runs: Runs, weakness_id: str, run: str | None = None) -> CellsView:
    """The cells that support a weakness (with its refs in each), those that contradict it, and the rest."""
    rid, d = runs.get(run)
    w = _weakness(d, weakness_id)
    if w is None:
        sl = reads.shortlist(d)
        ids = ", ".join(x.weakness_id for x in sl.weaknesses) if sl else "none"
        raise BadInput(f"no weakness {weakness_id} in run {rid}'s shortlist (it has {ids})")
    notes: list[str] = []
    cited = list(dict.fromkeys([*w.first_divergence.event_refs, *w.support.event_refs]))
    cell_of = _ref_cells(d, cited)
    counter = w.counter_evidence.items
    all_cells = list(dict.fromkeys([*w.support.cells, *w.first_divergence.cells, *(c.cell for c in counter)]))
    info = _cell_rows(d, all_cells)

    def line(cell: str, refs: list[str], note: str | None = None) -> CellLine:
        i = info.get(cell, {})
        shown = cut_list(refs, MAX_ITEMS // 5, f"refs of {cell}", "get_weakness(weakness_id)", notes)
        return CellLine(cell_id=cell, refs=shown, note=note, **i)

    support_cells = list(dict.fromkeys([*w.support.cells, *w.first_divergence.cells]))
    supporting = [line(c, [k for k in cited if cell_of.get(k) == c]) for c in support_cells]
    contradicting = [line(c.cell, list(c.refs), c.note) for c in counter]
    eligible = _eligible(d)
    named = set(support_cells) | {c.cell for c in counter}
    neither = [c for c in eligible if c not in named]
    more = 'query("SELECT ... FROM cells ...")'
    return CellsView(
        notes=notes,
        run_id=rid,
        weakness_id=weakness_id,
        supporting=cut_list(supporting, MAX_ITEMS, "supporting cells", more, notes),
        contradicting=cut_list(contradicting, MAX_ITEMS, "contradicting cells", more, notes),
        no_counter_evidence_reason=w.counter_evidence.none_reason,
        neither=cut_list(neither, MAX_ITEMS * 2, "cells neither cited nor contradicting", more, notes),
        eligible_cells=len(eligible),
    )


def _find_followup(runs: Runs, rid: str, d: Path) -> tuple[Path, Any] | None:
    """The follow-up of this run: its own followup.json, or one whose parent is this run (served or a sibling)."""
    for cand in reads.followup_candidates(d, list(runs.dirs.values())):
        doc = reads.followup_of(cand)
        if doc is None:
            continue
        if cand == d or doc.parent.run_id == rid or doc.child.run_id == rid:
            return cand, doc
    return None


def get_followup(runs: Runs, run: str | None = None) -> FollowupView:
    """The follow-up verdict on the run's selected card (read from the child run's followup.json), if any."""
    rid, d = runs.get(run)
    found = _find_followup(runs, rid, d)
    if found is None:
        _gate2, chosen = _selected(d)
        how = followup_command(d, chosen) if chosen else "select a card at gate 2 first, then lunasol followup"
        return FollowupView(
            run_id=rid,
            found=False,
            path=None,
            parent_run=None,
            child_run=None,
            proposal_id=chosen,
            verdict=None,
            reason=None,
            targeted=None,
            how_to_make_one=how,
        )
    where, doc = found
    notes: list[str] = []
    conditions = [
        ConditionLine(
            index=c.index,
            condition=c.condition,
            status=c.status,
            decided_by=c.decided_by,
            reason=cut_text(c.reason, 2_000, f"condition {c.index} reason", "the followup.json file", notes),
            refs=cut_list(list(c.refs), MAX_ITEMS // 5, f"condition {c.index} refs", "show_ref", notes),
        )
        for c in doc.conditions
    ]
    return FollowupView(
        notes=notes,
        run_id=rid,
        found=True,
        path=str(where / reads.FOLLOWUP_FILE),
        parent_run=doc.parent.run_id,
        child_run=doc.child.run_id,
        proposal_id=doc.proposal.proposal_id,
        verdict=doc.verdict.verdict,
        reason=doc.verdict.reason,
        covers=doc.verdict.covers,
        does_not_cover=doc.verdict.does_not_cover,
        pending_human=doc.verdict.pending_human,
        conditions=cut_list(conditions, MAX_ITEMS, "conditions", "the followup.json file", notes),
        targeted=doc.targeted.model_dump(mode="json"),
        how_to_make_one=None,
    )
