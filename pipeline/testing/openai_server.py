"""A local OpenAI chat-completions server (stdlib only) for tests, benchmarks and serving recordings.

``FakeOpenAI`` answers ``POST /v1/chat/completions`` (and the files and batches endpoints, see
:mod:`pipeline.testing.batch_api`) on 127.0.0.1 (an ephemeral port by default)
from a queue of scripted replies, then from a handler. Replies can inject faults: a status with
headers (429 + Retry-After, 500, 401), a delay (timeouts, slow servers), a dropped connection, a
non-JSON body, a schema-invalid answer, a 200 without choices or content (:func:`empty_choices`,
:func:`flaky_empty`), or no ``usage`` (:func:`without_usage`), as real proxies and local servers
send them. It counts requests in flight and records every request body. With
``context_tokens`` it declares a context and refuses larger requests (counted by
:func:`request_tokens`) with OpenAI's ``context_length_exceeded`` error body.

``serve_recordings(DIR)`` answers from a lunasol recording directory instead, proving a recording
is servable by any OpenAI-compatible server. Command line::

    python -m pipeline.testing.openai_server --port 8099 [--recordings DIR] [--delay-ms 200]
        [--empty-rate 0.3] [--no-usage] [--require-key KEY]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pipeline.core.canonical import canonical_json, digest
from pipeline.testing.batch_api import BatchAPI, BatchPlan

__all__ = ["BatchPlan", "FakeOpenAI", "Reply", "answer", "auto_answer", "raw_answer", "serve_recordings"]


@dataclass
class Reply:
    """One scripted HTTP answer. ``body`` None means "the handler's answer"; bytes are sent verbatim."""

    status: int = 200
    body: dict[str, Any] | bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    drop: bool = False  # close the connection without any response


Handler = Callable[[dict[str, Any]], Reply]
ScriptItem = Reply | Handler


def completion_body(
    request: dict[str, Any],
    *,
    content: str | None = None,
    tool_arguments: str | None = None,
    usage: tuple[int, int] | None = None,
    cached_tokens: int = 0,
) -> dict[str, Any]:
    """A chat.completion body. With ``tool_arguments`` and tools in the request, a forced tool call.

    ``cached_tokens`` > 0 reports that many prompt tokens as served from the prompt cache.
    """
    message: dict[str, Any] = {"role": "assistant", "content": content}
    finish = "stop"
    tools = request.get("tools") or []
    if tool_arguments is not None and tools:
        name = tools[0]["function"]["name"]
        message["content"] = None
        message["tool_calls"] = [
            {"id": "call_1", "type": "function", "function": {"name": name, "arguments": tool_arguments}}
        ]
        finish = "tool_calls"
    elif tool_arguments is not None:
        message["content"] = tool_arguments
    if usage is None:
        # Deterministic, roughly proportional token counts (~4 characters per token).
        prompt = max(1, len(canonical_json(request.get("messages", []))) // 4)
        completion = max(1, len(tool_arguments or content or "") // 4)
        usage = (prompt, completion)
    body: dict[str, Any] = {
        "id": "chatcmpl-" + digest(request)[7:31],
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": request.get("model", "test-model"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
    }
    if cached_tokens:
        body["usage"]["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return body


def answer(data: Any) -> Handler:
    """A handler that answers structured ``data`` in whatever shape the request asks (tool call or JSON text)."""

    def handle(request: dict[str, Any]) -> Reply:
        return Reply(body=completion_body(request, tool_arguments=json.dumps(data, ensure_ascii=False)))

    return handle


def raw_answer(arguments: str) -> Handler:
    """A handler answering this exact text as the tool arguments / content (e.g. invalid JSON)."""

    def handle(request: dict[str, Any]) -> Reply:
        return Reply(body=completion_body(request, tool_arguments=arguments))

    return handle


def rate_limited(retry_after: float = 0) -> Reply:
    """429 with a Retry-After header."""
    return Reply(
        status=429,
        headers={"Retry-After": f"{retry_after:g}"},
        body={"error": {"message": "rate limited (fake)", "type": "rate_limit_error", "code": "rate_limit"}},
    )


def server_error(status: int = 500) -> Reply:
    """A 5xx with an OpenAI-style error body."""
    return Reply(status=status, body={"error": {"message": f"fake server error {status}", "type": "server_error"}})


def unauthorized() -> Reply:
    """401 with OpenAI's invalid-key error body."""
    return Reply(
        status=401,
        body={"error": {"message": "Incorrect API key provided (fake)", "type": "invalid_request_error",
                        "code": "invalid_api_key"}},
    )  # fmt: skip


