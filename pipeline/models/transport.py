"""Transport helpers of the model client: lazy litellm, which client sends, retry classification, Retry-After."""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Callable
from typing import Any

from pipeline.core import offline
from pipeline.core.errors import LunasolError
from pipeline.core.settings import ModelSettings
from pipeline.core.urls import shown_url, shown_urls
from pipeline.models.errors import ModelRefused

LOADING = "loading model client (litellm)…"
"""Said before litellm's first import in a process (seconds, up to 20 on a busy machine)."""


def load_litellm(announce: Callable[[str], None] | None = None) -> Any:
    """Import litellm lazily (3+ s) with its feedback banner off and the offline switches set first.

    ``announce`` is told :data:`LOADING` before the first import, so a live run says why it waits.
    """
    if announce is not None and "litellm" not in sys.modules:
        announce(LOADING)
    offline.apply()  # before litellm's import: it would fetch a price map from GitHub otherwise
    import litellm

    litellm.suppress_debug_info = True
    quiet_instructor()
    return litellm


# openai's optional aiohttp transport (``openai.DefaultAioHttpClient``), which lunasol never uses
_OPENAI_AIOHTTP = "openai._vendor.httpx_aiohttp"


def load_openai() -> Any:
    """Import the openai SDK; when neither it nor aiohttp is loaded yet, without its aiohttp transport.

    The SDK imports that optional transport (and with it aiohttp, ~0.25 CPU s, a twentieth of a
    one-cell rerun) only to offer ``openai.DefaultAioHttpClient``; lunasol hands it an httpx2 client
    of its own. A module set to None in ``sys.modules`` fails to import, which the SDK takes as
    "aiohttp extra not installed"; the marker goes right after, so a later import of the transport
    works. litellm never uses the SDK's aiohttp client (it has its own aiohttp transport).
    """
    if "openai" not in sys.modules and "aiohttp" not in sys.modules and _OPENAI_AIOHTTP not in sys.modules:
        sys.modules[_OPENAI_AIOHTTP] = None  # type: ignore[assignment]  # import system: "not importable"
        try:
            import openai
        finally:
            if _OPENAI_AIOHTTP in sys.modules and sys.modules[_OPENAI_AIOHTTP] is None:
                del sys.modules[_OPENAI_AIOHTTP]
    import openai

    return openai


def quiet_instructor() -> None:
    """Instructor logs every failed attempt at ERROR; the call log records them, so keep stderr to one line.

    ``LUNASOL_DEBUG=1`` keeps instructor's messages.
    """
    if not os.environ.get("LUNASOL_DEBUG"):
        logging.getLogger("instructor").setLevel(logging.CRITICAL)


def no_wait() -> bool:
    """True when retry waits must be zero (LUNASOL_TEST_NO_WAIT=1, set by the tests)."""
    return os.environ.get("LUNASOL_TEST_NO_WAIT") == "1"


def lunasol_cause(exc: BaseException) -> LunasolError | None:
    """Our own error in the cause/context chain of ``exc``, if any."""
    # instructor wraps what the completion function raised; find our own error in the chain.
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, LunasolError):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def uses_openai_sdk(settings: ModelSettings, model: str | None) -> bool:
    """True when live calls go straight through the openai SDK, without litellm.

    ``openai/<name>`` with ``--api-base`` is an OpenAI-compatible server (vLLM, llama.cpp, Ollama,
    LM Studio): litellm's own route for it is the openai SDK with the prefix stripped, after
    importing itself (~2.5 CPU s, most of a one-cell rerun). ``LUNASOL_CLIENT=litellm`` keeps litellm.
    """
    return settings.client == "auto" and bool(model) and str(model).startswith("openai/") and bool(settings.api_base)


LITELLM_ONLY = frozenset({"num_retries", "max_retries", "api_base", "api_key", "timeout"})
"""litellm.acompletion arguments the openai SDK takes on its client instead (base URL, key, timeout, no
retries): never part of a request's JSON body."""


