"""The demo's proposer fixtures: valid cards inside the demo weakness's support, an honest zero,
and (when the demo recordings hold proposer exchanges) an offline replay through gate 1 and propose."""

from __future__ import annotations

import json
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest

from pipeline.artifacts.proposal_card import ProposalCard, ProposalList
from pipeline.validator import validate_entries
from pipeline.validator.quantities import CELL_REF
from pipeline.validator.similarity import THRESHOLD, similarity
from tests.conftest import DEMO_RECORDINGS, ROOT

ANSWERS = ROOT / "fixtures" / "answers" / "h0-demo"
STORY = ROOT / "fixtures" / "demo-story.json"


def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _support(weakness_id: str) -> tuple[set[str], set[str], set[str]]:
    """Cells, tasks and runs of a demo weakness, derived the way Sol's checks do (cells -> IR rows)."""
    sol = _json(ANSWERS / "sol.json")
    story = _json(STORY)["cells"]
    w = next(w for w in sol["weaknesses"] if w["weakness_id"] == weakness_id)
    cells = set(w["support"]["cells"])
    return cells, {story[c]["task_id"] for c in cells}, {story[c]["run_id"] for c in cells}


def test_demo_answers_parse_and_pass_the_validator() -> None:
    for wid in ("W-01", "W-02"):
        answer = ProposalList.model_validate(_json(ANSWERS / "proposer" / f"{wid}.json"))
        result = validate_entries([c.model_dump(mode="json") for c in answer.proposals])
        assert result.valid, [f.line() for f in result.findings]


def test_w01_has_two_genuinely_different_strategies_inside_its_support() -> None:
    answer = ProposalList.model_validate(_json(ANSWERS / "proposer" / "W-01.json"))
    assert len(answer.proposals) == 2
    _, tasks, runs = _support("W-01")
    story_cells = set(_json(STORY)["cells"])
    for card in answer.proposals:
        assert card.source_weakness == "W-01" and card.parent_harness == "H0"
        assert set(card.evidence.affected_tasks) <= tasks
        assert set(card.evidence.affected_runs) <= runs
        named = {c for text in card.model_dump_json().split('"') for c in CELL_REF.findall(text)}
        assert named <= story_cells
    a, b = answer.proposals
    assert similarity(a, b) < THRESHOLD / 2  # far apart, not a paraphrase
    assert set(a.evidence.affected_runs) < set(b.evidence.affected_runs)  # P-01 claims only C018's run


def test_w02_is_an_honest_zero_with_its_reason() -> None:
    answer = ProposalList.model_validate(_json(ANSWERS / "proposer" / "W-02.json"))
    assert answer.proposals == []
    assert answer.note and "completed" in answer.note


def test_demo_cards_do_not_duplicate_the_corpus() -> None:
    cards = [ProposalCard.model_validate(c) for c in _json(ANSWERS / "proposer" / "W-01.json")["proposals"]]
    for x, y in combinations(cards, 2):
        assert similarity(x, y) < THRESHOLD


def _has_proposer_recordings() -> bool:
    if not DEMO_RECORDINGS.is_dir():
        return False
    return any(_json(path).get("role") == "proposer" for path in DEMO_RECORDINGS.glob("*/*.json"))


@pytest.mark.skipif(not _has_proposer_recordings(), reason="demo recordings hold no proposer exchange yet")
def test_demo_replay_through_gate1_and_propose(demo_copy: Path) -> None:
    """Offline: the demo run replayed to gate 1, confirmed with the demo decisions, proposed from the recordings."""
    import importlib.util

    from pipeline.proposals.proposer import propose, run_model_settings
    from pipeline.validator import validate_file

    spec = importlib.util.spec_from_file_location("proposer_demo", ROOT / "fixtures" / "proposer_demo.py")
    assert spec and spec.loader
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    run_dir = demo_copy
    demo.confirm_demo(run_dir)
    out = propose(run_dir, run_model_settings(run_dir), log=lambda _m: None)
    assert [(c.proposal_id, c.source_weakness) for c in out.cards] == [("P-01", "W-01"), ("P-02", "W-01")]
    by_w = {w["weakness_id"]: w for w in out.validation["weaknesses"]}
    assert by_w["W-02"]["zero_cards"] is True
    assert validate_file(run_dir / "proposals.yaml", run_dir).valid
