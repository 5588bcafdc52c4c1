"""litellm's map read without litellm (pipeline.models.modelmap) gives litellm's own answers, entry by entry."""

from __future__ import annotations

import pytest

from pipeline.models import modelmap
from pipeline.models.transport import load_litellm

UNKNOWN = ["openai/fixture-model", "openai/test-model", "openai/zqxv-7b", "openai/my_local_llama"]


def _openai_models() -> list[str]:
    table = modelmap.bundled_map()
    assert table, "litellm's bundled map was not found"
    names = [k for k, v in table.items() if isinstance(v, dict) and v.get("litellm_provider") == "openai"]
    return sorted({k if k.startswith("openai/") else f"openai/{k}" for k in names} | set(UNKNOWN))


def _litellm_limits(litellm: object, model: str) -> tuple[int | None, int | None, str | None] | None:
    try:
        info = litellm.get_model_info(model)  # type: ignore[attr-defined]
    except Exception:
        return None
    max_in = info.get("max_input_tokens") or info.get("max_tokens")
    max_out = info.get("max_output_tokens")
    return (int(max_in) if max_in else None, int(max_out) if max_out else None, info.get("litellm_provider") or None)


def _litellm_price(litellm: object, model: str, pt: int, ct: int) -> float | None:
    try:
        p, c = litellm.cost_per_token(model=model, prompt_tokens=pt, completion_tokens=ct)  # type: ignore[attr-defined]
    except Exception:
        return None
    return float(p) + float(c)


def test_limits_and_prices_are_litellms_wherever_the_map_answers() -> None:
    litellm = load_litellm()
    answered = priced = 0
    for model in _openai_models():
        limits = modelmap.limits(model)
        if limits != modelmap.ASK:
            answered += 1
            expected = _litellm_limits(litellm, model)
            assert limits == (expected or (None, None, None)), model
        for pt, ct in ((1_000, 200), (15_333, 217), (300_000, 5_000)):
            price = modelmap.price(model, pt, ct)
            if price != modelmap.ASK:
                priced += price is not None
                assert price == _litellm_price(litellm, model, pt, ct), (model, pt, ct)
    assert answered > 100 and priced > 100  # the map answers for most OpenAI models, not just a few


@pytest.mark.parametrize("model", UNKNOWN)
def test_a_model_litellm_does_not_know_needs_no_litellm(model: str) -> None:
    assert modelmap.limits(model) == (None, None, None)
    assert modelmap.price(model, 10, 5) is None


@pytest.mark.parametrize("model", ["openai/gpt-5-foo", "openai/gpt-4o-mini-2099-01-01", "anthropic/claude-x", "gpt-4o"])
def test_what_only_litellm_can_resolve_is_asked_of_litellm(model: str) -> None:
    # litellm resolves wildcards, dated versions and other providers with its own code.
    assert modelmap.lookup(model) == modelmap.ASK or modelmap.limits(model) != (None, None, None)


def test_token_counts_are_litellms() -> None:
    litellm = load_litellm()
    texts = [
        "",
        "hello",
        "C001-e0042 read .workflow/tasks.md twice",
        "建议 应该 根因 " * 50,
        "<|endoftext|> {{ x }}\n" * 9,
    ]
    for text in texts:
        assert modelmap.count_tokens(text) == len(litellm.encode(model="gpt-4o", text=text))
