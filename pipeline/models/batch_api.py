"""Provider batches: many chat-completion request bodies sent as one batch through litellm's files/batches API.

The provider's batch endpoint answers each request hours later at about half the price.
:class:`BatchEndpoint` uploads a JSONL file of requests (``custom_id`` = the caller's id,
lunasol uses the replay key), creates the batch, retrieves its state, and reads the output and
error files back into one :class:`ItemResult` per request with the raw response body, which
the caller stores exactly as a synchronous answer.

OpenAI-compatible providers first (``openai/...`` models, with or without ``--api-base``): the
request body of a batch line is the one litellm would send synchronously, captured from
litellm itself by :func:`wire_body` (nothing is sent), so a batch answer and a synchronous
answer are answers to the same bytes.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipeline.core.errors import BadInput
from pipeline.models.transport import load_litellm, sdk_body

CHAT_ENDPOINT = "/v1/chat/completions"
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
DUMMY_API_KEY = "sk-lunasol-no-key"  # a bare OpenAI-compatible --api-base needs *some* key string
# Providers whose files/batches endpoints speak the OpenAI protocol through litellm.
BATCH_PROVIDERS = ("openai",)
QUEUE_FULL = "token_limit_exceeded"
"""OpenAI's error code on a batch it failed because the model's enqueued-token limit was reached.

