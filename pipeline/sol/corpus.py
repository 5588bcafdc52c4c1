"""What Sol reads of a run, loaded once: cells with outcomes, coverage, pattern groups, timelines, the evidence index.

Sol may see outcomes (Luna never does). Both the single call and the map/reduce calls render from
one :class:`Batch`, so they show the same facts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from pipeline.artifacts.run_info import analysis_run_id
from pipeline.artifacts.rundir import GROUPS
from pipeline.core import duck
from pipeline.core.canonical import read_json
from pipeline.ir.selection import PILOT_REASON
from pipeline.sol.checks import EvidenceIndex, load_index
from pipeline.sol.evidence import EvidenceStore, write_evidence
from pipeline.sol.families import bounded_by_task, walk_order
from pipeline.sol.timeline_cache import TimelineStore, open_store

GROUPS_FILE = GROUPS.filename
TIMELINE_BUDGET_CHARS = 400_000  # ~100K tokens; larger batches are trimmed visibly (fit_timelines)


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


def rows(con: Any, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
    """Rows of a query as dicts."""
    cur = con.execute(sql, params or [])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def timeline_budget() -> int:
    """Characters the timelines may take in Sol's single prompt (env ``LUNASOL_SOL_TIMELINE_CHARS``)."""
    return int(os.environ.get("LUNASOL_SOL_TIMELINE_CHARS", TIMELINE_BUDGET_CHARS))


@dataclass
class Batch:
    """Everything Sol is shown, for the whole batch."""

    run_id: str
    ir_path: Path
    cells: list[dict[str, Any]]  # every cell of the run, with its outcome
    coverage: list[dict[str, Any]]
    groups: list[dict[str, Any]]
    timeline: TimelineStore  # per cell, (detail, line) unfitted: read from the IR per partition
    index: EvidenceIndex
    evidence: EvidenceStore = field(repr=False)  # what the groups cite, with text: read per request
    eligible: list[dict[str, Any]] = field(init=False)

    def __post_init__(self) -> None:
        self.eligible = [c for c in self.cells if c["eligibility"] == "valid_behavior"]

    def close(self) -> None:
        """Close the IR connection the timelines are read on (also done when the batch is garbage)."""
        self.timeline.close()

    @cached_property
    def pilot_context(self) -> dict[str, int]:
        """``pilot_of``: the batch's eligible cells when this run is a pilot on a subset of them (else nothing).

        Only a pilot's prompts carry it, so a full run's requests are what they always were.
        """
        left = sum(1 for c in self.cells if str(c["exclusion_reason"] or "").startswith(PILOT_REASON))
        return {"pilot_of": len(self.eligible) + left} if left else {}

    @cached_property
    def by_cell(self) -> dict[str, dict[str, Any]]:
        """Eligible cells by id (built once: the reduce step looks cells up per sample)."""
        return {c["cell_id"]: c for c in self.eligible}

    @cached_property
    def by_task(self) -> str:
        """:func:`bounded_by_task` of the eligible cells (the same line in every request: made once)."""
        return bounded_by_task(self.eligible)

    @cached_property
    def harnesses(self) -> list[str]:
        """Harnesses of the eligible cells."""
        return sorted({str(c["harness"]) for c in self.eligible if c["harness"]})

    @cached_property
    def negatives(self) -> list[str]:
        """Successful eligible cells (counter-evidence candidates)."""
        return [c["cell_id"] for c in self.eligible if c["outcome"] == "completed"]

    @cached_property
    def excluded(self) -> list[dict[str, Any]]:
        """Cells outside the denominator, with the reason; a pilot's left-out cells as one entry (their count).

        A pilot of 100 cells of 100,000 would otherwise list 99,900 cells in Sol's prompt.
        """
        out = [
            {"cell_id": c["cell_id"], "reason": c["exclusion_reason"]}
            for c in self.cells
            if c["eligibility"] != "valid_behavior" and not str(c["exclusion_reason"] or "").startswith(PILOT_REASON)
        ]
        left = [c for c in self.cells if str(c["exclusion_reason"] or "").startswith(PILOT_REASON)]
        if left:
            out.append({"cell_id": f"{len(left)} other cells", "reason": left[0]["exclusion_reason"]})
        return out


