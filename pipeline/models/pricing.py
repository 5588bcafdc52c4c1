"""Prices from litellm's bundled cost map: the batch price and the cached part of a prompt.

Batch endpoints bill about half the synchronous price; litellm's map says exactly how much
(``input_cost_per_token_batches`` / ``output_cost_per_token_batches``) and
``litellm.cost_calculator.batch_cost_calculator`` applies it. A model the map does not know has
no price (None), never a guess.
"""

from __future__ import annotations

from typing import Any

from pipeline.models.transport import load_litellm


def known(model: str) -> bool:
    """True when litellm's bundled map prices ``model``."""
    litellm = load_litellm()
    try:
        info = litellm.get_model_info(model=model)
    except Exception:  # litellm raises for a model it does not know
        return False
    return info.get("input_cost_per_token") is not None


def batch_price(model: str, prompt_tokens: int, completion_tokens: int, *, cached_tokens: int = 0) -> float | None:
    """What these tokens cost through the provider's batch endpoint, None when litellm has no price."""
    if not known(model):
        return None  # batch_cost_calculator answers 0.0 for an unknown model; never report a free guess
    litellm = load_litellm()
    from litellm.cost_calculator import batch_cost_calculator  # a submodule of the lazily imported litellm

    usage = litellm.Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details={"cached_tokens": cached_tokens} if cached_tokens else None,
    )
    p, c = batch_cost_calculator(usage=usage, model=model)
    return float(p) + float(c)


def cached_tokens(usage: Any) -> int:
    """Prompt tokens the provider served from its prompt cache (``prompt_tokens_details.cached_tokens``)."""
    if usage is None:
        return 0
    details = (
        usage.get("prompt_tokens_details") if isinstance(usage, dict) else getattr(usage, "prompt_tokens_details", None)
    )
    if details is None:
        return 0
    value = details.get("cached_tokens") if isinstance(details, dict) else getattr(details, "cached_tokens", None)
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0
