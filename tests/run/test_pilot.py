"""Pilots of ``lunasol run``: ``--where SQL`` and ``--sample N --seed S`` on a subset of the cells.

The selection is computed here independently (from the bundle's request and outcome sidecar, with
:mod:`random` as the run draws), and every place a pilot must be labelled is checked: run.json,
the IR, Luna's cells, the shortlist's header and denominator, status, show, the report, gate 1's
receipt. A full run after a pilot reuses the pilot's Luna answers: under the same run id through
the per-cell cache, under another run id through the other run's exchanges (counted at the local
server).
"""

from __future__ import annotations

import json
import random
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from pipeline.agent import tools
from pipeline.agent.brief import run_summary
from pipeline.artifacts.migrations import steps
from pipeline.artifacts.run_info import read_run_info, run_command
from pipeline.cli.app import app
from pipeline.core.context import RunOptions
from pipeline.core.errors import BadInput
from pipeline.core.settings import ModelSettings
from pipeline.gates import gate1
from pipeline.ir.selection import check_where, sample_cells
from pipeline.run import runner
from pipeline.run.runner import run
from pipeline.run.status import format_status, gate_report, status
from pipeline.sol.shortlist import read_shortlist
from pipeline.testing.openai_server import FakeOpenAI, recordings_handler
from tests.conftest import DEMO_BUNDLE, DEMO_RECORDINGS

pytestmark = pytest.mark.skipif(not any(DEMO_RECORDINGS.glob("*/*.json")), reason="demo recordings absent")

REPLAY = ModelSettings(mode="replay", store=DEMO_RECORDINGS)
LUNA_HEAD = re.compile(r"^Cell (?P<cell>\S+) · task \S+ · run ", re.M)


def eligible_cells() -> list[str]:
    req = json.loads((DEMO_BUNDLE / "analysis-request.json").read_text(encoding="utf-8"))
    return sorted(c["cell_id"] for c in req["cells"] if c["eligibility"] == "valid_behavior")


