"""One async model client for every role: litellm + instructor + tenacity, over the recording store.

Layering (outer to inner) for one :meth:`ModelClient.call`:

1. render the role's template (jinja2, StrictUndefined) into messages;
2. our ``check`` re-ask loop: a deterministic check of the parsed answer; errors go back to the
   model as an assistant message (the previous answer) plus a user message (the errors);
3. instructor: parses into the pydantic model and re-asks on schema-invalid output;
4. :meth:`ModelClient._exchange`, the function instructor calls instead of ``litellm.acompletion``:
   every HTTP exchange, re-asks included, is keyed, recorded or replayed here;
5. tenacity around ``litellm.acompletion`` for transport faults, under the concurrency bound.

instructor is never given a ``context=``: it would jinja-render the messages again, and our
prompts hold raw log text that may contain ``{{``.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from pipeline.core import offline
from pipeline.core.errors import BadInput, LunasolError
from pipeline.core.settings import ModelSettings
from pipeline.models.budget import check_fits, context_error
from pipeline.models.calllog import CallLog
from pipeline.models.errors import BudgetExceeded, ModelUnavailable, ReplayMiss
from pipeline.models.progress import gather_bounded
from pipeline.models.prompts import render_source, template_path
from pipeline.models.store import RecordingStore, canonical_request, check_record, make_record, request_key
from pipeline.models.transport import (
    describe as _describe,
)
from pipeline.models.transport import (
    is_context_error,
    load_litellm,
    quiet_instructor,
)
from pipeline.models.transport import (
    lunasol_cause as _lunasol_cause,
)
from pipeline.models.transport import (
    no_wait as _no_wait,
)
from pipeline.models.transport import (
    reason_for as _reason,
)
from pipeline.models.transport import (
    retry_after as _retry_after,
)
from pipeline.models.transport import (
    retryable_types as _retryable_types,
)

T = TypeVar("T", bound=BaseModel)

DUMMY_API_KEY = "sk-lunasol-no-key"  # a bare OpenAI-compatible --api-base needs *some* key string
INSTRUCTOR_MODES = {"tools": "TOOLS", "json": "JSON", "md_json": "MD_JSON", "json_schema": "JSON_SCHEMA"}


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


@dataclass
class _CallState:
    # Per logical call, carried through instructor into _exchange by a context variable.
    role: str
    cell_id: str | None
    template_hash: str
    keys: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = 0.0
    transport_retries: int = 0


_STATE: contextvars.ContextVar[_CallState] = contextvars.ContextVar("lunasol_call_state")
_CAPTURE: contextvars.ContextVar[list[bytes] | None] = contextvars.ContextVar("lunasol_capture", default=None)


class ModelClient:
    """Every role's model calls: render, call (live / record / replay), validate, check, log, account."""

    def __init__(
        self,
        settings: ModelSettings,
        run_dir: Path,
        *,
        log: Callable[[str], None] | None = None,
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
        self.model = settings.model or self._model_from_store()
        self.calllog = CallLog(self.run_dir)
        imode = os.environ.get("LUNASOL_INSTRUCTOR_MODE", "tools").lower()
        if imode not in INSTRUCTOR_MODES:
            raise BadInput(f"LUNASOL_INSTRUCTOR_MODE must be one of {', '.join(INSTRUCTOR_MODES)}, not {imode!r}")
        self.instructor_mode = imode
        self._usage = Usage()
        self._sem: asyncio.Semaphore | None = None
        self._instructor: Any = None
        self._openai_clients: dict[int, Any] = {}
        self._price_warned = False
        self._unpriced = False
        self._templates: dict[str, str] = {}

    # ------------------------------------------------------------------ public
    def usage(self) -> Usage:
        """Tokens and cost so far (a copy)."""
        return Usage(**asdict(self._usage))

    async def call(
        self,
        *,
        role: str,
        cell_id: str | None,
        context: dict[str, Any],
        response_model: type[T],
        check: Callable[[T], list[str]] | None = None,
    ) -> CallOutcome[T]:
        """One structured call: render ``prompts/<role>.j2``, ask, validate, check, re-ask (bounded).

        Raises :class:`ReplayMiss`, :class:`BudgetExceeded` or :class:`ModelUnavailable` (all ``Blocked``);
        a validation or check failure that outlasts the re-asks is returned as ``ok=False``.
        """
        rendered = render_source(self._template(role), context, name=f"{role}.j2")
        state = _CallState(role=role, cell_id=cell_id, template_hash=rendered.template_hash)
        token = _STATE.set(state)
        started = time.perf_counter()
        messages: list[dict[str, Any]] = [dict(m) for m in rendered.messages]
        value: T | None = None
        last: T | None = None
        errors: list[str] = []
        outcome = "ok"
        try:
            self._check_budget()
            # Whole-request token budget (pipeline.models.budget): a request that cannot fit is never sent.
            check_fits(self.settings, role, cell_id, messages, response_model)
            for round_no in range(self.settings.max_reasks + 1):
                parsed, errors = await self._ask(messages, response_model)
                if parsed is None:
                    outcome = "invalid"
                    break
                last = parsed
                errors = list(check(parsed)) if check else []
                if not errors:
                    value = parsed
                    break
                outcome = "check_failed"
                if round_no == self.settings.max_reasks:
                    break
                # Re-ask with the previous answer and the errors; plain text, never re-templated.
                messages = [
                    *messages,
                    {"role": "assistant", "content": parsed.model_dump_json()},
                    {"role": "user", "content": _reask_text(errors)},
                ]
            if value is not None:
                outcome = "ok"
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
            errors = [_describe(exc)]
            raise
        finally:
            _STATE.reset(token)
            self._usage.calls += 1
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
                        "cost_usd": None if state.cost_usd is None else round(state.cost_usd, 10),
                        "latency_ms": round((time.perf_counter() - started) * 1000, 1),
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

    async def gather(self, coros: Any, *, label: str = "model calls") -> list[Any]:
        """Run many calls under ``settings.concurrency`` with a progress bar (on a TTY) showing spend."""
        # Twice the HTTP bound: the next calls render and prepare while others wait on the network,
        # so a freed slot is used at once; the HTTP concurrency itself stays at settings.concurrency.
        budget = (self.settings.budget_usd, self.settings.budget_tokens)
        return await gather_bounded(coros, 2 * self.settings.concurrency, label=label, usage=self.usage, budget=budget)

    # ------------------------------------------------------------------ internals
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
            offline.apply()  # instructor may import litellm: switches first
            import instructor

            quiet_instructor()
            mode = getattr(instructor.Mode, INSTRUCTOR_MODES[self.instructor_mode])
            self._instructor = instructor.from_litellm(self._exchange, mode=mode)
        return self._instructor

    async def _ask(self, messages: list[dict[str, Any]], response_model: type[T]) -> tuple[T | None, list[str]]:
        # One instructor round (which re-asks on schema-invalid output itself).
        from instructor.core import InstructorRetryException

        try:
            obj = await self._client().chat.completions.create(
                response_model=response_model,
                messages=messages,
                max_retries=self.settings.max_reasks,
                temperature=self.settings.temperature,
            )
        except Exception as exc:
            ours = _lunasol_cause(exc)
            if ours is not None:
                raise ours from None
            if isinstance(exc, InstructorRetryException):
                attempts = getattr(exc, "failed_attempts", None) or []
                last_exc = getattr(attempts[-1], "exception", None) if attempts else None
                return None, [_describe(last_exc or exc)]
            raise ModelUnavailable(
                f"model call failed for role={_STATE.get().role}: {_describe(exc)}", reason=_reason(exc)
            ) from exc
        # instructor returns a dynamic subclass carrying the raw response; keep only the plain model.
        return response_model.model_validate(obj.model_dump()), []

    def _semaphore(self) -> asyncio.Semaphore:
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.settings.concurrency)
        return self._sem

    def _check_budget(self) -> None:
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

    def _price(self, prompt_tokens: int, completion_tokens: int) -> float | None:
        if self._unpriced:
            return None
        litellm = load_litellm()
        try:
            p, c = litellm.cost_per_token(
                model=self.model, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
            )
            return float(p) + float(c)
        except Exception:  # litellm raises for a model not in its bundled price map; remember (it is slow)
            self._unpriced = True
            return None

    def _account(self, state: _CallState, response: Any) -> None:
        usage = getattr(response, "usage", None)
        pt = int(getattr(usage, "prompt_tokens", 0) or 0)
        ct = int(getattr(usage, "completion_tokens", 0) or 0)
        cost = self._price(pt, ct)
        state.prompt_tokens += pt
        state.completion_tokens += ct
        state.cost_usd = None if cost is None or state.cost_usd is None else state.cost_usd + cost
        u = self._usage
        u.exchanges += 1
        u.prompt_tokens += pt
        u.completion_tokens += ct
        if cost is None:
            u.unpriced_exchanges += 1
        else:
            u.cost_usd += cost

    async def _exchange(self, **kwargs: Any) -> Any:
        """Stand-in for ``litellm.acompletion`` under instructor: key, then replay / record / call live."""
        litellm = load_litellm()

        state = _STATE.get()
        # instructor does not pass the model through; the key must still name it (DESIGN: model is in the key).
        request = canonical_request({**kwargs, "model": self.model}, self.instructor_mode)
        key = request_key(request)
        attempt = len(state.keys)
        state.keys.append(key)
        store = self.store
        if store is not None and (store.mode == "replay" or key in store.written):
            # Replay; in record mode a key already written this run is served from disk too, so a
            # repeated request gets the same answer in record and in replay.
            record = store.load(key)
            if record is None:
                raise ReplayMiss(
                    role=state.role,
                    cell_id=state.cell_id,
                    template_hash=state.template_hash,
                    key=key,
                    model=self.model,
                    store=str(store.root),
                )
            record = check_record(record, store.path_for(key))
            response = litellm.ModelResponse(**record.get("response_openai", record["response"]))
            self._account(state, response)
        else:
            live, raw = await self._live(kwargs, capture=store is not None)
            if store is None:
                response = live
            else:
                body, source = (raw, "http_body") if raw is not None else (live.model_dump(mode="json"), "litellm")
                store.save(
                    make_record(
                        key=key,
                        request=request,
                        response=body,
                        response_source=source,
                        role=state.role,
                        cell_id=state.cell_id,
                        template_hash=state.template_hash,
                        model=str(self.model),
                        attempt=attempt,
                    )
                )
                # Return what replay will return, built from the stored body, so both paths are identical.
                response = litellm.ModelResponse(**body)
        return response

    def _transport_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"timeout": self.settings.timeout_s, "num_retries": 0, "max_retries": 0}
        if self.settings.api_base:
            kw["api_base"] = self.settings.api_base
            if self._is_openai() and not os.environ.get("OPENAI_API_KEY"):
                kw["api_key"] = DUMMY_API_KEY
        return kw

    def _is_openai(self) -> bool:
        return bool(self.model) and str(self.model).startswith("openai/")

    def _openai_client(self) -> Any:
        """An AsyncOpenAI (one per event loop) whose httpx hook captures the raw response body."""
        loop_id = id(asyncio.get_running_loop())
        client = self._openai_clients.get(loop_id)
        if client is None:
            import httpx
            from openai import AsyncOpenAI

            async def capture(response: httpx.Response) -> None:
                slot = _CAPTURE.get()
                if slot is not None and response.request.method == "POST":
                    await response.aread()
                    slot.append(response.content)

            base = self.settings.api_base or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"
            http_client: Any = httpx.AsyncClient(event_hooks={"response": [capture]}, timeout=self.settings.timeout_s)
            client = AsyncOpenAI(
                api_key=os.environ.get("OPENAI_API_KEY") or DUMMY_API_KEY,
                base_url=base,
                max_retries=0,
                timeout=self.settings.timeout_s,
                http_client=http_client,
            )
            self._openai_clients[loop_id] = client
        return client

    async def _live(self, kwargs: dict[str, Any], *, capture: bool) -> tuple[Any, dict[str, Any] | None]:
        """``litellm.acompletion`` with tenacity retries on transport faults, under the concurrency bound."""
        litellm = load_litellm()
        from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

        state = _STATE.get()
        fallback = wait_random_exponential(multiplier=0.5, max=20)

        def wait(retry_state: Any) -> float:
            if _no_wait():
                return 0.0
            exc = retry_state.outcome.exception() if retry_state.outcome else None
            after = _retry_after(exc) if exc is not None else None
            return after if after is not None else float(fallback(retry_state))

        def before_sleep(retry_state: Any) -> None:
            state.transport_retries += 1
            exc = retry_state.outcome.exception() if retry_state.outcome else None
            self.log(
                f"retry {retry_state.attempt_number}/{self.settings.transport_retries} {state.role}"
                f"{'/' + state.cell_id if state.cell_id else ''}: "
                f"{_describe(exc) if exc else '?'}"
            )

        call_kwargs = {**kwargs, **self._transport_kwargs(), "model": self.model}
        use_capture = capture and self._is_openai()
        if use_capture:
            call_kwargs["client"] = self._openai_client()
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(_retryable_types()),
            stop=stop_after_attempt(self.settings.transport_retries + 1),
            wait=wait,
            before_sleep=before_sleep,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    slot: list[bytes] = []
                    tok = _CAPTURE.set(slot if use_capture else None)
                    try:
                        async with self._semaphore():
                            # Budget checked and spend booked while holding the slot, so calls queued
                            # behind the bound never start on a budget that is already spent.
                            self._check_budget()
                            response = await litellm.acompletion(**call_kwargs)
                            self._account(state, response)
                    finally:
                        _CAPTURE.reset(tok)
                    raw = None
                    if slot:
                        try:
                            parsed = json.loads(slot[-1])
                            raw = parsed if isinstance(parsed, dict) else None
                        except ValueError:
                            raw = None
                    return response, raw
        except LunasolError:
            raise
        except Exception as exc:
            if is_context_error(exc):  # not transient: never retried; the unblock lowers --context-tokens
                raise context_error(exc, self.settings, state.role, state.cell_id) from exc
            tried = [{"action": "transport retries", "outcome": f"{state.transport_retries} retries, then failed"}]
            raise ModelUnavailable(
                f"model {self.model} unavailable for role={state.role} cell={state.cell_id or '-'} after "
                f"{state.transport_retries} retries: {_describe(exc)}",
                reason=_reason(exc),
                tried=tried,
                unblock="check the provider / --api-base and key, then: lunasol run BUNDLE --resume",
            ) from exc
        raise AssertionError("unreachable")  # pragma: no cover - tenacity returns or raises


def _reask_text(errors: list[str]) -> str:
    lines = "\n".join(f"- {e}" for e in errors)
    return (
        "Your previous answer failed these checks:\n"
        f"{lines}\n"
        "Answer again in full, in the same format, fixing every problem. Cite only ids that exist in the input."
    )
