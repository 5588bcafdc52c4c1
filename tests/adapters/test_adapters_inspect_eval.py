"""Inspect AI logs of the current version: zstd ``.eval`` members, limits, sample errors, every scorer.

tests/fixtures/foreign/inspect/mockllm-tools.eval was written by the real inspect_ai 0.3.285,
offline, with its mock model (make_eval.py beside it says how); inspect_ai is no test dependency.
"""

from __future__ import annotations

import json
import re
import shutil
import zipfile
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.adapters import detect, import_bundle
from pipeline.cli.app import app
from pipeline.core.zips import open_zip
from pipeline.eval.checks import STEP_CAP
from pipeline.ir.export import export
from pipeline.ir.refs import resolve_ref, show_ref
from pipeline.report.build import read_page_data, write_report
from tests.adapters.adapter_helpers import check_refs, events_of

LOG = Path(__file__).parent.parent / "fixtures" / "foreign" / "inspect" / "mockllm-tools.eval"


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[dict[str, object]]]:
    tmp = tmp_path_factory.mktemp("inspect-eval")
    (tmp / "src").mkdir()
    shutil.copyfile(LOG, tmp / "src" / LOG.name)
    bundle = tmp / "bundle"
    import_bundle("auto", tmp / "src", bundle)
    run = export(bundle, tmp / "runs" / "r").run_dir
    return bundle, run, events_of(run)


def _outcomes(bundle: Path) -> dict[str, dict[str, object]]:
    rows = [json.loads(x) for x in (bundle / "sidecar/outcomes.jsonl").read_text().splitlines()]
    return {str(r["cell_id"]): r for r in rows}


def test_the_fixture_is_zstd_throughout() -> None:
    # what stdlib zipfile (Python < 3.14) cannot read: every member is method 93
    with zipfile.ZipFile(LOG) as zf:
        assert {i.compress_type for i in zf.infolist()} == {93}
    with open_zip(LOG) as zf:
        assert json.loads(zf.read("header.json"))["eval"]["task"] == "mock-tools"


def test_zstd_eval_imports_and_every_ref_resolves(imported: tuple[Path, Path, list[dict[str, object]]]) -> None:
    bundle, run, events = imported
    assert detect(LOG) == "inspect"
    ok, bad = check_refs(bundle, events)
    assert bad == [] and ok == len(events) == 54
    kinds = Counter(str(e["kind"]) for e in events)
    assert kinds == {"message": 26, "tool_call": 14, "tool_result": 8, "error": 6}
    # the resolver of show-ref and the report reads the zstd member too
    call = next(e for e in events if e["kind"] == "tool_call" and e["tool_name"] == "add")
    ref = f"{call['source_path']}#L{call['line_start']}-L{call['line_end']}{call['json_pointer']}"
    view = resolve_ref(run, ref)
    assert view.element is not None and json.loads(view.element)["function"] == "add"


def test_sample_ids_whole_and_two_epochs(imported: tuple[Path, Path, list[dict[str, object]]]) -> None:
    bundle, _, _ = imported
    req = json.loads((bundle / "analysis-request.json").read_text())
    assert req["parent_harness"] == "Inspect AI (mock-tools)"  # not "mock-tools-calc" from rsplit("-")
    runs = sorted(c["run_id"] for c in req["cells"])
    assert [r.split("#", 1)[1] for r in runs] == sorted(
        f"{s}-epoch{n}" for s in ("calc-add-1", "fix-tests-2", "read-config-3", "deploy-4") for n in (1, 2)
    )
    tasks = {c["task_id"] for c in req["cells"]}
    assert tasks == {f"mock-tools-{s}" for s in ("calc-add-1", "fix-tests-2", "read-config-3", "deploy-4")}


