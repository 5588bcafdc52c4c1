"""The Coordinator: group Luna's patterns across cells with DuckDB SQL (files in ``sql/``, run in order).

Groups are keyed by pattern type and normalised concerns key (same obligation / target / state
transition). Every occurrence keeps its own event ids and raw refs; duplicate lines written by one
controller incident (same ts, same content) collapse into one occurrence. Per group: cells, tasks,
runs, occurrences, and occurrences in successful cells (negatives, from the outcome sidecar, which
the Coordinator may read and Luna never does). Every eligible cell is in the coverage table.
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb
from pydantic import BaseModel, ConfigDict, Field

from pipeline.artifacts.rundir import GROUPS
from pipeline.artifacts.versions import VERSIONS
from pipeline.coordinator.incidents import update_incidents
from pipeline.coordinator.ranged import run_by_ranges
from pipeline.core import duck
from pipeline.core.errors import BadInput
from pipeline.core.jsonstream import Fields, Items, atomic_write_chunks, pretty_object

GROUPS_FILE = GROUPS.filename
GROUPS_SCHEMA_VERSION = VERSIONS["pattern-groups"]
INCIDENTS_SQL = "01_incidents.sql"
OCCURRENCES_SQL = "02_occurrences.sql"
OCCURRENCE_EVENTS = 1_000_000
"""Cited events the occurrences are drafted from at a time (:mod:`pipeline.coordinator.ranged`)."""


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Occurrence(_Doc):
    """One occurrence of a group in one cell, with its own event ids and raw refs."""

    occurrence_id: str
    cell_id: str
    task_id: str | None
    run_id: str | None
    pattern_ids: list[str]
    events: list[str]
    refs: list[str]
    incidents: int
    collapsed_lines: int
    duplicate_lines_only: bool
    successful_cell: bool | None


class Support(_Doc):
    """Where a group was seen."""

    occurrences: int
    patterns: int
    cells: list[str]
    tasks: list[str]
    runs: list[str]
    n_cells: int
    n_tasks: int
    n_runs: int


class Negatives(_Doc):
    """Occurrences in successful cells (from the outcome sidecar)."""

    occurrences: int
    cells: list[str]


class PatternGroup(_Doc):
    """Patterns of one type about the same thing, across cells."""

    group_id: str
    type: str
    concerns: str
    support: Support
    negatives: Negatives
    collapsed_lines: int
    occurrences: list[Occurrence]


class Totals(_Doc):
    """Counts over the whole batch."""

    eligible_cells: int
    cells_with_patterns: int
    cells_without_patterns: int
    cells_not_analysed: list[str]
    patterns: int
    groups: int
    occurrences: int
    collapsed_lines: int


class CoverageRow(_Doc):
    """One eligible cell and what the Luna and Coordinator stages made of it."""

    cell_id: str
    task_id: str | None
    run_id: str | None
    successful_cell: bool | None
    luna_status: str | None
    luna_reason: str | None
    patterns: int
    groups: int
    occurrences: int


class PatternGroups(_Doc):
    """The whole ``pattern-groups.json``."""

    schema_version: int = GROUPS_SCHEMA_VERSION
    totals: Totals
    groups: list[PatternGroup] = Field(default_factory=list)
    coverage: list[CoverageRow] = Field(default_factory=list)


# When the Coordinator runs on an IR without a Luna stage (tests, hand-made patterns), the coverage
# query still needs these tables; created only if absent, never replacing Luna's.
_FALLBACK_DDL = """
CREATE TABLE IF NOT EXISTS luna_cells (
    cell_id VARCHAR PRIMARY KEY, status VARCHAR NOT NULL, parts INTEGER NOT NULL, est_tokens INTEGER NOT NULL,
    attempts INTEGER NOT NULL, patterns INTEGER NOT NULL, reason VARCHAR, reused BOOLEAN NOT NULL
);
"""


def sql_files() -> list[str]:
    """Names of the Coordinator's SQL files, in the order they run."""
    root = resources.files("pipeline.coordinator").joinpath("sql")
    return sorted(p.name for p in root.iterdir() if p.name.endswith(".sql"))


def _sql(name: str) -> str:
    return resources.files("pipeline.coordinator").joinpath("sql", name).read_text(encoding="utf-8")


