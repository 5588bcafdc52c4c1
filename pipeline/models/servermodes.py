"""Which structured-output modes an OpenAI-compatible server accepts, found by asking it, cached per server.

litellm's capability map knows hosted models, not what a local server does with ``tools`` or
``response_format``: llama-cpp-python turns a forced tool into a grammar (schema-shaped answers)
but answers a ``json_schema`` response format with an HTTP 500; vLLM and SGLang take both; Ollama
and llama.cpp's ``llama-server`` take ``json_schema`` (tools only with a tool-capable chat template,
``--jinja`` for llama-server). Asking the model for a schema in the prompt (``json``) is accepted
everywhere, and small models then answer prose.

So before a live or record run against ``openai/<name>`` with an ``--api-base`` and no ``--mode``,
:func:`probe` sends one tiny request per mode (a one-field schema, ``max_tokens`` 48) and keeps,
per mode, the HTTP status and whether the answer had the schema's shape. The default mode is the
first of tools, json_schema, json that answered in shape, else the first the server accepted.
The result is cached per server and model under the user cache dir
(``$LUNASOL_CACHE_DIR/server-modes``, the file named by a digest of URL and model: a URL's
credentials are never written), for :data:`MAX_AGE_S`; a format rejection during a run deletes it.
Never at import, never in replay, never anywhere but the user's own ``--api-base``.
"""

from __future__ import annotations

import base64
import json
import os
import re
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from pydantic import BaseModel, ValidationError

from pipeline.core.canonical import atomic_write_bytes, canonical_json, sha256_text
from pipeline.core.urls import shown_url
from pipeline.models.tokenizer import cache_dir

PROBED = ("tools", "json_schema", "json")
"""Modes asked, in order of preference (md_json is json with a fence: the same request format)."""

MAX_AGE_S = 24 * 3600.0
PROBE_TIMEOUT_S = 60.0
PROBE_MAX_TOKENS = 48
_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")


class ServerCheck(BaseModel):
    """The tiny answer each probe asks for."""

    ok: bool


def _path(api_base: str, model: str) -> Path:
    return cache_dir() / "server-modes" / f"{sha256_text(api_base + ' ' + model).removeprefix('sha256:')[:32]}.json"


def read(api_base: str, model: str) -> dict[str, Any] | None:
    """The cached probe of this server and model (None: never probed, unreadable, or older than a day)."""
    try:
        data = json.loads(_path(api_base, model).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or time.time() - float(data.get("probed_at", 0)) > MAX_AGE_S:
        return None
    return data


def forget(api_base: str, model: str) -> None:
    """Drop the cached probe (the server rejected a mode it had been seen to accept: it changed)."""
    _path(api_base, model).unlink(missing_ok=True)


def chosen(api_base: str, model: str) -> str | None:
    """The mode a cached probe chose for this server and model, or None."""
    data = read(api_base, model)
    mode = data.get("chosen") if data else None
    return mode if mode in PROBED else None


def accepted(api_base: str | None, model: str | None) -> list[str]:
    """The modes a cached probe saw this server accept (empty when unknown)."""
    data = read(api_base, model) if api_base and model else None
    return [m for m in PROBED if data and (data.get("modes") or {}).get(m, {}).get("status") == 200]


def _request(mode: str, model: str) -> dict[str, Any]:
    schema = ServerCheck.model_json_schema()
    messages = [
        {"role": "system", "content": "Answer with a JSON object with one boolean field `ok`."},
        {"role": "user", "content": 'Is 2 greater than 1? Answer {"ok": true} or {"ok": false}.'},
    ]
    body: dict[str, Any] = {
        "model": model.removeprefix("openai/"),
        "messages": messages,
        "max_tokens": PROBE_MAX_TOKENS,
        "temperature": 0,
    }
    if mode == "tools":
        body["tools"] = [{"type": "function", "function": {"name": "ServerCheck", "parameters": schema}}]
        body["tool_choice"] = {"type": "function", "function": {"name": "ServerCheck"}}
    elif mode == "json_schema":
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "ServerCheck", "schema": schema}}
    else:
        body["response_format"] = {"type": "json_object"}
    return body


def _in_shape(answer: dict[str, Any]) -> bool:
    try:
        message = answer["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        return False
    calls = message.get("tool_calls") or []
    text = calls[0]["function"]["arguments"] if calls else (message.get("content") or "")
    try:
        ServerCheck.model_validate_json(_FENCE.sub("", str(text).strip()))
    except (ValidationError, ValueError):
        return False
    return True


def _ask(api_base: str, body: dict[str, Any], timeout_s: float) -> tuple[int, dict[str, Any] | None, str]:
    # The request a run would send: user:pw@ in the URL as basic auth, else the provider key when set.
    parts = urlsplit(api_base)
    headers = {"Content-Type": "application/json"}
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, netloc = netloc.rsplit("@", 1)
        headers["Authorization"] = "Basic " + base64.b64encode(unquote(userinfo).encode("utf-8")).decode("ascii")
    elif os.environ.get("OPENAI_API_KEY"):
        headers["Authorization"] = "Bearer " + os.environ["OPENAI_API_KEY"]
    url = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/") + "/chat/completions", parts.query, ""))
    req = urllib.request.Request(url, data=json.dumps(body).encode("utf-8"), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            raw = resp.read()
            status = int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code, None, " ".join(exc.read().decode("utf-8", "replace").split())[:200]
    except (OSError, ValueError) as exc:
        return 0, None, str(exc)[:200]
    try:
        parsed = json.loads(raw)
    except ValueError:
        return status, None, "the answer is not JSON"
    return status, parsed if isinstance(parsed, dict) else None, ""


def probe(api_base: str, model: str, timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
    """Ask the server once per mode (:data:`PROBED`), cache and return what it accepted and which mode is chosen."""
    modes: dict[str, dict[str, Any]] = {}
    for mode in PROBED:
        started = time.perf_counter()
        status, answer, detail = _ask(api_base, _request(mode, model), min(timeout_s, PROBE_TIMEOUT_S))
        modes[mode] = {
            "status": status,
            "in_shape": bool(answer) and status == 200 and _in_shape(answer or {}),
            "detail": detail,
            "seconds": round(time.perf_counter() - started, 2),
        }
    shaped = [m for m in PROBED if modes[m]["in_shape"]]
    taken = [m for m in PROBED if modes[m]["status"] == 200]
    data = {
        "server": shown_url(api_base),
        "model": model,
        "probed_at": time.time(),
        "modes": modes,
        "chosen": (shaped or taken or ["json"])[0],
    }
    try:
        path = _path(api_base, model)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, canonical_json(data).encode("utf-8"))
    except OSError:
        pass  # a read-only home: probed again next run
    return data


def describe(data: dict[str, Any]) -> str:
    """One line: which modes the server took, which answered in shape, and the mode chosen."""
    bits = []
    for mode in PROBED:
        m = (data.get("modes") or {}).get(mode) or {}
        state = (
            "in shape" if m.get("in_shape") else ("accepted" if m.get("status") == 200 else f"HTTP {m.get('status')}")
        )
        bits.append(f"{mode} {state}")
    return f"server modes at {data.get('server')}: {', '.join(bits)}; default --mode {data.get('chosen')}"