def labels() -> dict[str, str]:
    lines = (DEMO_BUNDLE / "sidecar" / "outcomes.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    return {r["cell_id"]: r["label"] for r in rows}


def ir_eligible(run_dir: Path) -> list[str]:
    con = duckdb.connect(str(run_dir / "ir.duckdb"), read_only=True)
    try:
        rows = con.execute("SELECT cell_id FROM cells WHERE eligibility = 'valid_behavior' ORDER BY 1").fetchall()
        return [str(r[0]) for r in rows]
    finally:
        con.close()


def ir_rows(run_dir: Path, sql: str) -> list[tuple[object, ...]]:
    con = duckdb.connect(str(run_dir / "ir.duckdb"), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


@pytest.fixture(scope="module")
def pilot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's pilot (--sample 8 --seed 1), replayed to gate 1 once for this module."""
    runs = tmp_path_factory.mktemp("pilot") / "runs"
    opts = RunOptions(bundle=DEMO_BUNDLE, runs_dir=runs, models=REPLAY, sample=8, seed=1)
    return run(opts, log=lambda _m: None).ctx.run_dir


def test_the_sample_is_the_seeded_draw_and_only_it_is_analysed(pilot: Path) -> None:
    everyone = eligible_cells()
    expected = sorted(random.Random(1).sample(everyone, 8))  # the draw, computed here
    assert len(everyone) == 24 and ir_eligible(pilot) == expected
    # the IR stays whole: every cell's events are kept, the rest marked excluded with why
    assert ir_rows(pilot, "SELECT count(DISTINCT cell_id) FROM events")[0][0] == 24
    left = ir_rows(pilot, "SELECT cell_id, exclusion_reason FROM cells WHERE exclusion_reason LIKE 'not in this%'")
    assert sorted(c for c, _ in left) == sorted(set(everyone) - set(expected))
    assert all(r == "not in this pilot (--sample 8 --seed 1)" for _, r in left)
    assert sorted(r[0] for r in ir_rows(pilot, "SELECT cell_id FROM luna_cells")) == expected  # Luna saw 8
    assert sorted(r[0] for r in ir_rows(pilot, "SELECT cell_id FROM pattern_coverage")) == expected
    info = read_run_info(pilot).pilot
    assert info is not None
    assert (info.sample, info.seed, info.selected, info.eligible, info.matched) == (8, 1, 8, 24, 24)
    assert "--sample 8 --seed 1" in run_command(pilot)  # a resume continues the same pilot


def test_the_shortlist_is_over_the_subset_and_says_so(pilot: Path) -> None:
    sl = read_shortlist(pilot / "weakness-shortlist.json")
    expected = sorted(random.Random(1).sample(eligible_cells(), 8))
    assert sl.pilot is not None and sl.pilot.selected == 8
    assert sl.denominator.eligible_cells == 8 and sorted(sl.denominator.cells) == expected
    assert sl.weaknesses and all(set(w.support.cells) <= set(expected) for w in sl.weaknesses)
    text = gate_report(pilot)
    assert "PILOT: 8 of 24 eligible cells (--sample 8 --seed 1)" in text.splitlines()[1]  # right under its digest


def test_status_show_and_report_label_the_pilot(pilot: Path, tmp_path: Path) -> None:
    label = "PILOT: 8 of 24 eligible cells (--sample 8 --seed 1); every rate and Sol's support are over these 8 cells"
    s = status(pilot)
    assert s["pilot"]["selected"] == 8 and s["shortlist"]["pilot"]["sample"] == 8
    assert format_status(s).splitlines()[1].strip().startswith(label)
    shown = CliRunner().invoke(app, ["show", str(pilot), "W-01"])
    assert shown.exit_code == 0 and shown.output.splitlines()[1].startswith(label)
    out = tmp_path / "report"
    res = CliRunner().invoke(app, ["report", str(pilot), "-o", str(out)])
    assert res.exit_code == 0, res.output
    html = (out / "index.html").read_text(encoding="utf-8")
    header = html.split("<header>", 1)[1].split("</header>", 1)[0]
    assert 'id="pilot"' in header and label.replace("'", "&#39;") in header
    assert "eligible cells (the denominator: this pilot's subset)" in html
    listed = CliRunner().invoke(app, ["runs", "--runs-dir", str(pilot.parent)])
    assert listed.exit_code == 0 and "8 of 24 (pilot)" in listed.output
    # what a coding agent reads of the run (lunasol mcp's run summary) says it too
    assert f"- {label}" in run_summary(tools.Runs([pilot]))


def test_gate1_on_a_pilot_says_so_in_the_receipt(pilot: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / pilot.name
    shutil.copytree(pilot, run_dir)
    digest = read_shortlist(run_dir / "weakness-shortlist.json").digest
    args = ["confirm", str(run_dir), "--decision", "W-01=confirm", "--decision", "W-02=reject"]
    res = CliRunner().invoke(app, [*args, "--by", "ana", "--digest", digest])
    assert res.exit_code == 0, res.output
    assert "decided on a PILOT: 8 of 24 eligible cells (--sample 8 --seed 1)" in res.output
    receipt = gate1.standing(run_dir, gate1.GATE1)
    assert receipt is not None and receipt.pilot is not None and receipt.pilot.selected == 8
    # an older receipt (v2) upgrades to one that was not decided on a pilot
    upgrade = next(m for m in steps("gate-receipt") if m.to_version == 3)
    assert upgrade.upgrade({"schema_version": 2})["pilot"] is None


def test_a_full_run_after_the_pilot_equals_a_fresh_full_run(pilot: Path, tmp_path: Path, demo_gate1: Path) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(pilot, runs / pilot.name)
    logs: list[str] = []
    res = run(RunOptions(bundle=DEMO_BUNDLE, runs_dir=runs, run_id=pilot.name, models=REPLAY), log=logs.append)
    assert "[select] every eligible cell (no pilot); the 16 cell(s) an earlier pilot left out are back" in logs
    assert any(m.startswith("[luna]") and "16 cell(s) rendered, 8 unchanged" in m for m in logs), logs
    d = res.ctx.run_dir
    assert read_run_info(d).pilot is None and ir_eligible(d) == eligible_cells()
    for name in ("patterns.jsonl", "pattern-groups.json", "weakness-shortlist.json"):
        assert (d / name).read_bytes() == (demo_gate1 / name).read_bytes(), name
    assert "PILOT" not in format_status(status(d))


def test_where_selects_by_outcome(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # up to the Coordinator: Sol's answer for this subset is not among the fixture recordings
    monkeypatch.setattr(runner, "STAGES", runner.STAGES[: [s.name for s in runner.STAGES].index("coordinator") + 1])
    failed = sorted(c for c, label in labels().items() if label != "completed" and c in eligible_cells())
    assert failed, "the demo has failed cells"
    opts = RunOptions(bundle=DEMO_BUNDLE, runs_dir=tmp_path, models=REPLAY, where="outcome <> 'completed'")
    d = run(opts, log=lambda _m: None).ctx.run_dir
    assert ir_eligible(d) == failed
    info = read_run_info(d).pilot
    assert info is not None and info.where == "outcome <> 'completed'" and info.selected == info.matched == len(failed)
    assert info.sample is None and info.seed is None


def test_a_sample_larger_than_the_cells_takes_all_and_says_so(tmp_path: Path) -> None:
    logs: list[str] = []
    opts = RunOptions(bundle=DEMO_BUNDLE, runs_dir=tmp_path, models=REPLAY, sample=100, seed=3)
    d = run(opts, log=logs.append).ctx.run_dir
    assert "[select] --sample 100 is more than the 24 eligible cells: all 24 taken" in logs
    assert ir_eligible(d) == eligible_cells()
    info = read_run_info(d).pilot
    assert info is not None and info.selected == 24 and info.note and "all 24 taken" in info.note
    assert info.label() == "PILOT: 24 of 24 eligible cells (--sample 100 --seed 3); that is every eligible cell"


@pytest.mark.parametrize(
    ("where", "said"),
    [
        ("outcome = ", "not a valid filter over cell_id, task_id, run_id, harness, outcome"),
        ("colour = 'red'", "not a valid filter over cell_id, task_id, run_id, harness, outcome"),
        ("1 = 1; DROP TABLE cells", "not a valid filter"),
        # closes the filter's parenthesis: valid SQL, but three statements (DuckDB would run them all)
        ("1=1) ORDER BY cell_id; DROP VIEW cells; SELECT cell_id FROM cells WHERE (1=1", "holds 3 SQL statements"),
        ("task_id = 'no-such-task'", "no eligible cell matches --where \"task_id = 'no-such-task'\""),
    ],
)
def test_a_bad_where_is_one_line_exit_2_and_writes_nothing(tmp_path: Path, where: str, said: str) -> None:
    runs = tmp_path / "runs"
    args = ["run", str(DEMO_BUNDLE), "--replay", str(DEMO_RECORDINGS), "--runs-dir", str(runs), "--run-id", "p"]
    res = CliRunner().invoke(app, [*args, "--where", where])
    assert res.exit_code == 2, res.output
    assert said in res.output and len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output
    assert not (runs / "p").exists()


def test_a_bad_where_on_an_existing_run_changes_nothing(pilot: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(pilot, runs / pilot.name)
    before = {p: p.read_bytes() for p in (runs / pilot.name).rglob("*") if p.is_file()}
    args = ["run", str(DEMO_BUNDLE), "--replay", str(DEMO_RECORDINGS), "--runs-dir", str(runs), "--run-id", pilot.name]
    res = CliRunner().invoke(app, [*args, "--where", "harness = 'H9'"])
    assert res.exit_code == 2 and "no eligible cell matches --where" in res.output, res.output
    after = {p: p.read_bytes() for p in (runs / pilot.name).rglob("*") if p.is_file()}
    assert after == before


def test_seed_without_sample_is_refused(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["run", str(DEMO_BUNDLE), "--runs-dir", str(tmp_path), "--seed", "4"])
    assert res.exit_code == 2 and "--seed draws a --sample" in res.output


def test_selection_helpers() -> None:
    cells = [f"C{i:03d}" for i in range(50)]
    a, b = sample_cells(cells, 7, 5), sample_cells(cells, 7, 5)
    assert a == b == sorted(a) and len(set(a)) == 7 and sample_cells(cells, 7, 6) != a
    assert sample_cells(cells, None, 0) == cells and sample_cells(cells, 80, 0) == cells
    check_where("outcome = 'failed' AND harness LIKE 'H%'")
    with pytest.raises(BadInput, match="not a valid filter"):
        check_where("eligibility = 'excluded' OR label = 'x'")  # outside the five columns


def test_dry_run_of_a_pilot_plans_only_its_cells(tmp_path: Path) -> None:
    logs: list[str] = []
    opts = RunOptions(bundle=DEMO_BUNDLE, runs_dir=tmp_path / "runs", models=REPLAY, dry_run=True, sample=5, seed=2)
    res = run(opts, log=logs.append)
    assert {r.role: r.calls for r in res.estimate.roles}["luna"] == 5
    assert "note: PILOT: 5 of 24 eligible cells (--sample 5 --seed 2)" in "\n".join(logs)
    assert not (tmp_path / "runs").exists()


# -- a full run under another run id pays only for the cells the pilot did not analyse ------------


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(recordings_handler(DEMO_RECORDINGS)) as srv:
        yield srv


def luna_cells_asked(srv: FakeOpenAI, since: int) -> list[str]:
    out = []
    for req in srv.requests[since:]:
        first = next((m["content"] for m in req.get("messages", []) if m.get("role") == "user"), "")
        found = LUNA_HEAD.search(first if isinstance(first, str) else "")
        if found:
            out.append(found.group("cell"))
    return sorted(out)


def test_the_full_run_pays_only_for_the_cells_the_pilot_did_not_analyse(tmp_path: Path, server: FakeOpenAI) -> None:
    live = ModelSettings(model="openai/fixture-model", api_base=server.base_url, instructor_mode="tools", timeout_s=10)
    runs = tmp_path / "runs"
    logs: list[str] = []
    # the recorded pilot (its Sol answer is a fixture), now live against the local server
    pilot_opts = RunOptions(bundle=DEMO_BUNDLE, runs_dir=runs, run_id="pilot", models=live, sample=8, seed=1)
    run(pilot_opts, log=logs.append)
    picked = sorted(random.Random(1).sample(eligible_cells(), 8))
    assert luna_cells_asked(server, 0) == picked  # the pilot paid for its 8 cells, once each
    seen = len(server.requests)
    full = run(RunOptions(bundle=DEMO_BUNDLE, runs_dir=runs, run_id="full", models=live), log=logs.append)
    rest = sorted(set(eligible_cells()) - set(picked))
    assert luna_cells_asked(server, seen) == rest  # 16 Luna requests: the pilot's 8 were not asked again
    assert any("8 answer(s) taken from earlier run(s) of this bundle: pilot (8)" in m for m in logs), logs
    assert ir_rows(full.ctx.run_dir, "SELECT count(*) FROM luna_cells WHERE status <> 'failed'")[0][0] == 24
    # the control: a run under another runs directory has no earlier run to take from and pays for all 24
    seen = len(server.requests)
    run(RunOptions(bundle=DEMO_BUNDLE, runs_dir=tmp_path / "other", models=live), log=lambda _m: None)
    assert luna_cells_asked(server, seen) == eligible_cells()


def test_where_and_sample_draw_from_the_matching_cells(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "STAGES", runner.STAGES[: [s.name for s in runner.STAGES].index("select") + 1])
    done = sorted(c for c, label in labels().items() if label == "completed" and c in eligible_cells())
    opts = RunOptions(
        bundle=DEMO_BUNDLE, runs_dir=tmp_path, models=REPLAY, where="outcome = 'completed'", sample=3, seed=0
    )
    d = run(opts, log=lambda _m: None).ctx.run_dir
    assert ir_eligible(d) == sorted(random.Random(0).sample(done, 3))
    info = read_run_info(d).pilot
    assert info is not None and (info.eligible, info.matched, info.selected) == (24, len(done), 3)
    assert info.flags() == "--where \"outcome = 'completed'\" --sample 3 --seed 0"
