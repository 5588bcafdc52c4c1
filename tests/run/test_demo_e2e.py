"""The whole demo through replay: `lunasol run fixtures/bundles/h0-demo --replay fixtures/recordings/h0-demo`.

The recordings are hand-written fixture answers (see fixtures/recordings/h0-demo/README.md). Twice, in two
run directories: byte-identical patterns.jsonl and pattern-groups.json; every eligible cell covered; every
cited id resolves inside its cell; the dead-end cells show the patterns that reveal them and the
counter-examples do not; no Luna request carries an outcome.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pytest
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.core.settings import ModelSettings
from pipeline.run import runner
from pipeline.testing.openai_server import FakeOpenAI, flaky_empty

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = ROOT / "fixtures" / "bundles" / "h0-demo"
STORE = ROOT / "fixtures" / "recordings" / "h0-demo"
STORY = ROOT / "fixtures" / "demo-story.json"

pytestmark = pytest.mark.skipif(
    not (BUNDLE / "analysis-request.json").is_file() or not any(STORE.glob("*/*.json")),
    reason="demo bundle or recordings absent (run: python fixtures/record_demo.py)",
)


ARTIFACTS = ("patterns.jsonl", "pattern-groups.json", "weakness-shortlist.json")


@pytest.fixture(scope="module")
def cli_replay(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """README's first command, `lunasol run BUNDLE --replay STORE`, through the CLI: (run dir, output)."""
    runs = tmp_path_factory.mktemp("cli") / "runs"
    # under a run id that is not the bundle's: the folder is the user's choice and reaches no prompt
    args = ["run", str(BUNDLE), "--replay", str(STORE), "--runs-dir", str(runs), "--run-id", "other-b"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    [run_dir] = [p for p in runs.iterdir() if p.is_dir()]
    return run_dir, res.output


@pytest.fixture(scope="module")
def two_runs(demo_gate1: Path, cli_replay: tuple[Path, str]) -> tuple[Path, Path]:
    """Two independent replays: the session's library run and the CLI run."""
    return demo_gate1, cli_replay[0]


def test_cli_run_replays_the_whole_demo(cli_replay: tuple[Path, str]) -> None:
    """The done criterion: `lunasol run BUNDLE --replay STORE` (every stage, Sol included) exits 0 at gate 1."""
    run_dir, output = cli_replay
    assert "[luna] " in output and "24/24 cells" in output
    assert "gate 1: waiting for your decision" in output and "W-01" in output and "W-02" in output
    for name in ("patterns.jsonl", "pattern-groups.json", "weakness-shortlist.json"):
        assert (run_dir / name).is_file(), name


def patterns(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "patterns.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def run_a(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A library replay under run id 'a' (README's `--run-id a`)."""
    options = runner.RunOptions(
        bundle=BUNDLE,
        run_id="a",
        runs_dir=tmp_path_factory.mktemp("runs-a"),
        models=ModelSettings(mode="replay", store=STORE),
    )
    return runner.run(options, log=lambda _m: None).ctx.run_dir


def test_replay_under_other_run_ids_is_byte_identical(two_runs: tuple[Path, Path], run_a: Path) -> None:
    a, b = two_runs
    c = run_a
    assert (a.name, b.name, c.name) == ("h0-demo-20260809-a", "other-b", "a")
    for name in (*ARTIFACTS, "ledger.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes() == (c / name).read_bytes(), name
    shortlist = json.loads((a / "weakness-shortlist.json").read_text(encoding="utf-8"))
    assert shortlist["run_id"] == "h0-demo-20260809-a"  # the request's analysis run id, not the folder
    assert [w["weakness_id"] for w in shortlist["weaknesses"]] == ["W-01", "W-02"]


def test_every_eligible_cell_is_covered_and_every_id_resolves(two_runs: tuple[Path, Path]) -> None:
    run = two_runs[0]
    con = duckdb.connect(str(run / "ir.duckdb"), read_only=True)
    eligible = [r[0] for r in con.execute("SELECT cell_id FROM cells WHERE eligibility = 'valid_behavior'").fetchall()]
    ids = {r[0]: r[1] for r in con.execute("SELECT event_id, cell_id FROM events").fetchall()}
    statuses = dict(con.execute("SELECT cell_id, status FROM luna_cells").fetchall())
    con.close()
    assert len(eligible) == 24
    assert statuses == dict.fromkeys(eligible, "ok")
    groups = json.loads((run / "pattern-groups.json").read_text(encoding="utf-8"))
    assert sorted(c["cell_id"] for c in groups["coverage"]) == sorted(eligible)
    assert groups["totals"]["cells_not_analysed"] == []
    pats = patterns(run)
    assert pats and [p["pattern_id"] for p in pats] == sorted(p["pattern_id"] for p in pats)
    for p in pats:
        for e in p["evidence"]:
            assert ids.get(e) == p["cell_id"], (p["pattern_id"], e)
    for g in groups["groups"]:
        for occ in g["occurrences"]:
            assert len(occ["refs"]) == len(occ["events"]) and all("#L" in r for r in occ["refs"])
    zero = [c["cell_id"] for c in groups["coverage"] if c["patterns"] == 0]
    assert "C017" in zero  # a cell with no pattern is counted, with zero


def test_dead_ends_revealed_and_counter_examples_clean(two_runs: tuple[Path, Path]) -> None:
    pats = patterns(two_runs[0])
    by_cell: dict[str, set[tuple[str, str]]] = {}
    for p in pats:
        by_cell.setdefault(p["cell_id"], set()).add((p["type"], p["concerns"]))
    for cell, stage, report in (("C004", "review", "review.md"), ("C015", "review", "review.md"),
                                ("C018", "validation", "validation.md")):  # fmt: skip
        assert ("repeated_exploration", f"transition:{stage}->{stage}") in by_cell[cell]
        assert ("zero_information_gain", f"target:{report}") in by_cell[cell]
        assert ("zero_information_gain", "target:request_permission:write") in by_cell[cell]
    story = json.loads(STORY.read_text(encoding="utf-8"))["cells"]
    for cell in ("C013", "C017"):
        concerns = {c for _t, c in by_cell.get(cell, set())}
        assert not any(c.startswith("transition:") or "request_permission" in c for c in concerns), cell
        assert story[cell]["label"] == "completed"
    groups = json.loads((two_runs[0] / "pattern-groups.json").read_text(encoding="utf-8"))
    [perm] = [g for g in groups["groups"] if g["concerns"] == "target:request_permission:write"]
    assert perm["support"]["cells"] == ["C004", "C015", "C018"] and perm["support"]["n_tasks"] == 3
    assert perm["negatives"]["occurrences"] == 0


def test_recordings_carry_no_routing_line_and_no_folder_name() -> None:
    # The prompts hold what the model needs, nothing that exists for the fixture recorder or the user's folder.
    for path in STORE.glob("*/*.json"):
        text = path.read_text(encoding="utf-8")
        assert "request-id" not in text, path
        rec = json.loads(text)
        if rec["role"] in ("sol", "proposer"):
            first_user = next(m["content"] for m in rec["request"]["messages"] if m["role"] == "user")
            assert first_user.startswith("Analysis run h0-demo-20260809-a;"), path


def test_live_run_against_a_server_with_30_percent_empty_first_answers_gives_the_replay_artifacts(
    two_runs: tuple[Path, Path], tmp_path: Path
) -> None:
    import sys

    sys.path.insert(0, str(ROOT))
    from fixtures.record_demo import MODEL, AnswerBook

    book = AnswerBook(ROOT / "fixtures" / "answers" / "h0-demo")
    with FakeOpenAI(flaky_empty(book, 0.3)) as server:
        settings = ModelSettings(model=MODEL, api_base=server.base_url, instructor_mode="tools", max_reasks=0)
        options = runner.RunOptions(bundle=BUNDLE, run_id="live", runs_dir=tmp_path, models=settings)
        result = runner.run(options, log=lambda _m: None)
        empty = len(server.requests) - sum(book.served.values())
    assert not result.pending
    assert empty >= 3  # the server did answer with empty choices, and each was retried
    calls = [json.loads(line) for line in (result.ctx.run_dir / "calls.jsonl").read_text().splitlines()]
    assert sum(c["transport_retries"] for c in calls) == empty
    for name in ARTIFACTS:
        assert (result.ctx.run_dir / name).read_bytes() == (two_runs[0] / name).read_bytes(), name


def test_no_luna_request_in_the_store_carries_an_outcome() -> None:
    sidecar = [json.loads(x) for x in (BUNDLE / "sidecar" / "outcomes.jsonl").read_text().splitlines() if x]
    labels = {o["label"] for o in sidecar}
    assert "workflow_failed" in labels
    luna = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(STORE.glob("*/*.json"))]
    luna = [r for r in luna if r["role"] == "luna"]
    assert len(luna) == 24
    for rec in luna:
        text = json.dumps(rec["request"]["messages"], ensure_ascii=False)
        assert "workflow_failed" not in text
        assert "outcome" not in text.lower()
        assert '"label"' not in text


def test_record_demo_routes_by_what_the_prompt_says_and_reports_missing_answers(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(ROOT))
    from fixtures.record_demo import AnswerBook, answer_name

    (tmp_path / "luna").mkdir()
    (tmp_path / "luna" / "C004.json").write_text(
        '{"patterns": [], "rejected_candidates": [], "none_reason": "no step repeats on unchanged state"}',
        encoding="utf-8",
    )
    head = "Cell C004 · task T1 · run r1 · harness H0 · part 1/1\nLog"
    req = {"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": head}]}
    assert answer_name(req) == "luna/C004"
    split = {"messages": [{"role": "user", "content": head.replace("part 1/1", "part 2/3")}]}
    assert answer_name(split) == "luna/C004.part2of3"
    assert answer_name({"messages": [{"role": "user", "content": "Analysis run a; harness(es): H0.\n"}]}) == "sol"
    book = AnswerBook(tmp_path)
    assert book(req).status == 200 and book.served == {"luna/C004": 1}
    other = {
        "messages": [
            {"role": "user", "content": "Analysis run a; parent harness H0.\n\n## The confirmed weakness W-09 (gate"}
        ]
    }
    assert book(other).status == 400 and book.missing == {"proposer/W-09"}
    with pytest.raises(ValueError):
        book.path("../../etc/passwd")
