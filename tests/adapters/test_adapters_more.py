"""OpenTelemetry GenAI traces, GitHub Copilot CLI, OpenCode and Aider: real samples in, typed events out.

The samples and where each comes from: tests/fixtures/foreign/<format>/README.md.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.adapters import aider, copilot_cli, detect, import_bundle, opencode, otel, sniff_file
from pipeline.cli.app import app
from pipeline.ir.export import export
from tests.adapters.adapter_helpers import SUBSETS, check_refs, events_of
from tests.conftest import SHARED_DATA

FIX = Path(__file__).parent.parent / "fixtures" / "foreign"
SAMPLE_SUFFIXES = (".json", ".jsonl", ".md", ".txt")


def _samples(fmt: str, dest: Path) -> Path:
    """The format's sample files (not their README or recipe), keeping their relative paths."""
    root = FIX / fmt
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and p.name not in ("README.md", "script.json") and p.suffix in SAMPLE_SUFFIXES:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(p, dest / rel)
    return dest


def _imported(fmt: str, tmp: Path, how: str | None = None) -> tuple[Path, list[dict[str, object]], dict[str, object]]:
    src = _samples(fmt, tmp / "src")
    bundle = tmp / "bundle"
    import_bundle(how or fmt, src, bundle)
    rep = export(bundle, tmp / "runs" / "r")
    events = events_of(rep.run_dir)
    ok, bad = check_refs(bundle, events)
    assert bad == [] and ok == len(events) > 0
    return bundle, events, json.loads((bundle / "analysis-request.json").read_text())


def _cell(events: list[dict[str, object]], bundle: Path, path_suffix: str) -> list[dict[str, object]]:
    req = json.loads((bundle / "analysis-request.json").read_text())
    ids = [c for c, b in req["source"]["cells"].items() if str(b["path"]).endswith(path_suffix)]
    assert len(ids) == 1, (path_suffix, ids)
    return [e for e in events if e["cell_id"] == ids[0]]


# --- OpenTelemetry GenAI -------------------------------------------------------------------------


def test_otel_each_trace_is_a_cell_with_typed_events_and_resolving_refs(tmp_path: Path) -> None:
    bundle, events, req = _imported("otel-genai", tmp_path, "auto")
    assert req["format"] == "otel-genai"
    # contrib agents-v2 (1 trace), OpenInference agents (1), console dump (2), OTLP example (1), synthetic (1)
    assert len(req["cells"]) == 6
    for name in ("contrib-openai-agents-v2.spans.jsonl", "openinference-agents.otlp.json"):
        cell = _cell(events, bundle, name)
        calls = [e for e in cell if e["kind"] == "tool_call"]
        assert [c["tool_name"] for c in calls] == ["run_shell", "run_shell", "run_shell"]
        assert calls[0]["args_digest"] == calls[1]["args_digest"] != calls[2]["args_digest"]  # pytest twice, then rm
        outs = [e for e in cell if e["actor"] == "environment"]
        assert [o["kind"] for o in outs] == ["tool_result", "tool_result", "error"]
        assert "1 failed" in str(outs[0]["text"]) and outs[2]["detail"] == "tool_error"
        assert {"triage", "fixer"} <= {str(e["actor"]) for e in cell}  # agent names are the actors
        hand = [(e["actor"], e["target"]) for e in cell if e["kind"] == "handoff"]
        assert ("triage", "fixer") in hand
        said = [e["text"] for e in cell if e["kind"] == "message" and e["actor"] == "user"]
        assert said == ["The test suite fails; find out why."]  # repeated chat inputs are said once
        finals = [e for e in cell if e["kind"] == "message" and "off by one day" in str(e["text"])]
        assert len(finals) == 1 and finals[0]["actor"] == "fixer"
        assert all(e["ts"] for e in cell) and [e["ts"] for e in cell] == sorted(str(e["ts"]) for e in cell)
    console = _cell(events, bundle, "otlp-proto-example.trace.json")
    assert [e["kind"] for e in console] == ["other"]  # a span of no GenAI kind is kept, never dropped


