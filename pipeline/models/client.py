"""The call loop of the model client: render -> ask -> check / re-ask -> log, for every role.

Layering (outer to inner) for one :meth:`ModelClient.call`:

1. render the role's template (jinja2, StrictUndefined) into messages;
2. our ``check`` re-ask loop: a deterministic check of the parsed answer; errors go back to the
   model as an assistant message (the previous answer) plus a user message (the errors);
3. instructor: parses into the pydantic model and re-asks on schema-invalid output;
4. :class:`~pipeline.models.exchange.Exchange`, the function instructor calls instead of
   ``litellm.acompletion``: every HTTP exchange, re-asks included, is keyed, recorded or replayed
   there, with tenacity around ``litellm.acompletion`` for transport faults;
5. :class:`~pipeline.models.accounting.Accounting` books usage and price and holds the budget.

instructor is never given a ``context=``: it would jinja-render the messages again, and our
prompts hold raw log text that may contain ``{{``.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from pipeline.artifacts import rundir
from pipeline.core.errors import BadInput, LunasolError
from pipeline.core.settings import ModelSettings
from pipeline.models import shaping
from pipeline.models.accounting import Accounting, Usage
from pipeline.models.batch_api import TERMINAL
from pipeline.models.batch_submit import BATCHED_ROLES, Batcher, read_batches
from pipeline.models.budget import check_fits, role_budget
from pipeline.models.calllog import CallLog, used_keys
from pipeline.models.donors import Donors
from pipeline.models.errors import AnswerTruncated, ContextExceeded, ModelUnavailable
from pipeline.models.exchange import CALL_STATE, CallState, Exchange
from pipeline.models.modes import INSTRUCTOR_MODES, resolve_mode
from pipeline.models.progress import gather_bounded
from pipeline.models.prompts import render_source, template_path
from pipeline.models.store import RecordingStore, request_key
from pipeline.models.transport import describe, load_litellm, load_openai, lunasol_cause, quiet_instructor, reason_for

T = TypeVar("T", bound=BaseModel)

EXCHANGES_DIR = rundir.EXCHANGES_DIR  # runs/<id>/exchanges: a live run's raw answers, laid out like a recording store

__all__ = ["EXCHANGES_DIR", "INSTRUCTOR_MODES", "CallOutcome", "ModelClient", "Usage"]


@dataclass
class CallOutcome(Generic[T]):
    """Result of one logical call. ``ok=False`` is a recorded failure, never a silent drop."""

    ok: bool
    value: T | None
    errors: list[str]
    attempts: int
    keys: list[str]
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None
    role: str
    cell_id: str | None
    template_hash: str
    transport_retries: int = 0
    last_answer: dict[str, Any] | None = None  # the rejected answer when not ok (for the failure record)

    @property
    def key(self) -> str | None:
        """Key of the final exchange."""
        return self.keys[-1] if self.keys else None

    @property
    def tokens(self) -> int:
        """Prompt plus completion tokens of every attempt."""
        return self.prompt_tokens + self.completion_tokens


class ModelClient:
    """Every role's model calls: render, call (live / record / replay), validate, check, log, account."""

    def __init__(
        self,
        settings: ModelSettings,
        run_dir: Path,
        *,
        log: Callable[[str], None] | None = None,
        fresh: bool = False,
    ) -> None:
        self.settings = settings
        self.mode = settings.effective_mode()
        self.log = log or (lambda _msg: None)
        self.run_dir = Path(run_dir)
        self.store: RecordingStore | None = None
        if self.mode in ("record", "replay"):
            if settings.store is None:
                raise BadInput(f"--{self.mode} needs a recording directory")
            if self.mode == "replay" and not Path(settings.store).is_dir():
                raise BadInput(f"replay store not found: {settings.store}")
            self.store = RecordingStore(Path(settings.store), self.mode)
        else:
            # Live: every raw answer is kept in the run's own store before it is parsed, so a resume
            # (or a kill right after an answer arrived) never pays for an answer already received.
            self.store = RecordingStore(self.run_dir / EXCHANGES_DIR, "record")
            self.store.remove_stale_temps()  # a kill mid-write leaves .<key>.json.*.tmp behind
        self.model = settings.model or self._model_from_store()
        self.calllog = CallLog(self.run_dir)
        self.instructor_mode = resolve_mode(settings, self.model, self.store)
        self._consecutive_failures = 0
        self.accounting = Accounting(settings, self.model, self.log)
        self.exchange = Exchange(
            settings,
            model=self.model,
            store=self.store,
            instructor_mode=self.instructor_mode,
            accounting=self.accounting,
            log=self.log,
            # Asked live again: the answers of a call that failed (a retry wants a new answer) and, with
            # ``fresh`` (a deliberate redo, e.g. after gate 2's --redo), of every finished call. An ok
            # answer is otherwise served from the store: a resume killed before its artifact, or a
            # stage blocked on a sibling call, never buys it twice.
            consumed=used_keys(self.run_dir, every=fresh),
        )
        if self.mode not in ("record", "replay") and not fresh:
            # Live: a request another run of this bundle already had answered is served from that
            # run's store (a full run after its pilot); a deliberate redo asks afresh.
            self.exchange.donors = Donors(self.run_dir)
        if self._batching() and self.model:
            # --batch hook (pipeline.models.batch_submit): the exchange sends batched roles' first requests here.
            self.exchange.batcher = Batcher(
                str(self.model),
                self.run_dir,
                api_base=settings.api_base,
                timeout_s=settings.timeout_s,
                log=self.log,
                queue_tokens=settings.batch_queue_tokens,
                sdk=self.exchange.openai_sdk,
            )
        self._instructor: Any = None
        self._templates: dict[str, str] = {}
        self._requests_done = 0  # logical calls finished / in flight, for progress (a cell may be many)
        self._requests_active = 0

    # ------------------------------------------------------------------ public
    def usage(self) -> Usage:
        """Tokens and cost so far (a copy)."""
        return self.accounting.usage()

    async def call(
        self,
        *,
        role: str,
        cell_id: str | None,
        context: dict[str, Any],
        response_model: type[T],
        check: Callable[[T], list[str]] | None = None,
        soft_fail: bool = False,
    ) -> CallOutcome[T]:
        """One structured call: render ``prompts/<role>.j2``, ask, validate, check, re-ask (bounded).

        Raises :class:`ReplayMiss`, :class:`BudgetExceeded` or :class:`ModelUnavailable` (all ``Blocked``)
        and :class:`ModelRefused` (bad input: key, model, request); a validation or check failure that
        outlasts the re-asks is returned as ``ok=False``. With ``soft_fail`` (one call among many, e.g.
        a cell), transport faults and empty answers that outlast their retries are returned as
        ``ok=False`` too, until ``max_consecutive_failures`` calls in a row failed so (the provider is
        down for everyone: then :class:`ModelUnavailable` is raised).
        """
        rendered = render_source(self._template(role), context, name=f"{role}.j2", response_model=response_model)
        state = CallState(role=role, cell_id=cell_id, template_hash=rendered.template_hash)
        token = CALL_STATE.set(state)
        started = time.perf_counter()
        messages: list[dict[str, Any]] = [dict(m) for m in rendered.messages]
        value: T | None = None
        last: T | None = None
        errors: list[str] = []
        outcome = "interrupted"  # what the log says when a KeyboardInterrupt or SystemExit passes through
        self._requests_active += 1
        try:
            self.accounting.check_budget()
            # Whole-request token budget (pipeline.models.budget): a request that cannot fit is never sent.
            check_fits(self.settings, role, cell_id, messages, response_model)
            asked = "ok"
            for round_no in range(self.settings.max_reasks + 1):
                parsed, errors = await self._ask(messages, response_model, self.max_tokens(role))
                if parsed is None:
                    asked = "invalid"
                    break
                last = parsed
                errors = list(check(parsed)) if check else []
                if not errors:
                    value = parsed
                    break
                asked = "check_failed"
                if round_no == self.settings.max_reasks:
                    break
                # Re-ask with the previous answer and the errors; plain text, never re-templated.
                messages = [
                    *messages,
                    {"role": "assistant", "content": parsed.model_dump_json()},
                    {"role": "user", "content": _reask_text(errors)},
                ]
            outcome = "ok" if value is not None else asked
            self._consecutive_failures = 0
        except ModelUnavailable as exc:
            outcome, errors = exc.kind, [exc.one_line()]
            if not soft_fail or exc.reason == "credential":
                raise
            self._consecutive_failures += 1
            if self._consecutive_failures >= self.settings.max_consecutive_failures and isinstance(
                exc, AnswerTruncated
            ):
                raise AnswerTruncated(
                    f"{self._consecutive_failures} calls in a row ran out of max_tokens before their answer "
                    f"ended (not the provider: the bound is too low for these answers); last: {exc.one_line()}",
                    reason=exc.reason,
                    unblock=exc.unblock,
                ) from None
            if self._consecutive_failures >= self.settings.max_consecutive_failures:
                raise ModelUnavailable(
                    f"{self._consecutive_failures} calls in a row failed after their retries (provider down?); "
                    f"last: {exc.one_line()}",
                    reason=exc.reason,
                    tried=exc.tried,
                    unblock=exc.unblock,
                ) from None
        except LunasolError as exc:
            outcome = str(getattr(exc, "kind", None) or getattr(exc, "reason", "error"))
            errors = [exc.one_line()]
            raise
        except asyncio.CancelledError:
            outcome = "cancelled"  # a sibling call blocked the stage (budget, replay miss)
            errors = ["cancelled"]
            raise
        except Exception as exc:
            outcome = "error"
            errors = [describe(exc)]
            raise
        finally:
            CALL_STATE.reset(token)
            self._requests_active -= 1
            self._requests_done += 1
            self.accounting.count_call()
            if outcome != "cancelled" or state.keys:  # a call cancelled before it asked anything is not logged
                self.calllog.append(
                    {
                        "role": role,
                        "cell_id": cell_id,
                        "template_hash": rendered.template_hash,
                        "keys": list(state.keys),
                        "mode": self.mode,
                        "model": self.model,
                        "prompt_tokens": state.prompt_tokens,
                        "completion_tokens": state.completion_tokens,
                        "cached_tokens": state.cached_tokens,
                        "cost_usd": None if state.cost_usd is None else round(state.cost_usd, 10),
                        # the call's own time; waiting behind --concurrency is queue_ms (summed latency
                        # of a 1,106 s run was 27,481 s when the two were one figure)
                        "latency_ms": round((time.perf_counter() - started - state.queued_s) * 1000, 1),
                        "queue_ms": round(state.queued_s * 1000, 1),
                        "attempts": len(state.keys),
                        "transport_retries": state.transport_retries,
                        "outcome": outcome,
                        "errors": errors,
                    }
                )
        ok = value is not None
        return CallOutcome(
            ok=ok,
            value=value,
            errors=[] if ok else errors,
            attempts=len(state.keys),
            keys=list(state.keys),
            prompt_tokens=state.prompt_tokens,
            completion_tokens=state.completion_tokens,
            cost_usd=state.cost_usd,
            role=role,
            cell_id=cell_id,
            template_hash=rendered.template_hash,
            transport_retries=state.transport_retries,
            last_answer=None if ok or last is None else last.model_dump(mode="json"),
        )

    def max_tokens(self, role: str) -> int | None:
        """The ``max_tokens`` a request of ``role`` carries: never more than the room its budget keeps.

        With ``--context-tokens`` and no ``--max-tokens``, a role's default bound (Luna 4,096) could
        exceed the answer's room (a quarter of an 8K context): prompt plus bound would then pass the
        context, which vLLM refuses and llama.cpp truncates. Without ``--context-tokens`` nothing
        changes (the recordings' requests stay as they were).
        """
        sent = self.settings.max_tokens_for(role)
        if sent and self.settings.context_tokens and self.settings.max_tokens is None:
            sent = min(sent, role_budget(self.settings, role).answer_tokens)
        return sent

    def batching(self, role: str) -> bool:
        """Whether this role's first requests go out as provider batches (``--batch``)."""
        return self.exchange.batcher is not None and role in BATCHED_ROLES

    async def prefetch(
        self, role: str, calls: Callable[[], Iterable[tuple[str | None, dict[str, Any], type[BaseModel]]]]
    ) -> int:
        """``--batch``: submit the first request of each (cell id, context, answer model) of ``calls()`` first.

        Each request is rendered, shaped and keyed as :meth:`call` would (``pipeline.models.shaping``
        builds instructor's request; the tests hold the two equal), submitted in bounded batches
        and dropped, then every batch is collected: the calls that follow find their answers at
        once and run under the usual concurrency bound, so a run never holds every cell and its
        prompt while a batch takes hours. A request the store already answers, or one that does
        not fit the budget (its call says so), is not submitted. ``calls()`` may be read twice
        (:meth:`Batcher.prefetch`). Returns how many were submitted.
        """
        batcher = self.exchange.batcher
        if batcher is None or role not in BATCHED_ROLES:
            return 0
        source = self._template(role)
        max_tokens = self.max_tokens(role)
        params: dict[str, Any] = {"temperature": self.settings.temperature}
        if max_tokens:
            params["max_tokens"] = max_tokens

        def requests() -> Iterator[tuple[str, dict[str, Any]]]:
            for cell_id, context, response_model in calls():
                rendered = render_source(source, context, name=f"{role}.j2", response_model=response_model)
                messages = [dict(m) for m in rendered.messages]
                try:
                    check_fits(self.settings, role, cell_id, messages, response_model)
                except ContextExceeded:
                    continue
                kwargs = shaping.shape_request(messages, response_model, self.instructor_mode, **params)
                key = request_key(self.exchange.request_of(kwargs))
                if not self.exchange.serves(key):
                    yield key, kwargs

        return await batcher.prefetch(requests)

    async def gather(
        self, coros: Any, *, label: str = "model calls", total: int | None = None, keep: bool = True
    ) -> list[Any]:
        """Run many calls under ``settings.concurrency`` with a progress bar (on a TTY) showing spend.

        ``total`` with a generator of calls: each is made only when a slot is free; ``keep`` False:
        results are not kept (see :func:`~pipeline.models.progress.gather_bounded`).
        """
        # Twice the HTTP bound: the next calls render and prepare while others wait on the network,
        # so a freed slot is used at once; the HTTP concurrency itself stays at settings.concurrency.
        budget = (self.settings.budget_usd, self.settings.budget_tokens)
        batching = self.exchange.batcher is not None and not self.exchange.batcher.prefetched
        if total is None or batching:
            coros, total = list(coros), None
        if batching:
            # --batch without prefetch(): every call must reach the batcher before it submits, so none
            # waits on the bound.
            return await gather_bounded(
                coros,
                max(1, len(coros)),
                label=label,
                usage=self.usage,
                budget=budget,
                requests=self.request_counts,
                keep=keep,
            )
        out = await gather_bounded(
            coros,
            2 * self.settings.concurrency,
            label=label,
            usage=self.usage,
            budget=budget,
            requests=self.request_counts,
            total=total,
            keep=keep,
        )
        said = self.exchange.donors.said() if self.exchange.donors is not None else None
        if said:
            self.log(f"[{label}] {said}")
        return out

    def request_counts(self) -> tuple[int, int, int]:
        """(calls finished, requests being answered, calls queued behind --concurrency): progress counts parts."""
        sending = min(self.exchange.sending, self._requests_active)
        return self._requests_done, sending, self._requests_active - sending

    # ------------------------------------------------------------------ internals
    def _batching(self) -> bool:
        # A run with a batch still out keeps batching on resume even without --batch: its cells were
        # submitted once already and must be collected, never asked again synchronously.
        if self.mode == "replay":
            return False
        return self.settings.batch or any(b.get("status") not in TERMINAL for b in read_batches(self.run_dir))

    def _template(self, role: str) -> str:
        # Read once per client: every call of a run uses the same template bytes, even if the file
        # is edited mid-run (and a stat + open per call is measurable on slow filesystems).
        source = self._templates.get(role)
        if source is None:
            source = template_path(role).read_bytes().decode("utf-8")
            self._templates[role] = source
        return source

    def _model_from_store(self) -> str | None:
        if self.store is not None and self.mode == "replay":
            models = self.store.models()
            if len(models) == 1:
                return next(iter(models))
            if len(models) > 1:
                raise BadInput(f"replay store holds several models ({', '.join(sorted(models))}); pass --model")
        return None

    def _client(self) -> Any:
        if self._instructor is None:
            if not self.model:
                raise BadInput("no model given: pass --model (e.g. openai/gpt-4o-mini) or set LUNASOL_MODEL")
            if self.exchange.openai_sdk:
                load_openai()  # before instructor's first call imports it: without the SDK's aiohttp transport
            else:
                load_litellm(announce=self.log)  # the first live call says why it waits (seconds of import)
            import instructor

            quiet_instructor()
            mode = getattr(instructor.Mode, INSTRUCTOR_MODES[self.instructor_mode])
            self._instructor = instructor.from_litellm(self.exchange.complete, mode=mode)
        return self._instructor

    async def _ask(
        self, messages: list[dict[str, Any]], response_model: type[T], max_tokens: int | None
    ) -> tuple[T | None, list[str]]:
        # One instructor round (which re-asks on schema-invalid output itself).
        if self.mode == "replay":
            return await self._ask_replay(messages, response_model, max_tokens)
        # instructor loads only for live and record calls (seconds of startup a replay never pays).
        from instructor.core import InstructorRetryException

        try:
            obj = await self._client().chat.completions.create(
                response_model=_prepared(response_model),
                messages=messages,
                max_retries=self.settings.max_reasks,
                temperature=self.settings.temperature,
                **({"max_tokens": max_tokens} if max_tokens else {}),
            )
        except Exception as exc:
            ours = lunasol_cause(exc)
            if ours is not None:
                raise ours from None
            if type(exc).__name__ == "IncompleteOutputException":
                raise _truncated(exc, max_tokens) from exc
            if isinstance(exc, InstructorRetryException):
                attempts = getattr(exc, "failed_attempts", None) or []
                last_exc = getattr(attempts[-1], "exception", None) if attempts else None
                if type(last_exc).__name__ == "IncompleteOutputException" or _cut(last_exc or exc, max_tokens):
                    raise _truncated(last_exc or exc, max_tokens) from exc
                return None, [describe(last_exc or exc)]
            raise ModelUnavailable(
                f"model call failed for role={CALL_STATE.get().role}: {describe(exc)}", reason=reason_for(exc)
            ) from exc
        # instructor returns a dynamic subclass carrying the raw response; keep only the plain model.
        return response_model.model_validate(obj.model_dump()), []

    async def _ask_replay(
        self, messages: list[dict[str, Any]], response_model: type[T], max_tokens: int | None
    ) -> tuple[T | None, list[str]]:
        # The same round without instructor: requests shaped, answers parsed and re-asked as
        # instructor does (pipeline.models.shaping, checked against instructor by the tests), so the
        # replay keys, values and call-log lines are those of the live path.
        try:
            obj = await shaping.ask(
                self.exchange.answer,
                messages,
                response_model,
                self.instructor_mode,
                max_retries=self.settings.max_reasks,
                temperature=self.settings.temperature,
                **({"max_tokens": max_tokens} if max_tokens else {}),
            )
        except shaping.AskFailed as exc:
            if _cut(exc.shown, max_tokens):
                raise _truncated(exc.shown, max_tokens) from exc
            return None, [describe(exc.shown)]
        except shaping.IncompleteOutputException as exc:
            # What the live path reports for instructor's unwrapped IncompleteOutputException.
            raise _truncated(exc, max_tokens) from exc
        return response_model.model_validate(obj.model_dump()), []


