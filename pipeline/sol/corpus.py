"""What Sol reads of a run, loaded once: cells with outcomes, coverage, pattern groups, timelines, the evidence index.

Sol may see outcomes (Luna never does). Both the single call and the map/reduce calls render from
one :class:`Batch`, so they show the same facts.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
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
from pipeline.sol.timeline_cache import TimelineStore, capped, open_store

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
    """Rows of a query as dicts whose keys are shared: one table of column names for all the rows.

    Sol holds a row per cell for its whole run (cells and coverage: 200,000 rows at 100,000 cells).
    Each is the ``__dict__`` of an instance of a class made for the query, which CPython keeps as a
    key-sharing dict (PEP 412): ~180 bytes an 11-column row where a plain dict takes ~470, and still a
    plain ``dict`` to every reader (equality, order, JSON). Elsewhere it is simply a dict.
    """
    cur = con.execute(sql, params or [])
    names = [d[0] for d in cur.description]
    if len(set(names)) != len(names):  # a repeated column name keeps its last value, as dict(zip()) does
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    row_type = type("Row", (), {"__slots__": ("__dict__",)})
    out: list[dict[str, Any]] = []
    for r in cur.fetchall():
        d = row_type().__dict__  # the instance goes; its dict (keys shared with the query's other rows) stays
        for name, value in zip(names, r, strict=True):
            d[name] = value
        out.append(d)
    return out


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
    groups: list[dict[str, Any]]  # id, type and concerns of each group: its occurrences are read per request
    timeline: TimelineStore  # per cell, (detail, line) unfitted: read from the IR per partition
    index: EvidenceIndex
    evidence: EvidenceStore = field(repr=False)  # what the groups cite, with text: read per request
    task_groups: dict[str, tuple[str, ...]] = field(default_factory=dict)  # eligible task -> its cells' groups
    eligible: list[dict[str, Any]] = field(init=False)

    def __post_init__(self) -> None:
        self.eligible = [c for c in self.cells if c["eligibility"] == "valid_behavior"]

    def close(self) -> None:
        """Close the IR connection the timelines are read on (also done when the batch is garbage)."""
        self.timeline.close()

    def occurrences(self, cells: list[str]) -> dict[str, list[tuple[str, dict[str, Any]]]]:
        """Per cell of ``cells`` (eligible ones), its (group id, occurrence) pairs, by group id and occurrence id.

        Read from :data:`OCCURRENCES_TABLE` by the cells' range of ranks (a partition's cells are mostly one
        run of the walk): the batch's occurrences are never held (~490 MB as dicts at 100,000 cells).
        """
        rank = self.evidence.rank
        ranks = [rank[c] for c in cells if c in rank]
        out: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        if not ranks:
            return out
        keep = set(cells)
        sql = f"{_OCC_SELECT} WHERE rank BETWEEN ? AND ? ORDER BY rank, group_id, occurrence_id"
        for gid, o in self._occurrence_rows(sql, [min(ranks), max(ranks)]):
            if o["cell_id"] in keep:
                out.setdefault(o["cell_id"], []).append((gid, o))
        return out

    def group_stream(self, eligible_only: bool = True) -> Iterator[tuple[str, list[dict[str, Any]]]]:
        """Each group's occurrences (of eligible cells only, unless told), one group at a time, by group id.

        What a text over the whole batch walks: only one group's occurrences are held at a time. Each
        group is its own query (the caller reads the group's evidence on the same connection between two
        groups, which would end a result still streaming).
        """
        where = "rank < ?" if eligible_only else "? >= 0"
        n = len(self.evidence.rank)
        sql = f"SELECT DISTINCT group_id FROM {OCCURRENCES_TABLE} WHERE {where}"
        for gid in sorted(str(r[0]) for r in capped(self.timeline.con).execute(sql, [n]).fetchall()):
            sql = f"{_OCC_SELECT} WHERE group_id = ? AND {where} ORDER BY occurrence_id"
            yield gid, [o for _, o in self._occurrence_rows(sql, [gid, n])]

    def group_cell_counts(self) -> Iterator[tuple[str, str | None, int]]:
        """(group id, cell id, occurrences) for every group and cell it has occurrences in (any cell)."""
        sql = f"SELECT group_id, cell_id, count(*) FROM {OCCURRENCES_TABLE} GROUP BY group_id, cell_id"
        cur = capped(self.timeline.con).execute(sql)
        while got := cur.fetchmany(FETCH_ROWS):
            for gid, cell, n in got:
                yield str(gid), (None if cell is None else str(cell)), int(n)

    def _occurrence_rows(self, sql: str, params: list[Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        cur = capped(self.timeline.con).execute(sql, params)
        while got := cur.fetchmany(FETCH_ROWS):
            for gid, oid, cell, pids, events in got:
                yield str(gid), {"occurrence_id": oid, "cell_id": cell, "pattern_ids": pids, "events": events}

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


# What Sol reads of the Coordinator's groups: ids, type, concerns (held), and per occurrence its cell, patterns
# and events (not the refs, runs, tasks and counts the document also holds), read per request from a table
# of their own ordered by the partitions' walk.
_GROUPS_SQL = "SELECT group_id, type, concerns FROM pattern_groups ORDER BY group_id"
OCCURRENCES_TABLE = "sol_occurrences"
_OCC_SELECT = f"SELECT group_id, occurrence_id, cell_id, pattern_ids, events FROM {OCCURRENCES_TABLE}"
_OCC_DDL = f"""
CREATE OR REPLACE {{temp}}TABLE {OCCURRENCES_TABLE} (
    rank INTEGER NOT NULL,     -- its cell's place in the partitions' walk (the eligible cells'; others: their count)
    group_id VARCHAR NOT NULL,
    occurrence_id VARCHAR,
    cell_id VARCHAR,
    pattern_ids VARCHAR[],
    events VARCHAR[]
)
"""
FETCH_ROWS = 4_096


def _has_ir_groups(con: Any) -> bool:
    return all(duck.has_table(con, t) for t in ("pattern_groups", "pattern_occurrences", "pattern_coverage"))


def _doc_rows(groups: list[dict[str, Any]]) -> Any:
    """The occurrences of ``pattern-groups.json``'s groups (an IR without the pattern tables) as an Arrow table."""
    import pyarrow as pa  # loaded by the IR export already; kept off Sol's import path

    cols: tuple[list[Any], ...] = ([], [], [], [], [])
    for g in groups:
        gid = group_id(g)
        for o in g.get("occurrences") or []:
            if gid is None or not isinstance(o, dict):
                continue
            cell = o.get("cell_id")
            for col, v in zip(cols, (gid, o.get("occurrence_id"), cell or None, o.get("pattern_ids"),
                                     o.get("events")), strict=True):  # fmt: skip
                col.append(v)
    s = pa.string()
    return pa.table({
        "group_id": pa.array(cols[0], s),
        "occurrence_id": pa.array([None if x is None else str(x) for x in cols[1]], s),
        "cell_id": pa.array([None if x is None else str(x) for x in cols[2]], s),
        "pattern_ids": pa.array([[str(p) for p in x] if x else None for x in cols[3]], pa.list_(s)),
        "events": pa.array([[str(e) for e in x] if x else None for x in cols[4]], pa.list_(s)),
    })  # fmt: skip


def write_occurrences(con: Any, rank: dict[str, int], doc_groups: list[dict[str, Any]] | None, *, temp: bool) -> None:
    """Table ``sol_occurrences``: every occurrence Sol shows, by its cell's rank (a request's cells are a range).

    From the IR's ``pattern_occurrences`` (``doc_groups`` None), else from the document's groups.
    """
    import pyarrow as pa  # loaded by the IR export already; kept off Sol's import path

    con.execute(_OCC_DDL.format(temp="TEMP " if temp else ""))
    con.register("_sol_ranks", pa.table({"cell_id": pa.array(list(rank), pa.string()),
                                         "rank": pa.array(list(rank.values()), pa.int32())}))  # fmt: skip
    src = "pattern_occurrences"
    if doc_groups is not None:
        con.register("_sol_doc_occurrences", _doc_rows(doc_groups))
        src = "_sol_doc_occurrences"
    try:
        con.execute(
            f"INSERT INTO {OCCURRENCES_TABLE} SELECT coalesce(r.rank, ?), o.group_id, o.occurrence_id, o.cell_id, "
            f"o.pattern_ids, o.events FROM {src} o LEFT JOIN _sol_ranks r ON r.cell_id = o.cell_id "
            "WHERE o.group_id IS NOT NULL ORDER BY 1, 2, 3",
            [len(rank)],
        )
    finally:
        con.unregister("_sol_ranks")
        if doc_groups is not None:
            con.unregister("_sol_doc_occurrences")


def _group_cells(
    con: Any, doc_groups: list[dict[str, Any]] | None, task_of: dict[str, str], ids: dict[str, str]
) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(per task of ``task_of`` its groups, per group its cells) from one walk of the (group, cell) pairs.

    ``task_of``: eligible cell -> task; a group's cells (:func:`group_cells`) are any cells', each the
    string of ``ids`` (one per cell). From the IR's ``pattern_occurrences``, else the document's groups.
    """
    by_task: dict[str, set[str]] = {t: set() for t in task_of.values()}
    members: dict[str, set[str]] = {}
    if doc_groups is not None:
        for g in doc_groups:
            gid = group_id(g)
            if gid is None:
                continue
            cells = group_cells(g)
            if gid:  # an empty id names no group of the index
                members[gid] = {ids.get(c, c) for c in cells}
            for cell in cells:
                if cell in task_of:
                    by_task[task_of[cell]].add(gid)
        return by_task, members
    cur = con.execute("SELECT DISTINCT group_id, cell_id FROM pattern_occurrences WHERE group_id IS NOT NULL")
    while got := cur.fetchmany(FETCH_ROWS):
        for gid, cell in got:
            task = task_of.get(str(cell))
            if task is not None:
                by_task[task].add(str(gid))
            if cell is not None:
                members.setdefault(str(gid), set()).add(ids.get(cell, cell))
    return by_task, members


def _share(cells: list[dict[str, Any]], coverage: list[dict[str, Any]]) -> None:
    """One string object per distinct text of the rows (a task, run, harness or status repeats over cells).

    Rows are dicts (what the renderers read); their values are made one string per value as DuckDB gives a
    new one per row: ~6 per cell, ~40 MB at 100,000 cells.
    """
    same: dict[str, str] = {}
    for row in (*cells, *coverage):
        for k, v in row.items():
            if isinstance(v, str):
                row[k] = same.setdefault(v, v)


def load_batch(run_dir: Path, ir_path: Path) -> Batch:
    """Read the run's cells and groups' ids, and make the tables Sol reads per request (occurrences, evidence)."""
    con = duck.connect(ir_path, read_only=True)
    try:
        doc_groups: list[dict[str, Any]] | None = None  # the document's groups (an IR without the pattern tables)
        coverage: list[dict[str, Any]] | None = None
        groups: list[dict[str, Any]] = []
        if not (run_dir / GROUPS_FILE).is_file():
            doc_groups = []  # no groups: no occurrences
        else:
            if _has_ir_groups(con):
                # The groups and coverage from the IR tables the document was streamed from: parsing the
                # file (~60 MB at 10,000 cells) held every ref and count of every occurrence as well.
                groups = rows(con, _GROUPS_SQL)
                coverage = rows(con, "SELECT * FROM pattern_coverage ORDER BY cell_id")
            else:
                doc = read_json(run_dir / GROUPS_FILE)
                doc_groups = _group_list(doc)
                if isinstance(doc, dict) and isinstance(doc.get("coverage"), list):
                    coverage = doc["coverage"]  # the Coordinator's coverage carries pattern counts per cell
        cells = rows(
            con,
            "SELECT c.cell_id, c.task_id, c.run_id, c.harness, c.eligibility, c.exclusion_reason, "
            "o.label AS outcome, o.quality, o.completion, o.cost, o.stability "
            "FROM cells c LEFT JOIN outcomes o USING (cell_id) ORDER BY c.cell_id",
        )
        if coverage is None:
            coverage = rows(con, "SELECT * FROM coverage ORDER BY cell_id") if duck.has_table(con, "coverage") else []
        _share(cells, coverage)
        ids = {c["cell_id"]: c["cell_id"] for c in cells}  # one string per cell id, whoever holds it
        eligible = [c for c in cells if c["eligibility"] == "valid_behavior"]
        task_of = {str(c["cell_id"]): str(c["task_id"]) for c in eligible}
        by_task, members = _group_cells(con, doc_groups, task_of, ids)
        for g in groups:  # a group without occurrences is still one of the run's
            members.setdefault(str(g["group_id"]), set())
        index = load_index(ir_path, members, con)  # one connection for the batch
    finally:
        con.close()
    task_groups = {t: tuple(sorted(g)) for t, g in by_task.items()}
    rank = {c: i for i, c in enumerate(walk_order(eligible, task_groups))}

    def tables(c: Any, temp: bool) -> None:
        write_occurrences(c, rank, doc_groups, temp=temp)
        write_evidence(c, temp=temp)

    # The timelines of cells whose content changed (or all, the first time) made into the IR's table; the
    # occurrences, every cited event's line and Luna's words too; read per request on the batch's connection.
    store = open_store(ir_path, rank, tables)
    if doc_groups is not None:
        groups = [{k: v for k, v in g.items() if k != "occurrences"} for g in doc_groups]
        for g in groups:
            g.setdefault("group_id", group_id(g))
    return Batch(
        run_id=analysis_run_id(run_dir),  # the request's id, never the folder (replay under any --run-id)
        ir_path=ir_path,
        cells=cells,
        coverage=coverage,
        groups=groups,
        timeline=store,
        index=index,
        evidence=EvidenceStore(store.con, rank),
        task_groups=task_groups,
    )