def test_otel_span_tree_and_outcomes_are_kept_out_of_events(tmp_path: Path) -> None:
    bundle, events, req = _imported("otel-genai", tmp_path)
    block = next(b for b in req["source"]["cells"].values() if b["path"].endswith("otlp.jsonl"))
    spans = block["selector"]["spans"]
    assert [s[2] for s in spans] == ["invoke_agent lister", "openai.chat", "execute_tool shell"]
    assert spans[1][1] == spans[0][0] and spans[2][1] == spans[0][0]  # parent ids: the tree
    cell = _cell(events, bundle, "synthetic-collector-file.otlp.jsonl")
    assert [(e["kind"], e["step_index"]) for e in cell] == [
        ("other", 0),
        ("message", 1),
        ("message", 1),
        ("tool_call", 2),
        ("error", 2),
        ("error", 0),
    ]
    assert "PermissionError" in str(cell[4]["text"]) and cell[5]["detail"] == "span_error:invoke_agent"
    rows = [json.loads(x) for x in (bundle / "sidecar/outcomes.jsonl").read_text().splitlines()]
    synthetic = next(r for r in rows if r["root_status"] == "ERROR")
    assert synthetic["root_status_message"] == "agent gave up" and synthetic["error_spans"] == 2
    warnings = [w["warning"] for w in req["source"]["warnings"]]
    assert any("1 line(s) are not spans" in w for w in warnings)  # the cut-off line is counted, not fatal


def test_otel_console_dump_refs_are_line_ranges_of_each_span(tmp_path: Path) -> None:
    _, events, _ = _imported("otel-genai", tmp_path)
    cells = {e["cell_id"] for e in events if str(e["source_path"]).endswith("console.out.json")}
    assert len(cells) == 2  # SYNC and ASYNC: two traces in one dump
    for e in events:
        if str(e["source_path"]).endswith("console.out.json"):
            assert e["json_pointer"] is None and e["line_end"] - e["line_start"] > 40  # the whole pretty span
    runner = CliRunner()
    e = next(e for e in events if e["kind"] == "message" and e["actor"] == "user")
    ref = f"{e['source_path']}#L{e['line_start']}-L{e['line_end']}{e['json_pointer'] or ''}"
    res = runner.invoke(app, ["show-ref", ref, "--run", str(tmp_path / "runs" / "r")])
    assert res.exit_code == 0, res.output
    assert "The test suite fails" in res.output or "Write a haiku" in res.output


@pytest.mark.parametrize(
    "name",
    [
        "openinference-openai-console.out.json",
        "otlp-proto-example.trace.json",
        "openinference-agents.otlp.json",
        "contrib-openai-agents-v2.spans.jsonl",
        "synthetic-collector-file.otlp.jsonl",
    ],
)
def test_otel_detected_by_content(name: str, tmp_path: Path) -> None:
    src = tmp_path / ("renamed" + Path(name).suffix)
    shutil.copyfile(FIX / "otel-genai" / name, src)
    assert detect(src) == "otel-genai"


# --- GitHub Copilot CLI --------------------------------------------------------------------------


def test_copilot_sessions_of_two_versions_typed_with_exit_codes(tmp_path: Path) -> None:
    bundle, events, req = _imported("copilot-cli", tmp_path, "auto")
    assert req["format"] == "copilot-cli" and len(req["cells"]) == 3
    assert req["parent_harness"] == "GitHub Copilot CLI 1.0.102 + GitHub Copilot CLI 1.0.34"
    for sid in ("15c6b921-b7e9-4879-b52f-dd57657a4394", "e9a36447-7d9e-4cfe-bd50-70eb066c93e5"):
        cell = _cell(events, bundle, f"{sid}/events.jsonl")
        calls = [e for e in cell if e["kind"] == "tool_call"]
        assert [c["tool_name"] for c in calls] == ["bash", "view", "bash", "edit", "bash"]
        assert calls[3]["target"] == "/tmp/cpwork/calc.py"
        outs = [e for e in cell if e["actor"] == "environment"]
        assert [o["call_id"] for o in outs] == [c["call_id"] for c in calls]  # every result joins its call
        assert [o["kind"] for o in outs] == ["tool_result", "error", "error", "tool_result", "tool_result"]
        assert outs[1]["detail"] == "tool_error" and outs[1]["text"] == "Path does not exist"
        assert outs[2]["detail"] == "tool_error exit_code=1"  # 1.0.34: read from the output's last line
        assert outs[4]["detail"] == "exit_code=0"
        assert all(e["session_id"] == sid and e["ts"] for e in cell)
        assert [e["text"] for e in cell if e["actor"] == "user"] == ["The add function in calc.py is wrong; fix it."]
    err = _cell(events, bundle, "49507bdf-126f-471b-bd09-e9ce227d3402/events.jsonl")
    assert [e["detail"] for e in err if e["kind"] == "error"] == ["session.error:query"]
    rows = {
        json.loads(x)["cell_id"]: json.loads(x) for x in (bundle / "sidecar/outcomes.jsonl").read_text().splitlines()
    }
    assert sorted(r["session_errors"] for r in rows.values()) == [0, 0, 1]
    assert all(r["code_changes"] is not None for r in rows.values())  # accounting is an outcome, not an event


