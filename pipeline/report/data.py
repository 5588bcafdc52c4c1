"""What the report reads from a run's IR: cells with their outcome, per-cell timelines, comparison windows.

Every query is read-only and defensive: a partial run (no coverage, no outcomes) gives fewer columns,
never an error. "Failed" and "successful" are the Coordinator's rule (``lunasol_successful`` in
``pipeline/coordinator/sql/00_macros.sql``), so the report and the pattern groups agree on them.
"""

from __future__ import annotations

from collections.abc import Iterator
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


def cells(ir: IR, cell_id: str | None = None) -> list[Row]:
    """One row per cell (or for ``cell_id`` alone): ids, eligibility, coverage, outcome label and class, probe hits."""
    where, params = ("WHERE c.cell_id = ? ", [cell_id]) if cell_id is not None else ("", [])
    rows = ir.rows(
        "SELECT c.cell_id, c.task_id, c.run_id, c.eligibility, c.exclusion_reason, "
        "cov.status, cov.reason, cov.events, o.label, "
        "CASE WHEN c.eligibility <> 'valid_behavior' THEN 'excluded' WHEN o.label IS NULL THEN 'unknown' "
        "WHEN lunasol_successful(o.label) THEN 'successful' ELSE 'failed' END AS outcome "
        "FROM cells c LEFT JOIN coverage cov USING (cell_id) LEFT JOIN outcomes o USING (cell_id) "
        f"{where}ORDER BY c.cell_id",
        params,
    )
    if not rows:
        rows = ir.rows(
            "SELECT cell_id, task_id, run_id, eligibility, exclusion_reason, "
            "CASE WHEN eligibility <> 'valid_behavior' THEN 'excluded' ELSE 'unknown' END AS outcome "
            f"FROM cells c {where}ORDER BY 1",
            params,
        )
    hits = {
        r["cell_id"]: r["n"]
        for r in ir.rows(f"SELECT cell_id, count(*) AS n FROM probe_hits c {where}GROUP BY 1", params)
    }
    # None: the run has no probe hits at all (probes did not run), not this cell's zero
    probed = bool(hits) or bool(ir.rows("SELECT 1 FROM probe_hits LIMIT 1"))
    for r in rows:
        r["probe_hits"] = hits.get(r["cell_id"], 0) if probed else None
    return rows


def timelines(ir: IR, cells: list[str] | None = None) -> Iterator[tuple[str, list[list[Any]]]]:
    """Per cell in cell order, its events in order as compact rows for the page, one cell at a time.

    Row: ``[event_id, segment_id, kind, detail, actor, stage, tool, text, path, line_start, line_end, pointer]``
    (text cut to ``TEXT_CHARS``; the page shows the raw lines of cited events in full). Streamed: at
    10,000 cells the whole batch's rows as Python lists were ~2 GiB. ``cells`` (sorted): exactly these
    cells, each once (no events: no rows), read as one range of the events table (DuckDB skips the rest
    by min/max, and sorts only the range), so a report reads the IR a shard of cells at a time.
    """
    if cells is not None:
        if not cells:
            return
        got = dict(_timeline_rows(ir, (cells[0], cells[-1])))
        for cell in cells:
            yield cell, got.get(cell, [])
        return
    yield from _timeline_rows(ir, None)


def _timeline_rows(ir: IR, span: tuple[str, str] | None) -> Iterator[tuple[str, list[list[Any]]]]:
    if ir.con is None:
        return
    where, params = ("WHERE cell_id BETWEEN ? AND ? ", list(span)) if span else ("", [])
    try:
        cur = ir.con.execute(
            "SELECT cell_id, event_id, segment_id, kind, detail, actor, stage, tool_name, "
            f"left(coalesce(text, ''), {TEXT_CHARS}), source_path, line_start, line_end, json_pointer "
            f"FROM events {where}ORDER BY cell_id, seq",
            params,
        )
        cell: str | None = None
        rows: list[list[Any]] = []
        while batch := cur.fetchmany(50_000):
            for r in batch:
                if r[0] != cell:
                    if cell is not None:
                        yield cell, rows
                    cell, rows = r[0], []
                rows.append(list(r[1:]))
        if cell is not None:
            yield cell, rows
    except duckdb.Error:
        return


def places(
    ir: IR, spans: set[tuple[str, int, int]], span: tuple[str, str] | None = None
) -> tuple[dict[str, str], dict[tuple[str, int, int], str]]:
    """Where refs sit in the IR: each file's first cell (in cell order) and each exact span's first event.

    ``spans``: (path, line_start, line_end) of refs; first is by (cell_id, seq), as the timelines run.
    ``span``: (first, last) cell id: only events of that range count (a report's shard of cells).
    """
    if ir.con is None or not spans:
        return {}, {}
    paths, starts, ends = (list(x) for x in zip(*sorted(spans), strict=True))
    rng, extra = ("AND cell_id BETWEEN ? AND ? ", list(span)) if span else ("", [])
    try:
        cells = ir.con.execute(
            "SELECT source_path, min(cell_id) FROM events "
            f"WHERE source_path IN (SELECT unnest(?::VARCHAR[])) {rng}GROUP BY 1",
            [sorted(set(paths)), *extra],
        ).fetchall()
        firsts = ir.con.execute(
            "WITH s AS (SELECT unnest(?::VARCHAR[]) AS p, unnest(?::INTEGER[]) AS a, unnest(?::INTEGER[]) AS b) "
            "SELECT e.source_path, e.line_start, e.line_end, first(e.event_id ORDER BY e.cell_id, e.seq) "
            "FROM events e JOIN s ON e.source_path = s.p AND e.line_start = s.a AND e.line_end = s.b "
            f"{rng.replace('cell_id', 'e.cell_id')}GROUP BY 1, 2, 3",
            [paths, starts, ends, *extra],
        ).fetchall()
    except duckdb.Error:
        return {}, {}
    return {str(p): str(c) for p, c in cells}, {(str(p), int(a), int(b)): str(e) for p, a, b, e in firsts}


def window(ir: IR, cell: str, event_id: str, before: int = 4, after: int = 6) -> list[Row]:
    """The events of ``cell`` around ``event_id`` (by sequence), for a side-by-side comparison."""
    return ir.rows(
        "WITH a AS (SELECT seq FROM events WHERE event_id = ? AND cell_id = ?) "
        f"SELECT event_id, events.seq, kind, actor, stage, tool_name, left(coalesce(text, ''), {TEXT_CHARS}) AS text "
        "FROM events, a WHERE cell_id = ? AND events.seq BETWEEN a.seq - ? AND a.seq + ? ORDER BY events.seq",
        [event_id, cell, cell, before, after],
    )
