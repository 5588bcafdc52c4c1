"""Incidents per cell: only cells whose IR changed are looked at again; the others keep their cached links.

An event's incident is its own id unless it repeats an earlier controller line of its cell (same
ts, kind, detail, text, target): then it is that line's id (``sql/01_incidents.sql``, the rule).
Only those repeats are stored: table ``incident_links`` (cell_id, event_id, incident_id), a few
hundred rows at 1,000 cells, and ``event_incidents`` is a view giving every event its incident
from ``events`` and these links (the same rows the full table had, without writing 267,000 rows
a run). A cell's links depend on that cell's events only, so they are cached per cell in
``incident_cache`` (cell_id, content_digest, made_with, links), made from its IR content
(``cell_digests.content_digest``) with this rule (``made_with``: lunasol's version and the rule's
SQL); export carries the rows of unchanged cells (:mod:`pipeline.ir.cache`), as for the probes.
"""

from __future__ import annotations

import duckdb

import pipeline
from pipeline.coordinator.ranged import run_by_ranges
from pipeline.core import duck
from pipeline.core.canonical import digest
from pipeline.ir.cache import cached_rows

CACHE_TABLE = "incident_cache"
CACHE_DDL = f"""
CREATE OR REPLACE TABLE {CACHE_TABLE} (
    cell_id VARCHAR PRIMARY KEY,
    content_digest VARCHAR NOT NULL,   -- the cell's IR content these links were found in
    made_with VARCHAR NOT NULL,        -- lunasol version and the incident rule's SQL
    links STRUCT(event_id VARCHAR, incident_id VARCHAR)[] NOT NULL  -- its repeated lines, by event id
);
"""
_CACHE_SHAPE = [
    ("cell_id", "VARCHAR"),
    ("content_digest", "VARCHAR"),
    ("made_with", "VARCHAR"),
    ("links", "STRUCT(event_id VARCHAR, incident_id VARCHAR)[]"),
]
RULE_EVENTS = 2_000_000
"""Events the incident rule is run on at a time (about 10,000 cells of the scale benchmark)."""
# Every event with its incident: the table the rule once wrote whole, as a view over the events.
VIEW_SQL = """
CREATE OR REPLACE VIEW event_incidents AS
SELECT e.cell_id, e.event_id, e.seq, coalesce(l.incident_id, e.event_id) AS incident_id
FROM events e LEFT JOIN incident_links l ON l.event_id = e.event_id
"""


def made_with(rule_sql: str) -> str:
    """What a cell's links depend on besides its IR: lunasol's version and the rule."""
    return digest({"lunasol": pipeline.__version__, "sql": rule_sql})


def _kind(con: duckdb.DuckDBPyConnection, name: str) -> str | None:
    rows = con.execute(
        "SELECT table_type FROM information_schema.tables WHERE table_catalog = current_database() "
        "AND table_schema = 'main' AND table_name = ?",
        [name],
    ).fetchall()
    return str(rows[0][0]) if rows else None


def update_incidents(con: duckdb.DuckDBPyConnection, rule_sql: str) -> tuple[int, int]:
    """``incident_links`` and the ``event_incidents`` view for the whole IR, the rule run only on uncached cells.

    Returns the number of cells looked at and of all cells with events.
    """
    import pyarrow as pa  # here, not at module top: `lunasol --help` never loads Arrow

    stamp = made_with(rule_sql)
    digests = duck.has_table(con, "cell_digests")  # an IR built without export has none: nothing cached
    if digests and duck.table_shape(con, CACHE_TABLE) != _CACHE_SHAPE:
        con.execute(CACHE_DDL)  # absent, or written by another version: every cell is looked at
    kept = [str(r[0]) for r in cached_rows(con, CACHE_TABLE, "t.cell_id", stamp)] if digests else []
    counts = con.execute("SELECT cell_id, count(*) FROM events GROUP BY cell_id ORDER BY cell_id").fetchall()
    known = set(kept)
    todo = [(str(c), int(n)) for c, n in counts if c not in known]
    con.register("incident_kept", pa.table({"cell_id": pa.array(kept, pa.string())}))
    try:
        # the rule's hash tables hold every event of the cells it is run on: ranges keep them bounded
        run_by_ranges(con, rule_sql, "incident_cells", "incident_links_fresh", todo, RULE_EVENTS)
        con.register("incident_cells", pa.table({"cell_id": pa.array([c for c, _ in todo], pa.string())}))
        if digests:
            # valid rows stay as they are; the cells just looked at (with a stored digest) get theirs
            con.execute(f"DELETE FROM {CACHE_TABLE} WHERE cell_id NOT IN (SELECT cell_id FROM incident_kept)")
            con.execute(
                f"INSERT INTO {CACHE_TABLE} "
                "SELECT d.cell_id, d.content_digest, ?, "
                "coalesce(list({'event_id': f.event_id, 'incident_id': f.incident_id} ORDER BY f.event_id) "
                "FILTER (WHERE f.event_id IS NOT NULL), []) "
                "FROM cell_digests d LEFT JOIN incident_links_fresh f ON f.cell_id = d.cell_id "
                "WHERE d.cell_id IN (SELECT cell_id FROM incident_cells) "
                "GROUP BY d.cell_id, d.content_digest",
                [stamp],
            )
        kept_links = (
            f"SELECT cell_id, l.event_id, l.incident_id FROM (SELECT cell_id, unnest(links) AS l FROM {CACHE_TABLE} "
            "SEMI JOIN incident_kept USING (cell_id)) UNION ALL "
            if kept
            else ""
        )
        con.execute(f"CREATE OR REPLACE TABLE incident_links AS {kept_links}SELECT * FROM incident_links_fresh")
        con.execute("DROP TABLE incident_links_fresh")
    finally:
        con.unregister("incident_cells")
        con.unregister("incident_kept")
    if _kind(con, "event_incidents") == "BASE TABLE":  # the table an older lunasol wrote
        con.execute("DROP TABLE event_incidents")
    con.execute(VIEW_SQL)
    return len(todo), len(counts)
