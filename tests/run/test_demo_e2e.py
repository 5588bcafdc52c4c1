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

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = ROOT / "fixtures" / "bundles" / "h0-demo"
STORE = ROOT / "fixtures" / "recordings" / "h0-demo"
STORY = ROOT / "fixtures" / "demo-story.json"

pytestmark = pytest.mark.skipif(
    not (BUNDLE / "analysis-request.json").is_file() or not any(STORE.glob("*/*.json")),
    reason="demo bundle or recordings absent (run: python fixtures/record_demo.py)",
)


@pytest.fixture(scope="module")
def cli_replay(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """README's first command, `lunasol run BUNDLE --replay STORE`, through the CLI: (run dir, output)."""
    runs = tmp_path_factory.mktemp("cli") / "runs"
    res = CliRunner().invoke(app, ["run", str(BUNDLE), "--replay", str(STORE), "--runs-dir", str(runs)])
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


def test_replay_twice_is_byte_identical(two_runs: tuple[Path, Path]) -> None:
    a, b = two_runs
    for name in ("patterns.jsonl", "pattern-groups.json", "weakness-shortlist.json", "ledger.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


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


def test_record_demo_routes_by_request_id_and_reports_missing_answers(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(ROOT))
    from fixtures.record_demo import AnswerBook, answer_name

    (tmp_path / "luna").mkdir()
    (tmp_path / "luna" / "C004.json").write_text('{"patterns": [], "rejected_candidates": []}', encoding="utf-8")
    req = {"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "request-id: luna/C004\nCell"}]}
    assert answer_name(req) == "luna/C004"
    book = AnswerBook(tmp_path)
    assert book(req).status == 200 and book.served == {"luna/C004": 1}
    other = {"messages": [{"role": "user", "content": "request-id: proposer/W-09\n"}]}
    assert book(other).status == 400 and book.missing == {"proposer/W-09"}
    with pytest.raises(ValueError):
        book.path("../../etc/passwd")
