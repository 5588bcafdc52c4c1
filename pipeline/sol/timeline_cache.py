"""Sol's per-cell timelines in the run's DuckDB: made once per cell content, read per partition.

A cell's controller-level timeline (:mod:`pipeline.sol.timeline`) depends on that cell alone: its
row in ``cells`` and its events (even the main worker is found per cell). Table ``sol_timelines``
holds one row per eligible cell (its lines, the detail each was chosen by, their characters in a
prompt) under the cell's content digest (``cell_digests``: its cell row and every column of its
events, in order) and ``made_with`` (the digest of ``timeline.py``'s source and lunasol's,
DuckDB's and Python's versions). A row is the lines the query would give again while both hold;
the others are made again, a cell at a time from one streamed query, and written a thousand cells
at a time. Having ``cell_id`` and ``content_digest``, the table is a per-cell cache that a
re-export carries for unchanged cells (:mod:`pipeline.ir.cache`), as ``probe_cache`` is.

Sol never holds the batch's lines: :class:`TimelineStore` reads a partition's cells when its map
request is made (one query), and keeps only each cell's size (what partitioning needs). At 10,000
cells the lines held whole were ~120 MiB (541,697 lines); at 100,000, ten times that.
"""

from __future__ import annotations

import functools
import sys
import weakref
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import duckdb

import pipeline
from pipeline.core import duck
from pipeline.core.canonical import digest, sha256_bytes
from pipeline.sol import timeline
from pipeline.sol.timeline import timeline_chars

TABLE = "sol_timelines"
WALK_TABLE = "sol_timeline_walk"  # this run's eligible cells' lines, one row each, by rank (a request reads a range)
Lines = list[tuple[str, str]]
_SHAPE = [
    ("cell_id", "VARCHAR"),
    ("content_digest", "VARCHAR"),
    ("made_with", "VARCHAR"),
    ("details", "VARCHAR[]"),
    ("lines", "VARCHAR[]"),
    ("chars", "BIGINT"),
]
_DDL = f"""
CREATE OR REPLACE {{temp}}TABLE {TABLE} (
    cell_id VARCHAR NOT NULL,
    content_digest VARCHAR NOT NULL,  -- the cell's IR content the lines were made from ('': the IR stores none)
    made_with VARCHAR NOT NULL,       -- timeline.py's source, lunasol's, DuckDB's and Python's versions
    details VARCHAR[] NOT NULL,       -- per line: its event's detail (or kind), what fit_timelines trims by
    lines VARCHAR[] NOT NULL,         -- the cell's timeline lines, in event order
    chars BIGINT NOT NULL             -- timeline_chars of the lines: what they take in a prompt
)
"""
WRITE_CELLS = 1_000  # cells' lines written to DuckDB at a time
LITERAL_CELLS = 1_000  # up to this many cells to read again are named in the query, more are joined
QUERY_CELLS = 2_048  # a partition's cells read at a time


@functools.cache
def made_with() -> str:
    """Digest of what a stored timeline depends on besides its cell: the code and the libraries that make it."""
    return digest(
        {
            "timeline.py": sha256_bytes(Path(timeline.__file__).read_bytes()),
            "lunasol": pipeline.__version__,
            "duckdb": duckdb.__version__,
            "python": sys.version,
        }
    )


def _arrow(rows: list[tuple[str, list[str], list[str], int]]) -> Any:
    import pyarrow as pa  # loaded by the IR export already; kept off Sol's import path

    s = pa.string()
    return pa.table(
        {
            "cell_id": pa.array([r[0] for r in rows], s),
            "details": pa.array([r[1] for r in rows], pa.list_(s)),
            "lines": pa.array([r[2] for r in rows], pa.list_(s)),
            "chars": pa.array([r[3] for r in rows], pa.int64()),
        }
    )


