"""Dry-run estimate: exact instructor request, offline token count, price per role (known or stated unknown)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import BaseModel

from pipeline.core.settings import ModelSettings
from pipeline.models import ModelClient, PlannedCall, estimate, format_estimate, gather_bounded, render
from pipeline.models.estimate import instructor_request
from pipeline.testing.openai_server import FakeOpenAI

pytestmark = pytest.mark.usefixtures("tiny_prompts")


class Pattern(BaseModel):
    """Small output model."""

    statement: str
    event_ids: list[str]


def planned(n: int, role: str = "t") -> list[PlannedCall]:
    return [PlannedCall(role, f"C{i}", {"cell_id": f"C{i}", "text": "x " * 50 * (i + 1)}, Pattern) for i in range(n)]


async def test_estimated_request_is_what_is_sent(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.push_answer({"statement": "s", "event_ids": []})
    ctx = {"cell_id": "C1", "text": "log"}
    await ModelClient(model_settings(), tmp_path).call(role="t", cell_id="C1", context=ctx, response_model=Pattern)
    req = instructor_request(render("t", ctx).messages, Pattern)
    sent = fake_llm.requests[0]
    assert req["messages"] == sent["messages"] and req["tools"] == sent["tools"]


def test_estimate_known_price() -> None:
    est = estimate(planned(3), ModelSettings(model="openai/gpt-4o-mini"))
    (role,) = est.roles
    assert role.role == "t" and role.calls == 3 and est.calls == 3
    # the schema in the tool definition is counted: more than the rendered text alone
    assert role.prompt_tokens > 3 * 40
    assert est.price_known and est.cost_usd is not None and est.cost_usd > 0
    text = format_estimate(est)
    assert "openai/gpt-4o-mini" in text and "price unknown" not in text and "$" in text
    assert est.as_dict()["roles"][0]["template_hash"].startswith("sha256:")


def test_estimate_grows_with_prompt_size() -> None:
    small = estimate(planned(1), ModelSettings(model="openai/gpt-4o-mini"))
    big = estimate(planned(2)[1:], ModelSettings(model="openai/gpt-4o-mini"))
    assert big.prompt_tokens > small.prompt_tokens


def test_estimate_unknown_price_is_stated() -> None:
    est = estimate(planned(2), ModelSettings(model="openai/my-local-model"))
    assert not est.price_known and est.cost_usd is None and est.prompt_tokens > 0
    text = format_estimate(est)
    assert "price unknown: openai/my-local-model" in text and "unknown" in text.splitlines()[3]  # first role row
    assert "context 128,000 tokens (assumed: litellm does not know openai/my-local-model" in text


async def test_gather_bounded_keeps_order_and_cancels_on_error() -> None:
    import asyncio

    running = 0
    peak = 0

    async def work(i: int) -> int:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1
        if i == 5:
            raise ValueError("boom")
        return i

    assert await gather_bounded([work(i) for i in range(5)], 2, progress=True) == [0, 1, 2, 3, 4]
    assert peak == 2
    with pytest.raises(ValueError, match="boom"):
        await gather_bounded([work(i) for i in range(10)], 3)
