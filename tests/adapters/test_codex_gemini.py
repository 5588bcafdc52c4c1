"""Codex CLI and Gemini CLI adapters on real public samples (tests/fixtures/foreign/{codex,gemini-cli})."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from pipeline.adapters import import_bundle, judge
from pipeline.core.errors import BadInput
from pipeline.ir.export import export
from tests.adapters.adapter_helpers import FOREIGN_FIXTURES, check_refs, events_of, source_blocks

CODEX = FOREIGN_FIXTURES / "codex"
GEMINI = FOREIGN_FIXTURES / "gemini-cli"
CLAUDE_LINES = [
    {"type": "system", "subtype": "init", "session_id": "cc-1", "tools": ["Bash"], "model": "m"},
    {"type": "assistant", "session_id": "cc-1", "message": {"role": "assistant", "content": "done"}},
]


def _run(src: Path, tmp: Path, fmt: str = "auto") -> tuple[Path, list[dict[str, Any]], Any]:
    bundle = tmp / "bundle"
    result = import_bundle(fmt, src, bundle)
    run = tmp / "runs" / "r"
    export(bundle, run)
    return bundle, events_of(run), result


def _outcomes(bundle: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (bundle / "sidecar/outcomes.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(("src", "fmt", "cells"), [(CODEX, "codex", 5), (GEMINI, "gemini-cli", 8)])
def test_samples_import_with_every_ref_resolving(src: Path, fmt: str, cells: int, tmp_path: Path) -> None:
    bundle, events, result = _run(src, tmp_path)
    assert result.format == fmt and result.cells == cells
    ok, bad = check_refs(bundle, events)
    assert bad == [] and ok == len(events) > 0
    steps: dict[str, set[int]] = {}
    for e in events:
        steps.setdefault(e["cell_id"], set()).add(e["step_index"])
    for cell, block in source_blocks(bundle).items():
        assert len(steps[cell]) == block["source_steps"], cell  # every record of the source is a step
    # README and LICENSE files are skipped with the true reason, not another format's
    reasons = dict(result.skipped)
    assert all(r.startswith("format not recognised") for p, r in reasons.items() if p.endswith(("LICENSE", ".md")))


def test_codex_old_and_new_line_shapes_give_typed_events(tmp_path: Path) -> None:
    _, events, _ = _run(CODEX / "ai-sessions", tmp_path)
    by_cell: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        by_cell.setdefault(e["cell_id"], []).append(e)
    kinds = {c: [(e["kind"], e["tool_name"]) for e in evs] for c, evs in by_cell.items()}
    legacy = next(k for k in kinds.values() if ("tool_call", "Write") in k)  # the header/record_type shape
    assert ("tool_result", None) in legacy and ("message", None) in legacy
    shells = [e for e in events if e["kind"] == "tool_call" and e["detail"] == "shell"]
    assert shells  # the newer shape's shell call: named after its command, argv unwrapped
    assert all(e["tool_name"] != "shell" and not e["text"].startswith("shell ['") for e in shells)


def _codex_lines(tmp: Path, lines: list[dict[str, Any]]) -> Path:
    src = tmp / "src"
    src.mkdir()
    meta = {"timestamp": "2026-01-01T00:00:00Z", "type": "session_meta",
            "payload": {"id": "s-1", "cwd": "/w", "cli_version": "0.99.0"}}  # fmt: skip
    body = [meta, *lines]
    (src / "rollout-2026-01-01T00-00-00-s-1.jsonl").write_text("".join(json.dumps(x) + "\n" for x in body))
    return src


def _item(ts: str, payload: dict[str, Any], top: str = "response_item") -> dict[str, Any]:
    return {"timestamp": ts, "type": top, "payload": payload}


def test_codex_exit_codes_decide_error_and_unknown_lines_are_other(tmp_path: Path) -> None:
    """Lines written here (no public sample holds exec_command_end): exit codes and version drift."""
    cmd = json.dumps({"command": ["bash", "-lc", "# run the tests\npytest -q"]})
    cmd2 = json.dumps({"command": ["bash", "-lc", "pytest  -q"]})  # the same command, no comment
    lines = [
        _item("2026-01-01T00:00:01Z", {"type": "function_call", "name": "shell", "arguments": cmd, "call_id": "c1"}),
        _item("2026-01-01T00:00:02Z", {"type": "function_call_output", "call_id": "c1", "output": "1 failed"}),
        _item(
            "2026-01-01T00:00:02Z",
            {"type": "exec_command_end", "call_id": "c1", "exit_code": 1, "aggregated_output": "1 failed"},
            "event_msg",
        ),
        _item("2026-01-01T00:00:03Z", {"type": "function_call", "name": "shell", "arguments": cmd2, "call_id": "c2"}),
        _item(
            "2026-01-01T00:00:04Z",
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": json.dumps({"output": "ok", "metadata": {"exit_code": 0}}),
            },
        ),
        _item("2026-01-01T00:00:05Z", {"type": "brand_new_event", "x": 1}, "event_msg"),
        _item("2026-01-01T00:00:06Z", {"type": "hologram", "y": 2}),
        _item(
            "2026-01-01T00:00:07Z",
            {"type": "token_count", "info": {"total_token_usage": {"total_tokens": 99}}},
            "event_msg",
        ),
    ]
    bundle, events, result = _run(_codex_lines(tmp_path, lines), tmp_path)
    results = {e["call_id"]: e for e in events if e["kind"] in ("tool_result", "error") and e["call_id"]}
    assert results["c1"]["kind"] == "error" and results["c1"]["detail"] == "exit_code=1"  # from exec_command_end
    assert results["c2"]["kind"] == "tool_result" and results["c2"]["detail"] == "exit_code=0"
    calls = [e for e in events if e["kind"] == "tool_call"]
    assert [e["text"] for e in calls] == ["shell # run the tests\npytest -q", "shell pytest  -q"]
    assert [e["tool_name"] for e in calls] == ["pytest", "pytest"]  # never "#", never "bash"
    assert calls[0]["args_digest"] == calls[1]["args_digest"]  # the same commands digest equally
    drift = [e for e in events if (e["detail"] or "").startswith("unknown:")]
    assert {e["detail"] for e in drift} == {"unknown:event_msg/brand_new_event", "unknown:response_item/hologram"}
    assert all(e["kind"] == "other" for e in drift)
    assert len(result.warnings) == 1 and "2 line(s) of types this adapter does not know" in result.warnings[0][1]
    (out,) = _outcomes(bundle)
    assert out["total_token_usage"] == {"total_tokens": 99} and out["label"] is None
    assert all("total_tokens" not in (e["text"] or "") for e in events if e["kind"] != "other")


def test_gemini_tool_error_status_is_an_error_event(tmp_path: Path) -> None:
    _, events, _ = _run(GEMINI / "agent-history" / "gemini_with_tool_error.jsonl", tmp_path)
    errs = [e for e in events if e["kind"] == "error"]
    assert errs and all(e["call_id"] for e in errs)
    calls = {e["call_id"] for e in events if e["kind"] == "tool_call"}
    assert {e["call_id"] for e in errs} <= calls


def test_gemini_unknown_message_type_is_other_with_one_warning(tmp_path: Path) -> None:
    doc = json.loads((GEMINI / "agent-history" / "gemini_golden.json").read_text())
    doc["messages"].append({"id": "x1", "timestamp": "2025-01-05T14:01:00.000Z", "type": "hologram", "content": "?"})
    src = tmp_path / "session-x.json"
    src.write_text(json.dumps(doc, indent=2))
    _, events, result = _run(src, tmp_path)
    assert [e["detail"] for e in events if e["kind"] == "other"] == ["unknown:hologram"]
    assert len(result.warnings) == 1 and "hologram x1" in result.warnings[0][1]


def test_a_folder_of_several_tools_gives_one_cell_per_session_each_by_its_adapter(tmp_path: Path) -> None:
    src = tmp_path / "mixed"
    shutil.copytree(CODEX / "agent-history", src / "codex")
    shutil.copytree(GEMINI / "ai-sessions", src / "gemini")
    (src / "cc").mkdir()
    (src / "cc" / "stream.jsonl").write_text("".join(json.dumps(x) + "\n" for x in CLAUDE_LINES))
    bundle, events, result = _run(src, tmp_path)
    assert result.format == "mixed" and result.formats == ["claude-code", "codex", "gemini-cli"]
    blocks = source_blocks(bundle)
    by_adapter = {b["path"].split("/")[1]: set() for b in blocks.values()}
    for b in blocks.values():
        by_adapter[b["path"].split("/")[1]].add(b["adapter"])
    assert by_adapter == {"codex": {"codex"}, "gemini": {"gemini-cli"}, "cc": {"claude-code"}}
    assert result.cells == 3 + 3 + 1
    ok, bad = check_refs(bundle, events)
    assert bad == [] and ok == len(events)
    # no Codex rollout is skipped, and nothing is called "not a JSON file"
    assert not [p for p, r in result.skipped if p.endswith(".jsonl")]
    assert not [r for _, r in result.skipped if "not a JSON file" in r]


def test_a_codex_rollout_is_never_taken_for_claude_code() -> None:
    for p in sorted(CODEX.rglob("*.jsonl")):
        v = judge(p, p.name)
        assert v.name == "codex", (p, v.scores[:3])
        assert dict((n, s) for n, s, _ in v.scores)["claude-code"] < 0.5


def test_named_claude_code_on_a_codex_folder_is_one_line_and_nothing_left(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="no claude-code runs found") as err:
        import_bundle("claude-code", CODEX / "agent-history", tmp_path / "b")
    assert "the files look like codex (3 files)" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "b").exists() and not list(tmp_path.glob(".b.*"))


def test_gemini_jsonl_upserts_set_and_rewind(tmp_path: Path) -> None:
    """Lines written here in the shape of the CLI's append-only recording (upserts by id, $set, $rewindTo)."""
    lines = [
        {"sessionId": "g-1", "projectHash": "ab" * 32, "startTime": "2026-01-01T00:00:00Z", "messages": []},
        {"id": "m1", "timestamp": "2026-01-01T00:00:01Z", "type": "user", "content": "list files"},
        {"id": "m2", "timestamp": "2026-01-01T00:00:02Z", "type": "gemini", "content": "",
         "toolCalls": [{"id": "t1", "name": "run_shell_command", "args": {"command": "ls"}, "status": "executing"}]},
        {"id": "m2", "timestamp": "2026-01-01T00:00:02Z", "type": "gemini", "content": "",
         "toolCalls": [{"id": "t1", "name": "run_shell_command", "args": {"command": "ls"}, "status": "success",
                        "result": [{"functionResponse": {"id": "t1", "name": "run_shell_command",
                                    "response": {"output": "Output: a.txt\nExit Code: 0"}}}]}]},
        {"$set": {"summary": "listing"}},
        {"$rewindTo": "m2"},
    ]  # fmt: skip
    src = tmp_path / "session-2026-01-01T00-00-g1.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    bundle, events, result = _run(src, tmp_path)
    assert result.format == "gemini-cli" and result.warnings == []
    details = [(e["kind"], e["detail"]) for e in events]
    assert ("other", "superseded by line 4") in details  # the first version of m2
    assert ("state_change", "rewind") in details and ("other", "set_metadata") in details
    calls = [e for e in events if e["kind"] == "tool_call"]
    assert len(calls) == 1 and calls[0]["tool_name"] == "ls" and calls[0]["detail"] == "run_shell_command"
    ok, bad = check_refs(bundle, events)
    assert bad == [] and ok == len(events)


