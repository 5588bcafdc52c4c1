"""The demo end to end: hand-written answers (fixtures, not a model's output) through the real pipeline.

* replay of fixtures/recordings/h0-demo: the run stops at gate 1 (exit 0), status shows pending, the
  checker dead-end over C004/C015/C018 is W-01 with counter-evidence from C013 and C017;
* a copy of the demo bundle with one changed cell, served by the local answer server: a rerun makes
  exactly one Luna call (the changed cell) plus the downstream steps; an unchanged rerun makes none.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.core.context import RunOptions
from pipeline.core.settings import ModelSettings
from pipeline.models import read_calls
from pipeline.run.runner import run
from pipeline.testing.openai_server import FakeOpenAI
from tests.conftest import DEMO_BUNDLE, DEMO_RECORDINGS, ROOT

ANSWERS = ROOT / "fixtures" / "answers" / "h0-demo"
has_recordings = DEMO_RECORDINGS.is_dir() and any(DEMO_RECORDINGS.glob("*/*.json"))
has_answers = (ANSWERS / "sol.json").is_file() and (ANSWERS / "luna").is_dir()


def _answer_book() -> Any:
    spec = importlib.util.spec_from_file_location("record_demo", ROOT / "fixtures" / "record_demo.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.AnswerBook(ANSWERS)


def _check_w01(shortlist: dict[str, Any]) -> None:
    w01 = next(w for w in shortlist["weaknesses"] if w["weakness_id"] == "W-01")
    assert w01["support"]["cells"] == ["C004", "C015", "C018"]
    assert w01["support"]["counts"]["tasks"] == 3
    assert {i["cell"] for i in w01["counter_evidence"]["items"]} == {"C013", "C017"}
    assert shortlist["denominator"]["eligible_cells"] == 24


@pytest.mark.skipif(not has_recordings, reason="fixtures/recordings/h0-demo not recorded yet")
def test_demo_replay_stops_at_gate_1(demo_copy: Path) -> None:
    """The replayed demo waits at gate 1 with W-01 as the story plants it; a CLI rerun makes no call."""
    cli = CliRunner()
    run_dir = demo_copy
    st = cli.invoke(app, ["status", str(run_dir), "--json"])
    data = json.loads(st.output)
    assert data["handoff"]["userRootCauseConfirmation"] == "pending"
    assert data["handoff"]["phase"] == "rootCausesMined"
    _check_w01(json.loads((run_dir / "weakness-shortlist.json").read_text(encoding="utf-8")))
    n = len(read_calls(run_dir))
    again = cli.invoke(
        app, ["run", str(DEMO_BUNDLE), "--runs-dir", str(run_dir.parent), "--replay", str(DEMO_RECORDINGS)]
    )
    assert again.exit_code == 0, again.output
    assert "lunasol confirm" in again.output and "W-01" in again.output
    assert len(read_calls(run_dir)) == n  # unchanged rerun: zero model calls


@pytest.mark.skipif(not has_answers, reason="hand-written Luna answers not written yet")
def test_demo_one_changed_cell_costs_one_luna_call(tmp_path: Path, demo_copy: Path) -> None:
    """The replayed demo continued live against the local answer server: reused whole, then one cell changes."""
    from pipeline.bundle.manifest import freeze

    bundle = tmp_path / "h0-demo"
    shutil.copytree(DEMO_BUNDLE, bundle)
    d = demo_copy
    with FakeOpenAI(_answer_book()) as server:
        settings = ModelSettings(model="openai/fixture-model", api_base=server.base_url, max_reasks=0)
        opts = RunOptions(bundle=bundle, run_id=d.name, runs_dir=d.parent, models=settings)
        first = read_calls(d)
        assert sum(c["role"] == "sol" for c in first) == 1
        _check_w01(json.loads((d / "weakness-shortlist.json").read_text(encoding="utf-8")))
        run(opts, log=lambda _m: None)
        assert len(read_calls(d)) == len(first)  # unchanged rerun: zero calls
        # change one cell's log (same lines, other words) and re-freeze
        log = bundle / "cells" / "C008" / "sessions" / "01-proposal-operator.jsonl"
        lines = log.read_text(encoding="utf-8").splitlines(keepends=True)
        row = json.loads(lines[0])
        row["content"] = row["content"] + " (please keep the change small)"
        lines[0] = json.dumps(row, ensure_ascii=False) + "\n"
        log.write_text("".join(lines), encoding="utf-8")
        freeze(bundle)
        res = run(opts, log=lambda _m: None)
    new = read_calls(d)[len(first) :]
    assert [c["role"] for c in new].count("luna") == 1
    assert next(c for c in new if c["role"] == "luna")["cell_id"] == "C008"
    assert [c["role"] for c in new].count("sol") == 1
    assert res.ran == ["export", "select", "probes", "luna", "coordinator", "sol"]