@functools.cache
def _prepared(response_model: type[T]) -> type[T]:
    """The answer model as instructor wraps it for a request, wrapped once per model, not once per call.

    Given a plain model, instructor makes a new subclass on every call (pydantic's ``create_model``)
    and its schema cache (``lru_cache`` of 256) keeps the last 256 of them with their schemas: a
    millisecond of CPU and a few KiB held per call. Given its own wrapped class it wraps nothing;
    the class has the same name and schema, so the request is byte-for-byte the same.
    """
    # instructor loads only for live and record calls, after _client's set-up (a replay never pays it)
    from instructor.v2.core.response_model import prepare_response_model

    prepared = prepare_response_model(response_model)
    return response_model if prepared is None else prepared  # None: no answer model (never for lunasol)


def _cut(exc: BaseException, max_tokens: int | None) -> bool:
    """An answer whose JSON ends mid-way after using every token allowed: cut at max_tokens.

    llama-cpp-python reports ``finish_reason: tool_calls`` for a tool call it stopped at
    ``max_tokens`` (measured: 384 of 384 completion tokens, "EOF while parsing a string"), so
    instructor never sees ``length``; the usage and the torn JSON say it all the same.
    """
    state = CALL_STATE.get()
    torn = "EOF while parsing" in str(exc) or "Unterminated string" in str(exc)
    return bool(max_tokens) and torn and state.last_completion_tokens >= int(max_tokens or 0)


def _truncated(exc: BaseException, max_tokens: int | None) -> AnswerTruncated:
    """The model ran out of ``max_tokens`` (finish_reason length): the unblock raises the bound."""
    state = CALL_STATE.get()
    bound = f"max_tokens={max_tokens}" if max_tokens else "the server's default max_tokens"
    higher = 2 * max_tokens if max_tokens else 4096
    return AnswerTruncated(
        f"the answer for role={state.role} cell={state.cell_id or '-'} was cut at {bound} (finish_reason "
        f"length: the model ran out of tokens before the answer ended; {type(exc).__name__})",
        reason="external_system",
        unblock=f"lunasol run BUNDLE --resume --max-tokens {higher}  (answers cut at {bound} are asked again)",
        max_tokens=max_tokens,
    )


def _reask_text(errors: list[str]) -> str:
    lines = "\n".join(f"- {e}" for e in errors)
    return (
        "Your previous answer failed these checks:\n"
        f"{lines}\n"
        "Answer again in full, in the same format, fixing every problem. Cite only ids that exist in the input."
    )
