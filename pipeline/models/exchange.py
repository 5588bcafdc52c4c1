"""The exchange layer of the model client: one HTTP request and its answer, keyed, recorded or replayed.

:class:`Exchange` is the function instructor calls instead of ``litellm.acompletion``. For every
request (re-asks included) it computes the replay key, then answers from the store (replay, or a
key already recorded) or calls live: ``litellm.acompletion`` under the concurrency bound, with
tenacity retries on transport faults and the raw HTTP body captured by an HTTP client hook.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from pipeline.core.errors import LunasolError
from pipeline.core.settings import ModelSettings
from pipeline.models import servermodes
from pipeline.models.accounting import Accounting, Booked
from pipeline.models.batch_submit import BATCHED_ROLES, Batcher
from pipeline.models.budget import context_error
from pipeline.models.donors import Donors
from pipeline.models.errors import EmptyAnswer, ModelUnavailable, ReplayMiss
from pipeline.models.fleet import Fleet, fleet_api_key, is_fleet, total_concurrency
from pipeline.models.shaping import as_litellm_holds
from pipeline.models.store import RecordingStore, canonical_request, check_record, make_record, request_key
from pipeline.models.transport import (
    describe,
    is_context_error,
    is_transient,
    load_litellm,
    load_openai,
    no_wait,
    reason_for,
    refusal,
    retry_after,
    sdk_body,
    uses_openai_sdk,
)

DUMMY_API_KEY = "sk-lunasol-no-key"  # a bare OpenAI-compatible --api-base needs *some* key string


@dataclass
class CallState:
    """Per logical call, carried through instructor into :class:`Exchange` by a context variable."""

    role: str
    cell_id: str | None
    template_hash: str
    keys: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = 0.0
    transport_retries: int = 0
    cached_tokens: int = 0
    queued_s: float = 0.0  # waiting for a slot behind --concurrency (kept out of the call's latency)
    last_completion_tokens: int = 0  # of the latest exchange: an answer cut at max_tokens uses them all

    def add(self, booked: Booked) -> None:
        """Add one exchange's tokens and cost (cost stays None once any exchange had no price)."""
        self.prompt_tokens += booked.prompt_tokens
        self.completion_tokens += booked.completion_tokens
        self.last_completion_tokens = booked.completion_tokens
        self.cached_tokens += booked.cached_tokens
        cost = booked.cost_usd
        self.cost_usd = None if cost is None or self.cost_usd is None else self.cost_usd + cost


CALL_STATE: contextvars.ContextVar[CallState] = contextvars.ContextVar("lunasol_call_state")
_BEARER: Final = {"security": {"bearer_auth": True}}  # the auth create() asks for (the SDK's RequestOptions)
_CAPTURE: contextvars.ContextVar[list[bytes] | None] = contextvars.ContextVar("lunasol_capture", default=None)


