"""A resume never buys an answer the run already received: real SIGKILLs between answer and artifact.

Each case runs the real verb in a child process that kills itself (``kill -9`` on its own pid) at one
point between "the answer arrived" and "the artifact holding it is written": right after the raw
answer is stored in ``exchanges/`` (before it is parsed), or right after the finished call's ``ok`` row
reached ``calls.jsonl`` (before the stage wrote its artifact). The resume runs in this process; the
local server counts the requests: no request the killed process already got an answer for is sent
again. Roles: Luna and Sol (``lunasol run``), the proposer (``lunasol propose``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.context import RunOptions
from pipeline.models.calllog import read_calls
from pipeline.proposals.proposer import PROPOSALS_FILE, propose
from pipeline.run.runner import run
from pipeline.testing.openai_server import FakeOpenAI
from tests.proposals.test_proposals_proposer import card, serve
from tests.sol.sol_helpers import make_bundle
from tests.state.test_ledger import handler as ledger_handler

ROOT = Path(__file__).resolve().parents[2]

# The child: patch one point to kill -9 the process the first time a call of ROLE passes it, then run.
_KILLER = """
import os, signal, sys
sys.path.insert(0, {root!r})
ROLE, POINT = {role!r}, {point!r}
from pipeline.models import calllog, store
if POINT == "logged":  # the finished call's row is in calls.jsonl; its artifact is not written yet
    real_append = calllog.CallLog.append
    def append(self, entry):
        real_append(self, entry)
        if entry.get("role") == ROLE and entry.get("outcome") == "ok":
            os.kill(os.getpid(), signal.SIGKILL)
    calllog.CallLog.append = append
else:  # "stored": the raw answer is on disk in exchanges/, nothing has parsed it yet
    real_save = store.RecordingStore.save
    def save(self, record):
        path = real_save(self, record)
        if record.get("role") == ROLE and self.root.name == "exchanges":
            os.kill(os.getpid(), signal.SIGKILL)
        return path
    store.RecordingStore.save = save
"""


def _killed(body: str, role: str, point: str, env: dict[str, str] | None = None) -> None:
    script = _KILLER.format(root=str(ROOT), role=role, point=point) + textwrap.dedent(body)
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env or dict(os.environ)
    )
    assert proc.returncode == -9, (proc.returncode, proc.stderr[-3000:])


def _held(run_dir: Path) -> set[str]:
    """The requests whose answers the run holds in exchanges/ (their messages, canonical)."""
    out = set()
    for path in (run_dir / "exchanges").glob("*/*.json"):
        out.add(json.dumps(json.loads(path.read_text(encoding="utf-8"))["request"]["messages"], sort_keys=True))
    return out


def _repaid(requests: list[dict[str, Any]], before: int, held: set[str]) -> int:
    """Requests sent after the kill for an answer the killed process had already received and stored."""
    return sum(1 for r in requests[before:] if json.dumps(r["messages"], sort_keys=True) in held)


@pytest.mark.slow
@pytest.mark.parametrize(("role", "point"), [("luna", "stored"), ("luna", "logged"), ("sol", "logged")])
def test_run_killed_between_answer_and_artifact_repays_nothing(
    role: str, point: str, tmp_path: Path, runs_dir: Path, fake_llm: FakeOpenAI, model_settings: Any
) -> None:
    fake_llm.handler = ledger_handler
    bundle = make_bundle(tmp_path)
    s = model_settings()
    _killed(
        f"""
        from pipeline.cli.app import app
        app(["run", {str(bundle)!r}, "--runs-dir", {str(runs_dir)!r}, "--run-id", "k", "--model", {s.model!r},
             "--api-base", {s.api_base!r}, "--mode", "tools"])
        """,
        role,
        point,
    )
    run_dir = runs_dir / "k"
    before = len(fake_llm.requests)
    held = _held(run_dir)
    assert before >= 1 and held  # the killed process got (and kept) at least one answer
    if point == "logged":
        assert any(r["role"] == role and r["outcome"] == "ok" for r in read_calls(run_dir))
    result = run(RunOptions(bundle=bundle, run_id="k", runs_dir=runs_dir, models=s, resume=True), log=lambda _m: None)
    assert result is not None and (run_dir / "weakness-shortlist.json").is_file()
    assert _repaid(fake_llm.requests, before, held) == 0


@pytest.mark.slow
@pytest.mark.parametrize("point", ["stored", "logged"])
def test_propose_killed_between_answer_and_artifact_repays_nothing(
    point: str, runs_dir: Path, fake_llm: FakeOpenAI, model_settings: Any
) -> None:
    from tests.cards.fixture_run import make_run

    run_dir = make_run(runs_dir)
    serve(fake_llm, {"proposer/W-02": [[card("en_failure_section.yaml")]], "proposer/W-04": [[]]})
    s = model_settings()
    env = {**os.environ, "LUNASOL_EXPORT_WORKERS": "0"}
    _killed(
        f"""
        from pipeline.core.settings import ModelSettings
        from pipeline.proposals.proposer import propose
        settings = ModelSettings(model={s.model!r}, api_base={s.api_base!r}, instructor_mode="tools", timeout_s=5.0)
        propose(__import__("pathlib").Path({str(run_dir)!r}), settings, log=lambda _m: None)
        """,
        "proposer",
        point,
        env,
    )
    before, held = len(fake_llm.requests), _held(run_dir)
    assert held and not (run_dir / PROPOSALS_FILE).is_file()  # killed before the artifact
    result = propose(run_dir, s, log=lambda _m: None)
    assert [c.source_weakness for c in result.cards] == ["W-02"]
    assert _repaid(fake_llm.requests, before, held) == 0
    # one answer per confirmed weakness: the resume asked only for those not held (one in flight at the kill)
    assert len(fake_llm.requests) - before == 2 - len(held)