def _rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict[str, Any]]:
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


# A group's own columns, the same in the whole document and in the streamed one.
_HEAD_COLUMNS = """
    g.group_id, g.type, g.concerns,
    {'occurrences': g.occurrences::BIGINT, 'patterns': g.patterns::BIGINT, 'cells': g.cells, 'tasks': g.tasks,
     'runs': g.runs, 'n_cells': g.n_cells::BIGINT, 'n_tasks': g.n_tasks::BIGINT, 'n_runs': g.n_runs::BIGINT}
        AS support,
    {'occurrences': g.negative_occurrences::BIGINT, 'cells': g.negative_cells} AS negatives,
    g.collapsed_lines::BIGINT AS collapsed_lines"""


# The document's groups as DuckDB builds them: each group one row, its support, negatives and
# occurrences nested structs and lists, handed over through Arrow (C++ builds the Python dicts:
# 6,000 occurrences no longer zipped into dicts row by row). Keys are sorted when written, so
# struct order is free; sums are HUGEINT in DuckDB (a decimal in Arrow), hence the casts.
_GROUPS_SQL = (
    """
WITH occ AS (
    SELECT group_id, list({
        'occurrence_id': occurrence_id, 'cell_id': cell_id, 'task_id': task_id, 'run_id': run_id,
        'pattern_ids': pattern_ids, 'events': events, 'refs': refs, 'incidents': len(incidents)::BIGINT,
        'collapsed_lines': collapsed_lines::BIGINT, 'duplicate_lines_only': duplicate_lines_only,
        'successful_cell': successful_cell
    } ORDER BY occurrence_id) AS occurrences
    FROM pattern_occurrences GROUP BY group_id
)
SELECT
"""
    + _HEAD_COLUMNS
    + """,
    coalesce(o.occurrences, []) AS occurrences
FROM pattern_groups g LEFT JOIN occ o USING (group_id)
ORDER BY g.group_id
"""
)


# The same groups without their occurrences, and the occurrences alone in the document's order: the
# document is streamed a group and a batch of occurrences at a time (a group may hold one per cell).
_GROUP_HEADS_SQL = "SELECT\n" + _HEAD_COLUMNS + "\nFROM pattern_groups g\nORDER BY g.group_id\n"
# A group's occurrences in the document's order, one group per query: sorting every group's at once
# held them all in DuckDB (+119 against +77 MiB at 10,000 cells, and growing with the batch).
_OCCURRENCES_SQL = """
SELECT
    occurrence_id, cell_id, task_id, run_id, pattern_ids, events, refs, len(incidents)::BIGINT AS incidents,
    collapsed_lines::BIGINT AS collapsed_lines, duplicate_lines_only, successful_cell
FROM pattern_occurrences
WHERE group_id IN ({group})
ORDER BY occurrence_id
"""

GROUPS_PER_BATCH = 16
"""Groups fetched from DuckDB at a time when the document is streamed (their occurrences apart)."""
OCCURRENCES_PER_BATCH = 2_048
"""Occurrences fetched from DuckDB at a time when the document is streamed."""

COVERAGE_PER_BATCH = 2_048

_TOTALS_SQL = """
SELECT
    (SELECT count(*) FROM pattern_coverage) AS eligible_cells,
    (SELECT count(*) FROM pattern_coverage WHERE patterns <> 0) AS cells_with_patterns,
    (SELECT count(*) FROM pattern_coverage WHERE patterns = 0) AS cells_without_patterns,
    (SELECT coalesce(list(cell_id ORDER BY cell_id), [])
       FROM pattern_coverage WHERE luna_status IS NULL OR luna_status NOT IN ('ok', 'split')) AS cells_not_analysed,
    (SELECT coalesce(sum(patterns), 0)::BIGINT FROM pattern_coverage) AS patterns,
    (SELECT count(*) FROM pattern_groups) AS groups,
    (SELECT coalesce(sum(occurrences), 0)::BIGINT FROM pattern_groups) AS occurrences,
    (SELECT coalesce(sum(collapsed_lines), 0)::BIGINT FROM pattern_groups) AS collapsed_lines
"""


