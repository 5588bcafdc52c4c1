"""Errors of the model layer: each is a :class:`~pipeline.core.errors.Blocked` the runner turns into a block receipt."""

from __future__ import annotations

from typing import Any

from pipeline.core.errors import BadInput, Blocked, LunasolError


class PromptError(BadInput):
    """A template is missing, malformed, or needs a variable the context does not give."""


class ReplayMiss(Blocked):
    """Replay found no recording for a request; never falls back to a live call."""

    kind = "replay_miss"  # outcome in calls.jsonl; ``reason`` is the block receipt's constraint class

    def __init__(
        self, *, role: str, cell_id: str | None, template_hash: str, key: str, model: str | None, store: str
    ) -> None:
        unblock = (
            f"lunasol run BUNDLE --record {store} --model {model or 'MODEL'}  "
            "(re-record: the prompt, template, schema or model changed since the recording)"
        )
        super().__init__(
            f"replay: no recording for role={role} cell={cell_id or '-'} template={template_hash} key={key} "
            f"in {store}; re-record with: {unblock}",
            reason="missing_data",
            unblock=unblock,
            role=role,
            cell_id=cell_id,
            template_hash=template_hash,
            key=key,
            store=store,
        )
        self.role = role
        self.cell_id = cell_id
        self.template_hash = template_hash
        self.key = key


class BudgetExceeded(Blocked):
    """The run's budget (USD or tokens) is spent; no further model call is started."""

    kind = "budget_exceeded"

    def __init__(
        self,
        message: str,
        *,
        spent_usd: float | None,
        spent_tokens: int,
        budget_usd: float | None,
        budget_tokens: int | None,
        **data: Any,
    ) -> None:
        super().__init__(
            message,
            reason="user_stop",  # the user set the limit; raising it is their call
            unblock="lunasol run BUNDLE --resume --budget-usd <higher>  (finished calls are not repeated)",
            spent_usd=spent_usd,
            spent_tokens=spent_tokens,
            budget_usd=budget_usd,
            budget_tokens=budget_tokens,
            **data,
        )
        self.spent_usd = spent_usd
        self.spent_tokens = spent_tokens


class ModelUnavailable(Blocked):
    """Transport faults outlasted every retry, or the provider refused the request (key, model, size).

    ``reason`` is ``credential`` for an authentication or permission error, else ``external_system``.
    """

    kind = "model_unavailable"


class AnswerTruncated(ModelUnavailable):
    """The model ran out of ``max_tokens`` before its answer ended (finish_reason ``length``).

    Not the provider being down: the unblock raises ``--max-tokens``, never repeats the same bound.
    """

    kind = "answer_truncated"


class ModelRefused(BadInput):
    """The provider refused the request for a reason retrying cannot fix: key, model name, request shape.

    Exit 2 (a configuration error), never retried; ``reason`` is ``credential``, ``not_found`` or
    ``bad_request``. The message says what to change, not to repeat the same command.
    """

    kind = "model_refused"

    def __init__(self, message: str, *, reason: str, **data: Any) -> None:
        super().__init__(message, reason=reason, **data)
        self.reason = reason


class EmptyAnswer(LunasolError):
    """A 200 that says nothing: no choices, or a message with neither a tool call nor content.

    Transient: retried like a 5xx (real proxies and overloaded local servers send these).
    """

    kind = "empty_answer"


class ContextExceeded(Blocked):
    """A request is larger than the model's context: not transient, never retried.

    The unblock names ``--context-tokens``: a provider's refusal lowers the budget so the stage plans
    smaller requests (Sol splits into map/reduce calls); repeating the same request would fail the
    same way, so a bare ``--resume`` is never the answer.
    """

    kind = "context_exceeded"

    def __init__(self, message: str, *, unblock: str, suggested_tokens: int, **data: Any) -> None:
        super().__init__(message, reason="external_system", unblock=unblock, suggested_tokens=suggested_tokens, **data)
        self.suggested_tokens = suggested_tokens
