"""Export's memory is flat in the number of cells: rows go to DuckDB a bounded batch at a time.

Measured with tracemalloc (Python's own allocations: no timing, no RSS) on a synthetic bundle of
N and 6.7N cells, with the batch and statement sizes made small so that both bundles take many
batches. With the segments of the whole batch in one list the peak grew by ~7 KiB a cell here;
what may grow is a few small facts per cell (~0.9 KiB: event and redaction counts, each cell's
slice of the manifest and its bytes), and the batches in flight between the reading thread and
DuckDB vary a little from run to run (~0.1 MiB).
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from pipeline.bundle.manifest import read_manifest
from pipeline.bundle.request import load_request
from pipeline.bundle.synth import write_bundle
from pipeline.ir import export as export_mod
from pipeline.ir import rows, store
from pipeline.ir.store import IRWriter

SMALL, LARGE = 60, 400


@pytest.fixture
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rows, "BATCH_ROWS", 200)
    monkeypatch.setattr(store, "STATEMENT_ROWS", 400, raising=False)
    monkeypatch.setenv("LUNASOL_EXPORT_WORKERS", "0")  # this process's allocations: the serial path


def _load_peak(bundle: Path, tmp: Path) -> tuple[int, int, list[int]]:
    """(tracemalloc peak above the start while the cells are loaded, events, rows of each segments insert)."""
    manifest = read_manifest(bundle)
    request = load_request(bundle)
    writer = IRWriter(tmp / "ir.duckdb")
    inserts: list[int] = []
    insert_table = writer.insert_table

    def counted(name: str, table: pa.Table) -> None:
        if name == "segments":
            inserts.append(table.num_rows)
        insert_table(name, table)

    writer.insert_table = counted  # type: ignore[method-assign]
    try:
        tracemalloc.start()
        try:
            start = tracemalloc.get_traced_memory()[0]
            counts = export_mod._load_cells(writer, bundle, request.eligible_cells, manifest, "native", {})
            peak = tracemalloc.get_traced_memory()[1] - start
        finally:
            tracemalloc.stop()
        return peak, sum(counts.values()), inserts
    finally:
        writer.abort()


def test_the_load_of_more_cells_peaks_no_higher_in_python(small_batches: None, tmp_path: Path) -> None:
    # Each size loaded twice, the lower peak kept: a first load also imports and warms what every
    # load uses, and the first load of a bundle has peaked up to 1.5 MiB higher in Python.
    peaks = {}
    for n in (SMALL, LARGE):
        bundle = tmp_path / f"b{n}"
        write_bundle(bundle, cells=n, events_per_cell=24, excluded=0, output_chars=40)
        runs = []
        for k in range(2):
            (tmp_path / f"r{n}-{k}").mkdir()
            runs.append(_load_peak(bundle, tmp_path / f"r{n}-{k}"))
        peaks[n] = min(runs, key=lambda r: r[0])
    (small, small_events, small_inserts), (large, large_events, large_inserts) = peaks[SMALL], peaks[LARGE]
    assert large_events > 6 * small_events and len(large_inserts) > 5 * len(small_inserts) > 3  # many batches
    assert max(large_inserts) * 3 < sum(large_inserts)  # segments go in as they are made, not the batch's at once
    assert large - small < 1536 * (LARGE - SMALL), (small, large)


def test_an_export_in_many_statements_is_the_export_in_one(
    small_batches: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Statement and batch boundaries (and the checkpoints between statements) change no row.
    bundle = tmp_path / "b"
    write_bundle(bundle, cells=60, events_per_cell=24, excluded=1, output_chars=40)

    def tables(run: Path) -> dict[str, list[tuple[object, ...]]]:
        export_mod.export(bundle, run)
        con = duckdb.connect(str(run / "ir.duckdb"), read_only=True)
        try:
            return {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in store.TABLES}
        finally:
            con.close()

    many = tables(tmp_path / "many")
    monkeypatch.setattr(rows, "BATCH_ROWS", 65_536)
    monkeypatch.setattr(store, "STATEMENT_ROWS", 262_144)
    one = tables(tmp_path / "one")
    assert many == one and len(many["events"]) > 3 * 400


def test_the_export_writer_has_its_own_memory_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # DuckDB fills its limit with cached blocks of the file being written: the writer's own is lower
    # (the bulk load and the digests' fill after it), unless the user set one for every connection.
    def limits() -> tuple[str, list[str], str]:
        writer = IRWriter(tmp_path / "ir.duckdb")
        setting = "SELECT current_setting('memory_limit')"
        seen: list[str] = []
        try:
            before = str(writer.fetch(setting)[0][0])
            batch = pa.record_batch({"key": ["k"], "value": ["v"]})
            sql = "INSERT INTO meta SELECT * FROM _src"
            writer.insert_stream(
                sql, "_src", batch.schema, iter([batch]), between=lambda: seen.append(str(writer.fetch(setting)[0][0]))
            )
            return before, seen, str(writer.fetch(setting)[0][0])
        finally:
            writer.abort()

    monkeypatch.delenv("LUNASOL_DUCKDB_MEMORY", raising=False)
    assert limits() == ("256.0 MiB", ["256.0 MiB"], "256.0 MiB") and store.EXPORT_MEMORY == "256MiB"
    monkeypatch.setenv("LUNASOL_DUCKDB_MEMORY", "1GiB")
    assert limits() == ("1.0 GiB", ["1.0 GiB"], "1.0 GiB")
