"""``lunasol eval RUN --labels FILE.csv|.parquet``: your own labels against Luna's patterns and the cards.

The expected confusion matrices are computed here, independently, from the run's patterns.jsonl
and weakness shortlist and from the labels the test writes (seeded random labels over the demo's
cells), then compared with what ``eval`` prints as JSON.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import duckdb
import pytest
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.eval.user_labels import confusion, evaluate_label_file
from tests.conftest import copy_demo

TYPES = ("omission", "repeated_exploration", "zero_information_gain")


def _truth(run: Path) -> tuple[dict[str, set[str]], dict[str, set[str]], list[str]]:
    """Cells per pattern type, cells per card, eligible cells: read straight from the artifacts."""
    by_type: dict[str, set[str]] = {}
    for line in (run / "patterns.jsonl").read_text().splitlines():
        if line.strip():
            p = json.loads(line)
            by_type.setdefault(p["type"], set()).add(p["cell_id"])
    doc = json.loads((run / "weakness-shortlist.json").read_text())
    by_card = {w["weakness_id"]: set(w["support"]["cells"]) for w in doc["weaknesses"]}
    return by_type, by_card, sorted(doc["denominator"]["cells"])


def _labels(cells: list[str], names: list[str], seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    rows: list[tuple[str, str]] = []
    for cell in rng.sample(cells, 16):
        picked = [n for n in names if rng.random() < 0.35]
        rows += [(cell, n) for n in picked] or [(cell, "none")]
    return rows


def _expected(rows: list[tuple[str, str]], predicted: dict[str, set[str]], name: str) -> dict[str, int]:
    labelled = {c for c, _ in rows}
    gold = {c for c, n in rows if n == name}
    pred = predicted.get(name, set()) & labelled
    return {
        "tp": len(gold & pred),
        "fp": len(pred - gold),
        "fn": len(gold - pred),
        "tn": len(labelled - gold - pred),
    }


def _write_csv(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("cell,label\n" + "".join(f"{c},{n}\n" for c, n in rows), encoding="utf-8")
    return path


def test_counts_match_an_independent_count_csv_and_parquet(demo_gate1: Path, tmp_path: Path) -> None:
    by_type, by_card, cells = _truth(demo_gate1)
    names = [*TYPES, *sorted(by_card)]
    rows = _labels(cells, names, seed=7)
    csv = _write_csv(tmp_path / "mine.csv", rows)
    parquet = tmp_path / "mine.parquet"
    con = duckdb.connect()
    con.execute(f"COPY (SELECT * FROM read_csv('{csv}', header = true, all_varchar = true)) TO '{parquet}'")
    con.close()
    for path in (csv, parquet):
        res = CliRunner().invoke(app, ["eval", str(demo_gate1), "--labels", str(path), "--json"])
        assert res.exit_code == 0, res.output
        report: dict[str, Any] = json.loads(res.output)
        assert report["labelled_cells"] == len({c for c, _ in rows})
        types = report["sources"]["patterns"]["types"]
        cards = report["sources"]["weakness_cards"]["cards"]
        assert set(types) >= {n for _, n in rows if n in TYPES}
        for t in types:
            got = {k: types[t][k] for k in ("tp", "fp", "fn", "tn")}
            assert got == _expected(rows, by_type, t), t
        for w in cards:
            got = {k: cards[w][k] for k in ("tp", "fp", "fn", "tn")}
            assert got == _expected(rows, by_card, w), w
        # Some labels must disagree with the findings, or this test would not tell a wrong count apart.
        assert any(m["fp"] + m["fn"] for m in [*types.values(), *cards.values()])


def test_source_ids_name_cells_and_text_table(demo_gate1: Path, tmp_path: Path) -> None:
    con = duckdb.connect(str(demo_gate1 / "ir.duckdb"), read_only=True)
    (source,) = con.execute("SELECT run_id FROM cells WHERE cell_id = 'C002'").fetchone() or ("",)
    con.close()
    by_type, _, _ = _truth(demo_gate1)
    label = "omission" if "C002" in by_type.get("omission", set()) else "repeated_exploration"
    path = tmp_path / "by-source.csv"
    path.write_text(f"source_id,label\n{source},{label}\nC010,none\n", encoding="utf-8")
    report = evaluate_label_file(demo_gate1, path)
    assert report["labelled_cells"] == 2
    m = report["sources"]["patterns"]["types"][label]
    assert m["tp"] == 1 and m["fn"] == 0
    res = CliRunner().invoke(app, ["eval", str(demo_gate1), "--labels", str(path)])
    assert res.exit_code == 0 and "2 labelled cells of 24" in res.output
    assert "precision" in res.output and "bal.acc" in res.output


def test_confusion_formulas() -> None:
    m = confusion(tp=3, fp=1, fn=2, tn=4)
    assert (m["precision"], m["recall"], m["f1"]) == (0.75, 0.6, round(6 / 9, 4))
    assert m["balanced_accuracy"] == round((0.6 + 0.8) / 2, 4)
    assert confusion(0, 0, 0, 5)["precision"] is None and confusion(0, 0, 0, 5)["balanced_accuracy"] is None


def test_steps_checked_against_cited_events(demo_gate1: Path, tmp_path: Path) -> None:
    run = copy_demo(demo_gate1, tmp_path)
    # The demo's native logs carry no step numbers: give every event its seq as a step, in the copy.
    con = duckdb.connect(str(run / "ir.duckdb"))
    con.execute("UPDATE events SET step_index = seq")
    con.close()
    p = next(json.loads(line) for line in (run / "patterns.jsonl").read_text().splitlines() if line.strip())
    con = duckdb.connect(str(run / "ir.duckdb"), read_only=True)
    seqs = [s for (s,) in con.execute("SELECT seq FROM events WHERE event_id IN ?", [p["evidence"]]).fetchall()]
    con.close()
    path = tmp_path / "steps.csv"
    path.write_text(f"cell,label,step\n{p['cell_id']},{p['type']},{min(seqs) - 1}\n", encoding="utf-8")
    steps = evaluate_label_file(run, path)["sources"]["patterns"]["types"][p["type"]]["steps"]
    assert steps == {"checked": 1, "exact": 0, "within_1": 1}
    path.write_text(f"cell,label,step\n{p['cell_id']},{p['type']},{min(seqs)}\n", encoding="utf-8")
    steps = evaluate_label_file(run, path)["sources"]["patterns"]["types"][p["type"]]["steps"]
    assert steps == {"checked": 1, "exact": 1, "within_1": 1}


@pytest.mark.parametrize(
    ("name", "body", "message"),
    [
        ("no-label.csv", "cell,verdict\nC001,omission\n", "needs an id column"),
        ("unknown-cell.csv", "cell,label\nC999,omission\n", "row 1: 'C999' is neither a cell id"),
        ("typo.csv", "cell,label\nC001,omission\nC002,repeated-exploration\n", "row 2: label 'repeated-exploration'"),
        ("bad-step.csv", "cell,label,step\nC001,omission,three\n", "row 1: step 'three' is not a whole number"),
        ("empty.csv", "cell,label\n", "no rows"),
        ("broken.parquet", "not parquet at all", "not a readable parquet file"),
        ("missing.csv", None, "file not found"),
        ("labels.txt", "cell,label\n", "expected a .csv or .parquet file"),
    ],
)
def test_bad_label_files_one_line_exit_2(
    demo_gate1: Path, tmp_path: Path, name: str, body: str | None, message: str
) -> None:
    path = tmp_path / name
    if body is not None:
        path.write_text(body, encoding="utf-8")
    res = CliRunner().invoke(app, ["eval", str(demo_gate1), "--labels", str(path)])
    if name == "labels.txt":  # not a file suffix: read as an (unknown) public label format
        assert res.exit_code == 2 and "unknown label format" in res.output
        return
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1
