"""Per-cell work kept across re-exports: previous rows of unchanged cells, and later stages' per-cell caches.

A rerun after a bundle change re-exports only the cells whose raw inputs changed
(``cell_digests.source_digest``); every other cell's ``events``, ``segments`` and digests are
copied from the previous ``ir.duckdb``. A table of a later stage whose columns include
``cell_id`` and ``content_digest`` is a per-cell cache (e.g. ``probe_cache``, ``luna_cache``):
export carries its rows for every cell whose content digest is unchanged and drops the others,
so that stage redoes only the changed cells. Nothing here knows what a cache holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core import duck
from pipeline.core.canonical import digest
from pipeline.ir.redact import RULES_DIGEST
from pipeline.ir.schema import IR_SCHEMA_VERSION, TEXT_LIMIT
from pipeline.ir.store import TABLES

if TYPE_CHECKING:
    import duckdb

    from pipeline.ir.store import IRWriter

PREVIOUS = "_lunasol_prev"  # catalog name of the previous IR while a re-export reads it
_CACHE_TABLES = (
    "SELECT table_name FROM information_schema.columns WHERE table_catalog = ? AND table_schema = 'main' "
    "AND column_name IN ('cell_id', 'content_digest') GROUP BY table_name HAVING count(*) = 2 ORDER BY 1"
)


def rows_made_with(redact: bool = True) -> str:
    """What a cell's rows depend on besides its raw bytes: the redaction rules (or none) and the trim limit.

    Stored in ``meta``; a previous IR made under other rules (or before redaction) is read again,
    never copied, so a secret an older lunasol let through cannot survive a re-export. ``redact``
    False (``--no-redact``) is a rule set of its own: redacted and unredacted rows never mix.
    """
    return digest({"redaction": RULES_DIGEST if redact else "off", "text_limit": TEXT_LIMIT})


def previous_sources(path: Path, fmt: str, redact: bool = True) -> dict[str, str]:
    """Source digests of the cells of a previous IR at ``path`` that a re-export may copy.

    Empty when there is none, it cannot be read, it is of another IR schema or format, its rows
    were made under other redaction rules (``redact``: this export's), or it predates stored
    digests: then every cell is read again (never an error).
    """
    import duckdb

    if not path.is_file():
        return {}
    try:
        con = duck.connect(path, read_only=True)
    except duckdb.Error:
        return {}
    try:
        meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
        if meta.get("ir_schema_version") != str(IR_SCHEMA_VERSION) or meta.get("format") != fmt:
            return {}
        if meta.get("rows_made_with") != rows_made_with(redact):
            return {}
        rows = con.execute("SELECT cell_id, source_digest FROM cell_digests WHERE source_digest IS NOT NULL").fetchall()
        return {r[0]: r[1] for r in rows}
    except duckdb.Error:
        return {}
    finally:
        con.close()


def copy_cells(writer: IRWriter, path: Path, cell_ids: list[str], redactions: dict[str, int]) -> dict[str, int]:
    """Copy the previous IR's events, segments and digests of ``cell_ids``; return their event counts.

    ``redactions`` gets each copied cell's count of redacted secrets, as the previous export found it.

    The previous IR stays attached (read-only) until :func:`carry_caches` detaches it.
    """
    import pyarrow as pa

    writer.execute(f"ATTACH {duck.literal(str(path))} AS {PREVIOUS} (READ_ONLY)")
    if not cell_ids:
        return {}
    writer.register("_lunasol_reuse", pa.table({"cell_id": pa.array(cell_ids, pa.string())}))
    try:
        for table in ("events", "segments", "cell_digests"):
            writer.execute(
                f"INSERT INTO {table} BY NAME SELECT p.* FROM {PREVIOUS}.main.{table} p "
                "SEMI JOIN _lunasol_reuse r ON p.cell_id = r.cell_id"
            )
        rows = writer.fetch(
            f"SELECT p.cell_id, p.events, p.redactions FROM {PREVIOUS}.main.coverage p SEMI JOIN _lunasol_reuse r "
            "ON p.cell_id = r.cell_id"
        )
    finally:
        writer.unregister("_lunasol_reuse")
    redactions.update({str(r[0]): int(r[2]) for r in rows})
    return {str(r[0]): int(r[1]) for r in rows}


def keep_cells(writer: IRWriter, cell_ids: list[str], redactions: dict[str, int]) -> dict[str, int]:
    """In a copy of the previous IR (:class:`IRWriter` ``start_from``): keep only ``cell_ids``' rows.

    The copy keeps the events, segments and digests of ``cell_ids`` and nothing else of any other
    cell; the per-run tables (meta, cells, outcomes, coverage) are emptied for export to fill,
    and a later stage's table that is not a per-cell cache is dropped (it starts afresh, as in a
    full export). Returns the kept cells' event counts; ``redactions`` gets their redaction counts.
    Equivalent to :func:`copy_cells` into an empty IR, without writing the unchanged rows again.
    """
    import pyarrow as pa

    writer.register("_lunasol_keep", pa.table({"cell_id": pa.array(cell_ids, pa.string())}))
    try:
        rows = writer.fetch(
            "SELECT p.cell_id, p.events, p.redactions FROM coverage p "
            "SEMI JOIN _lunasol_keep r ON p.cell_id = r.cell_id"
        )
        for table in ("events", "segments", "cell_digests"):
            writer.execute(f"DELETE FROM {table} WHERE cell_id NOT IN (SELECT cell_id FROM _lunasol_keep)")
    finally:
        writer.unregister("_lunasol_keep")
    for table in ("meta", "cells", "outcomes", "coverage"):
        writer.execute(f"DELETE FROM {table}")
    caches = {str(r[0]) for r in writer.fetch(_CACHE_TABLES, [_catalog(writer)])}
    tables = writer.fetch("SELECT table_name, table_type FROM information_schema.tables WHERE table_schema = 'main'")
    for name, kind in tables:
        if name not in TABLES and name not in caches:
            writer.execute(f'DROP {"VIEW" if kind == "VIEW" else "TABLE"} IF EXISTS "{name}"')
    redactions.update({str(r[0]): int(r[2]) for r in rows})
    return {str(r[0]): int(r[1]) for r in rows}


def prune_caches(writer: IRWriter) -> list[str]:
    """In a copy of the previous IR: drop every per-cell cache row whose cell's content digest changed."""
    names = [str(r[0]) for r in writer.fetch(_CACHE_TABLES, [_catalog(writer)]) if r[0] not in TABLES]
    for name in names:
        writer.execute(
            f'DELETE FROM "{name}" t WHERE NOT EXISTS (SELECT 1 FROM cell_digests d '
            "WHERE d.cell_id = t.cell_id AND d.content_digest = t.content_digest)"
        )
    return names


