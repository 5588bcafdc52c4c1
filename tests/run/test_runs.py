"""lunasol runs: every run under a runs directory with its state and key figures (synthetic runs)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.run.index import list_runs
from tests.diff.test_diff import build_run  # the synthetic run builder


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("runs-index")
    full = build_run(root, "full")
    run_json = json.loads((full / "run.json").read_text())  # the model where the runner records it
    (full / "run.json").write_text(json.dumps({**run_json, "inputs": {"models": {"model": "openai/test-model"}}}))
    # A run that stopped at gate 1: shortlist written, no receipt, no proposals.
    gate1 = root / "runs" / "at-gate1"
    shutil.copytree(full, gate1)
    for name in ("proposals.yaml", "validation.json"):
        (gate1 / name).unlink()
    shutil.rmtree(gate1 / "gates")
    h = json.loads((gate1 / "handoff.json").read_text())
    h.update(run_id="at-gate1", userRootCauseConfirmation="pending", proposalGeneration="not_started",
             proposalSelection="not_started")  # fmt: skip
    (gate1 / "handoff.json").write_text(json.dumps(h))
    r = json.loads((gate1 / "run.json").read_text())
    (gate1 / "run.json").write_text(json.dumps({**r, "run_id": "at-gate1"}))
    # A blocked run: only the IR, the run file and a block receipt.
    blocked = root / "runs" / "blocked"
    blocked.mkdir()
    shutil.copy(full / "ir.duckdb", blocked / "ir.duckdb")
    (blocked / "run.json").write_text(json.dumps({**r, "run_id": "blocked"}))
    receipt = {"schema_version": 1, "run_id": "blocked", "stage": "luna", "blocked_at": "2026-01-01T00:00:00Z",
               "blocking_constraint": "no answer", "constraint_class": "missing_data", "error": "Blocked",
               "why_all_paths_dead": "no answer after the retries", "requested_unblock": "lunasol run ..."}  # fmt: skip
    (blocked / "block-receipt.json").write_text(json.dumps(receipt))
    # A broken one is still listed, with the error named.
    broken = root / "runs" / "broken"
    broken.mkdir()
    (broken / "run.json").write_text("{not json")
    (root / "runs" / "not-a-run").mkdir()
    return root / "runs"


def test_list_runs_states_and_figures(runs: Path) -> None:
    rows = {r.run_id: r for r in list_runs(runs)}
    assert sorted(rows) == ["at-gate1", "blocked", "broken", "full"]
    full = rows["full"]
    assert full.state == "proposalSelection: pending"
    assert (full.cells, full.patterns, full.weaknesses, full.proposals, full.calls) == (3, 3, 2, 1, 4)
    assert full.cost_usd == pytest.approx(0.013)
    assert full.model == "openai/test-model" and full.bundle_digest and full.bundle_digest.startswith("sha256:")
    assert rows["at-gate1"].state == "userRootCauseConfirmation: pending" and rows["at-gate1"].proposals is None
    assert rows["blocked"].state == "blocked: missing_data at luna" and rows["blocked"].patterns is None
    assert rows["broken"].state == "unreadable" and "not valid JSON" in (rows["broken"].error or "")


def test_runs_cli_text_and_json(runs: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["runs", "--runs-dir", str(runs), "--json"])
    assert res.exit_code == 0
    data = json.loads(res.output)
    assert [r["run_id"] for r in data] == ["at-gate1", "blocked", "broken", "full"]
    res = runner.invoke(app, ["runs", "--runs-dir", str(runs)])
    assert res.exit_code == 0 and "userRootCauseConfirmation: pending" in res.output
    res = runner.invoke(app, ["runs", "--runs-dir", str(runs / "missing")])
    assert res.exit_code == 2 and "runs directory not found" in res.output


def test_listing_counts_patterns_and_never_reads_what_grows_with_the_batch(
    runs: Path, artifact_reads: list[str]
) -> None:
    # At 10,000 cells patterns.jsonl and pattern-groups.json are tens of MB a run: a listing of
    # many runs must not parse them (it took 2 s and 450 MiB a run).
    read = artifact_reads
    rows = {r.run_id: r for r in list_runs(runs)}
    assert rows["full"].patterns == 3  # counted: one line per pattern
    assert "patterns.jsonl" not in read and "pattern-groups.json" not in read and "ledger.json" not in read
    assert "weakness-shortlist.json" in read  # the small artifacts are read as before
