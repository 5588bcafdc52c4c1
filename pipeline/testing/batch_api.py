"""The OpenAI files and batches endpoints of the local test server (stdlib only, in memory).

``BatchAPI`` serves ``POST /v1/files`` (multipart upload), ``GET /v1/files/{id}`` and
``GET /v1/files/{id}/content``, ``POST /v1/batches``, ``GET /v1/batches`` (newest first, with
``limit`` and ``after``), ``GET /v1/batches/{id}`` and ``POST /v1/batches/{id}/cancel``. Each
batch item is answered by the server's own per-request function (the scripted replies, then the
handler), so a batch answer equals the synchronous one.

A batch walks ``validating`` -> ``in_progress`` -> a terminal state, one step per retrieve as
its :class:`BatchPlan` says (queue plans with :meth:`BatchAPI.plan`): ``completed`` (every item
answered; non-200 answers go to the error file), ``failed`` (validation failed: no item runs) or
``expired`` (the first ``answered`` items answered, the rest in the error file as
``batch_expired``), the states a provider batch can end in.

``queue_tokens`` declares OpenAI's per-model enqueued-token limit: a batch whose requests would
take the tokens of the batches in progress past it fails validation with OpenAI's
``token_limit_exceeded`` error, worded as OpenAI words it (the limit in the message). With
``refuse_at_create`` the limit is a LiteLLM proxy's ``batch_enqueued_token_limit`` instead:
the create itself is refused with a 429, counting every batch not yet ended.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any
from urllib.parse import parse_qs

Answer = Callable[[dict[str, Any]], tuple[int, dict[str, Any]]]  # request body -> (status, response body)
Count = Callable[[dict[str, Any]], int]  # request body -> its tokens, as the server counts them

_CREATED = 1_700_000_000  # fixed clock: the server's answers are deterministic


@dataclass
class BatchPlan:
    """How one batch behaves: retrieves spent in each state, then how it ends."""

    validating_polls: int = 1
    in_progress_polls: int = 1
    outcome: str = "completed"  # completed | failed | expired
    answered: int | None = None  # expired: how many items were answered before the window closed


@dataclass
class _File:
    id: str
    filename: str
    purpose: str
    data: bytes

    def obj(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.data),
            "created_at": _CREATED,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
        }


@dataclass
class _Batch:
    obj: dict[str, Any]
    plan: BatchPlan
    items: list[dict[str, Any]]
    tokens: int = 0  # what the batch's requests weigh in the queue (the server's count)
    polls: int = 0
    ran: bool = False


class BatchAPI:
    """In-memory files and batches; :meth:`route` answers one HTTP request or returns None (not ours)."""

    def __init__(self, answer: Answer, count: Count | None = None) -> None:
        self.answer = answer
        self.count: Count = count or (lambda body: max(1, len(json.dumps(body.get("messages", []))) // 4))
        self.queue_tokens: int | None = None  # OpenAI's enqueued-token limit per model (None: no limit)
        self.refuse_at_create = False  # a proxy's limit: 429 at create instead of a failed batch
        self.peak_enqueued = 0  # the most tokens in progress at once, so tests can check a limit was kept
        self.lock = threading.RLock()
        self.files: dict[str, _File] = {}
        self.batches: dict[str, _Batch] = {}
        self.plans: list[BatchPlan] = []
        self.default_plan = BatchPlan()
        self.uploads = 0  # counted so tests can prove a resume submitted nothing twice
        self.created = 0
        self.retrieves = 0
        self.downloads: dict[str, int] = {}  # file id -> content reads (a provider's output file is large)

    def plan(self, *plans: BatchPlan) -> BatchAPI:
        """Queue plans, used by the next created batches in order (then ``default_plan``)."""
        with self.lock:
            self.plans.extend(plans)
        return self

    def reset(self) -> None:
        """Forget every file, batch, plan and counter."""
        with self.lock:
            self.files.clear()
            self.batches.clear()
            self.plans.clear()
            self.default_plan = BatchPlan()
            self.uploads = self.created = self.retrieves = 0
            self.downloads.clear()
            self.queue_tokens = None
            self.refuse_at_create = False
            self.peak_enqueued = 0

    # routing ---------------------------------------------------------------
    def route(self, method: str, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, bytes, str] | None:
        """(status, body, content type) for a files/batches request, else None."""
        path, _, qs = path.partition("?")
        path = path.rstrip("/")
        query = {k: v[-1] for k, v in parse_qs(qs).items()}
        if not re.match(r"^(/v1)?/(files|batches)(/|$)", path):
            return None
        parts = path.split("/")[2:] if path.startswith("/v1/") else path.split("/")[1:]
        with self.lock:
            try:
                return self._route(method, parts, headers, raw, query)
            except _HTTPError as exc:
                return (
                    exc.status,
                    json.dumps({"error": {"message": exc.message, "type": "invalid_request_error"}}).encode(),
                    "application/json",
                )

    def _route(
        self, method: str, parts: list[str], headers: dict[str, str], raw: bytes, query: dict[str, str]
    ) -> tuple[int, bytes, str]:
        kind, rest = parts[0], parts[1:]
        if kind == "files":
            if method == "POST" and not rest:
                return _json(self._upload(headers, raw).obj())
            f = self.files.get(rest[0]) if rest else None
            if f is None:
                raise _HTTPError(404, "no such file")
            if method == "GET" and len(rest) == 1:
                return _json(f.obj())
            if method == "GET" and rest[1:] == ["content"]:
                self.downloads[f.id] = self.downloads.get(f.id, 0) + 1
                return 200, f.data, "application/octet-stream"
        if kind == "batches":
            if method == "POST" and not rest:
                return _json(self._create(json.loads(raw or b"{}")))
            if method == "GET" and not rest:
                return _json(self._list(query))
            b = self.batches.get(rest[0]) if rest else None
            if b is None:
                raise _HTTPError(404, "no such batch")
            if method == "GET" and len(rest) == 1:
                self.retrieves += 1
                return _json(self._advance(b))
            if method == "POST" and rest[1:] == ["cancel"]:
                b.obj.update(status="cancelled", cancelled_at=_CREATED)
                return _json(b.obj)
        raise _HTTPError(404, f"fake server: no route {method} /{'/'.join(parts)}")

    # files -----------------------------------------------------------------
    def _upload(self, headers: dict[str, str], raw: bytes) -> _File:
        ctype = headers.get("content-type", "")
        msg = BytesParser(policy=HTTP).parsebytes(b"Content-Type: " + ctype.encode() + b"\r\n\r\n" + raw)
        fields: dict[str, tuple[str | None, bytes]] = {}
        for part in msg.iter_parts():
            name = part.get_param("name", header="content-disposition")
            payload = part.get_payload(decode=True)
            if isinstance(name, str) and isinstance(payload, bytes):
                fields[name] = (part.get_filename(), payload)
        if "file" not in fields:
            raise _HTTPError(400, "multipart upload without a 'file' field")
        self.uploads += 1
        purpose = fields.get("purpose", (None, b"batch"))[1].decode()
        return self._add_file(fields["file"][0] or "upload.jsonl", purpose, fields["file"][1])

    def _add_file(self, filename: str, purpose: str, data: bytes) -> _File:
        f = _File(id=f"file-{len(self.files) + 1:06d}", filename=filename, purpose=purpose, data=data)
        self.files[f.id] = f
        return f

    # batches ---------------------------------------------------------------
    def _list(self, query: dict[str, str]) -> dict[str, Any]:
        # OpenAI lists batches newest first; ``after`` is the last id of the previous page.
        newest = [b.obj for b in reversed(self.batches.values())]
        if query.get("after"):
            ids = [o["id"] for o in newest]
            newest = newest[ids.index(query["after"]) + 1 :] if query["after"] in ids else []
        limit = int(query.get("limit") or 20)
        page = [_public(o) for o in newest[:limit]]
        return {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(newest) > limit,
        }

    def _create(self, body: dict[str, Any]) -> dict[str, Any]:
        f = self.files.get(str(body.get("input_file_id")))
        if f is None:
            raise _HTTPError(400, "input_file_id names no uploaded file")
        endpoint = str(body.get("endpoint", "/v1/chat/completions"))
        items, problem = _parse_items(f.data, endpoint)
        tokens = sum(self.count(i["body"]) for i in items)
        if self.refuse_at_create and self.queue_tokens is not None:
            open_ = sum(o.tokens for o in self.batches.values() if o.obj["status"] in ("validating", "in_progress"))
            if open_ + tokens > self.queue_tokens:
                raise _HTTPError(
                    429,
                    f"Batch rate limit exceeded: this batch needs {tokens} enqueued tokens but only "
                    f"{max(0, self.queue_tokens - open_)} of {self.queue_tokens} remain",
                )
        self.created += 1
        plan = self.plans.pop(0) if self.plans else self.default_plan
        if problem:
            plan = BatchPlan(validating_polls=plan.validating_polls, in_progress_polls=0, outcome="failed")
        obj: dict[str, Any] = {
            "id": f"batch_{self.created:06d}",
            "object": "batch",
            "endpoint": endpoint,
            "errors": None,
            "input_file_id": f.id,
            "completion_window": body.get("completion_window", "24h"),
            "status": "validating",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": _CREATED,
            "expires_at": _CREATED + 86_400,
            "request_counts": {"total": len(items), "completed": 0, "failed": 0},
            "metadata": body.get("metadata"),
        }
        if problem:
            obj["_problem"] = problem
        b = _Batch(obj=obj, plan=plan, items=items, tokens=tokens)
        self.batches[obj["id"]] = b
        return _public(obj)

    def _advance(self, b: _Batch) -> dict[str, Any]:
        if b.obj["status"] in ("completed", "failed", "expired", "cancelled"):
            return _public(b.obj)
        b.polls += 1
        plan = b.plan
        if b.polls <= plan.validating_polls:
            return _public(b.obj)
        if b.obj["status"] == "validating" and self._queue_full(b):
            return _public(b.obj)
        if b.polls <= plan.validating_polls + plan.in_progress_polls:
            b.obj.update(status="in_progress", in_progress_at=_CREATED + 1)
            return _public(b.obj)
        self._finish(b)
        return _public(b.obj)

    def _queue_full(self, b: _Batch) -> bool:
        """Fail ``b`` at the end of validation when the batches in progress and it exceed ``queue_tokens``."""
        enqueued = sum(o.tokens for o in self.batches.values() if o.obj["status"] == "in_progress" and o is not b)
        if self.queue_tokens is None or enqueued + b.tokens <= self.queue_tokens:
            self.peak_enqueued = max(self.peak_enqueued, enqueued + b.tokens)
            return False
        model = str((b.items[0]["body"] if b.items else {}).get("model", "the model"))
        message = (
            f"Enqueued token limit reached for {model} in organization org-lunasol-fake. "
            f"Limit: {self.queue_tokens:,} enqueued tokens. Please try again once some in_progress batches "
            "have been completed."
        )
        b.obj.update(
            status="failed",
            failed_at=_CREATED + 2,
            errors={"object": "list", "data": [{"code": "token_limit_exceeded", "message": message, "line": None}]},
        )
        return True

    def _finish(self, b: _Batch) -> None:
        plan, obj = b.plan, b.obj
        if plan.outcome == "failed":
            message = obj.get("_problem") or "batch failed validation (scripted)"
            obj.update(
                status="failed",
                failed_at=_CREATED + 2,
                errors={"object": "list", "data": [{"code": "invalid_request", "message": message, "line": None}]},
            )
            return
        answered = len(b.items) if plan.outcome != "expired" or plan.answered is None else plan.answered
        out: list[str] = []
        err: list[str] = []
        for n, item in enumerate(b.items):
            rid = f"batch_req_{obj['id']}_{n:06d}"
            if n >= answered:
                err.append(
                    json.dumps(
                        {
                            "id": rid,
                            "custom_id": item["custom_id"],
                            "response": None,
                            "error": {
                                "code": "batch_expired",
                                "message": "This request could not be executed before the completion window expired.",
                            },
                        }
                    )
                )
                continue
            status, body = self.answer(item["body"])
            line = {
                "id": rid,
                "custom_id": item["custom_id"],
                "response": {"status_code": status, "request_id": rid, "body": body},
            }
            if status == 200:
                out.append(json.dumps({**line, "error": None}))
            else:
                message = str((body.get("error") or {}).get("message", "error")) if isinstance(body, dict) else "error"
                err.append(json.dumps({**line, "error": {"code": str(status), "message": message}}))
        ok = len(out)
        obj["request_counts"] = {"total": len(b.items), "completed": ok, "failed": len(b.items) - ok}
        if out:
            obj["output_file_id"] = self._add_file(f"{obj['id']}_output.jsonl", "batch_output", _lines(out)).id
        if err:
            obj["error_file_id"] = self._add_file(f"{obj['id']}_error.jsonl", "batch_output", _lines(err)).id
        if plan.outcome == "expired":
            obj.update(status="expired", expired_at=_CREATED + 86_400)
        else:
            obj.update(status="completed", finalizing_at=_CREATED + 2, completed_at=_CREATED + 3)


class _HTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _parse_items(data: bytes, endpoint: str) -> tuple[list[dict[str, Any]], str | None]:
    # Validation as a provider does it: every line a JSON request for this endpoint, custom ids unique.
    items: list[dict[str, Any]] = []
    seen: set[str] = set()
    for n, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError:
            return [], f"line {n} is not JSON"
        if not isinstance(item, dict) or not isinstance(item.get("body"), dict) or "custom_id" not in item:
            return [], f"line {n} needs custom_id and body"
        if item.get("url") != endpoint or item.get("method", "POST") != "POST":
            return [], f"line {n}: url {item.get('url')!r} is not the batch endpoint {endpoint}"
        if item["custom_id"] in seen:
            return [], f"line {n}: duplicate custom_id {item['custom_id']!r}"
        seen.add(item["custom_id"])
        items.append(item)
    if not items:
        return [], "the input file holds no request"
    return items, None


def _public(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if not k.startswith("_")}


def _json(obj: dict[str, Any]) -> tuple[int, bytes, str]:
    return 200, json.dumps(obj).encode("utf-8"), "application/json"


def _lines(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode("utf-8")
