"""DuckDB connections with bounded memory: every run's DuckDB file is opened here.

DuckDB's default memory limit is 80% of the machine's RAM, and it keeps the blocks it has read
cached up to that limit: on a 1,000-cell IR the probe queries alone left ~500 MiB resident, and
a 10,000-cell IR would have kept most of itself in memory. A limit makes DuckDB evict cached
blocks and spill large operators (sorts, joins, aggregates) to ``<db>.tmp`` instead. The limit
is ``LUNASOL_DUCKDB_MEMORY`` (DuckDB's syntax: ``1GiB``, ``512MB``, ``25%``), default 512 MiB:
the export's one big INSERT keeps its rows in memory until the statement ends (~0.6 KiB a row,
1.5 GiB at 10,000 demo cells), so past the limit they spill to disk instead.

It is set with ``SET`` after connecting rather than passed as a connect option: connect options
must match every open connection to the same file in the process, a SET does not.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.errors import BadInput

if TYPE_CHECKING:
    import duckdb

MEMORY_ENV = "LUNASOL_DUCKDB_MEMORY"
DEFAULT_MEMORY = "512MiB"
_MEMORY = re.compile(r"\d+(\.\d+)?\s*(%|[KMGT]i?B|B)", re.I)


def memory_limit() -> str:
    """DuckDB's memory limit for lunasol's connections (``$LUNASOL_DUCKDB_MEMORY`` or 512 MiB)."""
    raw = os.environ.get(MEMORY_ENV, "").strip()
    if not raw:
        return DEFAULT_MEMORY
    if not _MEMORY.fullmatch(raw):
        raise BadInput(f"{MEMORY_ENV}={raw!r}: expected an amount such as 1GiB, 512MB or 25%")
    return raw


def has_table(con: Any, name: str) -> bool:
    """Whether a table or view called ``name`` is visible on ``con`` (temporary ones count)."""
    row = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [name]).fetchone()
    return bool(row and row[0])


def table_shape(con: Any, name: str) -> list[tuple[str, str]]:
    """(column, type) of table ``name`` in the current database's main schema, in order; [] when absent."""
    rows = con.execute(
        "SELECT column_name, data_type FROM duckdb_columns() WHERE database_name = current_database() "
        "AND schema_name = 'main' AND table_name = ? ORDER BY column_index",
        [name],
    ).fetchall()
    return [(str(a), str(b)) for a, b in rows]


def connect(
    path: Path | str, *, read_only: bool = False, config: dict[str, Any] | None = None
) -> duckdb.DuckDBPyConnection:
    """``duckdb.connect`` with lunasol's memory limit applied (see the module docstring)."""
    import duckdb  # here, not at module top: `lunasol --help` and the lazy CLI verbs never load DuckDB

    limit = memory_limit()  # a bad value fails before the file is opened
    con = duckdb.connect(str(path), read_only=read_only, config=config or {})
    try:
        con.execute(f"SET memory_limit = '{limit}'")
    except BaseException:
        con.close()
        raise
    return con
