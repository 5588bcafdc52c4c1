"""Accounting of the model client: usage per exchange, price from litellm's map, the run's budget.

One :class:`Accounting` per :class:`~pipeline.models.client.ModelClient`; every exchange (live or
replayed) is booked here, and the budget is checked before any new HTTP request starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from pipeline.core.settings import ModelSettings
from pipeline.models import modelmap
from pipeline.models.errors import BudgetExceeded
from pipeline.models.pricing import batch_price, cached_tokens
from pipeline.models.transport import load_litellm


@dataclass
class Usage:
    """Spend so far (all roles): exchanges are HTTP answers received (or replayed)."""

    calls: int = 0
    exchanges: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    unpriced_exchanges: int = 0

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens

    @property
    def cost_known(self) -> bool:
        """False when any exchange used a model without a litellm price."""
        return self.unpriced_exchanges == 0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready view (cost None when unknown)."""
        d = asdict(self)
        d["total_tokens"] = self.total_tokens
        if not self.cost_known:
            d["cost_usd"] = None
        return d


@dataclass
class Booked:
    """What one exchange cost: tokens from the response's usage, and the price (None when unknown)."""

    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None
    cached_tokens: int = 0  # prompt tokens served from the provider's prompt cache


class Accounting:
    """Usage, price and budget of one client (all its roles and calls)."""

    def __init__(self, settings: ModelSettings, model: str | None, log: Callable[[str], None]) -> None:
        self.settings = settings
        self.model = model
        self.log = log
        self._usage = Usage()
        self._price_warned = False
        self._unpriced = False

    def usage(self) -> Usage:
        """Tokens and cost so far (a copy)."""
        return Usage(**asdict(self._usage))

    def count_call(self) -> None:
        """One more logical call finished (whatever its outcome)."""
        self._usage.calls += 1

    def check_budget(self) -> None:
        """Raise :class:`BudgetExceeded` when the USD or token budget is spent."""
        s, u = self.settings, self._usage
        over_usd = s.budget_usd is not None and u.cost_known and u.cost_usd >= s.budget_usd
        over_tok = s.budget_tokens is not None and u.total_tokens >= s.budget_tokens
        if s.budget_usd is not None and not u.cost_known and not self._price_warned:
            self._price_warned = True
            self.log(f"warning: no litellm price for {self.model}; --budget-usd cannot be enforced (use tokens)")
        if over_usd or over_tok:
            spent = f"${u.cost_usd:.4f}" if u.cost_known else "cost unknown"
            raise BudgetExceeded(
                f"budget exceeded after {u.calls} calls: {spent}, {u.total_tokens} tokens "
                f"(budget: usd={s.budget_usd}, tokens={s.budget_tokens})",
                spent_usd=u.cost_usd if u.cost_known else None,
                spent_tokens=u.total_tokens,
                budget_usd=s.budget_usd,
                budget_tokens=s.budget_tokens,
                tried=[{"action": "model calls", "outcome": f"{u.calls} calls, {u.exchanges} exchanges"}],
            )

    def price(self, prompt_tokens: int, completion_tokens: int) -> float | None:
        """USD for these tokens from litellm's bundled price map, or None for a model it does not price."""
        if self._unpriced:
            return None
        known = modelmap.price(str(self.model), prompt_tokens, completion_tokens)
        if known != modelmap.ASK:  # litellm's own answer, read from its map without importing it
            self._unpriced = known is None
            return None if known is None else float(known)
        litellm = load_litellm()
        try:
            p, c = litellm.cost_per_token(
                model=self.model, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
            )
            return float(p) + float(c)
        except Exception:  # litellm raises for a model not in its bundled price map; remember (it is slow)
            self._unpriced = True
            return None

    def book(self, response: Any, *, batch: bool = False) -> Booked:
        """Book one exchange's usage and price into the totals; return what it cost.

        ``response`` is litellm's response object or an answer's body (a replay parses bodies without
        litellm). ``batch``: answered through the provider's batch endpoint, priced at litellm's batch rates.
        """
        usage = response.get("usage") if isinstance(response, dict) else getattr(response, "usage", None)
        pt, ct = _count(usage, "prompt_tokens"), _count(usage, "completion_tokens")
        cost = batch_price(str(self.model), pt, ct) if batch and not self._unpriced else self.price(pt, ct)
        u = self._usage
        u.exchanges += 1
        u.prompt_tokens += pt
        u.completion_tokens += ct
        if cost is None:
            u.unpriced_exchanges += 1
        else:
            u.cost_usd += cost
        return Booked(pt, ct, cost, cached_tokens(usage))


def _count(usage: Any, name: str) -> int:
    value = usage.get(name) if isinstance(usage, dict) else getattr(usage, name, 0)
    try:
        return int(value or 0)
    except (TypeError, ValueError):  # a body with a malformed usage field books nothing
        return 0
