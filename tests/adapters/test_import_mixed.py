"""Mixed imports: each cell keeps its own harness and subset, several formats in one folder, label files
only in the sidecar, copies of the data (original/, duplicates) imported once."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import pytest

from pipeline.adapters import import_bundle
from pipeline.bundle.manifest import verify
from pipeline.ir.export import export
from tests.adapters.adapter_helpers import (
    FOREIGN_FIXTURES,
    SHARED_DATA,
    check_refs,
    events_of,
    make_subset,
    need_shared_data,
)


def _cells(run: Path) -> dict[str, str]:
    con = duckdb.connect(str(run / "ir.duckdb"), read_only=True)
    try:
        return dict(con.execute("SELECT cell_id, harness FROM cells ORDER BY cell_id").fetchall())
    finally:
        con.close()


def test_who_and_when_subsets_stay_two_systems(tmp_path: Path) -> None:
    need_shared_data()
    src = make_subset("who-and-when", tmp_path / "src")
    bundle = tmp_path / "b"
    result = import_bundle("who-and-when", src, bundle)
    rep = export(bundle, tmp_path / "runs" / "r")
    harness = _cells(rep.run_dir)
    req = json.loads((bundle / "analysis-request.json").read_text())
    by_path = {c["cell_id"]: c["path"] for c in req["cells"]}
    for cell, h in harness.items():
        if "/Hand-Crafted/" in by_path[cell]:
            assert h == "Magentic-One [Hand-Crafted]", cell
        else:
            assert h == "CaptainAgent (AG2) [Algorithm-Generated]", cell
    assert result.harness == "CaptainAgent (AG2) + Magentic-One"  # the batch's name lists both
    # Sol's context lists harnesses from the cells table: two systems, not one combined name
    assert len(set(harness.values())) == 2


def test_agentrx_folder_auto_imports_runs_and_keeps_labels_out_of_raw(tmp_path: Path) -> None:
    src = tmp_path / "AgentRx"
    shutil.copytree(FOREIGN_FIXTURES / "agentrx-like", src)
    bundle = tmp_path / "b"
    result = import_bundle("auto", src, bundle)
    assert result.format == "mixed" and result.formats == ["tau", "who-and-when"]
    raw = sorted(p.relative_to(bundle / "raw").as_posix() for p in (bundle / "raw").rglob("*") if p.is_file())
    # runs only: no ground truth, no steps_by_id metadata; the full file holds one run the failed file lacks
    assert raw == [
        "data/magentic_dataset/3f1c-run.json",
        "data/tau_retail/tau_dataset_failed.json",
        "data/tau_retail/tau_dataset_full.json",
    ]
    assert verify(bundle).ok
    req = json.loads((bundle / "analysis-request.json").read_text())
    assert [c["task_id"] for c in req["cells"]] == ["3f1c-run", "retail-7", "retail-9", "retail-8"]  # 7, 9 once
    blocks = req["source"]["cells"]
    assert [b["adapter"] for b in blocks.values()] == ["who-and-when", "tau", "tau", "tau"]
    skipped = dict(result.skipped)
    assert "label file" in skipped["raw/data/ground_truth/tau_ground_truth.json"]
    assert "raw/data/magentic_dataset/steps_by_id.json" in skipped  # reported, not copied
    assert any("duplicate run" in why for p, why in result.skipped if p.endswith("tau_dataset_full.json"))
    assert ("data/ground_truth/tau_ground_truth.json", "1 of 3 labels name no single imported run") in [
        (p.removeprefix("raw/"), w) for p, w in result.warnings
    ]
    lines = (bundle / "sidecar/outcomes.jsonl").read_text().splitlines()
    outcomes = {json.loads(x)["cell_id"]: json.loads(x) for x in lines}
    assert outcomes["C002"]["agentrx"]["failures"][0]["failure_category"] == "Invalid Invocation"
    assert outcomes["C001"]["agentrx"]["failures"][0]["failed_agent"] == "WebSurfer"
    assert "agentrx" not in outcomes["C004"]  # task 8 succeeded: no label
    rep = export(bundle, tmp_path / "runs" / "r")
    events = events_of(rep.run_dir)
    ok, bad = check_refs(bundle, events)
    assert bad == [] and ok == len(events)
    text = "\n".join(str(e["text"]) for e in events)
    assert "Returned item 1 although" not in text and "never recovered" not in text  # labels stay in the sidecar


def test_mast_folder_with_original_copies_imports_each_record_once(tmp_path: Path) -> None:
    need_shared_data()
    src = tmp_path / "MAST"
    (src / "original").mkdir(parents=True)
    data = SHARED_DATA / "mast-mad-human" / "MAD_human_labelled_dev.json"
    shutil.copyfile(data, src / "MAD_human_labelled_dev.json")
    shutil.copyfile(data, src / "original" / "MAD_human_labelled_dev.json")  # byte-identical copy
    records = json.loads(data.read_text())
    (src / "original" / "MAD_reserialised.json").write_text(json.dumps(records, indent=2))  # same records
    shutil.copyfile(
        SHARED_DATA / "mast-mad-human" / "mast_taxonomy_crosswalk.json", src / "mast_taxonomy_crosswalk.json"
    )
    for fmt in ("mast", "auto"):
        bundle = tmp_path / f"b-{fmt}"
        result = import_bundle(fmt, src, bundle)
        assert result.cells == len(records)
        req = json.loads((bundle / "analysis-request.json").read_text())
        assert {c["path"] for c in req["cells"]} == {"raw/MAD_human_labelled_dev.json"}  # the primary copy wins
        skipped = dict(result.skipped)
        assert (
            "byte-identical copy of raw/MAD_human_labelled_dev.json"
            in skipped["raw/original/MAD_human_labelled_dev.json"]
        )
        assert "duplicate run" in skipped["raw/original/MAD_reserialised.json"]
        assert not (bundle / "raw/original/MAD_human_labelled_dev.json").exists()
        assert (bundle / "raw/mast_taxonomy_crosswalk.json").is_file()  # read for the votes: kept
        outcomes = [json.loads(x) for x in (bundle / "sidecar/outcomes.jsonl").read_text().splitlines()]
        assert any(m.startswith("1.3 ") for m in outcomes[0]["failure_modes"])  # crosswalk still applied


@pytest.mark.parametrize("fmt", ["auto", "tau"])
def test_label_files_never_reach_raw_with_a_named_format(fmt: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(FOREIGN_FIXTURES / "agentrx-like" / "data", src)
    shutil.rmtree(src / "magentic_dataset")
    bundle = tmp_path / "b"
    import_bundle(fmt, src, bundle)
    assert not (bundle / "raw" / "ground_truth").exists()


def test_one_log_filed_under_two_questions_stays_two_runs(tmp_path: Path) -> None:
    # Who&When's Algorithm-Generated 22 and 51 hold the same history for two different questions
    # (and labels): a run is its task plus its records, so both are imported.
    need_shared_data()
    subset = ("who-and-when", ["Algorithm-Generated/22.json", "Algorithm-Generated/51.json"])
    src = make_subset("who-and-when", tmp_path / "src", subset)
    result = import_bundle("who-and-when", src, tmp_path / "b")
    assert result.cells == 2 and result.skipped == []
