"""Probes per cell: only cells whose IR changed are probed again; the others keep their cached hits.

Table ``probe_cache`` (cell_id, content_digest, made_with, hits) holds each cell's hits as
canonical JSON, made from that cell's IR content (``cell_digests.content_digest``) with this
probe set (``made_with``: lunasol's version and the SQL of every probe). Export carries the rows
of unchanged cells (:mod:`pipeline.ir.cache`). Hit ids are numbered within a cell, so a cell's
hits do not depend on any other cell: probing a subset gives exactly those cells' hits of a full run.
"""

from __future__ import annotations

import json

import duckdb
from pydantic import TypeAdapter

import pipeline
from pipeline.core import duck
from pipeline.core.canonical import canonical_json, digest
from pipeline.ir.cache import cached_rows
from pipeline.ir.digests import content_digests
from pipeline.probes.engine import PROBES, ProbeHit, run_probes, write_probe_hits
from pipeline.probes.files import Probe, base_sql

CACHE_TABLE = "probe_cache"
_HITS = TypeAdapter(list[ProbeHit])  # a cell's cached hits validated in one call, not one per hit
PROBE_EVENTS = 100_000  # events probed at once (see _chunks): ~250 MiB of DuckDB at the demo's shape
CACHE_DDL = f"""
CREATE OR REPLACE TABLE {CACHE_TABLE} (
    cell_id VARCHAR PRIMARY KEY,
    content_digest VARCHAR NOT NULL,   -- the cell's IR content these hits were found in
    made_with VARCHAR NOT NULL,        -- lunasol version and probe SQL
    hits VARCHAR NOT NULL              -- canonical JSON list of the cell's hits, in hit order
);
"""


def made_with(probes: tuple[Probe, ...] = PROBES) -> str:
    """What the hits depend on besides the cell's IR: lunasol's version and every probe's SQL (users' too)."""
    sql = {"_base": base_sql(), **{p.probe_id: p.sql for p in probes}}
    return digest({"lunasol": pipeline.__version__, "sql": sql})


def _probe_cells(con: duckdb.DuckDBPyConnection, cell_ids: list[str], probes: tuple[Probe, ...]) -> list[ProbeHit]:
    """Run every probe over ``cell_ids`` only (a temp ``events`` table shadows the IR's for the probes)."""
    catalog = con.execute("SELECT current_database()").fetchall()[0]  # fetchall: register() follows
    con.register("_lunasol_probe_cells", _cell_table(cell_ids))
    try:
        con.execute(
            f'CREATE OR REPLACE TEMP TABLE events AS SELECT e.* FROM "{catalog[0]}".main.events e '
            "SEMI JOIN _lunasol_probe_cells p ON e.cell_id = p.cell_id"
        )
        return run_probes(con, probes)
    finally:
        con.execute("DROP TABLE IF EXISTS temp.main.events")
        con.unregister("_lunasol_probe_cells")


def _chunks(con: duckdb.DuckDBPyConnection, cell_ids: list[str]) -> list[list[str]]:
    """``cell_ids`` in order, cut into runs of at most ``PROBE_EVENTS`` events (a cell is never cut).

    The probes' self-joins and windows hold the events they run over: probed a chunk at a time,
    their memory is a chunk's, not the batch's (3,000 demo cells at once took DuckDB's whole limit).
    """
    counts = dict(con.execute("SELECT cell_id, count(*) FROM events GROUP BY cell_id").fetchall())
    out: list[list[str]] = [[]]
    size = 0
    for cell in cell_ids:
        n = counts.get(cell, 0)
        if out[-1] and size + n > PROBE_EVENTS:
            out.append([])
            size = 0
        out[-1].append(cell)
        size += n
    return [c for c in out if c]


def _cell_table(cell_ids: list[str]) -> object:
    import pyarrow as pa

    return pa.table({"cell_id": pa.array(cell_ids, pa.string())})


def _rows_table(rows: list[list[str]]) -> object:
    import pyarrow as pa

    cols = list(zip(*rows, strict=True)) if rows else [(), (), (), ()]
    names = ("cell_id", "content_digest", "made_with", "hits")
    return pa.table({n: pa.array(list(c), pa.string()) for n, c in zip(names, cols, strict=True)})


_CACHE_SHAPE = [("cell_id", "VARCHAR"), ("content_digest", "VARCHAR"), ("made_with", "VARCHAR"), ("hits", "VARCHAR")]


def _keep_only(con: duckdb.DuckDBPyConnection, keep: list[str]) -> None:
    """Table ``probe_cache`` holding only the rows of ``keep`` (made anew when absent or of another shape)."""
    if duck.table_shape(con, CACHE_TABLE) != _CACHE_SHAPE:
        con.execute(CACHE_DDL)
        return
    con.register("_lunasol_probe_keep", _cell_table(keep))
    try:
        con.execute(f"DELETE FROM {CACHE_TABLE} WHERE cell_id NOT IN (SELECT cell_id FROM _lunasol_probe_keep)")
    finally:
        con.unregister("_lunasol_probe_keep")


def update_probe_hits(
    con: duckdb.DuckDBPyConnection, probes: tuple[Probe, ...] = PROBES
) -> tuple[list[ProbeHit], int, int]:
    """Table ``probe_hits`` for the whole IR, probing only the cells without valid cached hits.

    Returns every hit (cell order, then hit order), and how many eligible cells were probed, of how
    many: the counts export and Luna report (an excluded cell has no events; it is probed all the same).
    """
    stamp = made_with(probes)
    listed = con.execute("SELECT cell_id, eligibility = 'valid_behavior' FROM cells ORDER BY cell_id").fetchall()
    cells = [r[0] for r in listed]
    eligible = {r[0] for r in listed if r[1]}
    # An IR built without export (tests, tools) may hold no digests: those cells are probed, never cached.
    digests = content_digests(con) or {}
    # a cached cell's row is kept as it is: it is the canonical JSON of these hits (same lunasol, same probes)
    cached: dict[str, str] = dict(cached_rows(con, CACHE_TABLE, "t.cell_id, t.hits", stamp))
    by_cell: dict[str, list[ProbeHit]] = {cell: _HITS.validate_python(json.loads(raw)) for cell, raw in cached.items()}
    todo = [c for c in cells if c not in by_cell]
    if todo:
        fresh: dict[str, list[ProbeHit]] = {c: [] for c in todo}
        for chunk in _chunks(con, todo):
            found = run_probes(con, probes) if len(chunk) == len(cells) else _probe_cells(con, chunk, probes)
            for h in found:
                fresh.setdefault(h.cell_id, []).append(h)
        by_cell.update(fresh)
    hits = [h for cell in sorted(by_cell) for h in by_cell[cell]]
    write_probe_hits(con, hits)
    _keep_only(con, sorted(cached))  # the valid rows stay as they are: unchanged cells are not written again
    rows = [
        [cell, digests[cell], stamp, canonical_json([h.model_dump(mode="json") for h in by_cell[cell]])]
        for cell in sorted(digests)
        if cell in by_cell and cell not in cached
    ]
    if rows:
        con.register("_lunasol_probe_cache", _rows_table(rows))
        try:
            con.execute(f"INSERT INTO {CACHE_TABLE} SELECT * FROM _lunasol_probe_cache")
        finally:
            con.unregister("_lunasol_probe_cache")
    return hits, sum(1 for c in todo if c in eligible), len(eligible)