# What Sol reads of the Coordinator's groups: ids, type, concerns, and per occurrence its cell, patterns
# and events (not the refs, runs, tasks and counts the document also holds), from the IR's tables.
_GROUPS_SQL = "SELECT group_id, type, concerns FROM pattern_groups ORDER BY group_id"
_OCCURRENCES_SQL = (
    "SELECT group_id, occurrence_id, cell_id, pattern_ids, events FROM pattern_occurrences "
    "ORDER BY group_id, occurrence_id"
)
FETCH_ROWS = 4_096


def _groups_from_ir(con: Any) -> list[dict[str, Any]] | None:
    """The groups of ``pattern-groups.json`` as Sol reads them, from the tables it was written from (None: none)."""
    if not all(duck.has_table(con, t) for t in ("pattern_groups", "pattern_occurrences")):
        return None
    groups = [{**g, "occurrences": []} for g in rows(con, _GROUPS_SQL)]
    by_id = {g["group_id"]: g for g in groups}
    for batch in con.sql(_OCCURRENCES_SQL).fetch_record_batch(FETCH_ROWS):
        for o in batch.to_pylist():
            by_id[o.pop("group_id")]["occurrences"].append(o)
    return groups


def load_batch(run_dir: Path, ir_path: Path) -> Batch:
    """Read the run's IR and pattern groups once."""
    con = duck.connect(ir_path, read_only=True)
    try:
        doc: Any = {}
        if (run_dir / GROUPS_FILE).is_file():
            # The document's groups and coverage from the IR tables it was streamed from: parsing the
            # file (~60 MB at 10,000 cells) held every ref and count of every occurrence as well.
            from_ir = _groups_from_ir(con)
            if from_ir is not None and duck.has_table(con, "pattern_coverage"):
                doc = {"groups": from_ir, "coverage": rows(con, "SELECT * FROM pattern_coverage ORDER BY cell_id")}
            else:
                doc = read_json(run_dir / GROUPS_FILE)
        groups = _group_list(doc)
        index_groups = {gid: group_cells(g) for g in groups if (gid := group_id(g))}
        index = load_index(ir_path, index_groups, con)  # one connection for the batch (~20 ms each)
        cells = rows(
            con,
            "SELECT c.cell_id, c.task_id, c.run_id, c.harness, c.eligibility, c.exclusion_reason, "
            "o.label AS outcome, o.quality, o.completion, o.cost, o.stability "
            "FROM cells c LEFT JOIN outcomes o USING (cell_id) ORDER BY c.cell_id",
        )
        coverage = rows(con, "SELECT * FROM coverage ORDER BY cell_id") if duck.has_table(con, "coverage") else []
        if isinstance(doc, dict) and isinstance(doc.get("coverage"), list):
            coverage = doc["coverage"]  # the Coordinator's coverage carries pattern counts per cell
    finally:
        con.close()
    eligible = [c for c in cells if c["eligibility"] == "valid_behavior"]
    groups_of_cell: dict[str, set[str]] = {}
    for gid, members in index_groups.items():  # each group's cells (group_cells), turned around
        for cell in members:
            groups_of_cell.setdefault(cell, set()).add(gid)
    rank = {c: i for i, c in enumerate(walk_order(eligible, groups_of_cell))}
    # The timelines of cells whose content changed (or all, the first time) made into the IR's table, and every
    # cited event's line and Luna's words, then read per request on a connection the batch holds.
    store = open_store(ir_path, rank, lambda c, temp: write_evidence(c, groups, rank, temp=temp))
    return Batch(
        run_id=analysis_run_id(run_dir),  # the request's id, never the folder (replay under any --run-id)
        ir_path=ir_path,
        cells=cells,
        coverage=coverage,
        groups=groups,
        timeline=store,
        index=index,
        evidence=EvidenceStore(store.con, rank),
    )
