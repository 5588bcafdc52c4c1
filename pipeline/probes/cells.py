"""Probes per cell: only cells whose IR changed are probed again; the others keep their cached hits.

Table ``probe_cache`` (cell_id, content_digest, made_with, hits) holds each cell's hits as
canonical JSON, made from that cell's IR content (``cell_digests.content_digest``) with this
probe set (``made_with``: lunasol's version and the SQL of every probe). Export carries the rows
of unchanged cells (:mod:`pipeline.ir.cache`). Hit ids are numbered within a cell, so a cell's
hits do not depend on any other cell: probing a subset gives exactly those cells' hits of a full run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import duckdb
from pydantic import TypeAdapter

import pipeline
from pipeline.core import duck
from pipeline.core.canonical import canonical_json, digest
from pipeline.probes.engine import PROBE_HITS_DDL, PROBES, ProbeHit, append_probe_hits, run_probes
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


_CACHE_SHAPE = [("cell_id", "VARCHAR"), ("content_digest", "VARCHAR"), ("made_with", "VARCHAR"), ("hits", "VARCHAR")]


def _keep_valid(con: duckdb.DuckDBPyConnection, stamp: str) -> None:
    """Table ``probe_cache`` holding only its valid rows: the cell's content unchanged, made with ``stamp``.

    Made anew (empty) when absent or of another shape; emptied when the IR stores no digests.
    The rows kept are left as they are: unchanged cells are not written again.
    """
    if duck.table_shape(con, CACHE_TABLE) != _CACHE_SHAPE:
        con.execute(CACHE_DDL)
        return
    if not duck.has_table(con, "cell_digests"):
        con.execute(f"DELETE FROM {CACHE_TABLE}")
        return
    con.execute(
        f"DELETE FROM {CACHE_TABLE} t WHERE t.made_with <> ? OR NOT EXISTS (SELECT 1 FROM cell_digests d "
        "WHERE d.cell_id = t.cell_id AND d.content_digest = t.content_digest)",
        [stamp],
    )


@dataclass
class ProbeCounts:
    """What one probing of the IR found (the hits themselves are in table ``probe_hits``)."""

    hits: int = 0
    by_probe: dict[str, int] = field(default_factory=dict)
    cells_with_hits: int = 0
    probed: int = 0  # eligible cells probed (no valid cached hits)
    eligible: int = 0


def update_probe_hits(con: duckdb.DuckDBPyConnection, probes: tuple[Probe, ...] = PROBES) -> ProbeCounts:
    """Table ``probe_hits`` for the whole IR, probing only the cells without valid cached hits.

    Cells go a chunk at a time (:func:`_chunks`, in cell order): a chunk's cached hits are read, its
    other cells probed, and both written (hits in cell order, then hit order) before the next chunk,
    so nothing of the whole batch is held. Returns the counts; ``probed`` and ``eligible`` are the
    counts export and Luna report (an excluded cell has no events; it is probed all the same).
    """
    stamp = made_with(probes)
    listed = con.execute("SELECT cell_id, eligibility = 'valid_behavior' FROM cells ORDER BY cell_id").fetchall()
    cells = [str(r[0]) for r in listed]
    eligible = {str(r[0]) for r in listed if r[1]}
    del listed
    _keep_valid(con, stamp)  # what is left in probe_cache is valid (an IR without digests caches nothing)
    cacheable = duck.has_table(con, "cell_digests")
    counts = ProbeCounts(eligible=len(eligible))
    con.execute(PROBE_HITS_DDL)
    with_hits: set[str] = set()
    for chunk in _chunks(con, cells):
        con.register("_lunasol_probe_chunk", _cell_table(chunk))
        try:
            cached = dict(
                con.execute(
                    f"SELECT t.cell_id, t.hits FROM {CACHE_TABLE} t SEMI JOIN _lunasol_probe_chunk c "
                    "ON t.cell_id = c.cell_id"
                ).fetchall()
            )
        finally:
            con.unregister("_lunasol_probe_chunk")
        todo = [c for c in chunk if c not in cached]
        by_cell: dict[str, list[ProbeHit]] = {c: _HITS.validate_python(json.loads(raw)) for c, raw in cached.items()}
        if todo:
            fresh: dict[str, list[ProbeHit]] = {c: [] for c in todo}
            found = run_probes(con, probes) if len(todo) == len(cells) else _probe_cells(con, todo, probes)
            for h in found:
                fresh.setdefault(h.cell_id, []).append(h)
            by_cell.update(fresh)
            counts.probed += sum(1 for c in todo if c in eligible)
            if cacheable:
                rows = [[c, canonical_json([h.model_dump(mode="json") for h in fresh[c]])] for c in sorted(fresh)]
                _cache(con, rows, stamp)
        hits = [h for cell in sorted(by_cell) for h in by_cell[cell]]
        append_probe_hits(con, hits)
        for h in hits:
            counts.by_probe[h.probe_id] = counts.by_probe.get(h.probe_id, 0) + 1
            with_hits.add(h.cell_id)
        counts.hits += len(hits)
    counts.cells_with_hits = len(with_hits)
    return counts


def _cache(con: duckdb.DuckDBPyConnection, rows: list[list[str]], stamp: str) -> None:
    """Cache rows (cell, hits JSON) of cells just probed, with their content digest (cells without one: none)."""
    import pyarrow as pa  # kept off the import path of commands that never probe

    cols = list(zip(*rows, strict=True)) if rows else [(), ()]
    table = pa.table({n: pa.array(list(c), pa.string()) for n, c in zip(("cell_id", "hits"), cols, strict=True)})
    con.register("_lunasol_probe_cache", table)
    try:
        con.execute(
            f"INSERT INTO {CACHE_TABLE} SELECT p.cell_id, d.content_digest, ?, p.hits FROM _lunasol_probe_cache p "
            "JOIN cell_digests d ON p.cell_id = d.cell_id ORDER BY p.cell_id",
            [stamp],
        )
    finally:
        con.unregister("_lunasol_probe_cache")