class Exchange:
    """Stand-in for ``litellm.acompletion``: key, then replay / record / call live (with retries)."""

    def __init__(
        self,
        settings: ModelSettings,
        *,
        model: str | None,
        store: RecordingStore | None,
        instructor_mode: str,
        accounting: Accounting,
        log: Callable[[str], None],
        consumed: frozenset[str] = frozenset(),
    ) -> None:
        self.settings = settings
        self.consumed = consumed  # keys whose answers earlier finished calls of this run already used
        self.model = model
        self.store = store
        self.instructor_mode = instructor_mode
        self.accounting = accounting
        self.log = log
        self._sem: asyncio.Semaphore | None = None
        self._openai_clients: dict[int, Any] = {}
        self.batcher: Batcher | None = None  # --batch: set by the client (pipeline.models.batch_submit)
        self.donors: Donors | None = None  # live: other runs of the bundle, by request key (set by the client)
        self.refused: LunasolError | None = None  # a refusal stops every later request of the client
        # Several endpoints in --api-base: live calls go through litellm's Router (pipeline.models.fleet).
        self.is_fleet = is_fleet(settings.api_base)
        self._fleet: Fleet | None = None
        self.sending = 0  # HTTP requests holding a --concurrency slot now (progress: the rest are queued)

    async def complete(self, **kwargs: Any) -> Any:
        """One exchange as instructor needs it: a coroutine function returning a response object."""
        return response_from(await self.answer(**kwargs), openai_sdk=self.openai_sdk)

    @property
    def openai_sdk(self) -> bool:
        """True when live calls go through the openai SDK without litellm (:func:`uses_openai_sdk`)."""
        return not self.is_fleet and uses_openai_sdk(self.settings, self.model)

    def request_of(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The canonical request the replay key is made of, for the kwargs instructor hands over."""
        # instructor does not pass the model through; the key must still name it (DESIGN: model is in the key).
        return canonical_request({**kwargs, "model": self.model}, self.instructor_mode)

    def serves(self, key: str) -> bool:
        """Whether the store answers this key instead of a live call (see :meth:`answer`)."""
        store = self.store
        if store is None:
            return False
        return store.mode == "replay" or key in store.written or (key not in self.consumed and store.has(key))

    async def answer(self, **kwargs: Any) -> dict[str, Any]:
        """One exchange for the current call (:data:`CALL_STATE`): the answer's body (the raw HTTP JSON).

        Answers from the store when it holds a usable answer for the key: always in replay; in record
        mode and in the run's own exchange store when this process recorded it (a repeated request
        gets the answer replay will give) or an earlier process received it and no failed call used it
        (killed between receipt and parse, or between the call and its artifact). Else calls live, and
        stores the raw answer *before* anything parses it, so a resume never pays for an answer it
        already received, while a failed call, or any finished one in a deliberate redo (the client's
        ``fresh``), is asked again.
        """
        state = CALL_STATE.get()
        request = self.request_of(kwargs)
        key = request_key(request)
        attempt = len(state.keys)
        state.keys.append(key)
        store = self.store
        body: dict[str, Any] | None = None
        if store is not None:
            record = store.load(key) if self.serves(key) else None
            if record is None and self.donors is not None and store.mode == "record":
                record = self.donors.find(key)  # another run of the bundle received it: copied, served
                if record is not None:
                    store.save(record)
            if record is not None:
                body = _response_body(check_record(record, store.path_for(key)))
                if store.mode != "replay" and unusable(body) is not None:
                    body = None  # a stored empty answer is never served where a live retry is possible
            elif store.mode == "replay":
                raise ReplayMiss(
                    role=state.role,
                    cell_id=state.cell_id,
                    template_hash=state.template_hash,
                    key=key,
                    model=self.model,
                    store=str(store.root),
                )
        if body is not None:
            state.add(self.accounting.book(body))
            why = unusable(body)
            if why is not None:  # replay of an answer that was empty when recorded: the same failure
                raise ModelUnavailable(
                    f"model {self.model} gave no usable answer for role={state.role} cell={state.cell_id or '-'} "
                    f"(recorded): {why}",
                    reason="external_system",
                    unblock="re-record this call: lunasol run BUNDLE --record DIR",
                )
            return body

        def persist(answer: dict[str, Any], source: str) -> None:
            if store is not None:
                store.save(
                    make_record(
                        key=key,
                        request=request,
                        response=answer,
                        response_source=source,
                        role=state.role,
                        cell_id=state.cell_id,
                        template_hash=state.template_hash,
                        model=str(self.model),
                        attempt=attempt,
                    )
                )

        body = await self._batched(kwargs, persist) if self._batches(state) else None
        if body is None:
            body = await self._live(kwargs, persist)
        # The stored body, so a live answer and its replay are parsed from the same data.
        return body

    # ------------------------------------------------------------------ batch
    def _batches(self, state: CallState) -> bool:
        # A batched role's first request; re-asks (few) stay synchronous.
        return self.batcher is not None and state.role in BATCHED_ROLES and len(state.keys) == 1

    async def _batched(
        self, kwargs: dict[str, Any], persist: Callable[[dict[str, Any], str], None]
    ) -> dict[str, Any] | None:
        """The provider batch's raw answer under this request's key, persisted; None: ask synchronously."""
        assert self.batcher is not None
        state = CALL_STATE.get()
        body = await self.batcher.answer(state.keys[-1], kwargs)
        if body is None or unusable(body) is not None:
            return None  # a failed or empty item: the synchronous path retries it (empty answers too)
        persist(body, "http_body")  # the provider's own JSON, as a synchronous capture stores it
        state.add(self.accounting.book(body, batch=True))
        return body

    # ------------------------------------------------------------------ live
    def _semaphore(self) -> asyncio.Semaphore:
        if self._sem is None:
            bound = self.settings.concurrency
            if self.is_fleet:  # every endpoint has its own bound (the Router keeps each); in flight: their sum
                bound = total_concurrency(self.settings.api_base, bound)
            self._sem = asyncio.Semaphore(bound)
        return self._sem

    def _transport_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"timeout": self.settings.timeout_s, "num_retries": 0, "max_retries": 0}
        if self.settings.api_base and not self.is_fleet:  # a fleet's endpoints are the Router's
            kw["api_base"] = self.settings.api_base
            if self._is_openai() and not os.environ.get("OPENAI_API_KEY"):
                kw["api_key"] = DUMMY_API_KEY
        return kw

    def _is_openai(self) -> bool:
        return bool(self.model) and str(self.model).startswith("openai/")

    def _openai_client(self) -> Any:
        """An AsyncOpenAI (one per event loop) whose HTTP client hook captures the raw response body."""
        loop_id = id(asyncio.get_running_loop())
        client = self._openai_clients.get(loop_id)
        if client is None:
            # openai and httpx2 (its own HTTP client) load only for a live call (replay and --help never
            # need them); httpx itself is never imported on this path (~0.08 CPU s with its CLI's rich).
            import httpx2

            openai = load_openai()

            async def capture(response: httpx2.Response) -> None:
                slot = _CAPTURE.get()
                if slot is not None and response.request.method == "POST":
                    await response.aread()
                    slot.append(response.content)

            base = self.settings.api_base or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"
            http_client = httpx2.AsyncClient(event_hooks={"response": [capture]}, timeout=self.settings.timeout_s)
            client = openai.AsyncOpenAI(
                api_key=os.environ.get("OPENAI_API_KEY") or DUMMY_API_KEY,
                base_url=base,
                max_retries=0,
                timeout=self.settings.timeout_s,
                http_client=http_client,
            )
            self._openai_clients[loop_id] = client
        return client

    async def _send(self, call_kwargs: dict[str, Any], state: CallState) -> Any:
        """One HTTP request: through the openai SDK (an OpenAI-compatible --api-base) or litellm."""
        if self.is_fleet:
            if self._fleet is None:
                self._fleet = Fleet(
                    str(self.model),
                    str(self.settings.api_base),
                    concurrency=self.settings.concurrency,
                    timeout_s=self.settings.timeout_s,
                    api_key=fleet_api_key(),
                )
            response = await self._fleet.acompletion(call_kwargs)
            state.add(self.accounting.book(response))
            return response
        if self.openai_sdk:
            sdk_kwargs = sdk_body(str(self.model), call_kwargs)
            # The SDK's documented ``post`` for the request ``chat.completions.create`` would build (same
            # path, body and bearer auth): only the captured raw body is used, and ``client.chat`` would
            # import every resource module of the SDK (~0.5 CPU s, a tenth of a one-cell rerun).
            # HTTP errors still raise the SDK's status classes, which the retry rules read.
            import httpx2

            return await self._openai_client().post(
                "/chat/completions", body=sdk_kwargs, cast_to=httpx2.Response, options=_BEARER
            )
        response = await load_litellm().acompletion(**call_kwargs)
        state.add(self.accounting.book(response))
        return response

    async def _live(self, kwargs: dict[str, Any], persist: Callable[[dict[str, Any], str], None]) -> dict[str, Any]:
        """One request with tenacity retries on transport faults and empty answers.

        Returns the answer's body (the raw HTTP JSON when captured), already persisted.
        """
        # tenacity loads only for a live call (startup cost of replay).
        from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_random_exponential

        state = CALL_STATE.get()
        fallback = wait_random_exponential(multiplier=0.5, max=20)

        def wait(retry_state: Any) -> float:
            if no_wait():
                return 0.0
            exc = retry_state.outcome.exception() if retry_state.outcome else None
            after = retry_after(exc) if exc is not None else None
            return after if after is not None else float(fallback(retry_state))

        def before_sleep(retry_state: Any) -> None:
            state.transport_retries += 1
            exc = retry_state.outcome.exception() if retry_state.outcome else None
            self.log(
                f"retry {retry_state.attempt_number}/{self.settings.transport_retries} {state.role}"
                f"{'/' + state.cell_id if state.cell_id else ''}: "
                f"{describe(exc) if exc else '?'}"
            )

        call_kwargs = {**kwargs, **self._transport_kwargs(), "model": self.model}
        use_capture = self._is_openai() and not self.is_fleet  # the Router makes its own clients per endpoint
        if use_capture and not self.openai_sdk:
            call_kwargs["client"] = self._openai_client()
        retrying = AsyncRetrying(
            retry=retry_if_exception(lambda exc: isinstance(exc, EmptyAnswer) or is_transient(exc)),
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
                        waited = time.perf_counter()
                        async with self._semaphore():
                            state.queued_s += time.perf_counter() - waited
                            self.sending += 1
                            try:
                                # Budget checked and spend booked while holding the slot, so calls queued
                                # behind the bound never start on a budget that is already spent.
                                self.accounting.check_budget()
                                if self.refused is not None:  # a call queued behind the refused one never sends
                                    raise self.refused
                                response = await self._send(call_kwargs, state)
                            finally:
                                self.sending -= 1
                    finally:
                        _CAPTURE.reset(tok)
                    raw = _json_object(slot[-1]) if slot else None
                    if self.openai_sdk:
                        if raw is None:  # litellm calls such a body a server fault (500): retried alike
                            raise EmptyAnswer("the answer's body is not a JSON object")
                        state.add(self.accounting.book(raw))
                    body, source = (
                        (raw, "http_body") if raw is not None else (response.model_dump(mode="json"), "litellm")
                    )
                    persist(body, source)  # before any parsing: a kill from here on never pays again
                    why = unusable(body)
                    if why is not None:
                        error = error_in(body)
                        if error is not None and is_context_error(error):
                            raise error  # a 200 saying context_length_exceeded: the context error, not retried
                        raise EmptyAnswer(why)
                    return body
        except EmptyAnswer as exc:
            raise ModelUnavailable(
                f"model {self.model} gave no usable answer for role={state.role} cell={state.cell_id or '-'} after "
                f"{state.transport_retries} retries: {exc.one_line()}",
                reason="external_system",
                tried=[{"action": "retries", "outcome": f"{state.transport_retries} retries, every answer empty"}],
                unblock="check the provider / --api-base, then: lunasol run BUNDLE --resume",
            ) from None
        except LunasolError:
            raise
        except Exception as exc:
            if is_context_error(exc):  # not transient: never retried; the unblock lowers --context-tokens
                raise context_error(exc, self.settings, state.role, state.cell_id) from exc
            refused = refusal(
                exc,
                str(self.model),
                self.settings.api_base,
                mode=self.instructor_mode,
                accepted=servermodes.accepted(self.settings.api_base, self.model),
            )
            if refused is not None and refused.data.get("mode") and self.settings.api_base and self.model:
                servermodes.forget(self.settings.api_base, self.model)  # the server changed: ask it again next run
            if refused is not None:
                self.refused = refused
                raise refused from None
            tried = [{"action": "transport retries", "outcome": f"{state.transport_retries} retries, then failed"}]
            raise ModelUnavailable(
                f"model {self.model} unavailable for role={state.role} cell={state.cell_id or '-'} after "
                f"{state.transport_retries} retries: {describe(exc)}",
                reason=reason_for(exc),
                tried=tried,
                unblock="check the provider / --api-base and key, then: lunasol run BUNDLE --resume",
            ) from exc
        raise AssertionError("unreachable")  # pragma: no cover - tenacity returns or raises


def _json_object(raw: bytes) -> dict[str, Any] | None:
    try:
        parsed = json.loads(raw)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _response_body(record: dict[str, Any]) -> dict[str, Any]:
    body = record.get("response_openai", record["response"])
    return body if isinstance(body, dict) else {}


class ErrorBody(Exception):
    """A 200 whose body is an error object instead of choices (some servers and proxies answer so)."""

    def __init__(self, message: str, code: str | None) -> None:
        super().__init__(f"{code}: {message}" if code else message)
        self.code = code


def error_in(body: dict[str, Any]) -> ErrorBody | None:
    """The error object a 200 body carries (``{"error": {"message", "code"}}``), or None."""
    err = body.get("error")
    if isinstance(err, str):
        return ErrorBody(err, None)
    if not isinstance(err, dict):
        return None
    code = err.get("code") or err.get("type")
    return ErrorBody(str(err.get("message") or ""), None if code is None else str(code))


def unusable(body: dict[str, Any]) -> str | None:
    """Why an answer body says nothing (no choices; neither a tool call nor content), or None when usable."""
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        error = error_in(body)
        if error is not None:  # say what the body says, not only what it lacks
            return f"the answer has no choices, only an error: {' '.join(str(error).split())[:300]}"
        return "the answer has no choices"
    message = choices[0].get("message") or {}
    if not isinstance(message, dict):
        return "the answer's message is not an object"
    if message.get("tool_calls") or message.get("function_call"):
        return None
    content = message.get("content")
    if isinstance(content, str) and content.strip():
        return None
    return "the answer has neither a tool call nor any content"


def response_from(body: dict[str, Any], *, openai_sdk: bool = False) -> Any:
    """The response object instructor parses, built from a stored body (live and record alike).

    With the openai SDK it is the SDK's ChatCompletion, built without validation as the SDK builds
    its own (a server's extra or missing fields pass, as through litellm's ModelResponse), from the
    message litellm would hold (:func:`shaping.as_litellm_holds`): instructor's re-asks then equal
    litellm's and the replay's, byte for byte.
    """
    if openai_sdk:
        from openai.types.chat import ChatCompletion  # loaded already: the SDK sent the request

        return ChatCompletion.construct(**as_litellm_holds(body))
    litellm = load_litellm()
    return litellm.ModelResponse(**body)
