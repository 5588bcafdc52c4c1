"""``lunasol diff`` leads with what a reader decides on: cards added, dropped or changed, and their support.

Synthetic runs (tests.diff.test_diff's builder) check each status; the two demo generations (H0 and
H5, both replayed from their fixture recordings) check that the lead comes before the per-cell
pattern detail in text, Markdown, JSON and HTML, with support counts read independently from the
two shortlists.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.diff import diff_run_dirs, render_html, render_markdown, render_text
from tests.conftest import ROOT
from tests.diff.test_diff import build_run, copy_run, rewrite_json, weakness

H5_BUNDLE = ROOT / "fixtures" / "bundles" / "h5-demo"
H5_RECORDINGS = ROOT / "fixtures" / "recordings" / "h5-demo"


@pytest.fixture(scope="module")
def base_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_run(tmp_path_factory.mktemp("decisions"))


def test_same_run_lists_every_card_unchanged(base_run: Path) -> None:
    d = diff_run_dirs(base_run, base_run).decisions
    assert [(w.status, w.a_id, w.b_id) for w in d.weaknesses] == [
        ("unchanged", "W-01", "W-01"),
        ("unchanged", "W-02", "W-02"),
    ]
    rows = [(p.status, p.a_id, p.verdict_a, p.verdict_b) for p in d.proposals]
    assert rows == [("unchanged", "P-01", "valid", "valid")]
    assert d.weaknesses[0].gate1_a == "confirm" and d.weaknesses[1].gate1_b == "reject"


def test_added_dropped_and_support_moved(base_run: Path) -> None:
    b = copy_run(base_run, "moved")

    def change(doc: dict[str, Any]) -> dict[str, Any]:
        w1, _w2 = doc["weaknesses"]
        # W-01 loses C002 and gains C003; W-02 is dropped; a new card on C002 alone is added.
        w1["support"]["cells"] = ["C001", "C003"]
        w1["support"]["counts"]["cells"] = 2
        w1["confidence"] = "high"
        new = weakness("W-02", ["C002"], ["C002-e0099"], "a grep repeats an earlier grep", "low")
        doc["weaknesses"] = [w1, new]
        return doc

    rewrite_json(b / "weakness-shortlist.json", change)
    doc = yaml.safe_load((b / "proposals.yaml").read_text())
    doc["proposals"][0]["proposal_id"] = "P-03"
    (b / "proposals.yaml").write_text(yaml.safe_dump(doc))
    write = {"results": [{"proposal_id": "P-03", "valid": False, "errors": [{"rule": "R-LEVER"}]}]}
    (b / "validation.json").write_text(json.dumps(write))
    d = diff_run_dirs(base_run, b)
    by = {(w.status, w.a_id, w.b_id): w for w in d.decisions.weaknesses}
    assert set(by) == {("changed", "W-01", "W-01"), ("dropped", "W-02", None), ("added", None, "W-02")}
    w1 = by[("changed", "W-01", "W-01")]
    assert (w1.cells_gained, w1.cells_lost) == (["C003"], ["C002"])
    assert (w1.confidence_a, w1.confidence_b) == ("medium", "high")
    assert "confidence" in w1.changed_fields and "support" in w1.changed_fields
    assert w1.support_a is not None and w1.support_b is not None
    assert (w1.support_a.cells, w1.support_b.cells) == (2, 2)
    assert by[("dropped", "W-02", None)].cells_lost == ["C003"]
    assert by[("added", None, "W-02")].cells_gained == ["C002"]
    (p,) = d.decisions.proposals
    assert (p.status, p.a_id, p.b_id, p.verdict_a, p.verdict_b) == ("changed", "P-01", "P-03", "valid", "invalid")
    assert d.decisions.counts("weaknesses") == {"added": 1, "dropped": 1, "changed": 1, "unchanged": 0}

    text = render_text(d)
    lead = text[: text.index("PATTERNS PER CELL")]
    assert "dropped W-02: obligations stay open" in lead
    assert "added W-02: a grep repeats" in lead
    assert "(+C003 -C002)" in lead
    assert "changed P-01 -> P-03 (for W-01)" in lead and "validation valid -> invalid" in lead


def _lines_before(text: str, marker: str) -> list[str]:
    lines = text.splitlines()
    return lines[: next(i for i, line in enumerate(lines) if marker in line)]


@pytest.mark.skipif(not any(H5_RECORDINGS.glob("*/*.json")), reason="h5 demo recordings absent")
def test_demo_generations_lead_with_decisions(demo_gate1: Path, tmp_path: Path) -> None:
    from pipeline.core.context import RunOptions
    from pipeline.core.settings import ModelSettings
    from pipeline.run.runner import run

    settings = ModelSettings(mode="replay", store=H5_RECORDINGS)
    h5 = run(RunOptions(bundle=H5_BUNDLE, runs_dir=tmp_path / "runs", models=settings), log=lambda _m: None).ctx.run_dir
    d = diff_run_dirs(demo_gate1, h5)

    # The expected support, read from the two shortlists here, not from the diff.
    def cards(run_dir: Path) -> dict[str, set[str]]:
        doc = json.loads((run_dir / "weakness-shortlist.json").read_text())
        return {w["weakness_id"]: set(w["support"]["cells"]) for w in doc["weaknesses"]}

    ca, cb = cards(demo_gate1), cards(h5)
    assert {w.a_id for w in d.decisions.weaknesses if w.a_id} == set(ca)
    assert {w.b_id for w in d.decisions.weaknesses if w.b_id} == set(cb)
    for w in d.decisions.weaknesses:
        if w.a_id and w.b_id:
            assert set(w.cells_lost) == ca[w.a_id] - cb[w.b_id]
            assert set(w.cells_gained) == cb[w.b_id] - ca[w.a_id]
            assert w.support_a is not None and w.support_a.cells == len(ca[w.a_id])
            assert w.support_b is not None and w.support_b.cells == len(cb[w.b_id])
            assert w.support_a.denominator == 24

    text = render_text(d)
    before = _lines_before(text, "PATTERNS PER CELL")
    head = "\n".join(before)
    for w in d.decisions.weaknesses:
        assert f"{w.status} {w.a_id} -> {w.b_id}" in head or f"{w.status} {w.a_id}:" in head
    # The lead is short: every card and its support within the first 20 lines, before any cell detail.
    lead = _lines_before(text, "WEAKNESSES:")
    assert len(lead) <= 20 and sum("support: cells" in line for line in lead) == len(d.decisions.weaknesses)
    assert len(before) < len(text.splitlines()) // 2

    md = render_markdown(d)
    assert md.index("## decisions") < md.index("## weaknesses") < md.index("## patterns per cell")
    html = render_html(d)
    assert html.index("<h2>decisions") < html.index("<h2>weaknesses") < html.index("<h2>patterns per cell")
    res = CliRunner().invoke(app, ["diff", str(demo_gate1), str(h5), "--json"])
    assert res.exit_code == 1
    keys = list(json.loads(res.output))
    assert keys.index("decisions") < keys.index("cells") and keys[:6] == ["a", "b", "a_run_id", "b_run_id",
                                                                           "identical", "decisions"]  # fmt: skip
    assert json.loads(res.output)["decisions"]["counts"]["weaknesses"]["changed"] == sum(
        w.status == "changed" for w in d.decisions.weaknesses
    )
