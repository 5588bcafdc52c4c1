"""Sol reads timelines and cited-event lines per request from the run's DuckDB: its memory does not grow with them."""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path
from typing import Any

import duckdb
import pytest

from pipeline.sol import evidence as evidence_module
from pipeline.sol import timeline as timeline_module
from pipeline.sol import timeline_cache
from pipeline.sol.corpus import write_occurrences
from pipeline.sol.evidence import EvidenceStore, write_evidence
from pipeline.sol.timeline_cache import open_store

EVENTS = 30  # per cell, each a message of another role: every one is a timeline line
PER_REQUEST = 10  # cells read together, as a map request's partition


def _ir(path: Path, cells: int) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """A synthetic IR of ``cells`` cells (timeline-worthy events, digests, Luna's patterns); its groups and ranks."""
    con = duckdb.connect(str(path))
    try:
        con.execute(
            "CREATE TABLE cells AS SELECT 'C' || lpad(i::VARCHAR, 6, '0') AS cell_id, 't' || (i % 7) AS task_id, "
            "'valid_behavior' AS eligibility FROM range(?) r(i)",
            [cells],
        )
        con.execute(
            "CREATE TABLE events AS SELECT c.cell_id || '-e' || lpad(k::VARCHAR, 4, '0') AS event_id, c.cell_id, "
            "k::INTEGER AS seq, 'review' AS stage, 'reviewer' AS actor, 'message' AS kind, 'message' AS detail, "
            "NULL::VARCHAR AS tool_name, '2026-08-09T10:00:00Z' AS ts, "
            "'line ' || k || ' of ' || c.cell_id || ' ' || repeat('word ', 30) AS text, FALSE AS text_truncated, "
            "160 AS text_chars, NULL::VARCHAR AS call_id, NULL::VARCHAR AS args_digest, "
            "NULL::VARCHAR AS result_digest, NULL::VARCHAR AS state_digest "
            "FROM cells c, range(1, ?) r(k)",
            [EVENTS + 1],
        )
        con.execute(
            "CREATE TABLE cell_digests AS SELECT cell_id, 'sha256:s' AS source_digest, "
            "'sha256:' || md5(cell_id) AS content_digest FROM cells"
        )
        con.execute(
            "CREATE TABLE patterns AS SELECT cell_id || '-P01' AS pattern_id, repeat('observed ', 20) AS observed, "
            "repeat('fits ', 20) AS definition_fit FROM cells"
        )
        ids = [r[0] for r in con.execute("SELECT cell_id FROM cells ORDER BY 1").fetchall()]
    finally:
        con.close()
    occurrences = [
        {"occurrence_id": f"G001-O{i:06d}", "cell_id": c, "pattern_ids": [f"{c}-P01"],
         "events": [f"{c}-e0001", f"{c}-e0002", f"{c}-e0003"]}
        for i, c in enumerate(ids)
    ]  # fmt: skip
    return [{"group_id": "G001", "type": "omission", "concerns": "x", "occurrences": occurrences}], {
        c: i for i, c in enumerate(ids)
    }


def _peak(tmp_path: Path, cells: int) -> tuple[int, int]:
    """Python's peak allocation while Sol's stores are made and every cell is read, a request at a time."""
    ir = tmp_path / f"ir-{cells}.duckdb"
    groups, rank = _ir(ir, cells)
    walk = sorted(rank, key=rank.__getitem__)
    by_cell = {o["cell_id"]: o for o in groups[0]["occurrences"]}
    gc.collect()
    tracemalloc.start()
    try:

        def tables(con: Any, temp: bool) -> None:
            write_occurrences(con, rank, groups, temp=temp)
            write_evidence(con, temp=temp)

        store = open_store(ir, rank, tables)
        try:
            shown = 0
            evidence = EvidenceStore(store.con, rank)
            for i in range(0, len(walk), PER_REQUEST):
                part = walk[i : i + PER_REQUEST]
                lines = store.lines(part)
                seen = evidence.for_cells(part, [by_cell[c] for c in part])
                assert list(lines) == part and all(len(v) == EVENTS for v in lines.values())
                shown += len(seen.events)
        finally:
            store.close()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, shown


