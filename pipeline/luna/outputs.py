"""Luna's outputs written as its cells finish: nothing of the batch is held until the end of the stage.

Holding every cell's merged patterns, verdicts and cache row until the last call ended cost ~25 KiB
a cell (250 MiB at 10,000 cells, 2.5 GiB at 100,000). :class:`LunaOutputs` turns each finished cell
into rows at once and stages them in the IR ``FLUSH_CELLS`` cells at a time (tables
``_luna_staged_*``); :meth:`LunaOutputs.finish` then writes the Luna tables and ``patterns.jsonl``
from the staged rows in the order a whole-batch sort gave (patterns by id, cells by id, a cell's
verdicts and conflicts in merge order), so the outputs are byte-for-byte those of a batch held in
memory, and drops the staging tables. Only counts stay in Python.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from pydantic import TypeAdapter

from pipeline.core import duck
from pipeline.core.canonical import atomic_write_chunks
from pipeline.ir.store import insert_rows
from pipeline.luna.patterns import PATTERN_ROW_SCHEMA_VERSION, Pattern

if TYPE_CHECKING:
    import duckdb

    from pipeline.luna.merge import CellPatterns

PATTERN_COLUMNS = ("pattern_id", "cell_id", "type", "concerns", "observed", "definition_fit", "evidence", "confidence",
                   "state_changed", "probe_hits", "origin", "overruled")  # fmt: skip
LUNA_CELL_COLUMNS = ("cell_id", "status", "parts", "est_tokens", "attempts", "patterns", "reason", "reused")
VERDICT_COLUMNS = ("cell_id", "hit_id", "verdict", "observation")
CONFLICT_COLUMNS = ("conflict_id", "cell_id", "hit_id", "pattern_id", "kind", "model_claim", "probe_finding",
                    "resolution")  # fmt: skip
CACHE_COLUMNS = ("cell_id", "content_digest", "made_with", "summary", "key", "run")
PATTERN_LIST = TypeAdapter(list[Pattern])
FLUSH_CELLS = 500  # cells whose rows wait in memory before they go to the staging tables (~2 MiB)
FILE_ROWS = 5_000  # patterns read back at a time to write patterns.jsonl
# Patterns sorted at a time: the whole batch's patterns (650,000 rows, 309 MB of lines at 100,000 cells)
# sorted in one statement took DuckDB's whole limit twice at the end of the stage (+480 MiB each for
# the table and the file); a range of ids at a time is sorted in a few MiB.
RANGE_ROWS = 20_000
RANGE_CELLS = 2_000  # the same for the tables by cell (a cell's verdicts, its cache row with its task's summary)
# DuckDB's memory while the Luna tables and the file are written from the staged rows, a range at a time:
# a range is a few MiB, and under the general limit the blocks read range after range stayed cached up
# to it. (A whole-table sort does not fit: under 128 MiB one ran out of memory at 100,000 cells.)
FINISH_MEMORY = "128MiB"

TABLES_DDL = """
CREATE OR REPLACE TABLE patterns (
    pattern_id VARCHAR PRIMARY KEY,
    cell_id VARCHAR NOT NULL,
    type VARCHAR NOT NULL,
    concerns VARCHAR NOT NULL,
    observed VARCHAR NOT NULL,
    definition_fit VARCHAR NOT NULL,
    evidence VARCHAR[] NOT NULL,
    confidence VARCHAR NOT NULL,
    state_changed BOOLEAN NOT NULL,
    probe_hits VARCHAR[] NOT NULL,
    origin VARCHAR NOT NULL,
    overruled BOOLEAN NOT NULL
);
CREATE OR REPLACE TABLE luna_cells (
    cell_id VARCHAR PRIMARY KEY,
    status VARCHAR NOT NULL,          -- ok / split (ok, in several calls) / failed
    parts INTEGER NOT NULL,
    est_tokens INTEGER NOT NULL,      -- rendered IR, estimated tokens (PartBudget.chars_per_token)
    attempts INTEGER NOT NULL,
    patterns INTEGER NOT NULL,
    reason VARCHAR,
    reused BOOLEAN NOT NULL           -- answer taken from runs/<id>/luna/<cell>.json (same prompt, template, model)
);
CREATE OR REPLACE TABLE probe_verdicts (
    cell_id VARCHAR NOT NULL,
    hit_id VARCHAR PRIMARY KEY,
    verdict VARCHAR NOT NULL,         -- confirmed / rejected / overruled (rejection claimed a change)
    observation VARCHAR
);
CREATE OR REPLACE TABLE probe_conflicts (
    conflict_id VARCHAR PRIMARY KEY,
    cell_id VARCHAR NOT NULL,
    hit_id VARCHAR NOT NULL,
    pattern_id VARCHAR,
    kind VARCHAR NOT NULL,
    model_claim VARCHAR NOT NULL,
    probe_finding VARCHAR NOT NULL,
    resolution VARCHAR NOT NULL
);
"""

CACHE_TABLE = "luna_cache"
CACHE_DDL = f"""
CREATE TABLE IF NOT EXISTS {CACHE_TABLE} (
    cell_id VARCHAR PRIMARY KEY,
    content_digest VARCHAR NOT NULL,  -- the cell's IR content the prompt was rendered from
    made_with VARCHAR NOT NULL,       -- template, model, context budget, probe set, lunasol version
    summary VARCHAR NOT NULL,         -- the task summary in the prompt
    key VARCHAR,                      -- key of the stored answer (runs/<id>/luna/<cell>.json)
    run VARCHAR NOT NULL              -- canonical JSON: status, parts, sizes and the merged patterns
);
"""

_STAGED = "_luna_staged_"
# (staged table, final table, its columns, the extra staged columns, the order the final rows are written in)
_TABLES = (
    ("patterns", PATTERN_COLUMNS, "line VARCHAR", "pattern_id"),
    ("luna_cells", LUNA_CELL_COLUMNS, "", "cell_id"),
    ("probe_verdicts", VERDICT_COLUMNS, "n INTEGER", "cell_id, n"),
    ("probe_conflicts", CONFLICT_COLUMNS, "n INTEGER", "cell_id, n"),
    (CACHE_TABLE, CACHE_COLUMNS, "", "cell_id"),
)


def _staging_ddl() -> str:
    """The staging tables: the final tables' columns (keys dropped: checked when the final rows go in)."""
    ddl = (TABLES_DDL + CACHE_DDL.replace("CREATE TABLE IF NOT EXISTS", "CREATE OR REPLACE TABLE")).replace(
        " PRIMARY KEY", ""
    )
    ddl = ddl.replace("CREATE OR REPLACE TABLE ", f"CREATE OR REPLACE TABLE {_STAGED}")
    for name, _cols, extra, _order in _TABLES:
        if extra:
            ddl += f"ALTER TABLE {_STAGED}{name} ADD COLUMN {extra};\n"
    return ddl


