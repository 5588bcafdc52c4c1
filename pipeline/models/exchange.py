"""The exchange layer of the model client: one HTTP request and its answer, keyed, recorded or replayed.

:class:`Exchange` is the function instructor calls instead of ``litellm.acompletion``. For every
request (re-asks included) it computes the replay key, then answers from the store (replay, or a
key already recorded) or calls live: ``litellm.acompletion`` under the concurrency bound, with
tenacity retries on transport faults and the raw HTTP body captured by an httpx hook.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipeline.core.errors import LunasolError
from pipeline.core.settings import ModelSettings
from pipeline.models.accounting import Accounting, Booked
from pipeline.models.errors import ModelUnavailable, ReplayMiss
from pipeline.models.store import RecordingStore, canonical_request, check_record, make_record, request_key
from pipeline.models.transport import describe, load_litellm, no_wait, reason_for, retry_after, retryable_types

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

    def add(self, booked: Booked) -> None:
        """Add one exchange's tokens and cost (cost stays None once any exchange had no price)."""
        self.prompt_tokens += booked.prompt_tokens
        self.completion_tokens += booked.completion_tokens
        cost = booked.cost_usd
        self.cost_usd = None if cost is None or self.cost_usd is None else self.cost_usd + cost


CALL_STATE: contextvars.ContextVar[CallState] = contextvars.ContextVar("lunasol_call_state")
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
    ) -> None:
        self.settings = settings
        self.model = model
        self.store = store
        self.instructor_mode = instructor_mode
        self.accounting = accounting
        self.log = log
        self._sem: asyncio.Semaphore | None = None
        self._openai_clients: dict[int, Any] = {}

    async def complete(self, **kwargs: Any) -> Any:
        """One exchange for the current call (:data:`CALL_STATE`); a coroutine function, as instructor needs."""
        litellm = load_litellm()

        state = CALL_STATE.get()
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
            state.add(self.accounting.book(response))
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

    # ------------------------------------------------------------------ live
    def _semaphore(self) -> asyncio.Semaphore:
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.settings.concurrency)
        return self._sem

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
            # openai and httpx load only for a live call (replay and --help never need them).
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
        # tenacity loads only for a live call (startup cost of replay).
        from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

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
        use_capture = capture and self._is_openai()
        if use_capture:
            call_kwargs["client"] = self._openai_client()
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(retryable_types()),
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
                            self.accounting.check_budget()
                            response = await litellm.acompletion(**call_kwargs)
                            state.add(self.accounting.book(response))
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
            tried = [{"action": "transport retries", "outcome": f"{state.transport_retries} retries, then failed"}]
            raise ModelUnavailable(
                f"model {self.model} unavailable for role={state.role} cell={state.cell_id or '-'} after "
                f"{state.transport_retries} retries: {describe(exc)}",
                reason=reason_for(exc),
                tried=tried,
                unblock="check the provider / --api-base and key, then: lunasol run BUNDLE --resume",
            ) from exc
        raise AssertionError("unreachable")  # pragma: no cover - tenacity returns or raises
