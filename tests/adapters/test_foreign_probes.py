"""Probes fire on foreign logs: shell calls normalised (named after their command, digested without comments)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb

from pipeline.adapters import import_bundle
from pipeline.adapters.embedded import command_tool, normal_command, shell_command
from pipeline.ir.export import export
from pipeline.probes import run_probes


def test_command_tool_skips_comments_and_unwraps_shells() -> None:
    assert command_tool("# install the deps\n\nset -e\npip install -r req.txt") == "pip"
    assert command_tool("#!/bin/bash\n# x\n  sudo apt-get update") == "apt-get"
    assert command_tool("# only a comment") == ""
    assert shell_command(["bash", "-lc", "ls -la"]) == "ls -la"
    assert shell_command(["/bin/zsh", "-lc", "git status"]) == "git status"
    assert shell_command(["rg", "-n", "foo bar"]) == "rg -n 'foo bar'"
    assert normal_command("# run\npytest   -q\n\n") == normal_command("pytest -q")


def _line(ts: int, payload: dict[str, Any], top: str = "response_item") -> str:
    return json.dumps({"timestamp": f"2026-01-01T00:00:{ts:02d}Z", "type": top, "payload": payload}) + "\n"


def _call(ts: int, cid: str, script: str) -> str:
    args = json.dumps({"command": ["bash", "-lc", script], "workdir": "/w"})
    return _line(ts, {"type": "function_call", "name": "shell", "arguments": args, "call_id": cid})


def _out(ts: int, cid: str, text: str, code: int) -> str:
    body = json.dumps({"output": text, "metadata": {"exit_code": code}})
    return _line(ts, {"type": "function_call_output", "call_id": cid, "output": body})


def test_repeat_and_zero_gain_probes_fire_on_a_codex_rollout(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    meta = _line(0, {"id": "s-1", "cwd": "/w", "cli_version": "0.99.0"}, "session_meta")
    body = [
        meta,
        _call(1, "c1", "# look at the app\ncat src/app.py"),
        _out(2, "c1", "print('hi')", 0),
        _call(3, "c2", "cat src/app.py"),  # the same read, nothing changed: a repeat
        _out(4, "c2", "print('hi')", 0),
        _call(5, "c3", "pytest -q"),
        _out(6, "c3", "1 failed", 1),
        _call(7, "c4", "pytest -q"),  # the same check failing the same way: no information gained
        _out(8, "c4", "1 failed", 1),
    ]
    (src / "rollout-s-1.jsonl").write_text("".join(body))
    bundle = tmp_path / "b"
    import_bundle("auto", src, bundle)
    export(bundle, tmp_path / "runs" / "r")
    con = duckdb.connect(str(tmp_path / "runs" / "r" / "ir.duckdb"))
    try:
        hits = run_probes(con)
    finally:
        con.close()
    probes = {h.probe_id for h in hits}
    assert "repeat_call_same_state" in probes, [h.probe_id for h in hits]
    assert {"repeated_failure", "check_rerun_unchanged_source"} & probes, [h.probe_id for h in hits]


def test_results_without_ids_answer_calls_without_ids_in_order() -> None:
    from pipeline.adapters import link_results
    from pipeline.adapters.contract import SourceEvent

    def ev(kind: str, line: int, **kw: Any) -> SourceEvent:
        return SourceEvent(kind=kind, source_path="raw/a.traj", line_start=line, line_end=line, **kw)

    events = [
        ev("message", 1),
        ev("tool_call", 2, json_pointer="/trajectory/0"),
        ev("tool_call", 3, json_pointer="/trajectory/1"),
        ev("tool_result", 4),
        ev("error", 5, detail="tool_error"),
        ev("tool_call", 6),
        ev("message", 7),  # a new turn: the call of line 6 stays unanswered
        ev("tool_result", 8),
        ev("tool_call", 9, call_id="own"),
        ev("tool_result", 10, call_id="own"),
    ]
    out = link_results(events)
    ids = [e.call_id for e in out]
    assert ids[1] == ids[3] == "raw/a.traj#L2/trajectory/0"
    assert ids[2] == ids[4] == "raw/a.traj#L3/trajectory/1"
    assert ids[5] is None and ids[7] is None
    assert ids[8] == ids[9] == "own"  # a source's own ids are kept


def test_zero_gain_probe_fires_on_swe_agent_trajectories(tmp_path: Path) -> None:
    """SWE-agent writes no call ids: results now answer their calls, so a re-submitted wrong flag is seen."""
    from tests.adapters.adapter_helpers import SHARED_DATA, need_shared_data

    need_shared_data()
    src = SHARED_DATA / "swe-agent-trajectories/trajectories/demonstrations/ctf/crypto/eps.traj"
    import_bundle("swe-agent", src, tmp_path / "b")
    export(tmp_path / "b", tmp_path / "runs" / "r")
    con = duckdb.connect(str(tmp_path / "runs" / "r" / "ir.duckdb"))
    try:
        hits = [h for h in run_probes(con) if h.probe_id == "identical_result"]
    finally:
        con.close()
    assert hits and "submit" in hits[0].explanation