Its message names the limit ("... Limit: 2,000,000 enqueued tokens. Please try again once some
in_progress batches have been completed."), read by :meth:`BatchState.queue_limit`.
"""
_QUEUE_LIMIT = re.compile(r"limit:\s*([\d,_]+)\s*enqueued tokens", re.IGNORECASE)


@dataclass(frozen=True)
class ItemResult:
    """One request's result: the raw response body when the provider answered it, else the error."""

    custom_id: str
    status_code: int | None
    body: dict[str, Any] | None
    error: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        """True for a 200 answer with a body (a chat completion to parse)."""
        return self.status_code == 200 and self.body is not None


@dataclass
class BatchState:
    """What the provider says about one batch."""

    id: str
    status: str
    total: int = 0
    completed: int = 0
    failed: int = 0
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: list[str] = field(default_factory=list)
    error_codes: list[str] = field(default_factory=list)

    @property
    def done(self) -> bool:
        """True once the batch can change no more (completed, failed, expired, cancelled)."""
        return self.status in TERMINAL

    @property
    def queue_full(self) -> bool:
        """True for a batch the provider failed because the model's batch queue was full (retry later)."""
        return self.status == "failed" and QUEUE_FULL in self.error_codes

    def queue_limit(self) -> int | None:
        """The enqueued-token limit the provider's queue-full message states, if it states one."""
        for message in self.errors:
            found = _QUEUE_LIMIT.search(message)
            if found:
                return int(re.sub(r"[,_]", "", found.group(1)))
        return None


def batch_line(custom_id: str, body: dict[str, Any]) -> dict[str, Any]:
    """One line of a batch input file."""
    return {"custom_id": custom_id, "method": "POST", "url": CHAT_ENDPOINT, "body": body}


def provider_of(model: str) -> str:
    """The litellm provider of ``model`` when it can run as a batch, else :class:`BadInput`."""
    provider = model.split("/", 1)[0] if "/" in model else "openai"
    if provider not in BATCH_PROVIDERS:
        raise BadInput(
            f"--batch needs an OpenAI-compatible model (openai/..., with --api-base for other servers), not {model}"
        )
    return provider


class _Captured(Exception):
    # Raised by the capturing transport once the request bytes are in hand: nothing leaves the machine.
    pass


async def wire_body(model: str, kwargs: dict[str, Any], *, api_base: str | None = None) -> dict[str, Any]:
    """The JSON body litellm would POST for ``acompletion(model=model, **kwargs)``, captured before sending."""
    return (await wire_bodies(model, [kwargs], api_base=api_base))[0]


async def wire_bodies(
    model: str, many: list[dict[str, Any]], *, api_base: str | None = None, sdk: bool = False
) -> list[dict[str, Any]]:
    """:func:`wire_body` of each kwargs in turn, through one capturing client (a new client costs ~20 ms).

    ``sdk``: the synchronous calls go through the openai SDK (``uses_openai_sdk``), so each body is
    the one it posts (:func:`sdk_body`), built without litellm: a capture through litellm costs
    ~15 ms of CPU a request (its logging of the failed call), 150 CPU s at 10,000 cells.
    """
    if sdk:
        return [sdk_body(model, kwargs) for kwargs in many]
    litellm = load_litellm()
    import httpx  # litellm's own dependency; imported here with it (startup cost)
    from openai import AsyncOpenAI

    seen: list[bytes] = []

    class Capture(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            seen.append(await request.aread())
            raise _Captured("captured")

    http_client: Any = httpx.AsyncClient(transport=Capture())  # openai types it as httpx2; httpx works
    client = AsyncOpenAI(
        api_key=DUMMY_API_KEY, base_url=api_base or "http://127.0.0.1:9/v1", max_retries=0, http_client=http_client
    )
    bodies: list[dict[str, Any]] = []
    try:
        for kwargs in many:
            seen.clear()
            # The capture always ends the call with an error; what counts is whether the body was seen.
            try:
                await litellm.acompletion(model=model, client=client, num_retries=0, max_retries=0, **kwargs)
            except Exception as exc:
                _drop_frames(exc)
            if not seen:
                raise BadInput(
                    f"--batch: litellm built no HTTP request for {model} (not an OpenAI-compatible provider?)"
                )
            body = json.loads(seen[0])
            if not isinstance(body, dict):
                raise BadInput("--batch: the captured request body is not a JSON object")
            bodies.append(body)
    finally:
        await http_client.aclose()
    return bodies


def _drop_frames(exc: BaseException) -> None:
    """Clear the frames of an exception and of those it was raised from.

    litellm maps the capture's error through several frames that hold the request: each failed
    call left a reference cycle (exception, traceback, frame) keeping its whole prompt until a
    full garbage collection, which at ~700,000 live objects came seldom (2,000 cells: +100 MB per
    batch of 300 requests; 10,000 cells: 2.8 GiB in the Luna stage).
    """
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        todo += [e.__cause__, e.__context__]


class BatchEndpoint:
    """Submit, retrieve and collect provider batches (litellm files/batches API)."""

    def __init__(self, model: str, *, api_base: str | None = None, timeout_s: float = 120.0) -> None:
        self.model = model
        self.provider = provider_of(model)
        self.api_base = api_base or os.environ.get("OPENAI_BASE_URL") or None
        self.timeout_s = timeout_s

    def _auth(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"custom_llm_provider": self.provider, "timeout": self.timeout_s}
        if self.api_base:
            kw["api_base"] = self.api_base
            if not os.environ.get("OPENAI_API_KEY"):
                kw["api_key"] = DUMMY_API_KEY
        return kw

    async def submit(self, lines: list[dict[str, Any]], *, metadata: dict[str, str] | None = None) -> str:
        """Upload ``lines`` (see :func:`batch_line`) and create one batch; returns its id."""
        if not lines:
            raise BadInput("a batch needs at least one request")
        litellm = load_litellm()
        data = "".join(json.dumps(line, ensure_ascii=False, sort_keys=True) + "\n" for line in lines).encode("utf-8")
        f = await litellm.acreate_file(file=("lunasol-batch.jsonl", data), purpose="batch", **self._auth())
        batch = await litellm.acreate_batch(
            completion_window="24h",
            endpoint=CHAT_ENDPOINT,
            input_file_id=f.id,
            metadata=metadata,
            **self._auth(),
        )
        return str(batch.id)

    async def find(self, metadata_key: str, value: str, *, pages: int = 10) -> str | None:
        """The id of the newest batch whose ``metadata[metadata_key] == value``, or None.

        Used after a crash between asking for a batch and storing its id: the provider may have
        accepted it, and the metadata we sent is the only way to find it again. Lists newest
        first, at most ``pages`` pages of 100 (a batch looked for is minutes old, not thousands deep).
        """
        litellm = load_litellm()
        after: str | None = None
        for _ in range(pages):
            page = await litellm.alist_batches(after=after, limit=100, **self._auth())
            data = list(getattr(page, "data", None) or [])
            for b in data:
                meta = getattr(b, "metadata", None) or {}
                if isinstance(meta, dict) and meta.get(metadata_key) == value:
                    return str(b.id)
            if not data or not getattr(page, "has_more", False):
                return None
            after = str(data[-1].id)
        return None

    async def retrieve(self, batch_id: str) -> BatchState:
        """The provider's current state of one batch."""
        litellm = load_litellm()
        # The sync call in a thread: on a finished batch, litellm's aretrieve_batch logs its cost by
        # downloading the whole output file again in a background task, which the stage's loop then
        # ends unawaited (a RuntimeWarning on the user's terminal); results() reads that file once.
        b = await asyncio.to_thread(litellm.retrieve_batch, batch_id=batch_id, **self._auth())
        counts = getattr(b, "request_counts", None)
        errs = getattr(getattr(b, "errors", None), "data", None) or []
        return BatchState(
            id=str(b.id),
            status=str(b.status),
            total=int(getattr(counts, "total", 0) or 0),
            completed=int(getattr(counts, "completed", 0) or 0),
            failed=int(getattr(counts, "failed", 0) or 0),
            output_file_id=getattr(b, "output_file_id", None),
            error_file_id=getattr(b, "error_file_id", None),
            errors=[str(getattr(e, "message", e)) for e in errs],
            error_codes=[str(getattr(e, "code", "") or "") for e in errs],
        )

    async def wait(
        self,
        batch_id: str,
        *,
        poll_s: float = 30.0,
        max_wait_s: float | None = None,
        on_poll: Callable[[BatchState], None] | None = None,
    ) -> BatchState:
        """Retrieve until the batch is terminal, or ``max_wait_s`` has passed (then its last state)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        while True:
            state = await self.retrieve(batch_id)
            if on_poll is not None:
                on_poll(state)
            if state.done or (max_wait_s is not None and loop.time() - started >= max_wait_s):
                return state
            await asyncio.sleep(poll_s)

    async def _file(self, file_id: str) -> bytes:
        litellm = load_litellm()
        # The sync call in a thread: litellm's afile_content leaves an un-awaited coroutine behind (a warning).
        content = await asyncio.to_thread(litellm.file_content, file_id=file_id, **self._auth())
        return bytes(content.content)

    async def results(self, state: BatchState) -> dict[str, ItemResult]:
        """Every item the batch answered or reported (output and error files), by custom id."""
        out: dict[str, ItemResult] = {}
        for file_id in (state.error_file_id, state.output_file_id):  # output last: an answer beats an error line
            if not file_id:
                continue
            for raw in (await self._file(file_id)).decode("utf-8").split("\n"):  # a model text may hold U+2028
                if not raw.strip():
                    continue
                line = json.loads(raw)
                response = line.get("response") or {}
                body = response.get("body")
                out[str(line["custom_id"])] = ItemResult(
                    custom_id=str(line["custom_id"]),
                    status_code=response.get("status_code"),
                    body=body if isinstance(body, dict) else None,
                    error=line.get("error"),
                )
        return out