def empty_choices(request: dict[str, Any], *, content: bool = False) -> Reply:
    """A 200 that says nothing: ``"choices": []``, or (``content=True``) one choice with empty content."""
    body = completion_body(request, content="")
    if not content:
        body["choices"] = []
    return Reply(body=body)


def without_usage(handler: Handler) -> Handler:
    """``handler``'s answers with the ``usage`` object removed (llama.cpp and some proxies omit it)."""

    def handle(request: dict[str, Any]) -> Reply:
        reply = handler(request)
        body = reply.body if isinstance(reply.body, dict) else auto_answer(request).body
        if isinstance(body, dict):
            body = {k: v for k, v in body.items() if k != "usage"}
        return Reply(status=reply.status, body=body, headers=reply.headers, delay_s=reply.delay_s, drop=reply.drop)

    return handle


def flaky_empty(handler: Handler, rate: float, *, content: bool = False) -> Handler:
    """``handler``, but the first attempt of about ``rate`` of the distinct requests gets an empty 200.

    Which requests is a pure function of the request (its digest), so a run is reproducible; a retry
    of the same request is answered by ``handler``.
    """
    seen: set[str] = set()
    lock = threading.Lock()

    def handle(request: dict[str, Any]) -> Reply:
        key = _match_key(request)
        with lock:
            first = key not in seen
            seen.add(key)
        if first and int(key.split(":", 1)[-1][:8], 16) / 0xFFFFFFFF < rate:
            return empty_choices(request, content=content)
        return handler(request)

    return handle


def requiring_key(handler: Handler, key: str, headers: Callable[[], dict[str, str]]) -> Handler:
    """``handler`` behind a bearer key: 401 unless ``Authorization: Bearer <key>`` (``headers()``: this request's)."""

    def handle(request: dict[str, Any]) -> Reply:
        if headers().get("authorization") != f"Bearer {key}":
            return unauthorized()
        return handler(request)

    return handle


def request_text(request: dict[str, Any]) -> str:
    """What a server's tokenizer reads of a request: the messages' text, then the schema as JSON."""
    text = "\n".join(str(m.get("content") or "") for m in request.get("messages", []))
    schema = request.get("tools") or request.get("response_format")
    return text + (json.dumps(schema, ensure_ascii=False) if schema else "")


