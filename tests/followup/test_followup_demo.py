"""The follow-up on the two demo generations, offline by replay: H0 (parent, P-02 selected) and H5 (child).

Both runs replay hand-written fixture answers recorded through record mode (fixtures/recordings/h0-demo,
fixtures/recordings/h5-demo, the latter holding the judge's exchange). One module fixture builds the pair.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.followup import read_followup
from pipeline.followup.inputs import load_side
from pipeline.followup.prevalence import families, targeted_change
from tests.conftest import ROOT, copy_demo

H5_BUNDLE = ROOT / "fixtures" / "bundles" / "h5-demo"
H5_RECORDINGS = ROOT / "fixtures" / "recordings" / "h5-demo"


@pytest.fixture(scope="module")
def demo_pair(demo_gate1: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The session's H0 demo copied and taken through both gates (P-02), and the H5 child replayed beside it."""
    import importlib.util

    from pipeline.core.context import RunOptions
    from pipeline.core.settings import ModelSettings
    from pipeline.run.runner import run

    if not any(H5_RECORDINGS.glob("*/*.json")):
        pytest.skip("H5 recordings absent (run: python fixtures/record_demo.py --generation h5)")
    spec = importlib.util.spec_from_file_location("followup_demo", ROOT / "fixtures" / "followup_demo.py")
    assert spec and spec.loader
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    root = tmp_path_factory.mktemp("h5")
    parent = copy_demo(demo_gate1, root)
    _through_gate2(parent, demo.PROPOSAL)
    child = run(RunOptions(bundle=H5_BUNDLE, runs_dir=root / "runs", models=ModelSettings(mode="replay",
                store=H5_RECORDINGS)), log=lambda _m: None).ctx.run_dir  # fmt: skip
    return {"parent": parent, "child": child}


def _through_gate2(parent: Path, proposal: str) -> None:
    from fixtures.proposer_demo import DEMO_DECIDER, confirm_demo
    from pipeline.gates.gate2 import select
    from pipeline.proposals.proposer import propose, run_model_settings
    from pipeline.state import handoff as hf

    confirm_demo(parent)
    propose(parent, run_model_settings(parent), log=lambda _m: None)
    select(parent, choice="proposal", proposal_id=proposal, by=DEMO_DECIDER,
           expected_digest=hf.load(parent).proposals_digest)  # fmt: skip


def test_demo_followup_end_to_end_by_replay(demo_pair: dict[str, Path]) -> None:
    parent, child = demo_pair["parent"], demo_pair["child"]
    runner = CliRunner()
    res = runner.invoke(app, ["followup", str(parent), "--proposal", "P-02", "--child", str(child)])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "verdict: REJECTED" in out and "rejection condition 4 is triggered" in out
    assert "overall" in out and "Fisher p" in out and "minimum detectable difference at 80% power" in out
    assert "bat-sanitize" in out and "conflict on condition 4" in out
    doc = read_followup(child)
    assert doc is not None and doc.digest == doc.content_digest()
    t = doc.targeted.overall
    assert (t.a_hits, t.a_n, t.b_hits, t.b_n) == (3, 24, 1, 24) and doc.targeted.child_cells == ["C015"]
    assert not t.significant and t.mdd is None  # 24 cells: underpowered, whatever the drop
    # the judge was replayed from the child's store, once, and answered every condition
    assert doc.judge is not None and doc.judge.ok and doc.judge.model == "openai/fixture-model"
    calls = [json.loads(x) for x in (child / "calls.jsonl").read_text().splitlines()]
    judged = [c for c in calls if c["role"] == "judge"]
    assert judged and all(c["mode"] == "replay" and c["outcome"] == "ok" for c in judged)
    # like Luna, the judge is never shown the sidecar: no outcome label, no outcome figure in its request
    key = judged[-1]["keys"][-1].split(":", 1)[-1]
    request = json.dumps(json.loads((H5_RECORDINGS / key[:2] / f"{key}.json").read_text())["request"])
    outcomes = [json.loads(x) for x in (H5_BUNDLE / "sidecar" / "outcomes.jsonl").read_text().splitlines()]
    assert outcomes and all(o["label"] not in request for o in outcomes if o["label"] != "completed")
    assert "outcome" not in request.lower() and "sidecar" not in request
    by = {c.index: c for c in doc.conditions}
    assert len(by) == 7 and all(c.judge is not None for c in by.values())
    assert by[5].status == "triggered" and by[5].decided_by == "count" and by[5].judge.status == "triggered"  # type: ignore[union-attr]
    assert [c.index for c in doc.conditions if c.decided_by == "judge"] == [1, 2, 3, 6]
    # condition 4: the count sees C015's review->review repeat; the judge read it otherwise: the count wins
    assert by[4].status == "triggered" and by[4].decided_by == "count" and by[4].cells == ["C015"]
    assert [(k.index, k.count_status, k.judge_status) for k in doc.conflicts] == [(4, "triggered", "not_triggered")]
    # every cited child ref, the count's and the judge's, is what `lunasol show-ref REF --run CHILD` prints
    refs = {r for c in doc.conditions for r in c.refs} | {r for c in doc.conditions if c.judge for r in c.judge.refs}
    refs |= set(doc.judge.behavioral_change.refs if doc.judge.behavioral_change else [])
    assert refs and all(r.startswith("cells/") and "#L" in r for r in refs)
    for ref in sorted(refs):
        shown = runner.invoke(app, ["show-ref", ref, "--run", str(child)])
        assert shown.exit_code == 0 and shown.output.strip(), (ref, shown.output)


