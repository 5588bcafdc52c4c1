"""The demo at small contexts: budgets come from measurement, and every request fits the declared context.

The local server declares the context and counts each request the way a small-vocabulary model
would: cl100k_base tokens x 1.31, the ratio SmolLM2's tokenizer shows on the demo's rendered log
lines (2.16 characters a token against cl100k_base's 2.84; on English prose it is 1.05, so this
over-counts the instructions). Answers come from the scripted model (valid Luna and Sol answers
derived from each prompt), so the whole pipeline runs: Luna in parts, Sol in map/reduce.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import duckdb
import pytest

from pipeline.core.context import RunContext, RunOptions
from pipeline.core.settings import ModelSettings
from pipeline.luna.patterns import LunaAnswer
from pipeline.luna.stage import part_budget, prompt_overhead
from pipeline.luna.stage import plan as luna_plan
from pipeline.models import modelmap, render
from pipeline.models.budget import request_tokens, role_budget
from pipeline.run.runner import run
from pipeline.sol.shortlist import read_shortlist
from pipeline.testing.openai_server import FakeOpenAI
from pipeline.testing.scripted import ScriptedModel
from tests.conftest import DEMO_BUNDLE

# measured on the demo's rendered IR (1,354,034 characters); on whole Luna requests of today's compact
# rendering at 8K (log, prompt, tool schema) SmolLM2's tokenizer counts 1.255x cl100k_base, 1.289x at worst
SMOLLM2_PER_CL100K = 1.31


def smollm2_like(text: str) -> int:
    """A request's tokens as SmolLM2 would count them on log text (see the module docstring)."""
    return math.ceil(modelmap.count_tokens(text) * SMOLLM2_PER_CL100K)


@pytest.mark.slow
@pytest.mark.parametrize(("context", "max_parts"), [(8192, 6), (16384, 2), (32768, 1)])
def test_the_demo_plans_and_runs_map_reduce_within_a_small_context(
    context: int, max_parts: int, fake_llm: FakeOpenAI, model_settings: Any, tmp_path: Path
) -> None:
    fake_llm.handler = ScriptedModel()
    fake_llm.context_tokens = context
    fake_llm.token_counter = smollm2_like
    settings = model_settings(context_tokens=context, max_tokens=1024, concurrency=4)
    result = run(RunOptions(bundle=DEMO_BUNDLE, runs_dir=tmp_path / "runs", models=settings), log=lambda _m: None)
    # no request went over the declared context: the server refused none, and the largest fit
    assert fake_llm.refused_for_size == 0
    assert 0 < fake_llm.largest_request <= context - 1024
    con = duckdb.connect(str(result.ctx.ir_path), read_only=True)
    try:
        statuses = dict(con.execute("SELECT status, count(*) FROM luna_cells GROUP BY ALL").fetchall())
        parts = [r[0] for r in con.execute("SELECT parts FROM luna_cells").fetchall()]
    finally:
        con.close()
    assert statuses.get("failed", 0) == 0
    assert max(parts) <= max_parts  # measured, not assumed: 33-35 parts a cell at 8K before, then 9
    shortlist = read_shortlist(result.ctx.run_dir / "weakness-shortlist.json")
    assert shortlist.plan is not None and shortlist.plan.mode == "map_reduce"
    roles = {c.role for c in shortlist.plan.calls}
    assert {"sol_map", "sol_reduce"} <= roles
    assert all(c.request_tokens <= role_budget(settings, c.role).input_tokens for c in shortlist.plan.calls)


def test_the_answer_room_follows_max_tokens_and_the_prompt_is_measured() -> None:
    base = ModelSettings(model="openai/smollm2", api_base="http://127.0.0.1:9/v1", context_tokens=8192)
    assert role_budget(base, "luna").answer_tokens == 2048  # a quarter of the context without --max-tokens
    capped = base.model_copy(update={"max_tokens": 1024})
    assert role_budget(capped, "luna").answer_tokens == 1024
    assert role_budget(capped, "sol_map").input_tokens == 8192 - 1024
    # the prompt around the log is counted from the rendered template, not a fixed 6,000 tokens
    overhead = prompt_overhead(capped)
    assert 1000 < overhead < 4000
    budget = part_budget(capped)
    assert budget.tokens == 8192 - 1024 - overhead
    assert budget.chars_per_token == 2.0  # no sample, no known tokenizer: the JSON-heavy default
    assert "measured" in budget.describe()


@pytest.mark.parametrize("mode", [None, "tools"])
def test_every_demo_cell_fits_six_parts_at_8k_with_max_tokens_1024(
    demo_copy: Path, mode: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The plan a dry run makes (no model): at --context-tokens 8192 --max-tokens 1024 no demo cell needs
    # more than 6 Luna parts (11 before repeated texts were named by id and the prompt compacted), and
    # every part's request fits the budget as the request check counts it, whatever the mode.
    settings = ModelSettings(model="openai/smollm2", context_tokens=8192, max_tokens=1024, instructor_mode=mode)
    ctx = RunContext(options=RunOptions(bundle=DEMO_BUNDLE, models=settings), run_dir=demo_copy, log=lambda _m: None)
    calls = list(luna_plan(ctx))
    per_cell: dict[str, int] = {}
    for call in calls:
        per_cell[str(call.cell_id)] = per_cell.get(str(call.cell_id), 0) + 1
        assert call.context["part_total"] == sum(1 for c in calls if c.cell_id == call.cell_id)
    assert len(per_cell) == 24
    assert max(per_cell.values()) <= 6, per_cell
    assert max(per_cell.values()) > 1  # the largest cells (~44,500 characters) are still split at 8K
    budget = role_budget(settings, "luna")
    for call in calls:
        messages = render("luna", call.context, response_model=LunaAnswer).messages
        assert request_tokens(budget, messages, LunaAnswer) <= budget.input_tokens
