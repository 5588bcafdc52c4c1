"""CLI conventions: completion, no <bool> metavars, workflow order in --help, --json everywhere a result is
printed, "unknown" cost, interrupted runs shown as interrupted."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.cli.app import WORKFLOW, app
from pipeline.state.ledger import Ledger
from tests.conftest import DEMO_BUNDLE

runner = CliRunner()


def test_help_lists_verbs_in_workflow_order_without_bool_metavars() -> None:
    res = runner.invoke(app, ["--help"], env={"COLUMNS": "160"})
    assert res.exit_code == 0
    assert "--install-completion" in res.stdout  # shell completion is on
    names = [n for _, verbs in WORKFLOW for n in verbs]
    positions = [res.stdout.index(f"│ {n} ") for n in names]
    assert positions == sorted(positions)
    for panel, _ in WORKFLOW:
        assert panel in res.stdout
    for verb in ("run", "confirm", "report", "show", "diff", "runs"):
        assert "<bool>" not in runner.invoke(app, [verb, "--help"], env={"COLUMNS": "160"}).stdout


def test_json_on_run_report_and_bundle_freeze(demo_gate1: Path, tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    shutil.copytree(DEMO_BUNDLE, bundle)
    (bundle / "manifest.json").unlink()
    res = runner.invoke(app, ["bundle", "freeze", str(bundle), "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["files"] > 20
    rep = runner.invoke(app, ["report", str(demo_gate1), "-o", str(tmp_path / "r.html"), "--json"])
    assert rep.exit_code == 0 and json.loads(rep.stdout)["refs"] > 100
    dry = runner.invoke(
        app,
        ["run", str(DEMO_BUNDLE), "--runs-dir", str(tmp_path / "runs"), "--model", "openai/x", "--dry-run", "--json"],
    )
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.stdout)["estimate"]["model"] == "openai/x"


def test_a_dry_run_says_what_it_is_doing_on_stderr_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["run", str(DEMO_BUNDLE), "--runs-dir", str(tmp_path / "runs"), "--model", "openai/x", "--dry-run"]
    monkeypatch.setenv("LUNASOL_PROGRESS_EVERY", "0.000001")  # a count line after every request
    res = runner.invoke(app, argv)
    assert res.exit_code == 0, res.output
    said = res.stderr.splitlines()
    assert "dry run: export (deterministic, in a temporary directory)" in said
    assert "dry run: planning luna" in said and "dry run: planning sol" in said
    counted = [s for s in said if "rendered and counted" in s]
    assert counted and counted[0].startswith("dry run: 1 request(s) rendered and counted (luna now)")
    table = [line for line in res.stdout.splitlines() if not line.startswith("dry run: model")]
    assert table and not any(line.startswith("dry run:") for line in table)  # stdout holds the estimate only
    monkeypatch.setenv("LUNASOL_PROGRESS_EVERY", "0")  # quiet
    quiet = runner.invoke(app, [*argv[:3], str(tmp_path / "runs2"), *argv[4:]])
    assert quiet.exit_code == 0 and quiet.stderr == "" and quiet.stdout == res.stdout


def test_runs_shows_unknown_cost_and_interrupted(demo_copy: Path) -> None:
    res = runner.invoke(app, ["runs", "--runs-dir", str(demo_copy.parent)])
    assert res.exit_code == 0 and "unknown" in res.stdout and "0.0000" not in res.stdout
    assert (
        json.loads(runner.invoke(app, ["runs", "--runs-dir", str(demo_copy.parent), "--json"]).stdout)[0]["cost_usd"]
        is None
    )
    # A run stopped by Ctrl-C mid-stage leaves that stage pending and no lunasol holding its lock.
    Ledger(demo_copy).mark_pending("sol", "sol", {"x": "y"})
    res = runner.invoke(app, ["runs", "--runs-dir", str(demo_copy.parent)])
    assert "interrupted during sol" in res.stdout
    fd = os.open(demo_copy / ".run.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a working `lunasol run` holds it
        assert "running: sol" in runner.invoke(app, ["runs", "--runs-dir", str(demo_copy.parent)]).stdout
    finally:
        os.close(fd)