def sdk_body(model: str, call_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The JSON body of the request the openai SDK posts for these call kwargs (:func:`uses_openai_sdk`).

    The kwargs without litellm's own options, and the model without its ``openai/`` prefix, as
    litellm sends it. A synchronous call posts it; ``--batch`` puts the very same body in its file.
    """
    body = {k: v for k, v in call_kwargs.items() if k not in LITELLM_ONLY}
    body["model"] = str(model).removeprefix("openai/")
    return body


def _litellm_types(*names: str) -> tuple[type[BaseException], ...]:
    # litellm's own classes, only when it is loaded: an error from the openai SDK is never one of them.
    litellm = sys.modules.get("litellm")
    return tuple(t for n in names if isinstance(t := getattr(litellm, n, None), type)) if litellm else ()


def is_transient(exc: BaseException) -> bool:
    """A transport fault worth retrying with backoff: rate limit, timeout, connection, 5xx.

    litellm's exception classes subclass the openai SDK's, so one test covers both clients.
    """
    import openai  # loaded already: an exception of a live call is being classified

    if is_context_error(exc) or refusal_kind(exc) is not None:
        return False  # a 5xx whose body says the prompt is too long is not transient either
    if isinstance(exc, openai.RateLimitError | openai.APIConnectionError | openai.InternalServerError):
        return True  # APITimeoutError is an APIConnectionError; litellm maps "connection refused" to a 500
    return isinstance(exc, openai.APIStatusError) and exc.status_code >= 500  # litellm's 502 / 503 classes


def refusal_kind(exc: BaseException) -> str | None:
    """The kind of a provider error retrying cannot fix (credential, not_found, bad_request), else None."""
    import openai  # loaded already: an exception of a live call is being classified

    if is_context_error(exc):
        return None  # the prompt is too long for this model: the context budget handles it
    if is_format_rejection(exc):
        return "request_format"
    if isinstance(exc, openai.AuthenticationError | openai.PermissionDeniedError):
        return "credential"
    if isinstance(exc, openai.NotFoundError):
        return "not_found"
    if isinstance(exc, openai.BadRequestError | openai.UnprocessableEntityError):
        return "bad_request"  # litellm's UnsupportedParamsError is a BadRequestError
    return None


def retry_after(exc: BaseException) -> float | None:
    """Seconds from a Retry-After header (capped at 60), or None."""
    headers: Any = getattr(exc, "litellm_response_headers", None)
    if not headers:
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None)
    if not headers or not hasattr(headers, "get"):
        return None
    value = headers.get("retry-after") or headers.get("Retry-After")
    try:
        return min(max(float(value), 0.0), 60.0) if value is not None else None
    except (TypeError, ValueError):  # HTTP-date form: fall back to exponential backoff
        return None


def reason_for(exc: BaseException) -> str:
    """Block receipt constraint class for a provider error."""
    # the block receipt's constraint classes: a refused key is a credential problem, the rest is the provider's.
    return "credential" if refusal_kind(exc) == "credential" else "external_system"


def refusal(
    exc: BaseException,
    model: str,
    api_base: str | None,
    *,
    mode: str | None = None,
    accepted: list[str] | None = None,
) -> ModelRefused | None:
    """A provider error that retrying cannot fix, as one actionable line (None for anything else).

    Authentication and permission (401/403), an unknown model (404), a bad request (400) and a
    request whose format the server rejects (any status: llama-cpp-python answers an unsupported
    ``response_format`` with a 500) are configuration errors; a context-window overflow is not one
    of them (the prompt is too long for this model, which the context budget handles). ``mode``:
    the ``--mode`` the request was shaped with; ``accepted``: the modes the server is known to take.
    """
    kind = refusal_kind(exc)
    where = f" at {shown_url(api_base)}" if api_base else ""
    if kind == "request_format":
        others = [m for m in (accepted or []) if m != mode]
        if others:
            hint = f"this server accepts --mode {' or --mode '.join(others)}"
        else:
            hint = "pass another --mode: tools, json_schema or json (the schema in the prompt: every server takes it)"
        return ModelRefused(
            f"the server{where} rejected the request format of --mode {mode or '?'} for {model} "
            f"({describe(exc)}); not retried: {hint}",
            reason="bad_request",
            mode=mode,
            accepted=list(accepted or []),
        )
    if kind == "credential":
        return ModelRefused(
            f"the provider refused the key for {model}{where} ({describe(exc)}); set a valid key in the provider's "
            "env var (e.g. OPENAI_API_KEY), or point --api-base at a server that needs none",
            reason="credential",
        )
    if kind == "not_found":
        said = describe(exc)
        if "model" in said.split(":", 1)[-1].lower():  # the body names a model it does not serve
            return ModelRefused(
                f"model {model} was not found{where} ({said}); pass a --model the provider serves",
                reason="not_found",
            )
        # a 404 whose body says something else (a wrong path, a missing deployment): quote it, guess nothing
        return ModelRefused(
            f"the provider answered 404 Not Found{where} for {model}: {said}; check --api-base (its path, "
            "e.g. .../v1) and --model",
            reason="not_found",
        )
    if kind == "bad_request":
        return ModelRefused(
            f"the provider rejected the request for {model}{where} as invalid ({describe(exc)}); a server without "
            "tool calls or JSON schemas needs --mode json, one without max_tokens --max-tokens 0",
            reason="bad_request",
        )
    return None


def describe(exc: BaseException) -> str:
    """One line: exception type and message, folded, its secrets marked, cut at 300 characters.

    A provider may echo what it was sent (a key, a URL with its password); this line goes into block
    receipts, ``calls.jsonl`` and stderr, so the log redactor's rules and the URL marking apply.
    """
    from pipeline.ir.redact import redact  # only when an error is described: its rules compile on import

    text = redact(shown_urls(" ".join(str(exc).split())))[0]
    return f"{type(exc).__name__}: {text[:300]}"


# A request format a server does not take: its body names the feature, and says it is not supported.
_FORMAT_FEATURES = re.compile(
    r"response_format|json_schema|json_object|tool_choice|\btools?\b|function.call|grammar|--jinja"
)
_FORMAT_REFUSALS = re.compile(
    r"not supported|unsupported|does not support|doesn't support|not implemented|requires|not allowed|"
    r"unknown|unrecognized|invalid|cannot|can't|failed to parse|not available|only supports|must be|should be",
    re.I,
)


def is_format_rejection(exc: BaseException) -> bool:
    """True when a 4xx/5xx says the request's format (response_format, tools, grammar) is not supported.

    A configuration error (the wrong ``--mode`` for this server), never transient: retrying the
    same request gets the same answer (126 retries of one json_schema 500 before this check).
    """
    status = getattr(exc, "status_code", None)
    if not isinstance(status, int) or status < 400 or status in (401, 403, 404, 408, 429) or is_context_error(exc):
        return False
    text = " ".join(str(exc).split())
    return bool(_FORMAT_FEATURES.search(text.lower()) and _FORMAT_REFUSALS.search(text))


_CONTEXT_MARKERS = ("context_length_exceeded", "maximum context length", "context window", "too many tokens")
_MAX_CONTEXT = re.compile(r"maximum context length is (\d[\d,]*)")


def is_context_error(exc: BaseException) -> bool:
    """True when the provider refused a request for its size (OpenAI ``context_length_exceeded``)."""
    if isinstance(exc, _litellm_types("ContextWindowExceededError")):
        return True
    code = getattr(exc, "code", None)
    text = f"{code} {exc}".lower()
    return any(m in text for m in _CONTEXT_MARKERS)


def stated_context(exc: BaseException) -> int | None:
    """The context size a provider's error message states ("maximum context length is N"), if any."""
    m = _MAX_CONTEXT.search(str(exc))
    return int(m.group(1).replace(",", "")) if m else None
