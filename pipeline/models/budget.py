"""Whole-request token budgets: every request a role sends must fit the model's input limit.

The limit comes from ``--context-tokens`` / ``LUNASOL_CONTEXT_TOKENS`` when given (local or
unknown models), else from litellm's bundled model map (``litellm.get_model_info``, offline), else
:data:`ASSUMED_CONTEXT_TOKENS`, said so wherever the budget is shown. A role's budget is that limit
minus room for its answer. Requests are counted whole (system + user messages, the output schema
instructor sends as a tool, per-message framing): with the model's own tokenizer when litellm has
it (OpenAI models: tiktoken), otherwise with cl100k_base times :data:`ESTIMATE_FACTOR`, a
conservative estimate that is labelled as such. The answer's room is ``--max-tokens`` when it is set
(what the server is told it may generate), else the role's default capped at a quarter of the context.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from pipeline.core.roles import ROLE_SPECS, VERB_ROLE_SPECS
from pipeline.core.settings import ModelSettings
from pipeline.models import modelmap
from pipeline.models.errors import ContextExceeded
from pipeline.models.transport import describe, load_litellm, stated_context

ASSUMED_MODEL = "openai/gpt-4o-mini"
"""Model whose limits a dry run uses when no model is given (said so in its table)."""

ASSUMED_CONTEXT_TOKENS = 128_000
"""Input limit assumed for a model litellm does not know, when ``--context-tokens`` is not given."""

ESTIMATE_FACTOR = 1.35
"""cl100k_base count times this when litellm has no tokenizer of the model (over-counts on purpose).

Measured on the demo's rendered Luna IR (1,354,034 characters of JSON-heavy log lines):
cl100k_base counts 2.84 characters per token, SmolLM2's 49K-token BPE 2.16 (1.31 times as many
tokens; 1.05 times on English prose). 1.25 under-counted such small-vocabulary models.
"""

ANSWER_TOKENS: dict[str, int] = {r.name: r.answer_room for r in (*ROLE_SPECS, *VERB_ROLE_SPECS)}
"""Room kept for each role's answer (capped by the model's output limit and a quarter of its context)."""

DEFAULT_ANSWER_TOKENS = 4_000
_PER_MESSAGE = 4  # role and framing tokens per chat message (OpenAI's published accounting)
_PER_REQUEST = 3
_EXACT_PROVIDERS = frozenset({"openai", "azure", "text-completion-openai"})
_COUNT_WITH = "gpt-4o"  # litellm's bundled tiktoken encoding: never fetched from the network


@dataclass(frozen=True)
class ModelLimits:
    """What lunasol knows of a model's size limits and how it counts its tokens."""

    model: str
    context_tokens: int
    context_source: str  # "--context-tokens", "litellm model info" or "assumed"
    max_output_tokens: int | None
    exact: bool  # True: litellm has this model's tokenizer; False: a conservative estimate

    @property
    def counting(self) -> str:
        """How tokens are counted, for output."""
        if self.exact:
            return f"counted with {self.model}'s tokenizer (litellm)"
        return f"estimated: no tokenizer for {self.model} in litellm, cl100k_base x {ESTIMATE_FACTOR} (conservative)"

    def describe(self) -> str:
        """One line: the limit, where it comes from, how tokens are counted."""
        source = {
            "assumed": f"assumed: litellm does not know {self.model}; set --context-tokens N",
            "--context-tokens": "--context-tokens / LUNASOL_CONTEXT_TOKENS",
        }.get(self.context_source, self.context_source)
        return f"context {self.context_tokens:,} tokens ({source}); {self.counting}"