def request_tokens(request: dict[str, Any], chars_per_token: float | None = None) -> int:
    """The server's token count of a request.

    By default ~4 characters per token of the request's messages and tools as JSON. With
    ``chars_per_token``: that many characters per token of what a tokenizer reads, the messages'
    text and the schema (tools or response_format) as JSON; a small-vocabulary model (SmolLM2
    counts 2.16 characters a token on the demo's log lines) is served with ~2.1 to check that
    requests planned for a context really fit it.
    """
    if chars_per_token is None:
        return max(1, len(canonical_json([request.get("messages", []), request.get("tools") or []])) // 4)
    return max(1, int(len(request_text(request)) / chars_per_token))


def context_exceeded(limit: int, tokens: int) -> Reply:
    """OpenAI's 400 ``context_length_exceeded`` error, worded as OpenAI words it."""
    return Reply(
        status=400,
        body={
            "error": {
                "message": f"This model's maximum context length is {limit} tokens. However, your messages "
                f"resulted in {tokens} tokens. Please reduce the length of the messages.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        },
    )


def _example(schema: dict[str, Any], defs: dict[str, Any]) -> Any:
    # The smallest instance of a JSON schema: enough for a default, schema-valid answer.
    if "$ref" in schema:
        return _example(defs.get(schema["$ref"].split("/")[-1], {}), defs)
    for combo in ("anyOf", "oneOf", "allOf"):
        if schema.get(combo):
            return _example(schema[combo][0], defs)
    if "enum" in schema:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props = schema.get("properties", {})
        return {k: _example(props[k], defs) for k in schema.get("required", list(props))}
    if kind == "array":
        n = int(schema.get("minItems", 0))
        return [_example(schema.get("items", {}), defs) for _ in range(n)]
    return {"string": "x", "integer": 0, "number": 0, "boolean": False, "null": None}.get(kind, "x")


def auto_answer(request: dict[str, Any]) -> Reply:
    """Answer with the smallest instance of the requested schema (tools or json_schema), else ``{}``."""
    schema: dict[str, Any] = {}
    if request.get("tools"):
        schema = request["tools"][0]["function"].get("parameters", {})
    elif isinstance(request.get("response_format"), dict):
        schema = request["response_format"].get("json_schema", {}).get("schema", {})
    data = _example(schema, schema.get("$defs", {})) if schema else {}
    return Reply(body=completion_body(request, tool_arguments=json.dumps(data)))


def _match_key(request: dict[str, Any]) -> str:
    # What identifies a request on the wire: roles, contents, tool calls and the tool names.
    msgs = []
    for m in request.get("messages", []):
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in (m.get("tool_calls") or [])]
        msgs.append([m.get("role"), m.get("content") or "", calls, m.get("tool_call_id") or ""])
    tools = [t["function"]["name"] for t in request.get("tools") or []]
    return digest({"messages": msgs, "tools": tools})


def recordings_handler(store_dir: Path) -> Handler:
    """Answer each request with the recorded response of the matching exchange in ``store_dir``."""
    index: dict[str, dict[str, Any]] = {}
    for path in sorted(Path(store_dir).glob("*/*.json")):
        rec = json.loads(path.read_text(encoding="utf-8"))
        index[_match_key(rec["request"])] = rec.get("response_openai", rec["response"])

    def handle(request: dict[str, Any]) -> Reply:
        body = index.get(_match_key(request))
        if body is None:
            return Reply(status=404, body={"error": {"message": "no recording matches this request"}})
        return Reply(body=body)

    return handle


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that vanished (killed mid-request, timed out) is expected here; anything else is printed.
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


class FakeOpenAI:
    """A threaded local server speaking OpenAI chat completions; use as a context manager."""

    def __init__(
        self,
        handler: Handler | None = None,
        *,
        port: int = 0,
        delay_s: float = 0.0,
        context_tokens: int | None = None,
        chars_per_token: float | None = None,
        token_counter: Callable[[str], int] | None = None,
        keep_requests: bool = True,
    ) -> None:
        self.handler = handler
        # False: requests are counted and answered but not kept (a 100,000-cell benchmark's bodies are GBs)
        self.keep_requests = keep_requests
        self.delay_s = delay_s  # added to every reply (benchmarks)
        # A declared context: larger requests get OpenAI's context_length_exceeded (request_tokens counts).
        self.context_tokens = context_tokens
        self.chars_per_token: float | None = chars_per_token
        self.token_counter = token_counter  # a real tokenizer's count of request_text (overrides the others)
        self.largest_request = 0  # the largest request counted against a declared context (tokens)
        self.refused_for_size = 0
        self.script: list[ScriptItem] = []
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        # Files and batches, each batch item answered like a synchronous request (_batch_item).
        self.batch = BatchAPI(self._batch_item, request_tokens)
        self._local = threading.local()
        outer = self

        class _H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # else Nagle + delayed ACK add ~40 ms per call

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                if not outer._serve_batch_api(self, "POST"):
                    outer._serve(self)

            def do_GET(self) -> None:
                if not outer._serve_batch_api(self, "GET"):
                    outer._send(self, 404, json.dumps({"error": {"message": "fake server: no route"}}).encode())

        ThreadingHTTPServer.request_queue_size = 256  # default backlog 5 stalls bursts of connections
        self.httpd = _QuietServer(("127.0.0.1", port), _H)
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="fake-openai", daemon=True)

    def last_headers(self) -> dict[str, str]:
        """Headers of the request being served by this thread (lower-case names)."""
        return dict(getattr(self._local, "headers", {}))

    # scripting -------------------------------------------------------------
    def push(self, *items: ScriptItem) -> FakeOpenAI:
        """Queue replies (Reply objects or handlers), used in order before the default handler."""
        with self.lock:
            self.script.extend(items)
        return self

    def push_answer(self, data: Any) -> FakeOpenAI:
        """Queue a structured answer (a tool call or JSON text, whichever the request asks for)."""
        return self.push(answer(data))

    def reset(self) -> None:
        """Clear the script, the recorded requests, the counters and the handler."""
        with self.lock:
            self.script.clear()
            self.requests.clear()
            self.headers.clear()
            self.max_in_flight = self.in_flight
            self.handler = None
            self.delay_s = 0.0
            self.context_tokens = None
            self.chars_per_token = None
            self.largest_request = 0
            self.refused_for_size = 0
        self.batch.reset()

    # serving ---------------------------------------------------------------
    def _next_item(self, request: dict[str, Any], headers: dict[str, str]) -> tuple[ScriptItem | None, Handler | None]:
        # Record the request and take the next scripted reply (under the lock).
        # A request over a declared context is refused as a provider would, before the script is used.
        size = 0
        if self.context_tokens:
            size = (
                self.token_counter(request_text(request))
                if self.token_counter is not None
                else request_tokens(request, self.chars_per_token)
            )
        self.largest_request = max(self.largest_request, size)
        self._local.headers = headers  # what a handler sees as last_headers (this thread's request)
        with self.lock:
            if self.keep_requests:
                self.requests.append(request)
                self.headers.append(headers)
            too_large = bool(self.context_tokens) and size > int(self.context_tokens or 0)
            if too_large:
                self.refused_for_size += 1
            item: ScriptItem | None = context_exceeded(int(self.context_tokens or 0), size) if too_large else None
            if item is None and self.script:
                item = self.script.pop(0)
            return item, self.handler

    @staticmethod
    def _resolve(item: ScriptItem | None, handler: Handler | None, request: dict[str, Any]) -> Reply:
        # The reply for one request: a scripted item, else the handler; a body-less reply gets the auto answer.
        if item is None:
            item = handler or (
                lambda _r: Reply(status=400, body={"error": {"message": "fake server: no scripted reply"}})
            )
        reply = item if isinstance(item, Reply) else item(request)
        if reply.body is None:
            reply = Reply(
                status=reply.status,
                body=auto_answer(request).body,
                headers=reply.headers,
                delay_s=reply.delay_s,
                drop=reply.drop,
            )
        return reply

    def _batch_item(self, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """One batch item through the same script and handler as a synchronous request (no delay)."""
        item, handler = self._next_item(request, {"x-lunasol-batch-item": "1"})
        reply = self._resolve(item, handler, request)
        if reply.drop or isinstance(reply.body, bytes):
            # A dropped connection or a non-JSON body has no batch form: the provider reports a 500.
            return 500, {"error": {"message": "fake server: no JSON answer for this item", "type": "server_error"}}
        return reply.status, dict(reply.body or {})

    def _serve_batch_api(self, h: BaseHTTPRequestHandler, method: str) -> bool:
        length = int(h.headers.get("Content-Length") or 0)
        if not re.match(r"^(/v1)?/(files|batches)(/|$|\?)", h.path):
            return False
        raw = h.rfile.read(length) if length else b""
        routed = self.batch.route(method, h.path, {k.lower(): v for k, v in h.headers.items()}, raw)
        status, body, ctype = routed or (404, b"{}", "application/json")
        self._send(h, status, body, ctype)
        return True

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, body: bytes, ctype: str = "application/json") -> None:
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            h.wfile.write(body)

    def _serve(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        try:
            request = json.loads(raw or b"{}")
        except ValueError:
            request = {}
        item, handler = self._next_item(request, {k.lower(): v for k, v in h.headers.items()})
        with self.lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        done = False

        def finished() -> None:
            # Counted as finished before the answer is written: the client may send its next request
            # as soon as it reads this one, before this thread would otherwise get to decrement.
            nonlocal done
            if not done:
                done = True
                with self.lock:
                    self.in_flight -= 1

        try:
            reply = self._resolve(item, handler, request)
            delay = self.delay_s + reply.delay_s
            if delay:
                time.sleep(delay)
            finished()
            if reply.drop:
                h.close_connection = True
                with contextlib.suppress(OSError):
                    h.connection.shutdown(socket.SHUT_RDWR)
                return
            body = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode("utf-8")
            h.send_response(reply.status)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(body)))
            for k, v in reply.headers.items():
                h.send_header(k, v)
            h.end_headers()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client timed out first
                h.wfile.write(body)
        finally:
            finished()

    def start(self) -> FakeOpenAI:
        """Serve in a daemon thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket (the port refuses connections afterwards)."""
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_recordings(store_dir: Path, *, port: int = 0, delay_s: float = 0.0) -> FakeOpenAI:
    """A (not yet started) server answering from a recording directory."""
    return FakeOpenAI(recordings_handler(store_dir), port=port, delay_s=delay_s)