def update_timelines(con: Any, *, temp: bool = False) -> list[str]:
    """Table ``sol_timelines`` with a valid row for every eligible cell; returns the cells read from the IR.

    ``temp``: the table is a temporary one of this connection (an IR that cannot be written): every
    cell is read. Rows whose cell content or maker changed are deleted first; cells without a row
    are read in one streamed query (``where`` narrowing it to them) and written in batches.
    """
    import pyarrow as pa  # loaded by the IR export already; kept off Sol's import path

    stamp = made_with()
    if temp or duck.table_shape(con, TABLE) != _SHAPE:
        con.execute(_DDL.format(temp="TEMP " if temp else ""))
    elif duck.has_table(con, "cell_digests"):
        con.execute(
            f"DELETE FROM {TABLE} t WHERE t.made_with <> ? OR NOT EXISTS (SELECT 1 FROM cell_digests d "
            "WHERE d.cell_id = t.cell_id AND d.content_digest = t.content_digest)",
            [stamp],
        )
    else:  # nothing to key lines by: every cell is read again
        con.execute(f"DELETE FROM {TABLE}")
    eligible = con.execute("SELECT count(*) FROM cells WHERE eligibility = 'valid_behavior'").fetchall()[0][0]
    todo = [
        str(r[0])
        for r in con.execute(
            f"SELECT cell_id FROM cells c WHERE eligibility = 'valid_behavior' AND NOT EXISTS "
            f"(SELECT 1 FROM {TABLE} t WHERE t.cell_id = c.cell_id) ORDER BY cell_id"
        ).fetchall()
    ]
    if not todo:
        return []
    no_digests = "(SELECT NULL::VARCHAR AS cell_id, NULL::VARCHAR AS content_digest)"
    digests = "cell_digests" if duck.has_table(con, "cell_digests") else no_digests
    insert = (
        f"INSERT INTO {TABLE} SELECT b.cell_id, coalesce(d.content_digest, ''), ?, b.details, b.lines, b.chars "
        f"FROM _sol_timeline_rows b LEFT JOIN {digests} d ON d.cell_id = b.cell_id"
    )
    todo_table = pa.table({"cell_id": pa.array(todo, pa.string())})
    con.register("_sol_timeline_todo", todo_table)
    try:
        if len(todo) == eligible:
            where = "TRUE"
        elif len(todo) <= LITERAL_CELLS:
            where = f"e.cell_id IN ({duck.literals(todo)})"
        else:
            where = "e.cell_id IN (SELECT cell_id FROM _sol_timeline_todo)"
        rows: list[tuple[str, list[str], list[str], int]] = []

        def flush() -> None:
            con.register("_sol_timeline_rows", _arrow(rows))
            try:
                con.execute(insert, [stamp])
            finally:
                con.unregister("_sol_timeline_rows")
            rows.clear()

        reader = con.cursor()  # the query streams on a cursor of its own while rows are written on ``con``
        # a registered table is its connection's own: the reader's query names it too (over 1,000 cells to read)
        reader.register("_sol_timeline_todo", todo_table)
        try:
            for cell, lines in timeline.iter_timelines(reader, where):
                rows.append((cell, [k for k, _ in lines], [ln for _, ln in lines], timeline_chars(lines)))
                if len(rows) >= WRITE_CELLS:
                    flush()
        finally:
            reader.close()
        if rows:
            flush()
        # an eligible cell without a controller-level event: an empty row, so it is not read again
        con.execute(
            f"INSERT INTO {TABLE} SELECT c.cell_id, coalesce(d.content_digest, ''), ?, [], [], 0 "
            f"FROM _sol_timeline_todo c LEFT JOIN {digests} d ON d.cell_id = c.cell_id "
            f"WHERE NOT EXISTS (SELECT 1 FROM {TABLE} t WHERE t.cell_id = c.cell_id)",
            [stamp],
        )
    finally:
        con.unregister("_sol_timeline_todo")
    return todo


def write_walk(con: Any, rank: dict[str, int], *, temp: bool = False) -> None:
    """Table ``sol_timeline_walk``: the lines of ``rank``'s cells, one row each, ordered by rank and place.

    A partition's cells are mostly one run of ``rank`` (the partitions' walk): read by a range of
    ranks, a request's query skips the rest of the table. A query by cell ids read all of it, each
    time (170 against 81 CPU s for Sol at 10,000 cells); a range of rows holding lists still read
    their lists from the start (15 against 1.2 ms a request at 10,000 cells).
    """
    import pyarrow as pa  # loaded by the IR export already; kept off Sol's import path

    con.register("_sol_ranks", pa.table({"cell_id": pa.array(list(rank), pa.string()),
                                         "rank": pa.array(list(rank.values()), pa.int32())}))  # fmt: skip
    try:
        con.execute(
            f"CREATE OR REPLACE {'TEMP ' if temp else ''}TABLE {WALK_TABLE} AS SELECT * FROM ("
            "SELECT r.rank, t.cell_id, generate_subscripts(t.lines, 1) AS n, unnest(t.details) AS detail, "
            f"unnest(t.lines) AS line FROM {TABLE} t JOIN _sol_ranks r ON r.cell_id = t.cell_id WHERE t.chars > 0"
            ") ORDER BY rank, n"
        )
    finally:
        con.unregister("_sol_ranks")