@dataclass
class LunaOutputs:
    """Luna's tables and ``patterns.jsonl``, written from each cell as it finishes (see the module)."""

    ir_path: Path
    run_dir: Path
    patterns_file: str
    cells: int = 0
    patterns: int = 0
    conflicts: int = 0
    cached: int = 0
    _rows: dict[str, list[tuple[Any, ...]]] = field(default_factory=dict)
    _pending: int = 0
    _started: bool = False

    def add(self, row: tuple[Any, ...], merged: CellPatterns, cache_row: tuple[str | None, ...] | None = None,
            *, cached: bool = False) -> None:  # fmt: skip
        """One finished cell: its ``luna_cells`` row, merged patterns and (made now) cache row."""
        rows = self._rows
        # a cell's patterns validated and dumped in one call (pydantic-core walks the list), not per model
        dumped: list[dict[str, Any]] = PATTERN_LIST.dump_python(merged.patterns, mode="json")
        rows.setdefault("patterns", []).extend(
            (*(d[c] for c in PATTERN_COLUMNS), _line(d)) for d in dumped
        )  # fmt: skip
        rows.setdefault("luna_cells", []).append(row)
        rows.setdefault("probe_verdicts", []).extend(
            (v.cell_id, v.hit_id, v.verdict, v.observation, n) for n, v in enumerate(merged.verdicts)
        )
        rows.setdefault("probe_conflicts", []).extend(
            (c.conflict_id, c.cell_id, c.hit_id, c.pattern_id, c.kind, c.model_claim, c.probe_finding, c.resolution, n)
            for n, c in enumerate(merged.conflicts)
        )
        if cache_row is not None:
            rows.setdefault(CACHE_TABLE, []).append(cache_row)
        self.cells += 1
        self.patterns += len(dumped)
        self.conflicts += len(merged.conflicts)
        self.cached += cached
        self._pending += 1
        if self._pending >= FLUSH_CELLS:
            self.flush()

    def flush(self) -> None:
        """Stage the rows waiting in memory (the first flush makes the staging tables)."""
        con = duck.connect(self.ir_path)
        try:
            if not self._started:
                con.execute(_staging_ddl())
                self._started = True
            for name, cols, extra, _order in _TABLES:
                names = cols + ((extra.split()[0],) if extra else ())
                insert_rows(con, _STAGED + name, names, self._rows.get(name, []))
        finally:
            con.close()
        self._rows.clear()
        self._pending = 0

    def finish(self) -> str:
        """Write the Luna tables, the cache rows and ``patterns.jsonl`` from the staged rows; the file's digest."""
        self.flush()
        con = duck.connect(self.ir_path)
        try:
            con.execute(TABLES_DDL)
            con.execute(CACHE_DDL)
            # the cells made now replace their old cache rows; failed cells are not cached
            con.execute(f"DELETE FROM {CACHE_TABLE} WHERE cell_id IN (SELECT cell_id FROM {_STAGED}{CACHE_TABLE})")
            with duck.limited(con, FINISH_MEMORY):
                ranges = _id_ranges(con, "patterns", "pattern_id", RANGE_ROWS)
                by_cell = _id_ranges(con, "luna_cells", "cell_id", RANGE_CELLS)  # every other table is by cell
                for name, cols, _extra, order in _TABLES:
                    listed = ", ".join(cols)
                    sql = f"INSERT INTO {name} ({listed}) SELECT {listed} FROM {_STAGED}{name}"
                    # appended range after range: each table's rows are in the order of one whole sort
                    for where, params in ranges if name == "patterns" else by_cell:
                        con.execute(f"{sql} WHERE {where} ORDER BY {order}", params)
                digest = self._write_file(con, ranges)
            for name, *_ in _TABLES:
                con.execute(f"DROP TABLE IF EXISTS {_STAGED}{name}")
        finally:
            con.close()
        return digest

    def _write_file(self, con: duckdb.DuckDBPyConnection, ranges: list[tuple[str, list[str]]]) -> str:
        """``patterns.jsonl`` from the staged lines in pattern order, a range of ids at a time, atomically."""

        def chunks() -> Iterator[bytes]:
            for where, params in ranges:
                result = con.execute(f"SELECT line FROM {_STAGED}patterns WHERE {where} ORDER BY pattern_id", params)
                while chunk := result.fetchmany(FILE_ROWS):
                    yield "".join(line for (line,) in chunk).encode("utf-8")

        return atomic_write_chunks(self.run_dir / self.patterns_file, chunks())