def _tokenizer_counter(path: Path) -> Callable[[str], int]:
    from tokenizers import Tokenizer  # litellm's dependency; only for this option

    tok = Tokenizer.from_file(str(path))
    return lambda text: len(tok.encode(text).ids)


def main(argv: list[str] | None = None) -> None:
    """Serve until interrupted (scripted-less: schema-minimal answers, or recordings)."""
    ap = argparse.ArgumentParser(prog="python -m pipeline.testing.openai_server", description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--recordings", type=Path, default=None, help="answer from this lunasol recording directory")
    ap.add_argument("--delay-ms", type=float, default=0.0, help="added latency per reply")
    ap.add_argument("--empty-rate", type=float, default=0.0, help="share of first attempts answered with no choices")
    ap.add_argument("--no-usage", action="store_true", help="answers carry no usage object")
    ap.add_argument("--require-key", default=None, help="401 unless Authorization: Bearer KEY")
    ap.add_argument(
        "--context-tokens", type=int, default=None, help="refuse larger requests with context_length_exceeded"
    )
    ap.add_argument("--chars-per-token", type=float, default=None, help="count the context as text, N chars a token")
    ap.add_argument("--tokenizer", type=Path, default=None, help="count the context with this tokenizer.json")
    args = ap.parse_args(argv)
    handler: Handler = recordings_handler(args.recordings) if args.recordings else auto_answer
    if args.empty_rate:
        handler = flaky_empty(handler, args.empty_rate)
    if args.no_usage:
        handler = without_usage(handler)
    server = FakeOpenAI(
        None,
        port=args.port,
        delay_s=args.delay_ms / 1000,
        context_tokens=args.context_tokens,
        chars_per_token=args.chars_per_token,
        token_counter=_tokenizer_counter(args.tokenizer) if args.tokenizer else None,
    )
    if args.require_key:
        handler = requiring_key(handler, args.require_key, server.last_headers)
    server.handler = handler
    print(f"serving OpenAI chat completions, files and batches on {server.base_url}", flush=True)
    try:
        server.httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()


if __name__ == "__main__":
    main()
