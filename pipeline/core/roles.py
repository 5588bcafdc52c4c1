"""Model roles: one spec per role, the one place a role's name, template and answer limits are kept.

A new role is one :class:`RoleSpec` here plus its code (the stage that calls it, its answer model
and ``prompts/<template>.j2``). The tables other modules used to keep by hand are read from these
specs: the templates hashed into run.json (:data:`pipeline.models.prompts.ROLES`), the default
``max_tokens`` (:meth:`pipeline.core.settings.ModelSettings.max_tokens_for`), the room kept for the
answer in the whole-request budget (:mod:`pipeline.models.budget`) and the roles ``--batch`` sends
through the provider's batch API (:mod:`pipeline.models.batch_submit`).

The answer model is named, not imported: it lives with the stage that owns it, in a layer above
this one (a test checks that each name resolves to a pydantic model).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_TOKENS = 2048
"""``max_tokens`` of a role that states none (and of a role no spec knows: tests, a role being added)."""


@dataclass(frozen=True)
class RoleSpec:
    """One model role."""

    name: str
    """As calls.jsonl, the ledger (``<role>/<cell>``) and the recordings name it."""
    answer: str
    """The answer model, ``module:Class`` (the pydantic model its structured call returns)."""
    answer_room: int
    """Tokens kept for the answer when a request is fitted to the model's context."""
    max_tokens: int = DEFAULT_MAX_TOKENS
    """``max_tokens`` sent by default: a bound a CPU server can finish (``--max-tokens`` overrides)."""
    batched: bool = False
    """Whether ``--batch`` sends its calls through the provider's batch API (one call per cell)."""

    @property
    def template(self) -> str:
        """Its prompt template, ``prompts/<template>.j2``."""
        return self.name


LUNA = RoleSpec("luna", "pipeline.luna.patterns:LunaAnswer", answer_room=4_000, max_tokens=4096, batched=True)
SOL = RoleSpec("sol", "pipeline.sol.cards:SolAnswer", answer_room=8_000, max_tokens=8192)
SOL_MAP = RoleSpec("sol_map", "pipeline.sol.cards:SolAnswer", answer_room=6_000)
SOL_REDUCE = RoleSpec("sol_reduce", "pipeline.sol.cards:ReduceAnswer", answer_room=8_000)
PROPOSER = RoleSpec("proposer", "pipeline.artifacts.proposal_card:ProposalList", answer_room=6_000, max_tokens=4096)
JUDGE = RoleSpec("judge", "pipeline.followup.judge:JudgeAnswer", answer_room=4_000, max_tokens=4096)

ASK = RoleSpec("ask", "pipeline.ask.answer:AskAnswer", answer_room=4_000, max_tokens=DEFAULT_MAX_TOKENS, batched=True)

ROLE_SPECS: tuple[RoleSpec, ...] = (LUNA, SOL, SOL_MAP, SOL_REDUCE, PROPOSER, JUDGE)
"""Every role of the flow (``lunasol run`` and the gates), in its order: their templates are hashed into run.json."""
VERB_ROLE_SPECS: tuple[RoleSpec, ...] = (ASK,)
"""Roles a verb calls on a finished run (``lunasol ask``), outside the flow and its run.json."""
BY_NAME: dict[str, RoleSpec] = {r.name: r for r in (*ROLE_SPECS, *VERB_ROLE_SPECS)}

__all__ = [
    "ASK", "BY_NAME", "DEFAULT_MAX_TOKENS", "JUDGE", "LUNA", "PROPOSER", "ROLE_SPECS", "SOL", "SOL_MAP", "SOL_REDUCE",
    "VERB_ROLE_SPECS",
]  # fmt: skip
