"""DuckDB connections with bounded memory: every run's DuckDB file is opened here.

DuckDB's default memory limit is 80% of the machine's RAM, and it keeps the blocks it has read
cached up to that limit: on a 1,000-cell IR the probe queries alone left ~500 MiB resident, and
a 10,000-cell IR would have kept most of itself in memory. A limit makes DuckDB evict cached
blocks and spill large operators (sorts, joins, aggregates) to ``<db>.tmp`` instead. The limit
is ``LUNASOL_DUCKDB_MEMORY`` (DuckDB's syntax: ``1GiB``, ``512MB``, ``25%``), default 512 MiB:
the export's one big INSERT keeps its rows in memory until the statement ends (~0.6 KiB a row,
1.5 GiB at 10,000 demo cells), so past the limit they spill to disk instead. The export's writer (its
bulk load and the cell digests' fill) takes 256 MiB when the variable is unset
(``pipeline.ir.store.EXPORT_MEMORY``).

It is set with ``SET`` after connecting rather than passed as a connect option: connect options
must match every open connection to the same file in the process, a SET does not.

**One DuckDB instance per process.** Each ``duckdb.connect`` of a file creates a database instance,
~25 CPU ms (its catalog of built-in functions), and a run opens its IR a dozen times, a twentieth
of a one-cell rerun. So :func:`connect` attaches the file to one in-memory instance (the hub) and
hands out a cursor on it: ~5 ms. The file is attached while any of its connections is open and
detached (checkpointed, its lock released) when the last one closes, exactly the span a file
connection held it; the same file open read-only and read-write at once is refused, as DuckDB
refuses it; spills go to ``<file>.tmp`` as before. Connections with their own ``config`` (the
sandboxed query connection) and ``own=True`` (the export's writer, which changes instance
settings) get an instance of their own.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pipeline.core import memory
from pipeline.core.errors import BadInput

if TYPE_CHECKING:
    import duckdb

MEMORY_ENV = "LUNASOL_DUCKDB_MEMORY"
DEFAULT_MEMORY = "512MiB"
CHECKPOINT_MEMORY = "128MiB"  # the checkpoint a writable file's DETACH makes (see _Hub._release)
_MEMORY = re.compile(r"\d+(\.\d+)?\s*(%|[KMGT]i?B|B)", re.I)


def user_limit() -> str | None:
    """The limit the user set in ``$LUNASOL_DUCKDB_MEMORY`` (it holds for every connection), or None."""
    raw = os.environ.get(MEMORY_ENV, "").strip()
    if not raw:
        return None
    if not _MEMORY.fullmatch(raw):
        raise BadInput(f"{MEMORY_ENV}={raw!r}: expected an amount such as 1GiB, 512MB or 25%")
    return raw


def memory_limit(own: str = DEFAULT_MEMORY) -> str:
    """DuckDB's memory limit: ``$LUNASOL_DUCKDB_MEMORY`` when set (it holds for every connection), else ``own``.

    ``own``: lunasol's limit for the work at hand (512 MiB in general; smaller for a step that would
    otherwise keep cached blocks up to it, e.g. a checkpoint or Sol's per-request reads).
    """
    return user_limit() or own


PROCESS_BUDGET_MIB = 1024
"""The resident memory a run's process keeps under where DuckDB's share can give way (see :func:`budget_share`)."""
MIN_SHARE_MIB = 256
SHARE_GROWTH = 1.3
"""How much a stage's RSS grows per MiB of DuckDB's limit when its SQL fills it (the Coordinator at
100,000 cells, measured: +525 MiB under a 400 MiB limit, +640 under 512): DuckDB's own overheads past
its limit and the rows the stage holds in Python beside it."""


def budget_share(own: str = DEFAULT_MEMORY) -> str:
    """DuckDB's limit for work whose memory is DuckDB's: what the process leaves of its budget, ``own`` at most.

    A stage that starts after others finds part of the process's memory taken by what they left (the
    allocators keep freed heap: ~370-385 MiB at the Coordinator's start at 10,000 cells, ~590-610 at 100,000).
    Its DuckDB takes what keeps the process under :data:`PROCESS_BUDGET_MIB` (the room left, divided
    by :data:`SHARE_GROWTH`), between :data:`MIN_SHARE_MIB` and ``own`` (a ``MiB`` amount): DuckDB
    spills to disk past its limit, so the stage's peak stays about the budget instead of growing with
    the batch. Where the process's memory is unknown: ``own``.
    """
    cap = int(own.removesuffix("MiB"))
    held = memory.resident_bytes()
    if held is None:
        return own
    room = (PROCESS_BUDGET_MIB - (held >> 20)) / SHARE_GROWTH
    return f"{max(MIN_SHARE_MIB, min(cap, int(room)))}MiB"


@contextlib.contextmanager
def limited(con: Any, limit: str, *, threads: int | None = None) -> Iterator[Any]:
    """``con`` with DuckDB's memory limit at ``limit`` for the block, then lunasol's again.

    For work that reads a large table a small range at a time: under the general limit the blocks
    read stay cached up to it. The limit is the instance's (every connection of the hub); a limit
    the user set (``$LUNASOL_DUCKDB_MEMORY``) is kept. ``threads``: DuckDB's threads for the block
    too; a sort of a whole large table spills to disk under a small limit with one thread, where two
    each want their own buffers and run out of memory (Sol's timeline walk at 100,000 cells: 128 MiB).
    """
    if user_limit() is not None:
        yield con
        return
    before = con.execute("SELECT current_setting('threads')").fetchall()[0][0] if threads else None
    con.execute(f"SET memory_limit = '{limit}'")
    if threads:
        con.execute(f"SET threads = {threads}")
    try:
        yield con
    finally:
        with contextlib.suppress(Exception):  # the connection may be gone after an error
            con.execute(f"SET memory_limit = '{memory_limit()}'")
            if before is not None:
                con.execute(f"SET threads = {int(before)}")


CURRENT = "table_catalog IN (current_database(), 'temp')"
"""SQL: an ``information_schema`` row of the connection's own database (or its temporary objects):
the hub's other attached files are in its catalog too."""


def has_table(con: Any, name: str) -> bool:
    """Whether a table or view called ``name`` is visible on ``con`` (temporary ones count)."""
    sql = f"SELECT count(*) FROM information_schema.tables WHERE table_name = ? AND {CURRENT}"
    # fetchall, not fetchone: DuckDB refuses register() on a connection with an unfinished result
    return bool(con.execute(sql, [name]).fetchall()[0][0])


def table_shape(con: Any, name: str) -> list[tuple[str, str]]:
    """(column, type) of table ``name`` in the current database's main schema, in order; [] when absent."""
    rows = con.execute(
        "SELECT column_name, data_type FROM duckdb_columns() WHERE database_name = current_database() "
        "AND schema_name = 'main' AND table_name = ? ORDER BY column_index",
        [name],
    ).fetchall()
    return [(str(a), str(b)) for a, b in rows]


def connect(
    path: Path | str, *, read_only: bool = False, config: dict[str, Any] | None = None, own: bool = False
) -> duckdb.DuckDBPyConnection:
    """A connection to the DuckDB file ``path`` with lunasol's memory limit (see the module docstring).

    A cursor on the process's hub with the file attached, unless ``config`` is given or ``own``:
    then ``duckdb.connect`` itself (an instance of its own). Close it as any connection.
    """
    import duckdb  # here, not at module top: `lunasol --help` and the lazy CLI verbs never load DuckDB

    limit = memory_limit()  # a bad value fails before the file is opened
    if not (config or own or str(path) == ":memory:"):
        try:
            return cast("duckdb.DuckDBPyConnection", _HUB.open(Path(path), read_only, limit))
        except duckdb.Error as exc:
            if "Unique file handle conflict" not in str(exc):
                raise
            # The file is open in an instance of its own (a tool's or a test's plain connection):
            # join that instance, as duckdb.connect does.
    con = duckdb.connect(str(path), read_only=read_only, config=config or {})
    try:
        con.execute(f"SET memory_limit = '{limit}'")
        if str(path) != ":memory:":
            # spills next to the file, inside the run (an in-memory instance would use ./.tmp)
            with contextlib.suppress(duckdb.Error):  # a sandboxed connection may refuse the setting
                con.execute(f"SET temp_directory = {literal(os.path.realpath(path) + '.tmp')}")
    except BaseException:
        con.close()
        raise
    return con


def literal(text: str) -> str:
    """``text`` as a SQL string literal (single quotes, each inner one doubled)."""
    return "'" + text.replace("'", "''") + "'"


def literals(values: Iterable[str]) -> str:
    """Comma-separated SQL string literals (for ``IN (...)`` or a list ``[...]``)."""
    return ", ".join(map(literal, values))


def _identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@dataclass
class _Attached:
    alias: str
    read_only: bool
    refs: int = 0


class _Hub:
    """One in-memory DuckDB instance; each open file attached once, counted by its open connections."""

    def __init__(self) -> None:
        self._con: Any = None
        self._files: dict[str, _Attached] = {}
        self._lock = threading.Lock()  # Luna loads cells in a worker thread

    def open(self, path: Path, read_only: bool, limit: str) -> _Connection:
        import duckdb

        key = os.path.realpath(path)
        with self._lock:
            if self._con is None:
                self._con = duckdb.connect()
            db = self._files.get(key)
            if db is None:
                taken = {a.alias for a in self._files.values()}
                alias = stem = Path(key).stem or "db"
                n = 1
                while alias in taken or alias in ("memory", "temp", "system"):
                    n += 1
                    alias = f"{stem}_{n}"
                self._con.execute(f"SET memory_limit = '{limit}'")
                # Spills next to the file, as its own instance's would (never the working directory);
                # refused while another file's query is spilling: that directory stays in use meanwhile.
                with contextlib.suppress(duckdb.Error):
                    self._con.execute(f"SET temp_directory = {literal(key + '.tmp')}")
                opts = " (READ_ONLY)" if read_only else ""
                self._con.execute(f"ATTACH {literal(key)} AS {_identifier(alias)}{opts}")
                db = self._files[key] = _Attached(alias, read_only)
            elif db.read_only != read_only:
                mode = "read-only" if db.read_only else "read-write"
                raise duckdb.ConnectionException(
                    f"Can't open a connection to same database file with a different configuration than "
                    f"existing connections: {key} is open {mode}"
                )
            cur = self._con.cursor()
            try:
                cur.execute(f"USE {_identifier(db.alias)}")
            except BaseException:
                cur.close()
                self._release(key)
                raise
            db.refs += 1
            return _Connection(cur, self, key, read_only)

    def close(self, key: str) -> None:
        with self._lock:
            self._files[key].refs -= 1
            if self._files[key].refs <= 0:
                self._release(key)

    def _release(self, key: str) -> None:
        db = self._files.get(key)
        if db is not None and db.refs <= 0:
            del self._files[key]
            if not (db.read_only or self._files):
                # The DETACH checkpoints what was written since the last one: under the shared limit one
                # checkpoint of Luna's staged rows at 100,000 cells took +480 MiB for a second or two (the
                # stage's peak; ~550 MiB otherwise). No other file is attached: no other query shares it.
                self._con.execute(f"SET memory_limit = '{memory_limit(CHECKPOINT_MEMORY)}'")
            self._con.execute(f"DETACH {_identifier(db.alias)}")  # checkpoints it and drops its lock
            if not self._files:
                # The instance keeps what its queries allocated (~200 MiB after one grouped query over
                # a 10,000-cell IR), on top of every later stage's peak, until a limit asks it back;
                # the next attach sets the limit again.
                self._con.execute("SET memory_limit = '1MB'")


_HUB = _Hub()


class _Connection:
    """A hub cursor standing for a connection to one file: closing it may detach the file."""

    def __init__(self, cursor: Any, hub: _Hub, key: str, read_only: bool) -> None:
        self._cursor = cursor
        self._hub = hub
        self._key = key
        self._read_only = read_only
        self._open = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)

    def cursor(self) -> _Connection:
        """Another connection to the same file (a bare hub cursor would see the hub's own database)."""
        return self._hub.open(Path(self._key), self._read_only, memory_limit())

    def close(self) -> None:
        """Close the cursor; the last connection to the file detaches it."""
        if self._open:
            self._open = False
            try:
                self._cursor.close()
            finally:
                self._hub.close(self._key)

    def __enter__(self) -> _Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
