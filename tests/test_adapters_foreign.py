"""Formats from sources lunasol was not tuned to: mini-SWE-agent, OpenHands V1, detection that never guesses.

The samples are small files written for these tests (tests/fixtures/foreign/), shaped after each
project's documented format; no third-party file is copied.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from adapter_helpers import check_refs, events_of
from typer.testing import CliRunner

from pipeline.adapters import detect, import_bundle
from pipeline.adapters.spans import resolve_element
from pipeline.cli.app import app
from pipeline.errors import BadInput
from pipeline.ir.export import export

FIX = Path(__file__).parent / "fixtures" / "foreign"


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
    assert [c["tool_name"] for c in calls] == ["grep", "python", "python", "sed", "echo"]
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