def test_a_session_meta_line_longer_than_the_sniffed_head_is_still_codex(tmp_path: Path) -> None:
    meta = {"timestamp": "2026-06-05T04:58:20.653Z", "type": "session_meta",
            "payload": {"id": "s", "cli_version": "0.135.0", "base_instructions": {"text": "x" * 60000}}}  # fmt: skip
    f = tmp_path / "rollout-s.jsonl"
    f.write_text(json.dumps(meta, separators=(",", ":")) + "\n")
    assert judge(f, f.name).name == "codex"


def test_codex_exec_json_stream(tmp_path: Path) -> None:
    """`codex exec --json` output, lines written here in the shape the CLI prints (0.14x)."""
    lines = [
        {"type": "thread.started", "thread_id": "019f96b7-e404-7673-8853-2938007f2629"},
        {"type": "turn.started"},
        {"type": "item.completed", "item": {"id": "item_0", "type": "reasoning", "text": "**Checking the tests**"}},
        {"type": "item.started", "item": {"id": "item_1", "type": "command_execution",
                                          "command": "bash -lc 'pytest -q'", "status": "in_progress"}},
        {"type": "item.completed", "item": {"id": "item_1", "type": "command_execution",
                                            "command": ["bash", "-lc", "pytest -q"], "aggregated_output": "1 failed",
                                            "exit_code": 1, "status": "failed"}},
        {"type": "item.completed", "item": {"id": "item_2", "type": "hologram", "x": 1}},
        {"type": "item.completed", "item": {"id": "item_3", "type": "agent_message", "text": "One test fails."}},
        {"type": "turn.completed", "usage": {"input_tokens": 16668, "cached_input_tokens": 13056, "output_tokens": 5}},
    ]  # fmt: skip
    src = tmp_path / "codex-exec.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert judge(src, src.name).name == "codex"
    bundle, events, result = _run(src, tmp_path)
    kinds = [(e["kind"], e["tool_name"], e["detail"]) for e in events]
    assert ("tool_call", "pytest", "command_execution") in kinds and ("error", None, "exit_code=1") in kinds
    assert ("message", None, "thinking") in kinds and ("other", None, "unknown:item/hologram") in kinds
    assert len(result.warnings) == 1 and "item/hologram x1" in result.warnings[0][1]
    (out,) = _outcomes(bundle)
    assert out["total_token_usage"]["input_tokens"] == 16668
    ok, bad = check_refs(bundle, events)
    assert bad == [] and ok == len(events)
