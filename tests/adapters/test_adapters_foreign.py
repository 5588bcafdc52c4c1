"""Formats from sources lunasol was not tuned to: mini-SWE-agent, OpenHands V1, detection that never guesses.

The samples are small files written for these tests (tests/fixtures/foreign/), shaped after each
project's documented format; no third-party file is copied.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.adapters import detect, import_bundle
from pipeline.adapters.spans import resolve_element
from pipeline.cli.app import app
from pipeline.core.errors import BadInput
from pipeline.ir.export import export
from tests.adapters.adapter_helpers import check_refs, events_of

FIX = Path(__file__).parent.parent / "fixtures" / "foreign"


def _run(fmt: str, src: Path, tmp: Path) -> tuple[Path, list[dict[str, object]]]:
    bundle = tmp / "bundle"
    import_bundle(fmt, src, bundle)
    rep = export(bundle, tmp / "runs" / "r")
    events = events_of(rep.run_dir)
    ok, bad = check_refs(bundle, events)
    assert bad == [] and ok == len(events) > 0
    return bundle, events


def _ref_text(bundle: Path, e: dict[str, object]) -> str:
    raw = (bundle / str(e["source_path"])).read_bytes()
    return resolve_element(raw, int(e["line_start"]), int(e["line_end"]), e["json_pointer"])  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["timeparse-1.traj.json", "emptyconfig-2.traj.json", "messages-only.json"])
def test_mini_swe_agent_detected_by_content(name: str, tmp_path: Path) -> None:
    src = tmp_path / "renamed.json"  # the name says nothing: detection reads the content
    shutil.copyfile(FIX / "mini-swe-agent" / name, src)
    assert detect(src) == "mini-swe-agent"
    assert detect(FIX / "mini-swe-agent") == "mini-swe-agent"


def test_mini_swe_agent_actions_from_text_with_exact_refs(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    shutil.copyfile(FIX / "mini-swe-agent" / "timeparse-1.traj.json", src / "timeparse-1.traj.json")
    bundle, events = _run("auto", src, tmp_path)
    req = json.loads((bundle / "analysis-request.json").read_text())
    assert req["format"] == "mini-swe-agent" and req["parent_harness"] == "mini-SWE-agent 1.9.0"
    calls = [e for e in events if e["kind"] == "tool_call"]
    # 6 assistant turns with one block each, one turn with two blocks (rejected: no call)
    assert [c["tool_name"] for c in calls] == ["grep", "pytest", "pytest", "sed", "echo"]  # python -m pytest
    for c in calls:
        shown = _ref_text(bundle, c)
        assert shown.startswith("```bash") and shown.endswith("```") and str(c["text"]) in shown
        assert "#L" in str(c["json_pointer"])
    assert calls[1]["args_digest"] == calls[2]["args_digest"]  # the same pytest command twice
    results = [e for e in events if e["kind"] in ("tool_result", "error") and e["actor"] == "environment"]
    assert [r["kind"] for r in results] == ["tool_result", "error", "error", "tool_result"]
    by_call = {c["call_id"]: c for c in calls}
    assert all(r["call_id"] in by_call and by_call[r["call_id"]]["step_index"] == r["step_index"] - 1 for r in results)
    fmt_err = [e for e in events if e["detail"] == "format_error"]
    assert len(fmt_err) == 1 and fmt_err[0]["kind"] == "error" and fmt_err[0]["actor"] == "harness"
    outcome = json.loads((bundle / "sidecar/outcomes.jsonl").read_text().splitlines()[0])
    assert outcome["exit_status"] == "Submitted" and outcome["cost"] == 0.0421 and outcome["label"] is None
    assert "diff --git a/timeparse.py" not in "\n".join(str(e["text"]) for e in events)  # the submission is a label
    fired = {h.probe_id for h in _probe_hits(tmp_path / "runs" / "r")}  # type: ignore[attr-defined]
    assert {"check_rerun_unchanged_source", "repeated_failure"} <= fired  # the same failing test run twice


def test_mini_swe_agent_v2_tool_calls_and_limit(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    shutil.copyfile(FIX / "mini-swe-agent" / "emptyconfig-2.traj.json", src / "x.traj.json")
    _, events = _run("mini-swe-agent", src, tmp_path)
    calls = [e for e in events if e["kind"] == "tool_call"]
    assert [(c["tool_name"], c["call_id"]) for c in calls] == [("cat", "call_01"), ("python", "call_02")]
    errors = [e for e in events if e["kind"] == "error"]
    assert [e["call_id"] for e in errors if e["actor"] == "environment"] == ["call_02"]  # <exception>, returncode 1
    assert any(e["detail"] == "LimitsExceeded" and e["actor"] == "harness" for e in errors)


def test_swe_agent_format_points_at_mini_swe_agent(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    shutil.copyfile(FIX / "mini-swe-agent" / "timeparse-1.traj.json", src / "timeparse-1.traj.json")
    with pytest.raises(BadInput, match="format mini-swe-agent"):
        import_bundle("swe-agent", src, tmp_path / "b")


def test_a_plain_message_list_is_not_guessed(tmp_path: Path) -> None:
    src = tmp_path / "chat.json"
    msgs = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "Hi! How can I help?"}] * 14
    src.write_text(json.dumps(msgs))
    with pytest.raises(BadInput, match="cannot tell the format"):
        detect(src)
    res = CliRunner().invoke(app, ["bundle", "import", "auto", str(src), str(tmp_path / "b")])
    assert res.exit_code == 2 and "name it" in res.output and not (tmp_path / "b").exists()


def test_openhands_v1_event_files_folder(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(FIX / "openhands-v1", src)
    assert detect(src) == "openhands"
    bundle, events = _run("auto", src, tmp_path)
    req = json.loads((bundle / "analysis-request.json").read_text())
    assert req["parent_harness"] == "OpenHands V1" and len(req["cells"]) == 3
    folder = [e for e in events if e["cell_id"] == "C001"]  # cells in raw-path order: the folder first
    assert len(folder) == 12 and len({e["source_path"] for e in folder}) == 12  # one file, one event
    assert [e["step_index"] for e in folder] == list(range(12))
    calls = [e for e in folder if e["kind"] == "tool_call"]
    assert [(c["tool_name"], c["call_id"]) for c in calls] == [
        ("terminal", "toolu_01"),
        ("file_editor", "toolu_02"),
        ("terminal", "toolu_03"),
    ]
    assert calls[0]["args_digest"] == calls[2]["args_digest"] and calls[1]["target"] == "/workspace/proj/slugify.py"
    results = {e["call_id"]: e for e in folder if e["kind"] in ("tool_result", "error") and e["call_id"]}
    assert results["toolu_01"]["kind"] == "error" and results["toolu_02"]["kind"] == "tool_result"
    assert results["toolu_01"]["result_digest"] == results["toolu_03"]["result_digest"]
    details = {e["detail"]: e["kind"] for e in folder}
    assert details["agent_error"] == "error" and details["iteration_limit"] == "error"
    assert details["execution_status"] in ("state_change", "error")
    assert any("maximum iterations reached" in str(e["text"]) for e in folder)  # the step-cap check reads this
    jsonl = [e for e in events if e["source_path"].endswith("export.jsonl")]
    assert [e["line_start"] for e in jsonl] == [1, 2, 3, 4, 5]
    search = [e for e in events if e["source_path"].endswith("search-answer.json")]
    assert search[-1]["detail"] == "finish" and search[-1]["kind"] == "message"
    assert all(str(e["json_pointer"]).startswith("/items/") for e in search)


def _probe_hits(run: Path) -> list[object]:
    import duckdb

    from pipeline.probes import run_probes

    con = duckdb.connect(str(run / "ir.duckdb"))
    try:
        return list(run_probes(con))
    finally:
        con.close()


def test_chat_messages_yield_calls_results_and_errors(tmp_path: Path) -> None:
    from pipeline.eval import evaluate

    src = tmp_path / "src"
    shutil.copytree(FIX / "who-and-when", src)
    bundle, events = _run("auto", src, tmp_path)
    by_cell: dict[str, list[dict[str, object]]] = {}
    for e in events:
        by_cell.setdefault(str(e["cell_id"]), []).append(e)
    ag2, mag = by_cell["C001"], by_cell["C002"]  # raw-path order: ag2-like.json, magentic-like.json
    # Magentic-One: the message events stay (the ComputerTerminal reply is its tool result)
    assert sum(1 for e in mag if e["kind"] == "message") == 13
    calls = [(e["step_index"], e["tool_name"]) for e in mag if e["kind"] == "tool_call"]
    assert calls == [(3, "web_search"), (5, "web_search"), (7, "web_click"), (10, "python")]
    c3, c5 = (e for e in mag if e["kind"] == "tool_call" and e["tool_name"] == "web_search")
    assert c3["args_digest"] == c5["args_digest"]
    assert _ref_text(bundle, c3) == "I typed 'Lakeside library history second branch' into the browser search bar."
    results = {e["step_index"]: e for e in mag if e["kind"] in ("tool_result", "error") and e["call_id"]}
    assert results[3]["kind"] == results[5]["kind"] == "tool_result"
    assert results[3]["result_digest"] == results[5]["result_digest"]
    assert results[7]["kind"] == "error"  # an Error 404 page
    py = next(e for e in mag if e["tool_name"] == "python" and e["kind"] == "tool_call")
    assert results[12]["kind"] == "error" and results[12]["call_id"] == py["call_id"]  # exit code 1
    assert _ref_text(bundle, py) == "```python\nprint(open('about.html').read()[:100])\n```"
    tb = next(e for e in mag if e["detail"] == "harness_traceback")
    shown = _ref_text(bundle, tb)
    assert shown.startswith("Error processing publish message") and shown.endswith("page load timed out")
    said = next(e for e in mag if e["detail"] == "reported_failure")
    assert said["step_index"] == 8 and _ref_text(bundle, said).startswith("We cannot access")
    # AG2: the same failing script twice
    a_calls = [e for e in ag2 if e["kind"] == "tool_call"]
    a_errs = [e for e in ag2 if e["kind"] == "error" and e["call_id"]]
    assert [e["step_index"] for e in a_calls] == [1, 3] and a_calls[0]["args_digest"] == a_calls[1]["args_digest"]
    assert [e["call_id"] for e in a_errs] == [e["call_id"] for e in a_calls]
    assert any(e["detail"] == "reported_failure" and e["step_index"] == 5 for e in ag2)
    # the deterministic layer now fires on these logs
    fired = {(h.cell_id, h.probe_id) for h in _probe_hits(tmp_path / "runs" / "r")}  # type: ignore[attr-defined]
    assert {("C002", "repeat_call_same_state"), ("C002", "identical_result"), ("C001", "repeated_failure")} <= fired
    rep = evaluate(tmp_path / "runs" / "r", "who-and-when")
    first = rep["sources"]["baseline_first_error"]
    assert first["predicted"] == 2  # AG2: step 2 (label 1, ±1); Magentic: step 7 (label 5, ±3)
    assert (first["exact"], first["within_1"], first["within_3"]) == (0, 1, 2)


def test_mast_text_trace_gets_calls_results_and_errors(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(FIX / "mast", src)
    bundle, events = _run("mast", src, tmp_path)
    call = next(e for e in events if e["kind"] == "tool_call")
    assert call["tool_name"] == "python" and _ref_text(bundle, call) == "```python\nprint(17 * 23\n```"
    said = next(e for e in events if e["detail"] == "reported_failure")
    assert _ref_text(bundle, said) == "I could not run the code; the answer is 391."
    turns = [
        e for e in events if "#L" in str(e["json_pointer"]) and e["detail"] not in ("code_block", "reported_failure")
    ]
    assert any(e["kind"] == "error" and "exitcode: 1" in str(e["text"]) for e in turns)  # the executor's turn