def test_copilot_unknown_record_types_are_other_events_counted_once(tmp_path: Path) -> None:
    src = tmp_path / "src" / "s1"
    src.mkdir(parents=True)
    lines = (FIX / "copilot-cli/session-state/e9a36447-7d9e-4cfe-bd50-70eb066c93e5/events.jsonl").read_text()
    drift = json.dumps({"type": "assistant.telepathy", "data": {"x": 1}, "id": "z1", "parentId": None}) + "\n"
    (src / "events.jsonl").write_text(lines + drift + drift)
    bundle = tmp_path / "b"
    res = import_bundle("auto", tmp_path / "src", bundle)
    assert [w for _, w in res.warnings] == ["2 record(s) of unknown type read as other events (assistant.telepathy ×2)"]
    events = events_of(export(bundle, tmp_path / "runs" / "r").run_dir)
    drifted = [e for e in events if e["detail"] == "unknown:assistant.telepathy"]
    assert len(drifted) == 2 and all(e["kind"] == "other" for e in drifted)


# --- OpenCode ------------------------------------------------------------------------------------


def test_opencode_storage_trees_of_three_versions(tmp_path: Path) -> None:
    bundle, events, req = _imported("opencode", tmp_path, "auto")
    assert req["format"] == "opencode" and len(req["cells"]) == 3
    assert req["parent_harness"] == "OpenCode 0.5.29 + OpenCode 1.0.98 + OpenCode 1.1.34"
    full = _cell(events, bundle, "ses_db6044604ffepPonzDK5yAQ7ZV.json")
    calls = [e for e in full if e["kind"] == "tool_call"]
    assert [c["tool_name"] for c in calls] == ["bash", "read", "bash", "read", "edit", "bash"]
    outs = [e for e in full if e["actor"] == "environment"]
    assert [o["call_id"] for o in outs] == [c["call_id"] for c in calls]
    assert [(o["kind"], o["detail"]) for o in outs] == [
        ("tool_result", "exit_code=0"),
        ("error", "tool_error"),
        ("error", "tool_error exit_code=1"),
        ("tool_result", None),
        ("tool_result", None),
        ("tool_result", "exit_code=0"),
    ]
    assert outs[1]["text"] == "Error: File not found: /tmp/ocwork/missing.py"
    assert str(outs[1]["json_pointer"]) == "/state/error" and str(calls[4]["target"]) == "/tmp/ocwork/calc.py"
    assert [e["kind"] for e in full][:2] == ["other", "message"]  # the session, then the user's words
    assert [e["ts"] for e in full] == sorted(str(e["ts"]) for e in full) and all(e["ts"] for e in full)
    assert {e["actor"] for e in full if e["kind"] == "tool_call"} == {"assistant:build"}
    crashed = _cell(events, bundle, "ses_db603e3f6ffecj84G628DaUmC4.json")
    assert [e["kind"] for e in crashed if e["kind"] != "other"] == ["message", "message", "tool_call", "tool_result"]
    old = _cell(events, bundle, "ses_db602f9d2ffe7wPfhMCirVdNpd.json")  # 0.5 layout: session/info, part/<ses>/<msg>
    assert [e["kind"] for e in old] == ["other", "message"] and "calc.py" in str(old[1]["text"])
    rows = [json.loads(x) for x in (bundle / "sidecar/outcomes.jsonl").read_text().splitlines()]
    done = [r for r in rows if r["last_assistant_completed"]]
    assert len(done) == 1 and done[0]["diff_files"] == ["calc.py"] and done[0]["finish"][-1] == "stop"


# --- Aider ---------------------------------------------------------------------------------------


