"""The run's DuckDB file: written whole into a temp file and renamed, opened read-only for queries."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import BadInput
from pipeline.ir.schema import DDL, IR_SCHEMA_VERSION

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

IR_FILE = "ir.duckdb"
# Table order for loading and for Parquet; every table of schema.DDL.
TABLES = ("meta", "cells", "segments", "events", "outcomes", "coverage")


def _tmp_paths(path: Path) -> list[Path]:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    return [tmp, tmp.with_name(tmp.name + ".wal")]


def write_ir(path: Path, tables: dict[str, pa.Table]) -> None:
    """Create the IR at ``path`` from Arrow tables, atomically: a failure leaves no ``ir.duckdb``.

    Tables are bulk-loaded (``INSERT ... BY NAME SELECT * FROM arrow``), never row by row.
    """
    import duckdb

    tmp, wal = _tmp_paths(path)
    for p in (tmp, wal):
        p.unlink(missing_ok=True)
    try:
        con = duckdb.connect(str(tmp))
        try:
            con.execute(DDL)
            for name in TABLES:
                table = tables.get(name)
                if table is None or table.num_rows == 0:
                    continue
                con.register("_lunasol_src", table)
                con.execute(f"INSERT INTO {name} BY NAME SELECT * FROM _lunasol_src")
                con.unregister("_lunasol_src")
            con.execute("CHECKPOINT")
        finally:
            con.close()
        os.replace(tmp, path)
    finally:
        for p in (tmp, wal):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()


def write_parquet(ir_path: Path, out_dir: Path) -> list[Path]:
    """Write every IR table as ``<out_dir>/<table>.parquet`` (DuckDB COPY), each file atomically."""
    import duckdb

    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    con = duckdb.connect(str(ir_path), read_only=True)
    try:
        for name in TABLES:
            dest = out_dir / f"{name}.parquet"
            tmp = out_dir / f".{name}.parquet.{os.getpid()}.tmp"
            try:
                order = " ORDER BY ALL" if name != "events" else " ORDER BY cell_id, seq"
                con.execute(
                    f"COPY (SELECT * FROM {name}{order}) TO '{_sql_str(tmp)}' (FORMAT parquet, COMPRESSION zstd)"
                )
                os.replace(tmp, dest)
            finally:
                tmp.unlink(missing_ok=True)
            written.append(dest)
    finally:
        con.close()
    return written


def _sql_str(path: Path) -> str:
    return str(path).replace("'", "''")


def open_ir(run_dir: Path) -> duckdb.DuckDBPyConnection:
    """Open a run's IR read-only, refusing a missing file or a newer IR schema."""
    import duckdb

    path = run_dir / IR_FILE
    if not path.is_file():
        raise BadInput(f"no IR in {run_dir} (run: lunasol export BUNDLE)")
    try:
        con = duckdb.connect(str(path), read_only=True)
    except duckdb.Error as exc:
        raise BadInput(f"cannot open {path}: {' '.join(str(exc).split())}") from None
    version = meta_value(con, "ir_schema_version")
    if version is not None and int(version) > IR_SCHEMA_VERSION:
        con.close()
        raise BadInput(f"{path} has IR schema {version}, newer than this lunasol ({IR_SCHEMA_VERSION})")
    return con


def meta_value(con: Any, key: str) -> str | None:
    """One value of the ``meta`` table (None when absent)."""
    row = con.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
    return None if row is None else str(row[0])