def test_limit_error_and_scorers_reach_events_and_outcomes(
    imported: tuple[Path, Path, list[dict[str, object]]],
) -> None:
    bundle, _, events = imported
    outcomes = _outcomes(bundle)
    limits = [e for e in events if e["detail"] == "message_limit"]
    assert len(limits) == 2 and all(e["kind"] == "error" and e["actor"] == "harness" for e in limits)
    assert all(STEP_CAP.search(str(e["text"])) for e in limits)  # the step-cap check fires on it
    for e in limits:
        o = outcomes[str(e["cell_id"])]
        assert o["limit"] == {"type": "message", "limit": 8.0}
        assert o["scorers"] == {"match": {"value": "I", "quality": 0.0}, "reviewed": {"value": "N", "quality": 0.0}}
    crashed = [e for e in events if e["detail"] == "sample_error"]
    assert len(crashed) == 2 and all(e["text"] == "RuntimeError('deploy backend crashed')" for e in crashed)
    for e in crashed:
        o = outcomes[str(e["cell_id"])]
        assert o["label"] == "workflow_failed" and o["error"] == e["text"] and o["quality"] is None
    right = [o for o in outcomes.values() if o["label"] == "completed"]
    assert len(right) == 2
    assert all(o["scorers"]["reviewed"] == {"value": "P", "quality": 0.5} for o in right)  # type: ignore[index]
    assert sum(1 for e in events if e["detail"] == "tool_error") == 2
    # labels stay in the sidecar: the target and the scorer's explanation reach no event
    text = "\n".join(str(e["text"]) for e in events)
    assert "TARGET-ALL-GREEN-42" not in text and "secret-review-note-7Q" not in text


def test_show_ref_prints_the_element_and_its_position(imported: tuple[Path, Path, list[dict[str, object]]]) -> None:
    _, run, events = imported
    call = next(e for e in events if e["kind"] == "tool_call" and e["tool_name"] == "run_tests")
    ref = f"{call['source_path']}#L{call['line_start']}-L{call['line_end']}{call['json_pointer']}"
    shown = show_ref(run, ref)
    head, _, element = shown.partition("\n")
    member = str(call["json_pointer"]).split("!")[0].removeprefix("/")
    assert re.fullmatch(rf"# raw/{LOG.name} line 1, characters \d+-\d+ of member {member} \S+", head)
    assert json.loads(element)["function"] == "run_tests"
    assert "TARGET-ALL-GREEN-42" not in shown  # the sample's target sits on the same line
    whole = show_ref(run, ref, line=True)
    assert "TARGET-ALL-GREEN-42" in whole and len(whole) > 10 * len(shown)
    out = CliRunner().invoke(app, ["show-ref", ref, "--run", str(run), "--json"])
    doc = json.loads(out.output)
    assert out.exit_code == 0 and "lines" not in doc and doc["position"] in head
    # the characters named are the element's own bytes in the member's line
    a, b = (int(x) for x in re.findall(r"characters (\d+)-(\d+)", head)[0])
    with open_zip(LOG) as zf:
        line = zf.read(member).decode("utf-8").split("\n")[0]
    assert json.loads(line[a - 1 : b]) == json.loads(element)


def test_report_embeds_elements_not_the_sample_with_its_labels(
    imported: tuple[Path, Path, list[dict[str, object]]],
) -> None:
    _, run, events = imported
    cited = [str(e["event_id"]) for e in events if e["cell_id"] in ("C005", "C006")]
    # Luna's patterns, written by the test: they cite every event of the limit-stopped samples
    pattern = {"pattern_id": "C005-P01", "cell_id": "C005", "type": "repeated_exploration", "evidence": cited}
    (run / "patterns.jsonl").write_text(json.dumps(pattern) + "\n")
    path, stats = write_report(run)
    html = path.read_text()
    # the page and its compressed shards, inflated: everything the report can show
    page = html + json.dumps(read_page_data(path), ensure_ascii=False)
    assert stats["refs"] == len(cited) and stats["unresolved"] == 0
    assert "run_tests" in page and "Message limit exceeded" in page  # the elements are there
    assert "characters" in page  # with their position
    for label in ("TARGET-ALL-GREEN-42", "secret-review-note-7Q"):
        assert label not in page
