"""The run's DuckDB file: written whole into a temp file and renamed, opened read-only for queries."""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.artifacts import rundir
from pipeline.artifacts.run_info import run_command
from pipeline.core import duck
from pipeline.core.errors import BadInput
from pipeline.ir.schema import DDL, IR_SCHEMA_VERSION

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

IR_FILE = rundir.IR_FILE
# Table order for loading and for Parquet; every table of schema.DDL.
TABLES = ("meta", "cells", "segments", "events", "outcomes", "coverage", "cell_digests")
# A bulk load goes in as one INSERT statement (one transaction) per this many rows, each followed
# by a checkpoint: DuckDB then holds one statement's rows and index entries, not the batch's (see
# IRWriter.insert_stream). A checkpoint costs ~0.03 CPU s whatever the file's size (measured up to
# 22M rows); checkpointing every 1M rows instead made a 330 MiB spike at 10,000 cells.
STATEMENT_ROWS = 262_144
# DuckDB's memory limit for the export's writer, unless LUNASOL_DUCKDB_MEMORY sets one: a bulk-load
# statement's rows and index entries fit in it, and so does a range of the cell digests' fill; DuckDB
# otherwise fills the general 512 MiB with cached blocks of the file it writes and reads back (the
# export process's peak at 100,000 cells: 1,179 MiB in the fill, over 712 MiB of its own).
EXPORT_MEMORY = "256MiB"


def _tmp_paths(path: Path) -> list[Path]:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    return [tmp, tmp.with_name(tmp.name + ".wal")]