def _catalog(writer: IRWriter) -> str:
    return str(writer.fetch("SELECT current_database()")[0][0])


def carry_caches(writer: IRWriter) -> list[str]:
    """Copy every per-cell cache row whose cell's content digest is unchanged; detach the previous IR."""
    try:
        names = [str(r[0]) for r in writer.fetch(_CACHE_TABLES, [PREVIOUS]) if r[0] not in TABLES]
        for name in names:
            writer.execute(
                f'CREATE TABLE "{name}" AS SELECT p.* FROM {PREVIOUS}.main."{name}" p '
                "SEMI JOIN cell_digests d ON p.cell_id = d.cell_id AND p.content_digest = d.content_digest"
            )
        return names
    finally:
        writer.execute(f"DETACH {PREVIOUS}")


def cached_rows(con: duckdb.DuckDBPyConnection, table: str, columns: str, made_with: str) -> list[tuple[Any, ...]]:
    """Rows of cache ``table`` still valid: made from the cell's current content and with ``made_with``."""
    if not (duck.has_table(con, table) and duck.has_table(con, "cell_digests")):
        return []
    return con.execute(
        f'SELECT {columns} FROM "{table}" t SEMI JOIN cell_digests d '
        "ON t.cell_id = d.cell_id AND t.content_digest = d.content_digest WHERE t.made_with = ? ORDER BY t.cell_id",
        [made_with],
    ).fetchall()