def test_swapping_parent_and_child_flips_the_direction(demo_pair: dict[str, Path]) -> None:
    """The same matched groups counted child -> parent give the mirrored change (same p, opposite sign)."""
    parent, child = load_side(demo_pair["parent"], "parent"), load_side(demo_pair["child"], "child")
    fams = families(parent, child)
    weakness = next(w for w in parent.shortlist.weaknesses if w.weakness_id == "W-01")
    full, matched = targeted_change(parent, child, list(weakness.support.pattern_groups), fams)
    pairs = [(str(p["group_id"]), str(m["group_id"])) for p, m, _ in matched if m is not None]
    assert pairs  # the review->review groups come back in C015
    forward, _ = targeted_change(parent, child, [p for p, _ in pairs], fams)
    backward, back = targeted_change(child, parent, [c for _, c in pairs], families(child, parent))
    assert [(str(p["group_id"]), str(m["group_id"])) for p, m, _ in back if m is not None] == [(c, p) for p, c in pairs]
    f, b = forward.overall, backward.overall
    assert f.difference is not None and b.difference is not None and f.z is not None and b.z is not None
    assert f.difference < 0 < b.difference and b.difference == -f.difference and b.z == -f.z
    assert (f.a_hits, f.b_hits) == (b.b_hits, b.a_hits) and f.p_fisher == b.p_fisher
    assert full.overall.difference is not None and full.overall.difference < 0  # the whole weakness: fewer too
    # the lineage check refuses the swap itself: the H0 run implements nothing and has no child's selection
    res = CliRunner().invoke(app, ["followup", str(demo_pair["child"]), "--proposal", "P-02", "--child",
                                   str(demo_pair["parent"])])  # fmt: skip
    assert res.exit_code == 2 and "no gate-2 selection" in res.output


def test_the_h5_bundle_is_what_the_generator_writes() -> None:
    """The committed H5 bundle and story are the seeded generator's output, byte for byte."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("make_demo_bundle", ROOT / "fixtures" / "make_demo_bundle.py")
    assert spec and spec.loader
    gen = importlib.util.module_from_spec(spec)
    sys.modules["make_demo_bundle"] = gen
    spec.loader.exec_module(gen)
    assert gen.check(H5_BUNDLE, ROOT / "fixtures" / "demo-story-h5.json", "h5") == []


def test_the_child_report_shows_the_judge_and_the_conflict(demo_pair: dict[str, Path]) -> None:
    from pipeline.followup import followup
    from pipeline.report.build import render_report

    doc = followup(demo_pair["parent"], "P-02", demo_pair["child"]).doc  # replays the judge from the child's store
    html, stats = render_report(demo_pair["child"])
    assert 'id="followup-verdict">rejected<' in html and 'id="followup-behaviour"' in html
    assert "conflict on condition 4: count triggered, judge not_triggered" in html
    assert stats["unresolved"] == 0 and stats["hash_mismatches"] == 0
    for c in doc.conditions:
        assert all(ref in html for ref in c.refs)


def test_the_judge_request_shrinks_to_its_token_budget(demo_pair: dict[str, Path]) -> None:
    """Fewer cells with every controller line (the pattern's cells first), shorter lines: within --context-tokens."""
    from pipeline.core.settings import ModelSettings
    from pipeline.followup.inputs import load_selection
    from pipeline.followup.judge import JudgeAnswer, fit_request
    from pipeline.models import render
    from pipeline.models.budget import request_tokens, role_budget

    parent, child = load_side(demo_pair["parent"], "parent"), load_side(demo_pair["child"], "child")
    card = load_selection(demo_pair["parent"], "P-02").card
    fams = families(parent, child)
    weakness = next(w for w in parent.shortlist.weaknesses if w.weakness_id == card.source_weakness)
    _, matched = targeted_change(parent, child, list(weakness.support.pattern_groups), fams)

    def size(settings: ModelSettings) -> tuple[int, Any, int]:
        req = fit_request(child, card, matched, set(fams.covered), settings)
        budget = role_budget(settings, "judge")
        messages = render("judge", req.context, response_model=JudgeAnswer).messages
        assert request_tokens(budget, messages, JudgeAnswer) <= budget.input_tokens  # it fits
        return budget.count(messages), req, budget.input_tokens

    full_tokens, full, _ = size(ModelSettings(model="openai/fixture-model", context_tokens=128_000))
    assert full.full_cells == ["C004", "C013", "C015", "C017", "C018"] and full.context["omitted"] == 0
    for context_tokens in (full_tokens, 12_000, 8_000):
        tokens, req, limit = size(ModelSettings(model="openai/fixture-model", context_tokens=context_tokens))
        assert tokens <= limit < full_tokens
        assert "C015" in req.full_cells  # the cell with the targeted pattern keeps its whole timeline
        assert len(req.full_cells) < 5 or req.context["omitted"] > 0 or tokens < full_tokens
    assert req.context["omitted"] > 0 and len(req.full_cells) < 5  # the tightest: other cells only counted