def test_aider_sessions_turns_edits_and_test_runs_with_line_refs(tmp_path: Path) -> None:
    bundle, events, req = _imported("aider", tmp_path, "auto")
    assert req["format"] == "aider"
    assert "Aider v0.47.2-dev" in req["parent_harness"] and "Aider v0.86.1" in req["parent_harness"]
    assert all(e["json_pointer"] is None for e in events)  # refs are line ranges of the markdown
    raw = {p: (bundle / p).read_text().split("\n") for p in {str(e["source_path"]) for e in events}}
    for e in events:
        cited = raw[str(e["source_path"])][int(e["line_start"]) - 1 : int(e["line_end"])]
        if e["kind"] == "message" and e["actor"] == "user":
            assert all(line.startswith("####") for line in cited)
        if e["kind"] == "tool_call" and e["tool_name"] == "edit":
            assert any(line.startswith("<<<<<<< ") for line in cited) and e["target"]
            assert any(line.startswith(">>>>>>> ") for line in cited)
    v47 = [e for e in events if "v0.47" in str(e["source_path"])]
    tests = [e for e in v47 if e["tool_name"] == "test"]
    assert [(t["kind"], t["actor"]) for t in tests] == [("tool_call", "user"), ("error", "environment")] * 2
    assert "1 failed, 6 passed" in str(tests[3]["text"])
    assert tests[0]["call_id"] == tests[1]["call_id"]
    edits = [e for e in v47 if e["tool_name"] == "edit"]
    assert {e["target"] for e in edits} >= {"aider/utils.py", "tests/basic/test_repomap.py"}
    assert any(e["kind"] == "error" and "InternalServerError" in str(e["text"]) for e in v47)
    undo = [e for e in v47 if e["kind"] == "state_change" and e["detail"] == "/undo"]
    assert len(undo) >= 3
    v48 = [e for e in events if "v0.48" in str(e["source_path"])]
    assert any(e["kind"] == "error" and e["detail"] == "edit_failed" for e in v48)  # SearchReplaceNoExactMatch
    assert all(not str(e["target"] or "").startswith("<source>") for e in v48)
    excluded = {x["cell_id"] for x in req["exclusions"]}
    assert excluded and all(
        not any(e["actor"] == "user" for e in events if e["cell_id"] == c) for c in excluded
    )  # a session with no user turn is excluded, not dropped
    rows = [json.loads(x) for x in (bundle / "sidecar/outcomes.jsonl").read_text().splitlines()]
    assert sum(r["edits_applied"] for r in rows) >= 15 and any(r["commits"] for r in rows)
    assert any(r["cost"] for r in rows)


@pytest.mark.parametrize("fmt", ["otel-genai", "copilot-cli", "opencode", "aider"])
def test_bad_input_is_one_line_exit_2_and_nothing_left(fmt: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "notes.json").write_text('{"hello": "world"}\n')
    dest = tmp_path / "out" / "bundle"
    res = CliRunner().invoke(app, ["bundle", "import", fmt, str(src), str(dest)])
    assert res.exit_code == 2
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in res.output, res.output
    assert not dest.exists() and not any((tmp_path / "out").iterdir())


# --- Detection: each sample is claimed by its own format only -----------------------------------

MINE = {"otel-genai": otel, "copilot-cli": copilot_cli, "opencode": opencode, "aider": aider}


def _sample_files(fmt: str) -> list[Path]:
    root = FIX / fmt
    return [
        p
        for p in sorted(root.rglob("*"))
        if p.is_file()
        and p.name not in ("README.md", "script.json", "make_samples.py", "app.json")
        and p.parent.name != "project"  # OpenCode's project metadata is not a session file
        and p.suffix in SAMPLE_SUFFIXES
    ]


def _head(p: Path) -> str:
    return p.read_bytes()[:32768].decode("utf-8", errors="replace")


@pytest.mark.parametrize("fmt", sorted(MINE))
def test_each_sample_is_sniffed_as_its_own_format(fmt: str) -> None:
    files = _sample_files(fmt)
    assert files
    for p in files:
        rel = p.relative_to(FIX / fmt).as_posix()
        assert sniff_file(p, rel) == fmt, rel
        scores = {name: mod.score(rel, _head(p))[0] for name, mod in MINE.items()}
        assert max(scores, key=lambda n: scores[n]) == fmt and scores[fmt] >= 0.5, (rel, scores)
        assert sorted(scores.values())[-2] <= scores[fmt] - 0.2, (rel, scores)  # a clear win


def test_no_other_format_is_claimed_by_these_adapters() -> None:
    others = [p for p in FIX.rglob("*") if p.is_file() and p.parent.name not in MINE]
    others = [p for p in others if not any(part in MINE for part in p.relative_to(FIX).parts)]
    if SHARED_DATA.is_dir():
        for fmt, (folder, files) in SUBSETS.items():
            if fmt in MINE:
                continue
            others += [SHARED_DATA / folder / f for f in files if (SHARED_DATA / folder / f).is_file()]
    assert len(others) >= 10
    for p in others:
        for name, mod in MINE.items():
            sc, why = mod.score(p.name, _head(p))
            assert sc < 0.5, (str(p), name, why)
