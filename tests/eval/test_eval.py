"""``lunasol eval`` against human labels: hand-checked Who&When figures, sources kept apart, MAST modes."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.core.errors import BadInput
from pipeline.eval import evaluate, normalise_agent, score_steps
from pipeline.eval.predict import Prediction
from tests.adapters.adapter_helpers import HAND_CHECKED, SHARED_DATA, events_of, imported, need_shared_data


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("eval")


def _ww(base: Path) -> tuple[Path, Path]:
    need_shared_data()
    bundle, run, _ = imported("who-and-when", base / "ww4", HAND_CHECKED)
    return bundle, run


# HAND_CHECKED: 4 Who&When files scored by hand. Cells are numbered in raw-path order:
# C001 = Algorithm-Generated/1.json, C002 = .../12.json, C003 = .../45.json, C004 = Hand-Crafted/34.json.


def test_who_and_when_baselines_hand_checked(base: Path) -> None:
    # By hand from the JSON (history index = step, 0-based; labels mistake_step / mistake_agent):
    #   AG/1  label 0 Excel_Expert:        history 0 Excel_Expert ... 5 DataVerification_Expert (TERMINATE)
    #   AG/12 label 1 Verification_Expert: history 0 MBTA_..._Expert ... 4 MBTA_..._Expert (TERMINATE)
    #   AG/45 label 1 PublicationData_Expert: history 0 DataAnalysis_Expert ... 4 PublicationData_Expert
    #   HC/34 label 4 WebSurfer:           history 0 human, 1-3 Orchestrator, 4 WebSurfer (last entry)
    # first agent step: 0 / 0 / 0 / 1  -> |d| = 0,1,1,3: exact 1, ±1 3, ±3 4; agent right only on AG/1.
    # last agent step:  5 / 4 / 4 / 4  -> |d| = 5,3,3,0: exact 1, ±1 1, ±3 3; agent right on AG/45, HC/34.
    # first error: every Computer_terminal output says "exitcode: 0" (tool results, no errors); HC/34's
    # WebSurfer reply (step 4) has autogen_core's "Error processing publish message" traceback printed
    # into it -> one harness error at step 4: exact, agent wrong ("harness"). The other 3 cells have
    # no prediction (reported, not dropped, counted wrong). The step before it: Orchestrator, step 3.
    _, run = _ww(base)
    rep = evaluate(run, "who-and-when")
    assert rep["labelled_cells"] == 4
    s = rep["sources"]
    first = s["baseline_first_step"]
    assert (first["exact"], first["within_1"], first["within_3"], first["agent"]) == (1, 3, 4, 1)
    assert first["exact_acc"] == 0.25 and first["within_3_acc"] == 1.0
    last = s["baseline_last_step"]
    assert (last["exact"], last["within_1"], last["within_3"], last["agent"]) == (1, 1, 3, 2)
    err = s["baseline_first_error"]
    assert err["predicted"] == 1 and err["no_prediction"] == 3
    assert err["no_prediction_cells"] == ["C001", "C002", "C003"]
    assert (err["exact"], err["within_1"], err["agent"]) == (1, 1, 0)
    assert err["exact_acc"] == 0.25  # missing predictions count as wrong, never silently dropped
    cause = s["baseline_first_error_cause"]
    assert (cause["predicted"], cause["exact"], cause["within_1"], cause["agent"]) == (1, 0, 1, 0)
    assert s["weakness_cards"]["predicted"] == 0 and "no weakness-shortlist.json" in s["weakness_cards"]["status"]


def test_weakness_cards_are_a_separate_source(base: Path) -> None:
    _, run = _ww(base)
    events = events_of(run)
    hc = next(e for e in events if e["cell_id"] == "C004" and e["step_index"] == 4)
    source_ref = f"{hc['source_path']}#L{hc['line_start']}-L{hc['line_end']}"
    shortlist = {
        "weaknesses": [
            {"first_divergence": {"cells": ["C001"], "event_refs": ["C001-e0000", "C001-e0003"]}},
            {"first_divergence": {"cells": ["C004"], "event_refs": [source_ref]}},
        ]
    }
    path = run / "weakness-shortlist.json"
    path.write_text(json.dumps(shortlist))
    try:
        rep = evaluate(run, "who-and-when")
    finally:
        path.unlink()
    cards = rep["sources"]["weakness_cards"]
    # C001: earliest cited event e0000 = step 0 (label 0, Excel_Expert); C004: step 4 WebSurfer (label 4).
    assert (cards["predicted"], cards["exact"], cards["agent"]) == (2, 2, 2)
    assert cards["no_prediction_cells"] == ["C002", "C003"]
    assert rep["sources"]["baseline_first_step"]["exact"] == 1  # baselines unchanged beside it


def test_probe_hits_predict_from_earliest_evidence(base: Path, tmp_path: Path) -> None:
    _, run = _ww(base)
    copy = tmp_path / "run"
    copy.mkdir()
    (copy / "ir.duckdb").write_bytes((run / "ir.duckdb").read_bytes())
    (copy / "run.json").write_text((run / "run.json").read_text().replace('"bundle": "', '"bundle": "../../'))
    con = duckdb.connect(str(copy / "ir.duckdb"))
    con.execute(
        "CREATE TABLE probe_hits (hit_id VARCHAR, probe_id VARCHAR, cell_id VARCHAR, type VARCHAR, key VARCHAR, "
        "evidence VARCHAR[], first_seq INTEGER, last_seq INTEGER, proves_unchanged BOOLEAN, explanation VARCHAR)"
    )
    con.execute(
        "INSERT INTO probe_hits VALUES ('C002-H01','identical_result','C002','t','k',['C002-e0003'],3,4,false,''),"
        "('C002-H02','identical_result','C002','t','k',['C002-e0001'],1,2,false,'')"
    )
    con.close()
    rep = evaluate(copy, "who-and-when")
    probes = rep["sources"]["probe_hits"]
    assert probes["status"].startswith("2 probe hits (table probe_hits)")
    # earliest evidence is seq 1 = history 1 Verification_Expert: exactly the label of AG/12
    assert (probes["predicted"], probes["exact"], probes["agent"], probes["no_prediction"]) == (1, 1, 1, 3)


def test_exact_step_matching_is_not_substring() -> None:
    labels = {"C1": (1, "A"), "C2": (12, "B")}
    preds = {"C1": Prediction(11, "A", "C1-e0011"), "C2": Prediction(2, "b", "C2-e0002")}
    s = score_steps(labels, preds)
    assert (s["exact"], s["within_1"], s["within_3"], s["agent"]) == (0, 0, 0, 2)
    s = score_steps(labels, {"C1": Prediction(2, "A", "x")}, offset=1)  # IR numbered from 1
    assert (s["exact"], s["no_prediction"], s["no_prediction_cells"]) == (1, 1, ["C2"])


def test_agent_names_normalised() -> None:
    assert normalise_agent("Orchestrator (thought)") == normalise_agent("Orchestrator")
    assert normalise_agent("Verification_Expert") == normalise_agent("verification expert")
    assert normalise_agent("WebSurfer") != normalise_agent("FileSurfer")


def test_mast_modes_from_the_votes(base: Path) -> None:
    need_shared_data()
    _, run, _ = imported("mast", base / "mast")
    rep = evaluate(run, "mast")
    assert rep["labelled_cells"] == 5
    raw = json.loads((SHARED_DATA / "mast-mad-human/MAD_human_labelled_dev.json").read_text())
    cw = json.loads((SHARED_DATA / "mast-mad-human/mast_taxonomy_crosswalk.json").read_text())
    table = {**cw["map_round1_to_mast14"], **cw["map_round2_3_to_mast14"]}
    table.update({f"{m['code']} {m['name']}": f"{m['code']} {m['name']}" for m in cw["mast14"]})
    positives: dict[str, int] = {}
    for rec in raw:  # majority = at least 2 of the 3 annotators, counted straight from the JSON
        for a in rec["annotations"]:
            title = " ".join(a["failure mode"].split("\n", 1)[0].split())
            mode = table.get(title, f"unmapped: {title}")
            if sum(bool(a[k]) for k in ("annotator_1", "annotator_2", "annotator_3")) >= 2:
                positives[mode] = positives.get(mode, 0) + 1
    checks = rep["sources"]["baseline_mode_checks"]
    assert checks["available"]
    for mode, n in positives.items():
        m = checks["modes"][mode]
        assert m["tp"] + m["fn"] == n
    assert rep["sources"]["weakness_cards"]["available"] is False


def test_cli_eval_json_and_errors(base: Path, tmp_path: Path) -> None:
    _, run = _ww(base)
    runner = CliRunner()
    res = runner.invoke(app, ["eval", str(run), "--labels", "who-and-when", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["labelled_cells"] == 4
    res = runner.invoke(app, ["eval", str(run), "--labels", "who-and-when"])
    assert "baseline_first_error" in res.output and "no prediction: 4" in res.output
    res = runner.invoke(app, ["eval", str(run), "--labels", "nope"])
    assert res.exit_code == 2
    with pytest.raises(BadInput):
        evaluate(tmp_path, "who-and-when")


def test_foreign_checks_success_claim_and_step_cap(base: Path) -> None:
    need_shared_data()
    bundle, run, _ = imported("claude-code", base / "cc")
    rep = evaluate(run, "who-and-when")
    assert rep["labelled_cells"] == 0  # no decisive-step labels here: nothing scored, nothing invented
    cells = json.loads((bundle / "analysis-request.json").read_text())["cells"]
    regex_log = next(c["cell_id"] for c in cells if c["run_id"] == "regex-log__XYfBZFy")
    # regex-log: the last word is "Done. The regex is saved ..." and verifier/reward.txt says 0.
    claims = rep["checks"]["success_claim_failing_verifier"]["first_evidence"]
    assert list(claims) == [regex_log]
    ev = next(e for e in events_of(run) if e["event_id"] == claims[regex_log])
    assert ev["detail"] == "result" and "Done" in ev["text"]
    _, run_oh, _ = imported("openhands", base / "oh")
    capped = evaluate(run_oh, "who-and-when")["checks"]["step_cap"]
    assert capped["cells"] == 1  # the multi_swe_bench run stopped on "maximum iteration"


# AgentRx labels on a folder written for the test (tests/fixtures/foreign/agentrx-like), imported with
# auto: C001 = the Magentic-One run (0-based positions, label step 3 is 1-based: IR step 2),
# C002/C003 = tau tasks 7 and 9 (1-based `index`), C004 = task 8 (succeeded, unlabelled).
def _agentrx_run(tmp_path: Path) -> Path:
    import shutil

    from pipeline.adapters import import_bundle
    from pipeline.ir.export import export
    from tests.adapters.adapter_helpers import FOREIGN_FIXTURES

    src = tmp_path / "AgentRx"
    shutil.copytree(FOREIGN_FIXTURES / "agentrx-like", src)
    import_bundle("auto", src, tmp_path / "b")
    return export(tmp_path / "b", tmp_path / "runs" / "r").run_dir


def test_agentrx_scores_hand_checked(tmp_path: Path) -> None:
    # By hand (AgentRx step = IR step + 1 for the Magentic-One cell, = IR step for tau):
    #   C002/C003: the tool's "Error: item 1 not in order" is the first error (index 6, actor tool);
    #     the assistant's return call just before it is index 5 = the root cause step (label 5).
    #   C001: no error; first agent step = Orchestrator at position 1 -> AgentRx 2 (label 3, ±1).
    rep = evaluate(_agentrx_run(tmp_path), "agentrx")
    assert rep["labelled_cells"] == 3
    s = rep["sources"]
    cause = s["baseline_first_error_cause"]
    assert (cause["predicted"], cause["root_exact"], cause["any_exact"], cause["agent"]) == (2, 2, 2, 2)
    assert cause["no_prediction_cells"] == ["C001"]
    assert cause["root_exact_acc"] == 0.6667 and cause["root_exact_se"] == 0.2722  # sqrt(2/3 * 1/3 / 3)
    err = s["baseline_first_error"]
    assert (err["predicted"], err["root_exact"], err["root_within_1"], err["agent"]) == (2, 0, 2, 0)
    first = s["baseline_first_step"]
    assert (first["root_exact"], first["root_within_1"], first["root_within_3"], first["agent"]) == (0, 1, 3, 2)
    assert rep["positional"]["baseline_first_step"]["root_within_1_acc"] == 0.3333
    cats = rep["categories"]["baseline_error_category"]["categories"]
    assert cats["Invalid Invocation"] == {
        "tp": 1,
        "fp": 1,
        "fn": 0,
        "precision": 0.5,
        "precision_se": 0.3536,
        "recall": 1.0,
        "recall_se": 0.0,
    }
    assert cats["Instruction/Plan Adherence Failure"]["fn"] == 1
    assert rep["categories"]["weakness_cards"]["available"] is False


def test_cli_eval_agentrx_prints_positional_baselines_beside_each_source(tmp_path: Path) -> None:
    run = _agentrx_run(tmp_path)
    res = CliRunner().invoke(app, ["eval", str(run), "--labels", "agentrx"])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "3 labelled cells of 4 (agentrx)" in out
    block = out.split("\nprobe_hits:")[1].split("\n\n")[0]
    assert "positional first_step (n=3)" in block and "positional last_step (n=3)" in block
    assert "root exact 0.667±0.272" in out  # the first error's cause, with its standard error
    assert "Invalid Invocation: precision 0.500 recall 1.000" in out


def test_who_and_when_report_carries_standard_errors_and_positional_baselines(base: Path) -> None:
    _, run = _ww(base)
    rep = evaluate(run, "who-and-when")
    first = rep["sources"]["baseline_first_step"]
    assert first["exact_se"] == 0.2165  # sqrt(0.25 * 0.75 / 4)
    assert rep["positional"]["baseline_last_step"]["agent_acc"] == 0.5