def _run_sql(con: duckdb.DuckDBPyConnection) -> None:
    # The Coordinator's SQL files, in order: pattern_occurrences, pattern_groups, pattern_coverage in the IR.
    if not duck.has_table(con, "patterns"):
        raise BadInput("no patterns table in the IR: the luna stage must run before the coordinator")
    con.execute(_FALLBACK_DDL)
    for name in sql_files():
        if name == INCIDENTS_SQL:  # the rule runs on the cells whose incidents are not cached
            update_incidents(con, _sql(name))
        elif name == OCCURRENCES_SQL:
            cited = con.execute(
                "SELECT cell_id, sum(len(evidence))::BIGINT FROM patterns GROUP BY cell_id ORDER BY cell_id"
            ).fetchall()
            sizes = [(str(c), int(n or 0)) for c, n in cited]
            run_by_ranges(con, _sql(name), "occurrence_cells", "pattern_occurrences_draft", sizes, OCCURRENCE_EVENTS)
        else:
            con.execute(_sql(name))


def totals(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """The document's ``totals``, aggregated in DuckDB from the tables the SQL wrote."""
    return _rows(con, _TOTALS_SQL)[0]


def _batches(con: duckdb.DuckDBPyConnection, sql: str, size: int) -> Any:
    # Arrow record batches of ``size`` rows: at most one batch of groups is in Python at a time.
    reader = con.sql(sql).fetch_record_batch(size)
    for batch in reader:
        yield from batch.to_pylist()


def coordinate(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """Run the SQL over the IR on ``con`` (tables written there) and return the whole groups document.

    Held whole in Python: for tests and small batches. :func:`run_coordinator` streams the same bytes.
    """
    _run_sql(con)
    return {
        "schema_version": GROUPS_SCHEMA_VERSION,
        "totals": totals(con),
        "groups": con.sql(_GROUPS_SQL).to_arrow_table().to_pylist(),
        "coverage": _rows(con, "SELECT * FROM pattern_coverage ORDER BY cell_id"),
    }


def _streamed_groups(con: duckdb.DuckDBPyConnection) -> Iterator[Fields]:
    # The groups' heads on a cursor of their own, so a group's occurrences are read beside them
    # (closed when done: an open cursor keeps the file attached).
    heads = con.cursor()
    try:
        for head in _batches(heads, _GROUP_HEADS_SQL, GROUPS_PER_BATCH):
            sql = _OCCURRENCES_SQL.format(group=duck.literals([str(head["group_id"])]))
            yield Fields({**head, "occurrences": Items(_batches(con, sql, OCCURRENCES_PER_BATCH))})
    finally:
        heads.close()


def run_coordinator(ir_path: Path, run_dir: Path) -> dict[str, Any]:
    """Coordinate the run's patterns into the IR's tables and stream ``pattern-groups.json`` from them.

    The groups live in the run's DuckDB (``pattern_groups``, ``pattern_occurrences``,
    ``pattern_coverage``); the JSON artifact is written a batch of groups at a time, never built whole
    (its bytes are those of :func:`coordinate`'s document through ``pretty_json_plain``), a group's
    occurrences a batch at a time too. Returns the
    document's ``schema_version`` and ``totals`` (read the file for its groups and coverage).
    """
    con = duck.connect(ir_path)
    # The Coordinator's memory is DuckDB's (its SQL fills the limit at any size): it takes what the
    # process leaves of its budget (~320-340 MiB at 100,000 cells; alone under 400 its CPU was 37.9 s, was
    # 33.6 under 512; 490-512 MiB at 10,000 cells).
    try:
        with duck.limited(con, duck.budget_share()):
            _run_sql(con)
            head = {"schema_version": GROUPS_SCHEMA_VERSION, "totals": totals(con)}
            chunks = pretty_object(
                {
                    **head,
                    "groups": Items(_streamed_groups(con)),
                    "coverage": Items(
                        _batches(con, "SELECT * FROM pattern_coverage ORDER BY cell_id", COVERAGE_PER_BATCH)
                    ),
                }
            )
            # strings, whole numbers, booleans and None only: orjson's bytes are pretty_json's (pipeline.core.canonical)
            atomic_write_chunks(run_dir / GROUPS_FILE, chunks)
    finally:
        con.close()
    return head
