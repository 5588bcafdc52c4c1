"""Adapters on the shared public data: import -> verify -> export, refs, steps, labels kept out of events."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from pipeline.adapters import FORMATS, detect, import_bundle
from pipeline.bundle.manifest import verify
from pipeline.cli.app import app
from pipeline.core.canonical import sha256_file
from pipeline.core.errors import BadInput
from tests.adapters.adapter_helpers import (
    FOREIGN_FIXTURES,
    SHARED_DATA,
    SUBSETS,
    check_refs,
    events_of,
    imported,
    make_subset,
    need_shared_data,
    source_blocks,
)

FMTS = sorted(SUBSETS)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("adapters")


def _imported(fmt: str, base: Path) -> tuple[Path, Path, object]:
    need_shared_data()
    return imported(fmt, base / fmt)


def test_every_format_has_a_subset() -> None:
    assert set(FORMATS) == set(SUBSETS)


@pytest.mark.parametrize("fmt", FMTS)
def test_import_freezes_verbatim_copies(fmt: str, base: Path) -> None:
    bundle, _, result = _imported(fmt, base)
    assert verify(bundle).ok
    folder, files = SUBSETS[fmt]
    for rel in files:  # byte-for-byte: the raw copy hashes like the shared original
        assert sha256_file(bundle / "raw" / rel) == sha256_file(SHARED_DATA / folder / rel)
    req = json.loads((bundle / "analysis-request.json").read_text())
    assert req["format"] == fmt
    assert (req["parent_harness"] and req["parent_harness"] != fmt) or fmt in ("tau",)
    assert len(req["cells"]) == result.cells > 0  # type: ignore[attr-defined]
    outcomes = [json.loads(x) for x in (bundle / "sidecar/outcomes.jsonl").read_text().splitlines()]
    assert [o["cell_id"] for o in outcomes] == [c["cell_id"] for c in req["cells"]]


@pytest.mark.parametrize("fmt", FMTS)
def test_every_ref_resolves(fmt: str, base: Path) -> None:
    bundle, run, _ = _imported(fmt, base)
    events = events_of(run)
    ok, bad = check_refs(bundle, events)
    assert bad == []
    assert ok == len(events) > 0


@pytest.mark.parametrize("fmt", FMTS)
def test_step_counts_equal_the_source(fmt: str, base: Path) -> None:
    bundle, run, _ = _imported(fmt, base)
    blocks = source_blocks(bundle)
    steps: dict[str, set[tuple[str | None, int]]] = {}
    for e in events_of(run):
        if e["step_index"] is not None:
            steps.setdefault(e["cell_id"], set()).add((e["session_id"], e["step_index"]))
    excluded = {x["cell_id"] for x in json.loads((bundle / "analysis-request.json").read_text())["exclusions"]}
    for cell, block in blocks.items():
        if cell not in excluded:  # an excluded cell is not exported: it has no events to count
            assert len(steps.get(cell, set())) == block["source_steps"], cell


@pytest.mark.parametrize("fmt", FMTS)
def test_label_values_never_in_event_text(fmt: str, base: Path) -> None:
    _, run, result = _imported(fmt, base)
    texts: dict[str, str] = {}
    for e in events_of(run):
        texts[e["cell_id"]] = texts.get(e["cell_id"], "") + "\n" + (e["text"] or "")
    for cell, labels in result.label_texts.items():  # type: ignore[attr-defined]
        for value in labels:
            probe = value[:200]  # trimmed event text keeps heads: compare a head of the label
            assert probe not in texts.get(cell, ""), (cell, probe[:60])


def test_who_and_when_labels_checked_from_the_source(base: Path) -> None:
    # Independent of the adapter's own label list: read the labels straight from the JSON.
    bundle, run, _ = _imported("who-and-when", base)
    by_run = {c["cell_id"]: c["run_id"] for c in json.loads((bundle / "analysis-request.json").read_text())["cells"]}
    events = events_of(run)
    for cell, run_id in by_run.items():
        doc = json.loads((bundle / "raw" / f"{run_id.removeprefix('raw/')}.json").read_text())
        cell_text = "\n".join(e["text"] for e in events if e["cell_id"] == cell)
        assert doc["mistake_reason"][:120] not in cell_text
        steps = [e["step_index"] for e in events if e["cell_id"] == cell]
        # order and 0-based step index kept; events derived from a message's text share its step
        assert sorted(set(steps)) == list(range(len(doc["history"]))) and steps == sorted(steps)
        outcome = next(json.loads(x) for x in (bundle / "sidecar/outcomes.jsonl").read_text().splitlines() if cell in x)
        assert outcome["mistake_step"] == doc["mistake_step"] and outcome["mistake_agent"] == doc["mistake_agent"]


def test_who_and_when_pointer_spans_pretty_json(base: Path) -> None:
    bundle, run, _ = _imported("who-and-when", base)
    ev = next(e for e in events_of(run) if e["json_pointer"] == "/history/4" and "34" in e["source_path"])
    lines = (bundle / ev["source_path"]).read_text().split("\n")[ev["line_start"] - 1 : ev["line_end"]]
    assert lines[0].strip() == "{" and lines[-1].strip() in ("}", "},")
    assert ev["actor"] == "WebSurfer"


def test_tau_steps_are_one_based_index(base: Path) -> None:
    bundle, run, _ = _imported("tau", base)
    events = events_of(run)
    assert min(e["step_index"] for e in events) == 1
    calls = [e for e in events if e["kind"] == "tool_call"]
    assert calls and all(e["tool_name"] and e["args_digest"] for e in calls)
    assert all(e["result_digest"] for e in events if e["kind"] == "tool_result")
    assert source_blocks(bundle)["C001"]["step_index_base"] == 1


def test_inspect_eval_zip_members_and_tool_errors(base: Path) -> None:
    _, run, result = _imported("inspect", base)
    events = events_of(run)
    zipped = [e for e in events if e["source_path"].endswith(".eval")]
    assert zipped and all("!" in (e["json_pointer"] or "") for e in zipped)
    assert sum(1 for e in events if e["kind"] == "error") >= 10  # log_tool_call_error: 10 typed tool errors
    assert any("no samples" in why for _, why in result.skipped)  # type: ignore[attr-defined]


def test_claude_code_subagent_and_compaction(base: Path) -> None:
    bundle, run, _ = _imported("claude-code", base)
    events = events_of(run)
    assert any((e["actor"] or "").startswith("subagent:") for e in events)
    assert any(e["detail"] == "compact_boundary" and e["kind"] == "state_change" for e in events)
    assert any(e["detail"] == "compact_summary" for e in events)
    assert any(e["detail"] == "clear" for e in events)
    outcomes = [json.loads(x) for x in (bundle / "sidecar/outcomes.jsonl").read_text().splitlines()]
    assert any(o.get("verifier_reward") == 0.0 for o in outcomes)  # regex-log: verifier said 0


def test_openhands_step_cap_is_an_event(base: Path) -> None:
    _, run, _ = _imported("openhands", base)
    errors = [e for e in events_of(run) if e["kind"] == "error" and e["detail"] == "run_error"]
    assert any("maximum iteration" in e["text"] for e in errors)


def test_mast_turns_cover_every_line(base: Path) -> None:
    bundle, run, _ = _imported("mast", base)
    records = json.loads((bundle / "raw/MAD_human_labelled_dev.json").read_text())
    events = events_of(run)
    for i, rec in enumerate(records):
        if rec["trace"].lstrip().startswith("{"):
            continue  # JSON traces: turns are the trajectory's elements
        lines = rec["trace"].split("\n")
        covered: set[int] = set()
        for e in events:
            ptr = e["json_pointer"] or ""
            if ptr.startswith(f"/{i}/trace#L"):
                a, b = ptr.rsplit("#L", 1)[1].split("-L")
                covered.update(range(int(a), int(b) + 1))
        blank = {n for n, line in enumerate(lines, 1) if not line.strip()}
        uncovered = sorted(set(range(1, len(lines) + 1)) - covered - blank)
        if uncovered:  # only the evaluator's verdict trailer may stay out of the events
            assert lines[uncovered[0] - 1].strip() == "Evaluation", rec["mas_name"]
            assert uncovered == [n for n in range(uncovered[0], len(lines) + 1) if n not in blank]


def test_mast_evaluation_trailer_is_an_outcome(base: Path) -> None:
    bundle, run, _ = _imported("mast", base)
    outcomes = [json.loads(x) for x in (bundle / "sidecar/outcomes.jsonl").read_text().splitlines()]
    appworld = next(o for o in outcomes if o.get("mas_name") == "AppWorld")
    assert appworld["trace_labels"]["trace_evaluation"]["success"] is True
    text = "\n".join(e["text"] for e in events_of(run) if e["cell_id"] == appworld["cell_id"])
    assert "no_op_fail" not in text and "assert answers match" not in text


def test_mast_votes_go_to_the_sidecar(base: Path) -> None:
    bundle, run, _ = _imported("mast", base)
    outcomes = [json.loads(x) for x in (bundle / "sidecar/outcomes.jsonl").read_text().splitlines()]
    modes = outcomes[0]["failure_modes"]
    assert all(set(v) >= {"votes", "majority"} for v in modes.values())
    assert any(m.startswith("1.3 Step Repetition") for m in modes)  # mapped onto MAST-14 titles
    text = "\n".join(e["text"] for e in events_of(run))
    assert "annotator_1" not in text and "Poor task constraint compliance" not in text


@pytest.mark.parametrize(
    ("folder", "fmt"),
    [
        ("who-and-when", "who-and-when"),
        ("mast-mad-human", "mast"),
        ("swe-agent-trajectories", "swe-agent"),
        ("openhands-trajectories", "openhands"),
        ("inspect-ai-logs", "inspect"),
        ("claude-code-sessions", "claude-code"),
        ("atif-trajectories", "atif"),
        ("agentrx-examples/trajectories/tau-retail", "tau"),
        (str(FOREIGN_FIXTURES / "mini-swe-agent"), "mini-swe-agent"),
    ],
)
def test_auto_detect(folder: str, fmt: str) -> None:
    need_shared_data()
    assert detect(SHARED_DATA / folder) == fmt


@pytest.mark.parametrize(
    ("rel", "fmt"),
    [
        # labels after a history longer than the sniffed head; the Magentic-One team speaks in it
        ("who-and-when/Hand-Crafted/2.json", "who-and-when"),
        # "history" after a question of more than 400 characters
        ("who-and-when/Algorithm-Generated/1.json", "who-and-when"),
        # a benchmark record: patch and instruction first, the first event 45 KB in
        ("openhands-trajectories/evaluation/benchmarks/multi_swe_bench/examples/output.jsonl", "openhands"),
    ],
)
def test_auto_detects_a_run_whose_head_says_little(rel: str, fmt: str, tmp_path: Path) -> None:
    # Alone, or among logs of other formats: each file is sniffed by its own head.
    need_shared_data()
    assert detect(SHARED_DATA / rel) == fmt
    src = tmp_path / "src"
    (src / rel).parent.mkdir(parents=True)
    (src / rel).write_bytes((SHARED_DATA / rel).read_bytes())
    inspect_log = "inspect-ai-logs/tests/log/test_eval_log/log_message_deduplication.eval"
    (src / "inspect.eval").write_bytes((SHARED_DATA / inspect_log).read_bytes())
    result = import_bundle("auto", src, tmp_path / "b")
    assert result.formats == sorted({fmt, "inspect"}) and not result.skipped


def test_cli_import_auto_says_which_format(tmp_path: Path) -> None:
    need_shared_data()
    src = make_subset("atif", tmp_path / "src")
    res = CliRunner().invoke(app, ["bundle", "import", "auto", str(src), str(tmp_path / "b")])
    assert res.exit_code == 0, res.output
    assert "detected format: atif" in res.output


def test_cli_refuses_non_empty_dest(tmp_path: Path) -> None:
    need_shared_data()
    src = make_subset("tau", tmp_path / "src")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "x").write_text("keep")
    res = CliRunner().invoke(app, ["bundle", "import", "tau", str(src), str(dest)])
    assert res.exit_code == 2
    assert "not empty" in res.output
    assert sorted(p.name for p in dest.iterdir()) == ["x"]


def test_import_with_no_runs_leaves_nothing(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "notes.txt").write_text("hello\n")
    with pytest.raises(BadInput, match="no tau runs"):
        import_bundle("tau", src, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["src"]


def test_unknown_format_is_bad_input(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["bundle", "import", "nope", str(tmp_path), str(tmp_path / "d")])
    assert res.exit_code == 2
    assert "unknown format" in res.output


@pytest.mark.parametrize("fmt", FMTS)
def test_label_values_never_in_luna_prompts(fmt: str, base: Path) -> None:
    # What Luna is sent per cell: the rendered IR part plus task summary, run and task ids.
    stage = pytest.importorskip("pipeline.luna.stage")
    bundle, run, result = _imported(fmt, base)
    summaries = {
        t["task_id"]: t["summary"] for t in json.loads((bundle / "analysis-request.json").read_text())["tasks"]
    }
    con = duckdb.connect(str(run / "ir.duckdb"), read_only=True)
    try:
        prepared = stage.prepare(con)
    finally:
        con.close()
    assert prepared
    for cell, parts, _ in prepared:
        prompt = "\n".join(
            json.dumps(stage.part_context(cell, p, summaries.get(cell.task_id, "")), ensure_ascii=False) + p.text
            for p in parts
        )
        for value in result.label_texts.get(cell.cell_id, []):  # type: ignore[attr-defined]
            assert value[:200] not in prompt, (cell.cell_id, value[:60])
        assert "mistake_reason" not in prompt and "annotator_1" not in prompt


@pytest.mark.parametrize(("fmt", "base_index"), [("who-and-when", 0), ("tau", 1), ("atif", 1), ("swe-agent", 0)])
def test_step_index_base_reaches_the_ir(fmt: str, base_index: int, base: Path) -> None:
    _, run, _ = _imported(fmt, base)
    con = duckdb.connect(str(run / "ir.duckdb"), read_only=True)
    try:
        bases = {r[0] for r in con.execute("SELECT step_index_base FROM cells").fetchall()}
    finally:
        con.close()
    assert bases == {base_index}


@pytest.mark.parametrize("argv", [["bundle", "import", "--help"], ["eval", "--help"]])
def test_verbs_have_help(argv: list[str]) -> None:
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 0 and "Usage" in res.output


def test_dest_inside_src_is_refused(tmp_path: Path) -> None:
    need_shared_data()
    src = make_subset("tau", tmp_path / "src")
    res = CliRunner().invoke(app, ["bundle", "import", "tau", str(src), str(src / "bundle")])
    assert res.exit_code == 2 and "inside the source" in res.output
    assert not (src / "bundle").exists()
