"""Per-cell re-export: a changed cell is read again, every other cell's rows come from the previous IR.

The reference is a fresh export of the same bundle: every IR table must be equal by content,
and the stored content digests must equal the canonical-JSON digests computed in Python.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pytest

from pipeline.bundle import freeze
from pipeline.bundle.synth import write_bundle
from pipeline.core.canonical import digest
from pipeline.ir import cache, digests
from pipeline.ir import export as export_module
from pipeline.ir.digests import CELL_COLUMNS, EVENT_COLUMNS
from pipeline.ir.export import export
from pipeline.ir.store import TABLES

DEMO = Path(__file__).resolve().parents[2] / "fixtures" / "bundles" / "h0-demo"


def _tables(run_dir: Path) -> dict[str, list[str]]:
    con = duckdb.connect(str(run_dir / "ir.duckdb"), read_only=True)
    try:
        return {t: [repr(r) for r in con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall()] for t in TABLES}
    finally:
        con.close()


def _python_digests(run_dir: Path) -> dict[str, str]:
    """The reference: digest() of the cell row and its events, every value loaded into Python."""
    con = duckdb.connect(str(run_dir / "ir.duckdb"), read_only=True)
    try:
        cells = con.execute(f"SELECT {', '.join(CELL_COLUMNS)} FROM cells ORDER BY cell_id").fetchall()
        names = ", ".join(c for c, _ in EVENT_COLUMNS)
        events: dict[str, list[list[Any]]] = {c[0]: [] for c in cells}
        for row in con.execute(f"SELECT cell_id, {names} FROM events ORDER BY cell_id, seq").fetchall():
            events[row[0]].append(list(row[1:]))
    finally:
        con.close()
    return {c[0]: digest({"cell": list(c), "events": events[c[0]]}) for c in cells}


def _stored_digests(run_dir: Path) -> dict[str, str]:
    con = duckdb.connect(str(run_dir / "ir.duckdb"), read_only=True)
    try:
        return dict(con.execute("SELECT cell_id, content_digest FROM cell_digests").fetchall())
    finally:
        con.close()


def _edit(bundle: Path, cell: str, text: str) -> None:
    path = bundle / "cells" / cell / "sessions" / "02-design-candidate.jsonl"
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps({"ts": "2026-08-09T23:00:00Z", "type": "message", "role": "operator", "content": text}))
        fh.write("\n")
    freeze(bundle)


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    root = tmp_path / "bundle"
    write_bundle(root, cells=8, events_per_cell=60, excluded=1, seed=21)
    return root


@pytest.fixture(params=["sql", "python"])
def fill_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Digests filled in DuckDB (any number of events), or in Python (a rerun's few cells)."""
    monkeypatch.setattr(digests, "PYTHON_FILL_EVENTS", 0 if request.param == "sql" else 10**9)
    return str(request.param)


def test_content_digests_equal_the_python_canonical_json(bundle: Path, tmp_path: Path, fill_path: str) -> None:
    # Odd text: every control character (Python and DuckDB spell some escapes differently), quotes,
    # backslashes, a backslash before 'u', non-ASCII, and text long enough to be trimmed.
    odd = "".join(chr(i) for i in range(32)) + '"\\ \\u000b \u2028 é ✓ 😀 /' + "x" * 2100
    _edit(bundle, "C002", odd)
    export(bundle, tmp_path / "run")
    stored = _stored_digests(tmp_path / "run")
    assert stored == _python_digests(tmp_path / "run")
    assert len(stored) == 9  # every cell, the excluded one too


def test_a_re_exported_cell_needing_escapes_gets_the_exact_digest(bundle: Path, tmp_path: Path, fill_path: str) -> None:
    # A re-export fills the digests of the changed cell alone: its \\u escapes must still take the exact path.
    run = tmp_path / "run"
    export(bundle, run)
    _edit(bundle, "C004", "".join(chr(i) for i in range(32)) + "\u2028 é")
    again = export(bundle, run)
    assert "1 read" in again.summary()
    assert _stored_digests(run) == _python_digests(run)


