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


@pytest.fixture
def luna_prompt(tiny_prompts: Path) -> None:
    # The batched role's name over the tiny template: the price, not the prompt, is under test.
    (tiny_prompts / "luna.j2").write_text((tiny_prompts / "t.j2").read_text())


@pytest.mark.usefixtures("luna_prompt")
def test_dry_run_batch_shows_both_prices_from_litellms_batch_rates() -> None:
    import litellm

    est = estimate(planned(3, role="luna"), ModelSettings(model="openai/gpt-4o-mini", batch=True))
    (luna,) = est.roles
    rates = litellm.model_cost["gpt-4o-mini"]
    expected = (
        luna.prompt_tokens * rates["input_cost_per_token_batches"]
        + luna.completion_tokens * rates["output_cost_per_token_batches"]
    )
    assert luna.batch_cost_usd == pytest.approx(expected)
    assert est.cost_usd is not None and est.batch_cost_usd is not None and est.batch_cost_usd < est.cost_usd
    text = format_estimate(est)
    assert f"${est.batch_cost_usd:.4f} in all, against ${est.cost_usd:.4f} synchronous" in text
    assert est.as_dict()["batch_cost_usd"] == est.batch_cost_usd
    # Without --batch the line is not shown; a role that is not batched keeps its synchronous price.
    assert "--batch" not in format_estimate(
        estimate(planned(1, role="luna"), ModelSettings(model="openai/gpt-4o-mini"))
    )
    mixed = estimate([*planned(1, role="luna"), *planned(1, role="t")], ModelSettings(model="openai/gpt-4o-mini"))
    t = next(r for r in mixed.roles if r.role == "t")
    luna2 = next(r for r in mixed.roles if r.role == "luna")
    assert mixed.batch_cost_usd == pytest.approx((luna2.batch_cost_usd or 0) + (t.cost_usd or 0))


@pytest.mark.usefixtures("luna_prompt")
def test_dry_run_batch_price_unknown_is_stated() -> None:
    est = estimate(planned(2, role="luna"), ModelSettings(model="openai/my-local-model", batch=True))
    assert est.batch_cost_usd is None and est.roles[0].batch_cost_usd is None
    assert "--batch (luna in one provider batch" in format_estimate(est) and "unknown in all" in format_estimate(est)
