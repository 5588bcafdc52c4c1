"""A fleet of OpenAI-compatible endpoints serving one model, spread by litellm's Router.

``--api-base http://a:8000/v1,http://b:8000/v1`` (a comma list; ``URL#N`` caps that endpoint at N
calls in flight, default ``--concurrency``) runs every live call through ``litellm.Router``: one
deployment per endpoint, each with its own parallel-request bound, and a call that fails on one
endpoint (refused connection, timeout, 5xx) is retried on another while the failing one cools
down. An endpoint that dies mid-run so takes no cell with it. The Router is litellm's, not a
balancer of ours.

The request key and the recorded exchange never name the endpoint (``store.request_key`` leaves
``api_base`` out), so a fleet's recording replays with one endpoint or none, and the reverse.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any

from pipeline.core.errors import BadInput
from pipeline.models.transport import load_litellm

FLEET_GROUP = "lunasol-fleet"
"""The Router's model group name: every endpoint is one deployment of it."""

SLOTS_FULL = "max_parallel_requests slots in use"
"""litellm.Router's 429 when the endpoint it picked has every slot in use (it does not wait for one)."""

SLOT_WAIT_S = 0.05

COOLDOWN_S = 30.0
"""Seconds a failing endpoint is left out before the Router tries it again."""


@dataclass(frozen=True)
class Endpoint:
    """One OpenAI-compatible base URL of the fleet and its own bound on calls in flight."""

    url: str
    concurrency: int | None = None  # None: --concurrency


def endpoints(api_base: str | None) -> list[Endpoint]:
    """The endpoints of an ``--api-base`` value: one URL, or a comma list; ``URL#N`` bounds one at N calls.

    Raises :class:`BadInput` for an entry that is not an http(s) URL or whose bound is not a positive integer.
    """
    out: list[Endpoint] = []
    for part in (api_base or "").split(","):
        part = part.strip()
        if not part:
            continue
        url, hash_, cap = part.rpartition("#") if "#" in part else (part, "", "")
        if not url.startswith(("http://", "https://")):
            raise BadInput(f"invalid --api-base entry {part.split('@')[-1]!r}: expected an http:// or https:// URL")
        if hash_ and not (cap.isdigit() and int(cap) > 0):
            raise BadInput(f"invalid --api-base entry: '#{cap}' is not a positive number of calls in flight")
        out.append(Endpoint(url, int(cap) if hash_ else None))
    return out


def is_fleet(api_base: str | None) -> bool:
    """True when ``api_base`` names more than one endpoint (or bounds one with ``#N``)."""
    eps = endpoints(api_base)
    return len(eps) > 1 or any(e.concurrency is not None for e in eps)


def total_concurrency(api_base: str | None, per_endpoint: int) -> int:
    """Calls in flight over the whole fleet: the sum of every endpoint's bound."""
    return sum(e.concurrency or per_endpoint for e in endpoints(api_base)) or per_endpoint


class Fleet:
    """litellm's Router over the endpoints of ``api_base``, for one model."""

    def __init__(self, model: str, api_base: str, *, concurrency: int, timeout_s: float, api_key: str) -> None:
        litellm = load_litellm()
        self.endpoints = endpoints(api_base)
        deployments = [
            {
                "model_name": FLEET_GROUP,
                "litellm_params": {
                    "model": model,
                    "api_base": e.url,
                    "api_key": api_key,
                    "timeout": timeout_s,
                    "max_parallel_requests": e.concurrency or concurrency,
                },
                "model_info": {"id": f"endpoint-{i}"},
            }
            for i, e in enumerate(self.endpoints)
        ]
        # Retries here are the Router's own: each picks a deployment again, skipping cooled-down ones,
        # so a dead endpoint's call lands on a live one. lunasol's tenacity retries stay around the Router.
        # The Router registers each deployment's model in litellm's process-wide price map; a fleet must
        # not change what litellm says of that model elsewhere in the process, so the map is restored.
        known = dict(litellm.model_cost)
        self.router = litellm.Router(
            model_list=deployments,
            num_retries=len(self.endpoints) + 2,
            retry_after=0,
            allowed_fails=0,
            # A 429 is the Router's own "every slot of this endpoint is in use" (or the server's pacing), not a
            # dead endpoint: it must not send a live endpoint to cool down. Anything else cools it down at once.
            allowed_fails_policy=litellm.types.router.AllowedFailsPolicy(RateLimitErrorAllowedFails=1_000_000),
            cooldown_time=COOLDOWN_S,
            timeout=timeout_s,
        )
        litellm.model_cost.clear()
        litellm.model_cost.update(known)

    async def acompletion(self, call_kwargs: dict[str, Any]) -> Any:
        """One chat completion through the Router (the kwargs of ``litellm.acompletion``, minus the endpoint)."""
        kw = {k: v for k, v in call_kwargs.items() if k not in ("model", "api_base", "api_key", "client")}
        while True:
            try:
                response = await self.router.acompletion(model=FLEET_GROUP, **kw)
                break
            except Exception as exc:
                # litellm answers "every slot of the endpoint it picked is in use" with a 429 rather than
                # waiting: wait for a slot here (the Router picks again), never a retry of lunasol's budget.
                if SLOTS_FULL not in str(exc):
                    raise
                await asyncio.sleep(SLOT_WAIT_S)
        return response


DUMMY_API_KEY = "sk-lunasol-no-key"  # as pipeline.models.exchange sends to a bare OpenAI-compatible server


def fleet_api_key() -> str:
    """The key sent to every endpoint: OPENAI_API_KEY, or a dummy one (local servers need none)."""
    return os.environ.get("OPENAI_API_KEY") or DUMMY_API_KEY