@pytest.fixture
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows fetched and written a few at a time, so that both sizes below stream (the defaults hold thousands)."""
    monkeypatch.setattr(timeline_module, "FETCH_ROWS", 64)
    monkeypatch.setattr(timeline_cache, "WRITE_CELLS", 8)
    monkeypatch.setattr(timeline_cache, "QUERY_CELLS", 64)
    monkeypatch.setattr(evidence_module, "WRITE_ROWS", 64)


def test_sol_holds_no_timeline_or_cited_line_of_the_whole_batch(tmp_path: Path, small_batches: None) -> None:
    """4x the cells, not 4x the memory: lines are written and read a request at a time.

    Holding every cell's timeline (as ``sol_map/timelines.json`` did) or every cited event's line
    (as ``GroupEvidence`` did) makes the peak grow with the batch: ~4x here. What still grows is a
    number per cell (its timeline's size, its rank).
    """
    _peak(tmp_path, 20)  # first imports and DuckDB's first allocations, not measured
    small, shown_small = _peak(tmp_path, 100)
    large, shown_large = _peak(tmp_path, 400)
    assert (shown_small, shown_large) == (100 * 3, 400 * 3)  # every cited line was read, by the requests
    # measured: 1.2x (335 -> 408 KB); with every cell's lines held before writing them, 3.8x (0.9 -> 3.5 MB)
    assert large < 1.6 * small, (small, large)


def test_the_batch_tables_are_sorted_under_the_write_limit_on_one_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each whole sort (walk, occurrences, cited lines) spills under 128 MiB; under 512 MiB it held +528 MiB at 100K."""
    monkeypatch.delenv("LUNASOL_DUCKDB_MEMORY", raising=False)
    ir = tmp_path / "ir.duckdb"
    groups, rank = _ir(ir, 30)
    seen: list[tuple[str, str, int]] = []

    def settings(con: Any, what: str) -> None:
        limit, threads = con.execute("SELECT current_setting('memory_limit'), current_setting('threads')").fetchall()[0]
        seen.append((what, limit, threads))

    walk = timeline_cache.write_walk

    def write_walk(con: Any, r: dict[str, int], *, temp: bool = False) -> None:
        settings(con, "walk")
        walk(con, r, temp=temp)

    def tables(con: Any, temp: bool) -> None:
        settings(con, "occurrences and evidence")
        write_occurrences(con, rank, groups, temp=temp)
        write_evidence(con, temp=temp)

    monkeypatch.setattr(timeline_cache, "write_walk", write_walk)
    store = open_store(ir, rank, tables)
    try:
        after = store.con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]
    finally:
        store.close()
    assert seen == [("walk", "128.0 MiB", 1), ("occurrences and evidence", "128.0 MiB", 1)]
    assert after == timeline_cache.STORE_MEMORY.replace("MiB", ".0 MiB")  # the reading connection: its own cap
    con = duckdb.connect(str(ir), read_only=True)
    try:
        walk_rows = con.execute(f"SELECT rank FROM {timeline_cache.WALK_TABLE}").fetchall()
    finally:
        con.close()
    assert [r[0] for r in walk_rows] == sorted(r[0] for r in walk_rows) and len(walk_rows) == 30 * EVENTS


def test_a_memory_limit_the_user_set_holds_for_the_store_reader_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``$LUNASOL_DUCKDB_MEMORY`` is every connection's limit: the reader's own 96 MiB cap does not override it."""
    monkeypatch.setenv("LUNASOL_DUCKDB_MEMORY", "300MiB")
    ir = tmp_path / "ir.duckdb"
    _groups, rank = _ir(ir, 5)
    store = open_store(ir, rank)
    try:
        con = timeline_cache.capped(store.con)
        assert con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0] == "300.0 MiB"
    finally:
        store.close()