class TimelineStore:
    """The eligible cells' timelines in ``sol_timelines``, read per partition on an open read-only connection.

    Holds each cell's size (:meth:`chars`) and nothing of its lines. ``read``: the cells whose lines
    were made from the IR in this run (the others were kept from an earlier one). :meth:`close`
    closes the connection (also when the store is garbage).
    """

    def __init__(self, con: Any, read: list[str], rank: dict[str, int]) -> None:
        self._con = con
        self.read = read
        self.rank = rank
        self._close = weakref.finalize(self, con.close)
        self._chars: dict[str, int] = {}
        sql = f"SELECT cell_id, chars FROM {TABLE} WHERE chars > 0 AND cell_id IN (SELECT cell_id FROM {WALK_TABLE})"
        for cell, chars in self._query(sql):
            if cell in rank:
                self._chars[str(cell)] = int(chars)

    def _query(self, sql: str, params: list[Any] | None = None) -> Iterator[tuple[Any, ...]]:
        cur = capped(self._con).execute(sql, params or [])
        while rows := cur.fetchmany(QUERY_CELLS):
            yield from rows

    @property
    def con(self) -> Any:
        """The read-only connection to the IR the store reads on (the batch's other per-request reads use it too)."""
        return self._con

    def close(self) -> None:
        """Close the connection the store reads on."""
        self._close()

    def __contains__(self, cell: object) -> bool:
        return cell in self._chars

    def chars(self, cell: str) -> int:
        """:func:`~pipeline.sol.timeline.timeline_chars` of the cell's whole timeline (0: it has none)."""
        return self._chars.get(cell, 0)

    def lines(self, cells: Iterable[str]) -> dict[str, Lines]:
        """Per cell of ``cells`` with a timeline: its (detail, line) pairs, in the order of ``cells``."""
        wanted = [c for c in cells if c in self._chars]
        if not wanted:
            return {}
        keep = set(wanted)
        ranks = [self.rank[c] for c in wanted]
        got: dict[str, Lines] = {}
        sql = f"SELECT cell_id, detail, line FROM {WALK_TABLE} WHERE rank BETWEEN ? AND ? ORDER BY rank, n"
        for cell, detail, line in self._query(sql, [min(ranks), max(ranks)]):
            if cell in keep:
                got.setdefault(str(cell), []).append((detail, line))
        return {c: got[c] for c in wanted if c in got}

    def get(self, cell: str) -> Lines:
        """One cell's (detail, line) pairs (empty: it has none)."""
        return self.lines([cell]).get(cell, [])

    def total(self) -> int:
        """Lines of every eligible cell (what a whole-batch note counts)."""
        return int(self._con.execute(f"SELECT count(*) FROM {WALK_TABLE}").fetchall()[0][0])


STORE_MEMORY = "96MiB"
"""DuckDB's memory while Sol reads a request's rows: each request reads a range of its tables, and under
lunasol's shared limit the blocks read stayed cached up to it (RSS +500 MiB over Sol's map calls at
100,000 cells)."""
WRITE_MEMORY = "128MiB"
"""DuckDB's memory while Sol writes the batch's tables (walk, occurrences, cited lines), on one thread: their
whole sorts spill to disk under it. Under lunasol's shared limit the walk alone held +528 MiB at 100,000 cells."""


def _reader(ir_path: Path) -> Any:
    # An instance of its own (the process's other connections to the file join it, and may set its limit
    # again: :func:`capped` sets it before each request's read).
    return duck.connect(ir_path, read_only=True, own=True)


def capped(con: Any) -> Any:
    """``con`` with DuckDB's memory limit at :data:`STORE_MEMORY`: blocks cached by earlier reads are let go.

    A limit the user set (``$LUNASOL_DUCKDB_MEMORY``) holds here too, as for every other connection.
    """
    con.execute(f"SET memory_limit = '{duck.memory_limit(STORE_MEMORY)}'")
    return con


def open_store(
    ir_path: Path, rank: dict[str, int] | None = None, also: Callable[[Any, bool], None] | None = None
) -> TimelineStore:
    """The timelines of the IR at ``ir_path``: its table brought up to date, then opened read-only.

    ``rank``: the eligible cells' places in the partitions' walk (default: cell id order).
    An IR that cannot be written (a read-only file, or held read-only by this process) gets its
    lines in a temporary table of the store's own connection instead. ``also(con, temp)`` writes
    other tables the same way (on the connection that may write; ``temp``: temporary ones).
    """
    if rank is None:
        ro = duck.connect(ir_path, read_only=True)
        try:
            listed = ro.execute("SELECT cell_id FROM cells WHERE eligibility = 'valid_behavior' ORDER BY 1").fetchall()
        finally:
            ro.close()
        rank = {str(r[0]): i for i, r in enumerate(listed)}

    def write(c: Any, temp: bool) -> list[str]:
        with duck.limited(c, WRITE_MEMORY, threads=1):
            read = update_timelines(c, temp=temp)
            write_walk(c, rank, temp=temp)
            if also is not None:
                also(c, temp)
        return read

    try:
        con = duck.connect(ir_path)
    except (duckdb.Error, OSError):
        con = None
    if con is not None:
        try:
            read = write(con, False)
        finally:
            con.close()
        return TimelineStore(_reader(ir_path), read, rank)
    ro = duck.connect(ir_path, read_only=True)
    try:
        read = write(ro, True)
    except BaseException:
        ro.close()
        raise
    return TimelineStore(ro, read, rank)
