"""The proposer's request fits its whole-request budget: cited groups compact first, then only cited cells."""

from __future__ import annotations

from pathlib import Path

from pipeline.artifacts.proposal_card import ProposalList
from pipeline.core.settings import ModelSettings
from pipeline.models import render
from pipeline.models.budget import request_tokens, role_budget
from pipeline.proposals.proposer import ROLE, _groups_by_id, build_context, fit_context
from pipeline.sol.shortlist import read_shortlist
from pipeline.validator import load_run_facts


def test_proposer_context_fits_a_small_budget(demo_gate1: Path) -> None:
    w = read_shortlist(demo_gate1 / "weakness-shortlist.json").weaknesses[0]
    groups = _groups_by_id(demo_gate1)
    full = build_context(demo_gate1, w, {"decision": "confirm"}, load_run_facts(demo_gate1), groups)
    roomy = ModelSettings(model="openai/fixture-model")
    assert fit_context(full, w, groups, roomy) is full  # fits: the full view, unchanged
    small = ModelSettings(model="openai/fixture-model", context_tokens=14_000)
    budget = role_budget(small, ROLE)
    full_messages = render(ROLE, full, response_model=ProposalList).messages
    assert not budget.fits(request_tokens(budget, full_messages, ProposalList))
    fitted = fit_context(full, w, groups, small)
    fitted_messages = render(ROLE, fitted, response_model=ProposalList).messages
    assert budget.fits(request_tokens(budget, fitted_messages, ProposalList))
    # every cited group is still named, each of its occurrences reachable by id
    for gid in w.support.pattern_groups:
        assert gid in fitted["pattern_groups_json"]
        for o in groups[gid]["occurrences"]:
            assert o["occurrence_id"] in fitted["pattern_groups_json"]