def _id_ranges(con: duckdb.DuckDBPyConnection, table: str, column: str, every: int) -> list[tuple[str, list[str]]]:
    """(WHERE clause, its parameters) for consecutive ranges of staged ``table``'s ``column``, ``every`` values each.

    Only that column is sorted whole (~25 bytes a value); the first and last ranges are open, so every
    row of a table keyed by the same values falls in exactly one range.
    """
    bounds = [
        str(r[0])
        for r in con.execute(
            f"SELECT {column} FROM (SELECT {column}, row_number() OVER (ORDER BY {column}) AS n "
            f"FROM {_STAGED}{table}) WHERE n % {every} = 0 ORDER BY n"
        ).fetchall()
    ]
    if not bounds:
        return [("true", [])]
    return [
        (f"{column} <= ?", [bounds[0]]),
        *((f"{column} > ? AND {column} <= ?", [lo, hi]) for lo, hi in pairwise(bounds)),
        (f"{column} > ?", [bounds[-1]]),
    ]


def discard_staged(ir_path: Path) -> None:
    """Drop the staging tables a stopped stage left (its finished cells' answers are kept in ``luna/``)."""
    con = duck.connect(ir_path)
    try:
        for name, *_ in _TABLES:
            con.execute(f"DROP TABLE IF EXISTS {_STAGED}{name}")
    finally:
        con.close()


def _line(dumped: dict[str, Any]) -> str:
    # Every row carries the schema version, like calls.jsonl (see pipeline.artifacts.schemas). A
    # pattern's fields are strings, booleans and lists of strings: orjson spells them as
    # canonical_json does (sorted keys, compact, UTF-8 kept), in a fraction of the time.
    line = orjson.dumps({"schema_version": PATTERN_ROW_SCHEMA_VERSION, **dumped}, option=orjson.OPT_SORT_KEYS)
    return line.decode("utf-8") + "\n"