def _stale_tmp_paths(path: Path) -> list[Path]:
    """Temp IR files left by an export process that no longer runs (killed mid-export)."""
    stale = []
    for p in path.parent.glob(f".{path.name}.*.tmp*"):
        pid = p.name[len(path.name) + 2 :].split(".", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            stale.append(p)
    return stale


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


class IRWriter:
    """Bulk-loads Arrow data into a temp DuckDB file; ``commit`` renames it into place.

    ``abort`` (or any error before commit) removes the temp file, so a failed export never
    leaves an ``ir.duckdb`` behind. Nothing is inserted row by row.
    """

    def __init__(self, path: Path, start_from: Path | None = None) -> None:
        self.path = path
        self._tmp, self._wal = _tmp_paths(path)
        self._open(start_from)

    def _open(self, start_from: Path | None = None) -> None:
        for p in (self._tmp, self._wal, *_stale_tmp_paths(self.path)):
            if p.is_dir():  # DuckDB's spill directory (<file>.tmp) of a killed export
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        if start_from is not None:
            # A rerun edits a copy of the previous IR (its file is never touched; commit renames the copy).
            shutil.copyfile(start_from, self._tmp)
        self._con = duck.connect(self._tmp, own=True)  # it changes instance settings (checkpointing)
        self._con.execute(f"SET memory_limit = '{duck.memory_limit(EXPORT_MEMORY)}'")
        # One checkpoint at the end instead of one per WAL threshold: the load is one transaction anyway.
        self._con.execute("SET checkpoint_threshold = '64GB'")
        # DuckDB draws a progress bar on stdout for statements over 2 s: never inside lunasol's output.
        self._con.execute("SET enable_progress_bar = false")
        self._con.execute(DDL)

    @staticmethod
    def can_start_from(path: Path) -> bool:
        """Whether a copy of the DuckDB file at ``path`` holds all its data (no write-ahead log beside it)."""
        return path.is_file() and not path.with_name(path.name + ".wal").exists()

    def reset(self) -> None:
        """Throw away everything loaded so far and start again from empty tables."""
        self.abort()
        self._open()

    def insert_table(self, name: str, table: pa.Table) -> None:
        """Insert a whole Arrow table into IR table ``name`` (columns matched by name)."""
        if table.num_rows:
            self._con.register("_lunasol_src", table)
            try:
                self._con.execute(f"INSERT INTO {name} BY NAME SELECT * FROM _lunasol_src")
            finally:
                self._con.unregister("_lunasol_src")

    def execute(self, sql: str, params: dict[str, Any] | None = None) -> None:
        """Run SQL on the file being written (e.g. a derived table filled from the loaded ones)."""
        self._con.execute(sql, params)

    def fetch(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        """Rows of a query on the file being written."""
        return self._con.execute(sql, params or []).fetchall()

    def register(self, name: str, table: pa.Table) -> None:
        """Make an Arrow table visible to SQL as ``name`` until :meth:`unregister`."""
        self._con.register(name, table)

    def unregister(self, name: str) -> None:
        """Drop a view made by :meth:`register`."""
        self._con.unregister(name)

    def insert_stream(
        self,
        sql: str,
        source: str,
        schema: pa.Schema,
        batches: Iterator[pa.RecordBatch],
        between: Callable[[], None] | None = None,
    ) -> None:
        """Run ``INSERT ... SELECT ... FROM <source>`` over the batches produced by ``batches``.

        The iterator runs in a producer thread while DuckDB (which releases the GIL) inserts the
        previous batch, so Python parsing and DuckDB writing overlap. The rows go in as one
        statement per :data:`STATEMENT_ROWS` (each its own transaction, in order), each followed by
        a checkpoint. One statement over the whole batch kept its rows and its primary-key index in
        memory until it committed (the index alone outgrew the 512 MiB limit at 30,000 cells and the
        commit failed); a checkpointed index is on disk and evictable, so DuckDB's memory stays the
        same at any size. A failure still leaves nothing: the file is
        the temp file until :meth:`commit`. ``between`` runs after each statement (e.g. to insert
        the rows of another table made meanwhile). A producer error is re-raised as is.
        """
        import pyarrow as pa

        q: queue.Queue[pa.RecordBatch | BaseException | None] = queue.Queue(maxsize=4)
        failure: list[BaseException] = []
        stop = threading.Event()

        def put(item: pa.RecordBatch | BaseException | None) -> bool:
            # Never block forever: the consumer may have died (DuckDB error) and set `stop`.
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def produce() -> None:
            try:
                for batch in batches:
                    if not put(batch):
                        return
                put(None)
            except BaseException as exc:
                failure.append(exc)
                put(exc)

        interrupted: list[bool] = []
        ended: list[bool] = []

        def consume() -> Iterator[pa.RecordBatch]:
            rows = 0
            try:
                while rows < STATEMENT_ROWS:
                    item = q.get()
                    if item is None:
                        ended.append(True)
                        return
                    if isinstance(item, BaseException):
                        raise RuntimeError("producer failed")  # the real error is in `failure`
                    rows += item.num_rows
                    yield item
            except KeyboardInterrupt:
                # Ctrl-C lands here (DuckDB calls this generator on the main thread) and DuckDB would
                # report it as an invalid-input error: remember it and re-raise it as what it is.
                interrupted.append(True)
                raise

        thread = threading.Thread(target=produce, name="lunasol-ir-producer", daemon=True)
        thread.start()
        try:
            while not ended:
                self._con.register(source, pa.RecordBatchReader.from_batches(schema, consume()))
                try:
                    self._con.execute(sql)
                finally:
                    with contextlib.suppress(Exception):
                        self._con.unregister(source)
                if between is not None:
                    between()
                self._con.execute("CHECKPOINT")
        except BaseException:
            if failure:
                raise failure[0] from None
            if interrupted:
                raise KeyboardInterrupt from None
            raise
        finally:
            stop.set()
            thread.join()
        if failure:
            raise failure[0]

    def commit(self) -> None:
        """Checkpoint and rename the file into place."""
        try:
            self._con.execute("CHECKPOINT")
            self._con.close()
            os.replace(self._tmp, self.path)
        finally:
            self.abort()

    def abort(self) -> None:
        """Close and remove the temp file (a no-op after a successful commit)."""
        with contextlib.suppress(Exception):
            self._con.close()
        for p in (self._tmp, self._wal):
            p.unlink(missing_ok=True)


def insert_rows(con: Any, table: str, columns: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
    """Insert row tuples into ``table`` in one statement through Arrow (types cast to the table's by name)."""
    import pyarrow as pa

    if not rows:
        return
    cols = list(zip(*rows, strict=True))
    data = pa.table({name: pa.array(list(col)) for name, col in zip(columns, cols, strict=True)})
    con.register("_lunasol_rows", data)
    try:
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _lunasol_rows")
    finally:
        con.unregister("_lunasol_rows")


def write_parquet(ir_path: Path, out_dir: Path) -> list[Path]:
    """Write every IR table as ``<out_dir>/<table>.parquet`` (DuckDB COPY), each file atomically."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    con = duck.connect(ir_path, read_only=True)
    try:
        for name in TABLES:
            dest = out_dir / f"{name}.parquet"
            tmp = out_dir / f".{name}.parquet.{os.getpid()}.tmp"
            try:
                order = " ORDER BY ALL" if name != "events" else " ORDER BY cell_id, seq"
                con.execute(
                    f"COPY (SELECT * FROM {name}{order}) TO {duck.literal(str(tmp))} (FORMAT parquet, COMPRESSION zstd)"
                )
                os.replace(tmp, dest)
            finally:
                tmp.unlink(missing_ok=True)
            written.append(dest)
    finally:
        con.close()
    return written


def open_ir(run_dir: Path) -> duckdb.DuckDBPyConnection:
    """Open a run's IR read-only, refusing a missing file or a newer IR schema."""
    import duckdb

    path = run_dir / IR_FILE
    if not path.is_file():
        raise BadInput(f"no IR in {run_dir} (run: lunasol export BUNDLE)")
    try:
        con = duck.connect(path, read_only=True)
    except duckdb.Error as exc:
        raise BadInput(f"cannot open {path}: {' '.join(str(exc).split())}") from None

    try:
        check_ir_version(meta_value(con, "ir_schema_version"), path, rerun=lambda: run_command(run_dir))
    except BadInput:
        con.close()
        raise
    return con


def meta_value(con: Any, key: str) -> str | None:
    """One value of the ``meta`` table (None when absent)."""
    row = con.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
    return None if row is None else str(row[0])


def check_ir_version(found: str | None, path: Path, rerun: Callable[[], str] | None = None) -> None:
    """Refuse an IR whose ``meta.ir_schema_version`` is not this lunasol's.

    Newer: upgrade lunasol. Older or absent: the IR is derived from the frozen bundle, so it is
    re-exported rather than migrated (``rerun()`` gives the command; per-cell model answers are reused).
    """
    try:
        version = 0 if found is None else int(found)
    except ValueError:
        raise BadInput(f"{path} has IR schema {found!r}; expected a whole number") from None
    if version > IR_SCHEMA_VERSION:
        raise BadInput(
            f"{path} has IR schema {version}, newer than this lunasol reads ({IR_SCHEMA_VERSION}): upgrade lunasol"
        )
    if version < IR_SCHEMA_VERSION:
        how = rerun() if rerun else "lunasol export BUNDLE --run-id ID"
        raise BadInput(
            f"{path} has IR schema {version}, older than this lunasol's ({IR_SCHEMA_VERSION}); "
            f"the IR is rebuilt from the bundle, not migrated: re-export with {how}"
        )
