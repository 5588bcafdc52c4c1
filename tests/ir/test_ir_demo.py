"""The committed demo bundle: verify, export, and every event's ref resolves to the exact frozen bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.bundle import verify
from pipeline.bundle.synth import tree_snapshot
from pipeline.cli.app import app
from pipeline.ir.export import export
from pipeline.ir.query import query
from pipeline.ir.refs import read_refs, ref_of, show_ref

DEMO = Path(__file__).resolve().parents[2] / "fixtures" / "bundles" / "h0-demo"
pytestmark = pytest.mark.skipif(not (DEMO / "manifest.json").is_file(), reason="demo bundle not committed yet")


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    before = tree_snapshot(DEMO)
    run_dir = tmp_path_factory.mktemp("runs") / "demo"
    export(DEMO, run_dir)
    assert tree_snapshot(DEMO) == before
    return run_dir


def test_demo_verifies() -> None:
    assert verify(DEMO).ok


def test_demo_coverage(demo_run: Path) -> None:
    request = json.loads((DEMO / "analysis-request.json").read_text())
    eligible = [c["cell_id"] for c in request["cells"] if c["eligibility"] == "valid_behavior"]
    rows = query(demo_run, "SELECT cell_id, status, reason, events FROM coverage ORDER BY cell_id").rows
    assert [r[0] for r in rows if r[1] == "included"] == sorted(eligible)
    assert all(r[3] > 0 for r in rows if r[1] == "included")
    assert all(r[2] and r[3] == 0 for r in rows if r[1] == "excluded")
    assert len([r for r in rows if r[1] == "excluded"]) >= 1


def test_every_demo_event_ref_resolves_to_frozen_bytes(demo_run: Path) -> None:
    rows = query(demo_run, "SELECT source_path, line_start, line_end, json_pointer FROM events").rows
    refs = [ref_of(p, a, b, ptr) for p, a, b, ptr in rows]
    shown = read_refs(demo_run, refs)
    raw_cache: dict[str, list[bytes]] = {}
    for (path, a, b, _), ref in zip(rows, refs, strict=True):
        lines = raw_cache.setdefault(path, (DEMO / path).read_bytes().split(b"\n"))
        assert shown[ref].encode("utf-8") == b"\n".join(lines[a - 1 : b])
    # and the single-ref path agrees on a sample
    for ref in refs[:: max(1, len(refs) // 50)]:
        assert show_ref(demo_run, ref) == shown[ref]


def test_demo_cli_export_twice_identical(tmp_path: Path) -> None:
    runner = CliRunner()
    for run_id in ("a", "b"):
        result = runner.invoke(app, ["export", str(DEMO), "--run-id", run_id, "--runs-dir", str(tmp_path)])
        assert result.exit_code == 0, result.output
        assert "24 cells in" in result.output
    for table in ("cells", "segments", "events", "outcomes", "coverage", "meta"):
        a = query(tmp_path / "a", f"SELECT * FROM {table} ORDER BY ALL").rows
        b = query(tmp_path / "b", f"SELECT * FROM {table} ORDER BY ALL").rows
        assert a == b, table
