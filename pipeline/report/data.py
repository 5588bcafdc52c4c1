"""What the report reads from a run's IR: cells with their outcome, per-cell timelines, comparison windows.

Every query is read-only and defensive: a partial run (no coverage, no outcomes) gives fewer columns,
never an error. "Failed" and "successful" are the Coordinator's rule (``lunasol_successful`` in
``pipeline/coordinator/sql/00_macros.sql``), so the report and the pattern groups agree on them.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import duckdb

from pipeline.core import duck

Row = dict[str, Any]

TEXT_CHARS = 140  # characters of an event's text kept in the page's timeline (the raw lines are whole)

_MACROS = "00_macros.sql"


class IR:
    """A read-only connection to a run's IR (or nothing, when the run has none)."""

    def __init__(self, path: Path) -> None:
        self.con: duckdb.DuckDBPyConnection | None = None
        if path.is_file():
            try:
                self.con = duck.connect(path, read_only=True)
                sql = resources.files("pipeline.coordinator").joinpath("sql", _MACROS).read_text(encoding="utf-8")
                self.con.execute(sql)
            except duckdb.Error:
                self.con = None

    def rows(self, sql: str, params: list[Any] | None = None) -> list[Row]:
        """Rows of a query; [] when the IR or a table is absent."""
        if self.con is None:
            return []
        try:
            cur = self.con.execute(sql, params or [])
            cols = [d[0] for d in cur.description]
            return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
        except duckdb.Error:  # a table a partial run never wrote
            return []

    def close(self) -> None:
        """Release the connection."""
        if self.con is not None:
            self.con.close()


def cells(ir: IR) -> list[Row]:
    """One row per cell: ids, eligibility, coverage, outcome label and class, probe hits."""
    rows = ir.rows(
        "SELECT c.cell_id, c.task_id, c.run_id, c.eligibility, c.exclusion_reason, "
        "cov.status, cov.reason, cov.events, o.label, "
        "CASE WHEN c.eligibility <> 'valid_behavior' THEN 'excluded' WHEN o.label IS NULL THEN 'unknown' "
        "WHEN lunasol_successful(o.label) THEN 'successful' ELSE 'failed' END AS outcome "
        "FROM cells c LEFT JOIN coverage cov USING (cell_id) LEFT JOIN outcomes o USING (cell_id) "
        "ORDER BY c.cell_id"
    )
    if not rows:
        rows = ir.rows(
            "SELECT cell_id, task_id, run_id, eligibility, exclusion_reason, "
            "CASE WHEN eligibility <> 'valid_behavior' THEN 'excluded' ELSE 'unknown' END AS outcome "
            "FROM cells ORDER BY 1"
        )
    hits = {r["cell_id"]: r["n"] for r in ir.rows("SELECT cell_id, count(*) AS n FROM probe_hits GROUP BY 1")}
    for r in rows:
        r["probe_hits"] = hits.get(r["cell_id"], 0) if hits else None
    return rows


def timelines(ir: IR) -> dict[str, list[list[Any]]]:
    """Per cell, its events in order as compact rows for the page.

    Row: ``[event_id, segment_id, kind, detail, actor, stage, tool, text, path, line_start, line_end, pointer]``
    (text cut to ``TEXT_CHARS``; the page shows the raw lines of cited events in full).
    """
    out: dict[str, list[list[Any]]] = {}
    if ir.con is None:
        return out
    try:
        cur = ir.con.execute(
            "SELECT cell_id, event_id, segment_id, kind, detail, actor, stage, tool_name, "
            f"left(coalesce(text, ''), {TEXT_CHARS}), source_path, line_start, line_end, json_pointer "
            "FROM events ORDER BY cell_id, seq"
        )
        while batch := cur.fetchmany(50_000):
            for r in batch:
                out.setdefault(r[0], []).append(list(r[1:]))
    except duckdb.Error:
        return {}
    return out


def window(ir: IR, cell: str, event_id: str, before: int = 4, after: int = 6) -> list[Row]:
    """The events of ``cell`` around ``event_id`` (by sequence), for a side-by-side comparison."""
    return ir.rows(
        "WITH a AS (SELECT seq FROM events WHERE event_id = ? AND cell_id = ?) "
        f"SELECT event_id, events.seq, kind, actor, stage, tool_name, left(coalesce(text, ''), {TEXT_CHARS}) AS text "
        "FROM events, a WHERE cell_id = ? AND events.seq BETWEEN a.seq - ? AND a.seq + ? ORDER BY events.seq",
        [event_id, cell, cell, before, after],
    )
