"""Reduce packing: a draft left alone joins the previous pack (it could merge with nothing alone)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from pipeline.core.settings import ModelSettings
from pipeline.models.budget import role_budget
from pipeline.sol.merge import pack


def _draft(i: int) -> Any:
    return SimpleNamespace(
        draft_id=f"M0{i}/W-01", card=SimpleNamespace(support=SimpleNamespace(pattern_groups=[f"G00{i}"]))
    )


def test_a_last_draft_alone_joins_a_pack_of_two() -> None:
    # two packs, [d1, d2] and [d3]: the lone draft joins the first (this raised IndexError at an 8K context)
    budget = role_budget(ModelSettings(model="openai/x", context_tokens=8192), "sol_reduce")
    drafts = [_draft(i) for i in (1, 2, 3)]
    blocks = {d.draft_id: "word " * 60 for d in drafts}
    packs = pack(drafts, blocks, budget, fixed_tokens=budget.input_tokens - 100)
    assert [[d.draft_id for d in p] for p in packs] == [["M01/W-01", "M02/W-01", "M03/W-01"]]