def test_digests_filled_range_by_range_equal_one_statement(
    bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fill runs one statement per range of cells (bounded memory); a range of one cell gives the same digests.
    monkeypatch.setattr(digests, "PYTHON_FILL_EVENTS", 0)  # the DuckDB fill, whose ranges this is about
    export(bundle, tmp_path / "whole")
    monkeypatch.setattr(digests, "FILL_BYTES", 1)
    export(bundle, tmp_path / "ranged")
    assert _stored_digests(tmp_path / "ranged") == _stored_digests(tmp_path / "whole")
    assert _stored_digests(tmp_path / "ranged") == _python_digests(tmp_path / "ranged")


def test_a_range_that_runs_out_of_memory_is_filled_as_halves(
    bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # DuckDB really runs out of memory on every range of several cells (its limit is cut to 1 MiB for
    # them): each failed INSERT is rolled back and its halves are filled, down to single cells.
    monkeypatch.setattr(digests, "PYTHON_FILL_EVENTS", 0)
    export(bundle, tmp_path / "whole")
    run_sql = export_module.IRWriter.execute
    failed: list[tuple[str, str]] = []

    def tight(self: Any, sql: str, params: dict[str, Any] | None = None) -> None:
        if params and params["lo"] != params["hi"]:
            self._con.execute("SET memory_limit = '1MiB'")
            try:
                run_sql(self, sql, params)
            except duckdb.OutOfMemoryException:
                failed.append((params["lo"], params["hi"]))
                raise
            finally:
                self._con.execute("SET memory_limit = '256MiB'")
        else:
            run_sql(self, sql, params)

    monkeypatch.setattr(export_module.IRWriter, "execute", tight)
    export(bundle, tmp_path / "halved")
    assert failed[0] == ("C001", "C009")  # the whole batch first, then its halves
    assert len(failed) >= 2  # a half failed again and was halved in turn
    assert _stored_digests(tmp_path / "halved") == _stored_digests(tmp_path / "whole")
    assert _stored_digests(tmp_path / "halved") == _python_digests(tmp_path / "halved")


def test_fill_ranges_bound_sizes_and_never_split_a_cell() -> None:
    counts = [("C3", 5), ("C1", 4), ("C2", 7), ("C4", 30)]
    assert digests.fill_ranges(counts, 10) == [("C1", "C1"), ("C2", "C2"), ("C3", "C3"), ("C4", "C4")]
    assert digests.fill_ranges(counts, 11) == [("C1", "C2"), ("C3", "C3"), ("C4", "C4")]
    assert digests.fill_ranges(counts, 100) == [("C1", "C4")]
    assert digests.fill_ranges([], 10) == []


def test_one_changed_cell_is_read_again_alone(bundle: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    first = export(bundle, run)
    assert first.reused == []
    before = _stored_digests(run)
    _edit(bundle, "C005", "one more line in one cell")
    again = export(bundle, run)
    assert again.reused == [c for c in first.events_per_cell if c != "C005"]  # all others, in request order
    assert "7 unchanged cells reused, 1 read" in again.summary()
    fresh = export(bundle, tmp_path / "fresh")
    assert fresh.reused == []
    assert _tables(run) == _tables(tmp_path / "fresh")  # same IR as a full export, table by table
    assert again.events_per_cell == fresh.events_per_cell
    after = _stored_digests(run)
    assert {c for c in after if after[c] != before[c]} == {"C005"}
    assert after == _python_digests(run)


def test_later_stages_caches_keep_only_unchanged_cells(bundle: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    export(bundle, run)
    con = duckdb.connect(str(run / "ir.duckdb"))
    try:
        con.execute(
            "CREATE TABLE some_cache AS SELECT cell_id, content_digest, 'made-' || cell_id AS value FROM cell_digests"
        )
        con.execute("CREATE TABLE not_a_cache AS SELECT cell_id FROM cells")
    finally:
        con.close()
    _edit(bundle, "C003", "changed")
    export(bundle, run)
    con = duckdb.connect(str(run / "ir.duckdb"), read_only=True)
    try:
        kept = [r[0] for r in con.execute("SELECT cell_id FROM some_cache ORDER BY 1").fetchall()]
        tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    finally:
        con.close()
    assert kept == [f"C{i:03d}" for i in range(1, 10) if i != 3]
    assert "not_a_cache" not in tables  # derived tables without a content digest start afresh


def test_a_changed_request_entry_or_format_reads_every_cell(bundle: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    export(bundle, run)
    req = json.loads((bundle / "analysis-request.json").read_text(encoding="utf-8"))
    req["parent_harness"] = "H1"
    (bundle / "analysis-request.json").write_text(json.dumps(req), encoding="utf-8")
    freeze(bundle)
    again = export(bundle, run)
    assert again.reused == []
    assert _stored_digests(run) == _python_digests(run)


def test_a_rerun_edits_a_copy_of_the_previous_ir(bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    export(bundle, run)
    con = duckdb.connect(str(run / "ir.duckdb"))
    try:
        con.execute("CREATE VIEW a_view AS SELECT cell_id FROM cells")  # a later stage's view goes too
    finally:
        con.close()
    previous = (run / "ir.duckdb").read_bytes()

    def never(*_a: Any) -> None:
        raise AssertionError("unchanged rows were written again")

    monkeypatch.setattr(cache, "copy_cells", never)
    monkeypatch.setattr(cache, "carry_caches", never)
    _edit(bundle, "C004", "changed")
    monkeypatch.setattr(export_module, "_load_cells", _failing(export_module._load_cells))
    with pytest.raises(RuntimeError, match="killed"):
        export(bundle, run)
    assert (run / "ir.duckdb").read_bytes() == previous  # a failed export leaves the previous IR as it was
    assert {p.name for p in run.iterdir()} == {"ir.duckdb", "run.json"}  # no temp copy is left behind
    monkeypatch.undo()
    monkeypatch.setattr(cache, "copy_cells", never)
    again = export(bundle, run)
    assert "7 unchanged cells reused, 1 read" in again.summary()
    export(bundle, tmp_path / "fresh")
    assert _tables(run) == _tables(tmp_path / "fresh")
    con = duckdb.connect(str(run / "ir.duckdb"), read_only=True)
    try:
        names = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    finally:
        con.close()
    assert names == set(TABLES)


def _failing(fn: Any) -> Any:
    def run(*a: Any, **k: Any) -> Any:
        raise RuntimeError("killed mid-export")

    return run


def test_the_stored_digests_are_read_once_per_state_of_the_ir(
    bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    export(bundle, run)
    ir = run / "ir.duckdb"
    opened: list[bool] = []
    real = digests._connect

    def counted(path: Path) -> Any:
        opened.append(True)
        return real(path)

    monkeypatch.setattr(digests, "_connect", counted)
    cells = digests.ir_cell_digests(ir)
    first = digests.ir_digest(ir)
    assert digests.stored_ir_digest(ir) == first and cells == _stored_digests(run) and len(opened) == 1
    cells["C001"] = "tampered"  # a caller's copy: the remembered digests stay as read
    assert digests.ir_cell_digests(ir) == _stored_digests(run) and len(opened) == 1
    con = duckdb.connect(str(ir))
    con.execute("UPDATE outcomes SET label = 'changed' WHERE cell_id = (SELECT min(cell_id) FROM outcomes)")
    con.close()
    assert digests.ir_digest(ir) != first and len(opened) == 2  # the file changed: read again
    _edit(bundle, "C002", "one more line")
    freeze(bundle)
    export(bundle, run)  # a new IR renamed in
    assert digests.ir_cell_digests(ir) == _stored_digests(run) and len(opened) == 3


def test_fill_sizes_follow_the_events_json(tmp_path: Path) -> None:
    # The fill's ranges are bounded by TODO_SQL's estimate of each cell's event JSON: on the demo's
    # real logs it stays within a factor of two of the bytes the fill aggregates.
    run = tmp_path / "run"
    export(DEMO, run)
    con = duckdb.connect(str(run / "ir.duckdb"))
    try:
        actual = dict(
            con.execute(
                f"SELECT cell_id, sum(strlen({digests._EVENT_ARRAY}) + 1) FROM events e GROUP BY cell_id"
            ).fetchall()
        )
        con.execute("DELETE FROM cell_digests")
        todo = {cell: (n, size) for cell, n, size in con.execute(digests.TODO_SQL).fetchall()}
    finally:
        con.close()
    assert set(actual) <= set(todo) and len(actual) >= 20
    for cell, (n, size) in todo.items():
        if cell in actual:
            assert n > 0 and actual[cell] / 2 <= size <= actual[cell] * 2, (cell, size, actual[cell])
        else:
            assert (n, size) == (0, 0)  # an excluded cell: no events