@dataclass(frozen=True)
class RoleBudget:
    """The whole-request budget of one role: the model's input limit minus room for the answer."""

    role: str
    limits: ModelLimits
    answer_tokens: int

    @property
    def input_tokens(self) -> int:
        """Tokens one whole request of this role may take."""
        return max(self.limits.context_tokens - self.answer_tokens, 1)

    def fits(self, tokens: int) -> bool:
        """True when a request of ``tokens`` fits."""
        return tokens <= self.input_tokens

    def count(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
        """Tokens of a whole request (see :func:`count_request`)."""
        return count_request(self.limits, messages, tools)

    def describe(self) -> str:
        """One line for output."""
        return (
            f"{self.role}: {self.input_tokens:,} tokens per request "
            f"({self.limits.context_tokens:,} context - {self.answer_tokens:,} for the answer)"
        )


@functools.lru_cache(maxsize=32)
def _model_info(model: str) -> tuple[int | None, int | None, str | None]:
    known = modelmap.limits(model)
    if not isinstance(known, str):  # litellm's own answer, read from its map without importing it
        return known
    litellm = load_litellm()
    try:
        info = litellm.get_model_info(model)
    except Exception:  # litellm raises for a model that is not in its bundled map
        return None, None, None
    max_in = info.get("max_input_tokens") or info.get("max_tokens")
    return (
        int(max_in) if max_in else None,
        int(info["max_output_tokens"]) if info.get("max_output_tokens") else None,
        str(info.get("litellm_provider") or "") or None,
    )


def model_limits(settings: ModelSettings) -> ModelLimits:
    """The limits of the settings' model (or :data:`ASSUMED_MODEL` when none is given)."""
    model = settings.model or ASSUMED_MODEL
    max_in, max_out, provider = _model_info(model)
    exact = provider in _EXACT_PROVIDERS
    if settings.context_tokens:
        return ModelLimits(model, int(settings.context_tokens), "--context-tokens", max_out, exact)
    if max_in:
        return ModelLimits(model, max_in, "litellm model info", max_out, exact)
    return ModelLimits(model, ASSUMED_CONTEXT_TOKENS, "assumed", max_out, exact)


def role_budget(settings: ModelSettings, role: str) -> RoleBudget:
    """The budget of ``role``'s requests under ``settings``.

    With ``--max-tokens N`` the answer's room is N (the bound every request carries; at most half the
    context, so a request still has room); otherwise the role's default, capped by the model's output
    limit and a quarter of its context.
    """
    limits = model_limits(settings)
    if settings.max_tokens:
        return RoleBudget(role=role, limits=limits, answer_tokens=min(settings.max_tokens, limits.context_tokens // 2))
    answer = ANSWER_TOKENS.get(role, DEFAULT_ANSWER_TOKENS)
    if limits.max_output_tokens:
        answer = min(answer, limits.max_output_tokens)
    return RoleBudget(role=role, limits=limits, answer_tokens=min(answer, limits.context_tokens // 4))


@functools.lru_cache(maxsize=8)
def count_text(limits: ModelLimits, text: str) -> int:
    """Tokens of ``text`` for this model (exact or the conservative estimate).

    Kept for the last few texts: a request planned and counted is counted again before it is sent.
    """
    if not text:
        return 0
    n = modelmap.count_tokens(text)  # what litellm.encode(model=_COUNT_WITH) counts, without litellm
    return n if limits.exact else math.ceil(n * ESTIMATE_FACTOR)


def count_request(
    limits: ModelLimits, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
) -> int:
    """Tokens of a whole chat request: every message's text and framing, plus the tools' schema."""
    text = "\n".join(str(m.get("content") or "") for m in messages)
    framing = _PER_REQUEST + _PER_MESSAGE * len(messages)
    schema = json.dumps(tools, ensure_ascii=False, sort_keys=True) if tools else ""
    return count_text(limits, text + schema) + framing


def chars_per_token(limits: ModelLimits, sample: str) -> float:
    """Characters per counted token in ``sample`` (to size pieces of a prompt before rendering it)."""
    n = count_text(limits, sample)
    return len(sample) / n if n else 4.0


# -- refusing what does not fit --------------------------------------------------------------------


@functools.lru_cache(maxsize=32)
def _schema_text(response_model: type[BaseModel]) -> str:
    """What instructor adds to a request for this answer, in the mode that adds the most.

    Tools and json_schema send the JSON schema beside the messages; json and md_json write it into
    the system message, indented with instructions (on Luna's answer 1,184 cl100k tokens against
    929): counting the largest keeps the budget true whatever ``--mode`` the run ends up with.
    """
    from pipeline.models.shaping import shape_request  # instructor's own request shapes

    texts = []
    for mode in ("tools", "json_schema", "json", "md_json"):
        req = shape_request([{"role": "system", "content": ""}, {"role": "user", "content": ""}], response_model, mode)
        added = "\n".join(str(m.get("content") or "") for m in req["messages"])
        beside = {k: v for k, v in req.items() if k in ("tools", "response_format")}
        texts.append(added + (json.dumps(beside, ensure_ascii=False, sort_keys=True) if beside else ""))
    return max(texts, key=modelmap.count_tokens)


def request_tokens(
    budget: RoleBudget, messages: list[dict[str, Any]], response_model: type[BaseModel], *, exact: bool = False
) -> int:
    """Tokens of the request these messages make (upper bound when it is far below the budget).

    ``exact``: always counted (never the byte bound): for sizes that plan other requests, such as a
    prompt's fixed overhead, where an upper bound of 1.35 tokens a byte would waste most of the room.
    """
    text = "\n".join(str(m.get("content") or "") for m in messages) + _schema_text(response_model)
    framing = _PER_REQUEST + _PER_MESSAGE * len(messages)
    if exact:
        return count_text(budget.limits, text) + framing
    # Every token is at least one UTF-8 byte: a request whose bytes fit needs no tokenizer pass.
    bound = math.ceil(len(text.encode("utf-8")) * (1 if budget.limits.exact else ESTIMATE_FACTOR)) + framing
    if budget.fits(bound):
        return bound
    return count_text(budget.limits, text) + framing


def check_fits(
    settings: ModelSettings,
    role: str,
    cell_id: str | None,
    messages: list[dict[str, Any]],
    response_model: type[BaseModel],
) -> None:
    """Raise :class:`ContextExceeded` (before anything is sent) when a request exceeds its role's budget."""
    budget = role_budget(settings, role)
    tokens = request_tokens(budget, messages, response_model)
    if budget.fits(tokens):
        return
    needed = tokens + budget.answer_tokens
    raise ContextExceeded(
        f"request of role={role} cell={cell_id or '-'} is {tokens:,} tokens, over its budget of "
        f"{budget.input_tokens:,} ({budget.limits.describe()}); not sent",
        unblock=(
            f"lunasol run BUNDLE --context-tokens {needed}  (only if {budget.limits.model} takes that many; "
            "otherwise --model with a larger context)"
        ),
        suggested_tokens=needed,
        role=role,
        cell_id=cell_id,
        request_tokens=tokens,
        budget_tokens=budget.input_tokens,
    )


def context_error(exc: BaseException, settings: ModelSettings, role: str, cell_id: str | None) -> ContextExceeded:
    """The provider refused a request for its size: a block whose unblock lowers ``--context-tokens``."""
    limits = model_limits(settings)
    stated = stated_context(exc)
    lower = stated if stated and stated < limits.context_tokens else (limits.context_tokens * 3 // 4) // 1000 * 1000
    lower = max(lower, 1000)
    return ContextExceeded(
        f"model {limits.model} refused role={role} cell={cell_id or '-'}: the request exceeds its context "
        f"(budgeted for {limits.context_tokens:,} tokens, {limits.context_source}); not retried: {describe(exc)}",
        unblock=f"lunasol run BUNDLE --context-tokens {lower}  (requests are planned to fit the lower budget)",
        suggested_tokens=lower,
        role=role,
        cell_id=cell_id,
        context_tokens=limits.context_tokens,
    )
