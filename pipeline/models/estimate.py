"""Dry run: render every planned prompt, count tokens offline, price per role; nothing is called.

Messages are the exact ones instructor would send (:func:`pipeline.models.shaping.shape_request`,
checked against instructor by the tests); nothing is sent.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from pipeline.core.settings import ModelSettings
from pipeline.models.batch_submit import BATCHED_ROLES
from pipeline.models.budget import ASSUMED_MODEL, ESTIMATE_FACTOR, model_limits, role_budget
from pipeline.models.modes import resolve_mode
from pipeline.models.pricing import batch_price
from pipeline.models.progress import plain_every
from pipeline.models.prompts import render
from pipeline.models.shaping import shape_request
from pipeline.models.store import RecordingStore
from pipeline.models.transport import load_litellm

DEFAULT_OUTPUT_TOKENS = 800
"""Assumed completion size per call when a role does not say (stated in the table)."""


@dataclass
class PlannedCall:
    """One call a role would make: ``plan(ctx) -> list[PlannedCall]`` in each role module."""

    role: str
    cell_id: str | None
    context: dict[str, Any]
    response_model: type[BaseModel]
    expected_output_tokens: int = DEFAULT_OUTPUT_TOKENS
    note: str = ""  # how the role planned this call (e.g. Sol's map/reduce plan), shown by the dry run


@dataclass
class RoleEstimate:
    """Totals for one role."""

    role: str
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0  # assumed, see PlannedCall.expected_output_tokens
    cost_usd: float | None = 0.0
    template_hash: str = ""
    batch_cost_usd: float | None = None  # the same tokens through the provider's batch endpoint
    largest_request: int = 0  # tokens of the largest request, as the budget counts them
    budget_tokens: int = 0  # whole-request budget of this role
    over_budget: int = 0  # requests larger than the budget
    notes: list[str] = field(default_factory=list)  # how the role planned its calls


@dataclass
class Estimate:
    """Calls, tokens and cost per role, before anything is called."""

    model: str
    roles: list[RoleEstimate] = field(default_factory=list)
    price_known: bool = True
    counted_with: str = "litellm.token_counter"
    model_assumed: bool = False  # no --model given: priced as ASSUMED_MODEL
    batch: bool = False  # --batch: Luna's calls go out as one provider batch (batch price shown)
    context: str = ""  # the model's context and how tokens are counted (pipeline.models.budget)

    @property
    def calls(self) -> int:
        """Planned calls (first attempts only; re-asks are not predicted)."""
        return sum(r.calls for r in self.roles)

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens of all first attempts."""
        return sum(r.prompt_tokens for r in self.roles)

    @property
    def completion_tokens(self) -> int:
        """Assumed completion tokens."""
        return sum(r.completion_tokens for r in self.roles)

    @property
    def cost_usd(self) -> float | None:
        """Estimated cost, None when the model has no litellm price."""
        if not self.price_known:
            return None
        return sum(r.cost_usd or 0.0 for r in self.roles)

    @property
    def batch_cost_usd(self) -> float | None:
        """Estimated cost with --batch: batched roles at the batch price, the others at the synchronous one."""
        if not self.price_known or any(r.role in BATCHED_ROLES and r.batch_cost_usd is None for r in self.roles):
            return None
        return sum((r.batch_cost_usd or 0.0) if r.role in BATCHED_ROLES else (r.cost_usd or 0.0) for r in self.roles)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready view."""
        return {
            "model": self.model,
            "model_assumed": self.model_assumed,
            "context": self.context,
            "price_known": self.price_known,
            "counted_with": self.counted_with,
            "calls": self.calls,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens_assumed": self.completion_tokens,
            "cost_usd": self.cost_usd,
            "batch": self.batch,
            "batch_cost_usd": self.batch_cost_usd,
            "roles": [
                {
                    "role": r.role,
                    "calls": r.calls,
                    "prompt_tokens": r.prompt_tokens,
                    "completion_tokens_assumed": r.completion_tokens,
                    "cost_usd": r.cost_usd,
                    "batch_cost_usd": r.batch_cost_usd if r.role in BATCHED_ROLES else None,
                    "template_hash": r.template_hash,
                    "largest_request_tokens": r.largest_request,
                    "budget_tokens": r.budget_tokens,
                    "over_budget": r.over_budget,
                    "notes": r.notes,
                }
                for r in self.roles
            ],
        }


def instructor_request(
    messages: list[dict[str, Any]], response_model: type[BaseModel], imode: str = "tools"
) -> dict[str, Any]:
    """The kwargs instructor would hand to litellm for these messages (schema, tools, system text added)."""
    return shape_request(messages, response_model, imode)


def _count(model: str, request: dict[str, Any]) -> int:

    litellm = load_litellm()

    return int(litellm.token_counter(model=model, messages=request["messages"], tools=request.get("tools")))


def _price(model: str, prompt_tokens: int, completion_tokens: int) -> float | None:

    litellm = load_litellm()

    try:
        p, c = litellm.cost_per_token(model=model, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
        return float(p) + float(c)
    except Exception:  # not in litellm's bundled price map
        return None


def estimate(
    planned: Iterable[PlannedCall], settings: ModelSettings, progress: Callable[[str], None] | None = None
) -> Estimate:
    """Render and count every planned call; price from litellm's bundled map (offline).

    ``progress``: told how many requests are counted so far, every :func:`plain_every` seconds
    (a 10,000-cell batch takes minutes to render and tokenize).
    """
    model = settings.model or ASSUMED_MODEL
    every, started = plain_every(), time.monotonic()
    last = started
    limits = model_limits(settings)
    est = Estimate(model=model, model_assumed=settings.model is None, context=limits.describe(), batch=settings.batch)
    by_role: dict[str, RoleEstimate] = {}
    store = RecordingStore(settings.store, "replay") if settings.store and settings.mode == "replay" else None
    imode = resolve_mode(settings, model, store)
    for counted, call in enumerate(planned, 1):
        rendered = render(call.role, call.context, response_model=call.response_model)
        request = instructor_request(rendered.messages, call.response_model, imode)
        prompt_tokens = _count(model, request)
        r = by_role.get(call.role)
        if r is None:
            budget = role_budget(settings, call.role)
            r = RoleEstimate(role=call.role, template_hash=rendered.template_hash, budget_tokens=budget.input_tokens)
            by_role[call.role] = r
        r.calls += 1
        r.prompt_tokens += prompt_tokens
        r.completion_tokens += call.expected_output_tokens
        # sized as the client's budget check sizes it (a conservative estimate without the model's tokenizer)
        sized = prompt_tokens if limits.exact else math.ceil(prompt_tokens * ESTIMATE_FACTOR)
        r.largest_request = max(r.largest_request, sized)
        r.over_budget += sized > r.budget_tokens
        if call.note and call.note not in r.notes:
            r.notes.append(call.note)
        if progress is not None and every > 0 and time.monotonic() - last >= every:
            last = time.monotonic()
            progress(f"{counted:,} request(s) rendered and counted ({call.role} now), {last - started:.0f} s")
    for r in by_role.values():
        r.cost_usd = _price(model, r.prompt_tokens, r.completion_tokens)
        r.batch_cost_usd = batch_price(model, r.prompt_tokens, r.completion_tokens)
        if r.cost_usd is None:
            est.price_known = False
        est.roles.append(r)
    return est


def format_estimate(est: Estimate) -> str:
    """Plain-text table of an :class:`Estimate`, stating assumptions and unknown prices."""
    assumed = " (assumed: no --model given)" if est.model_assumed else ""
    lines = [f"dry run: model {est.model}{assumed} (nothing was called)"]
    if est.context:
        lines.append(est.context)
    lines.append(
        f"{'role':<10} {'calls':>6} {'prompt tok':>11} {'output tok*':>12} {'est. cost':>12} "
        f"{'largest req':>12} {'budget':>9}"
    )

    def money(v: float | None) -> str:
        return "unknown" if v is None else f"${v:.4f}"

    for r in est.roles:
        lines.append(
            f"{r.role:<10} {r.calls:>6} {r.prompt_tokens:>11} {r.completion_tokens:>12} {money(r.cost_usd):>12} "
            f"{r.largest_request:>12} {r.budget_tokens:>9}"
        )
    lines.append(
        f"{'total':<10} {est.calls:>6} {est.prompt_tokens:>11} {est.completion_tokens:>12} {money(est.cost_usd):>12}"
    )
    lines.append(
        f"* output tokens assumed ({DEFAULT_OUTPUT_TOKENS} per call unless a role says otherwise); "
        "re-asks not included; prompt tokens counted offline with litellm.token_counter"
    )
    if not est.price_known:
        lines.append(f"price unknown: {est.model} is not in litellm's bundled price map")
    for r in est.roles:
        lines += [f"plan {r.role}: {n}" for n in r.notes]
    for r in est.roles:
        if r.over_budget:
            lines.append(
                f"WARNING: {r.over_budget} {r.role} request(s) exceed the budget of {r.budget_tokens:,} tokens "
                f"(largest {r.largest_request:,}); the provider would refuse them (give the model's real "
                "--context-tokens, or use --model with a larger context)"
            )
    if est.batch:
        lines.append(_batch_line(est, money))
    return "\n".join(lines)


def _batch_line(est: Estimate, money: Any) -> str:
    # Both prices side by side: what --batch saves, from litellm's batch rates (never an assumed half).
    batched = ", ".join(sorted(r.role for r in est.roles if r.role in BATCHED_ROLES)) or "no role of this run"
    return (
        f"--batch ({batched} in one provider batch at litellm's batch price, the rest synchronous): "
        f"{money(est.batch_cost_usd)} in all, against {money(est.cost_usd)} synchronous; "
        "a batch answers within 24 h"
    )
