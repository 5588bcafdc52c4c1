"""``lunasol calls RUN`` through the CLI runner and through the library."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.models import CallLog, summarise

runner = CliRunner()


def make_run(tmp_path: Path) -> Path:
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "run.json").write_text("{}")
    log = CallLog(run)
    base = {"template_hash": "sha256:t", "mode": "replay", "model": "openai/gpt-4o-mini", "latency_ms": 3.0}
    log.append(
        {
            **base,
            "role": "luna",
            "cell_id": "C1",
            "keys": ["k1"],
            "attempts": 1,
            "transport_retries": 0,
            "prompt_tokens": 100,
            "completion_tokens": 20,
            "cost_usd": 0.001,
            "outcome": "ok",
        }
    )
    log.append(
        {
            **base,
            "role": "luna",
            "cell_id": "C2",
            "keys": ["k2", "k3"],
            "attempts": 2,
            "transport_retries": 1,
            "prompt_tokens": 200,
            "completion_tokens": 40,
            "cost_usd": 0.002,
            "outcome": "ok",
        }
    )
    log.append(
        {
            **base,
            "role": "luna",
            "cell_id": "C3",
            "keys": ["k4", "k5", "k6"],
            "attempts": 3,
            "transport_retries": 0,
            "prompt_tokens": 300,
            "completion_tokens": 60,
            "cost_usd": 0.003,
            "outcome": "check_failed",
        }
    )
    log.append(
        {
            **base,
            "role": "sol",
            "cell_id": None,
            "keys": ["k7"],
            "attempts": 1,
            "transport_retries": 2,
            "prompt_tokens": 1000,
            "completion_tokens": 300,
            "cost_usd": None,
            "outcome": "ok",
        }
    )
    return run


def test_summarise_per_role(tmp_path: Path) -> None:
    s = summarise(make_run(tmp_path))
    luna, sol = s["roles"]["luna"], s["roles"]["sol"]
    assert (luna["calls"], luna["attempts"], luna["reasks"], luna["transport_retries"]) == (3, 6, 3, 1)
    assert (luna["prompt_tokens"], luna["completion_tokens"], luna["failures"]) == (600, 120, 1)
    assert luna["cost_usd"] == 0.006 and sol["cost_usd"] is None  # unknown stays unknown
    assert s["totals"]["calls"] == 4 and s["totals"]["cost_usd"] is None and s["totals"]["transport_retries"] == 3


def test_cli_text_and_json(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    res = runner.invoke(app, ["calls", str(run)])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[1].split()[:2] == ["luna", "3"] and lines[2].split()[:2] == ["sol", "1"]
    assert "unknown" in lines[2] and "cost unknown" in res.output
    res = runner.invoke(app, ["calls", str(run), "--json"])
    assert res.exit_code == 0 and json.loads(res.output) == summarise(run)


def test_cli_not_a_run_is_exit_2(tmp_path: Path) -> None:
    res = runner.invoke(app, ["calls", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "not a lunasol run directory" in res.output


def test_cli_empty_log(tmp_path: Path) -> None:
    run = tmp_path / "r"
    run.mkdir()
    (run / "run.json").write_text("{}")
    res = runner.invoke(app, ["calls", str(run)])
    assert res.exit_code == 0 and "no model calls" in res.output


def test_torn_last_line_is_skipped(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    with (run / "calls.jsonl").open("a") as fh:
        fh.write('{"role": "luna", "cell')
    assert summarise(run)["totals"]["calls"] == 4
