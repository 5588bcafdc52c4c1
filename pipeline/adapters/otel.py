"""OpenTelemetry GenAI traces: OTLP/JSON exports and the Python SDK's console span JSON.

Shapes read (one trace = one cell, across every file that holds its spans):

- OTLP/JSON (``resourceSpans → scopeSpans → spans``, attributes as ``[{key, value: {stringValue…}}]``),
  one export request per file or one per line (the collector's file exporter);
- the SDK's ``ReadableSpan.to_json()`` (``context.trace_id``, ``parent_id``, ``attributes`` as an
  object), one span per line, or the console exporter's default concatenated pretty-printed spans
  (lines between spans that are not JSON are reported and skipped; refs are then line ranges).

Attributes understood: the GenAI semantic conventions (``gen_ai.operation.name`` invoke_agent / chat /
execute_tool / agent_handoff, ``gen_ai.input.messages`` / ``gen_ai.output.messages``,
``gen_ai.tool.*``, the older flat ``gen_ai.prompt.N.*`` / ``gen_ai.completion.N.*``), OpenInference
(``openinference.span.kind``, ``llm.input_messages.N.message.*``, ``tool.name``, ``input.value`` /
``output.value``) and OpenLLMetry's ``traceloop.span.kind``. Spans become events in start-time
order; a chat span's input messages already seen earlier in the trace are not repeated; tool calls
come from tool spans (call + result, ``error`` when the span failed), or from the model's output
when the trace has no tool spans. Every span gives at least one event: spans of no known kind are
``other`` events (counted in one warning). The actor is the nearest agent span's name. The span
tree is kept in the cell's source block (``selector.spans``: ``[span_id, parent_id, name]`` in
event order; an event's ``step_index`` is its span's position there). The root span's status goes
to the sidecar.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from pipeline.adapters.base import Adapter, CellSource, Discovery, args_digest, json_text, load_json
from pipeline.adapters.contract import SourceEvent
from pipeline.adapters.spans import JsonFile, LineIndex, escape_token
from pipeline.core.canonical import digest, sha256_text
from pipeline.core.limits import check_size

NAME = "otel-genai"
_SUFFIXES = (".json", ".jsonl", ".ndjson", ".txt", ".log")
_AGENT_OPS = {"invoke_agent", "create_agent", "AGENT", "agent"}
_CHAT_OPS = {"chat", "text_completion", "generate_content", "LLM", "llm", "completion"}
_TOOL_OPS = {"execute_tool", "TOOL", "tool"}
_ARG_KEYS = ("gen_ai.tool.call.arguments", "input.value", "traceloop.entity.input")
_RESULT_KEYS = ("gen_ai.tool.call.result", "output.value", "traceloop.entity.output")
_INDEXED = re.compile(r"^(llm\.input_messages|llm\.output_messages|gen_ai\.prompt|gen_ai\.completion)\.(\d+)\.(.+)$")


def score(rel: str, head: str) -> tuple[float, str]:
    """How sure the head of a file is an OTel trace export (0..1) and why."""
    if not rel.endswith(_SUFFIXES):
        return 0.0, "not a .json/.jsonl/.txt/.log file"
    genai = any(k in head for k in ('"gen_ai.', '"openinference.span.kind"', '"llm.', '"traceloop.'))
    if '"resourceSpans"' in head and '"scopeSpans"' in head:
        return (
            (0.97, "OTLP/JSON resourceSpans → scopeSpans with GenAI attributes")
            if genai
            else (
                0.9,
                "OTLP/JSON resourceSpans → scopeSpans",
            )
        )
    if '"trace_id"' in head and '"span_id"' in head and '"context"' in head and '"parent_id"' in head:
        return (
            (0.95, "SDK span JSON (context.trace_id, parent_id) with GenAI attributes")
            if genai
            else (
                0.85,
                "SDK span JSON (context.trace_id, parent_id)",
            )
        )
    return 0.0, "no resourceSpans and no SDK span context"


def sniff(rel: str, head: str) -> bool:
    """An OTLP/JSON export or SDK span JSON."""
    return score(rel, head)[0] >= 0.5


@dataclass
class _Span:
    """One span, normalised from either shape, with how to point at it and at its attributes."""

    rel: str
    trace: str
    span: str
    parent: str | None
    name: str
    start_ns: int | None
    end_ns: int | None
    attrs: dict[str, Any]
    attr_ptr: dict[str, str]  # attribute key -> JSON pointer of its value ("" for line-range refs)
    error: bool
    status_msg: str
    exceptions: list[str]
    service: str | None
    ptr: str  # the span's own pointer ("" for the whole line)
    line: int | None  # JSON Lines: the line the span's document is on
    lines: tuple[int, int] | None = None  # concatenated pretty-printed spans: the span's line range
    order: int = 0


@dataclass
class _Parsed:
    spans: list[_Span] = field(default_factory=list)
    bad_lines: list[int] = field(default_factory=list)
    jf: JsonFile | None = None


def _any_value(v: Any) -> Any:
    """An OTLP AnyValue as a plain value."""
    if not isinstance(v, dict):
        return v
    for k in ("stringValue", "boolValue", "doubleValue", "bytesValue"):
        if k in v:
            return v[k]
    if "intValue" in v:
        try:
            return int(v["intValue"])
        except (TypeError, ValueError):
            return v["intValue"]
    if "arrayValue" in v:
        return [_any_value(x) for x in (v["arrayValue"] or {}).get("values") or []]
    if "kvlistValue" in v:
        return {str(kv.get("key")): _any_value(kv.get("value")) for kv in (v["kvlistValue"] or {}).get("values") or []}
    return None


def _ns(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _iso_ns(text: Any) -> int | None:
    if not isinstance(text, str):
        return None
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return int(dt.timestamp()) * 1_000_000_000 + dt.microsecond * 1000


def _ts(ns: int | None) -> str | None:
    if ns is None:
        return None
    dt = datetime.fromtimestamp(ns // 1_000_000_000, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + f".{ns % 1_000_000_000:09d}Z"


def _otlp_spans(rel: str, doc: dict[str, Any], line: int | None) -> Iterator[_Span]:
    for i, rs in enumerate(doc.get("resourceSpans") or []):
        if not isinstance(rs, dict):
            continue
        res = {
            str(a.get("key")): _any_value(a.get("value")) for a in (rs.get("resource") or {}).get("attributes") or []
        }
        for j, ss in enumerate(rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or []):
            key = "scopeSpans" if "scopeSpans" in rs else "instrumentationLibrarySpans"
            for k, sp in enumerate((ss or {}).get("spans") or []):
                if not isinstance(sp, dict):
                    continue
                base = f"/resourceSpans/{i}/{key}/{j}/spans/{k}"
                attrs: dict[str, Any] = {}
                ptrs: dict[str, str] = {}
                for n, a in enumerate(sp.get("attributes") or []):
                    if isinstance(a, dict) and "key" in a:
                        attrs[str(a["key"])] = _any_value(a.get("value"))
                        ptrs[str(a["key"])] = f"{base}/attributes/{n}/value"
                status = sp.get("status") or {}
                code = status.get("code")
                exc = [_exception_text(ev.get("attributes") or [], otlp=True) for ev in sp.get("events") or []]
                yield _Span(
                    rel=rel,
                    trace=str(sp.get("traceId") or ""),
                    span=str(sp.get("spanId") or ""),
                    parent=str(sp.get("parentSpanId")) if sp.get("parentSpanId") else None,
                    name=str(sp.get("name") or ""),
                    start_ns=_ns(sp.get("startTimeUnixNano")),
                    end_ns=_ns(sp.get("endTimeUnixNano")),
                    attrs=attrs,
                    attr_ptr=ptrs,
                    error=code in (2, "2", "STATUS_CODE_ERROR", "ERROR"),
                    status_msg=str(status.get("message") or ""),
                    exceptions=[e for e in exc if e],
                    service=res.get("service.name"),
                    ptr=base,
                    line=line,
                )


def _exception_text(attributes: Any, *, otlp: bool) -> str:
    if otlp:
        attrs = {str(a.get("key")): _any_value(a.get("value")) for a in attributes if isinstance(a, dict)}
    else:
        attrs = attributes if isinstance(attributes, dict) else {}
    if "exception.type" not in attrs and "exception.message" not in attrs:
        return ""
    return f"{attrs.get('exception.type') or 'exception'}: {attrs.get('exception.message') or ''}".strip()


def _sdk_span(rel: str, doc: dict[str, Any], line: int | None, lines: tuple[int, int] | None) -> _Span:
    ctx = doc.get("context") or {}
    attrs: dict[str, Any] = doc["attributes"] if isinstance(doc.get("attributes"), dict) else {}
    status = doc.get("status") or {}
    res = (doc.get("resource") or {}).get("attributes") or {}
    exc = [_exception_text(ev.get("attributes"), otlp=False) for ev in doc.get("events") or [] if isinstance(ev, dict)]
    return _Span(
        rel=rel,
        trace=str(ctx.get("trace_id") or ""),
        span=str(ctx.get("span_id") or ""),
        parent=str(doc["parent_id"]) if doc.get("parent_id") else None,
        name=str(doc.get("name") or ""),
        start_ns=_iso_ns(doc.get("start_time")),
        end_ns=_iso_ns(doc.get("end_time")),
        attrs=dict(attrs),
        attr_ptr={k: ("" if lines else f"/attributes/{escape_token(k)}") for k in attrs},
        error=str(status.get("status_code") or "").upper() == "ERROR",
        status_msg=str(status.get("description") or ""),
        exceptions=[e for e in exc if e],
        service=res.get("service.name") if isinstance(res, dict) else None,
        ptr="",
        line=line,
        lines=lines,
    )


def _is_sdk_span(d: Any) -> bool:
    return isinstance(d, dict) and isinstance(d.get("context"), dict) and "span_id" in d["context"]


def _concatenated(rel: str, text: str) -> _Parsed:
    """Spans printed one after another (pretty or not), with whatever else the program printed between them."""
    out = _Parsed()
    index = LineIndex(text)
    dec = json.JSONDecoder()
    pos = 0
    n = len(text)
    while pos < n:
        while pos < n and text[pos].isspace():
            pos += 1
        if pos >= n:
            break
        start_line = index.line_of(pos)
        if text[pos] == "{":
            try:
                doc, end = dec.raw_decode(text, pos)
            except json.JSONDecodeError:
                doc, end = None, -1
            if _is_sdk_span(doc) and end > 0:
                out.spans.append(_sdk_span(rel, doc, None, (start_line, index.line_of(end - 1))))
                pos = end
                continue
        out.bad_lines.append(start_line)
        nl = text.find("\n", pos)
        pos = n if nl < 0 else nl + 1
    return out


def _parse(bundle: Path, rel: str) -> _Parsed | None:
    """The spans of one file (None: it holds none)."""
    path = bundle / rel
    try:
        jf = load_json(path, 8, rel)
    except (ValueError, UnicodeDecodeError):
        try:
            check_size(path.stat().st_size, "LUNASOL_MAX_FILE_BYTES", rel, "the file")
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None
        parsed = _concatenated(rel, text)
        return parsed if parsed.spans else None
    out = _Parsed(bad_lines=list(jf.bad_lines), jf=jf)
    for line, doc in jf.docs:
        if isinstance(doc, dict) and "resourceSpans" in doc:
            out.spans.extend(_otlp_spans(rel, doc, line))
        elif _is_sdk_span(doc):
            out.spans.append(_sdk_span(rel, doc, line, None))
        elif isinstance(doc, list) and doc and all(_is_sdk_span(d) for d in doc):
            # A JSON array of SDK spans (a list dumped at once): pointers index into it.
            for i, d in enumerate(doc):
                sp = _sdk_span(rel, d, line, None)
                sp.ptr = f"/{i}"
                sp.attr_ptr = {k: f"/{i}{v}" for k, v in sp.attr_ptr.items()}
                out.spans.append(sp)
        elif line is not None:
            out.bad_lines.append(line)
    return out if out.spans else None


def _op(sp: _Span) -> str:
    """The span's operation: GenAI name, else OpenInference / OpenLLMetry kind, else from the span name."""
    a = sp.attrs
    for key in ("gen_ai.operation.name", "openinference.span.kind", "traceloop.span.kind"):
        v = a.get(key)
        if isinstance(v, str) and v and v != "unknown":
            return v
    first = sp.name.split(" ", 1)[0]
    if first in ("invoke_agent", "execute_tool", "chat", "create_agent", "agent_handoff"):
        return first
    return str(a.get("gen_ai.operation.name") or "")


def _kind(op: str) -> str:
    if op in _AGENT_OPS:
        return "agent"
    if op in _CHAT_OPS:
        return "chat"
    if op in _TOOL_OPS:
        return "tool"
    if op in ("agent_handoff", "handoff"):
        return "handoff"
    return "other"


def _agent_name(sp: _Span) -> str | None:
    a = sp.attrs
    name = a.get("gen_ai.agent.name") or a.get("agent.name") or a.get("traceloop.entity.name")
    if isinstance(name, str) and name:
        return name
    return sp.name.removeprefix("invoke_agent ").strip() or None


def _parse_json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


@dataclass
class _Msg:
    role: str
    text: str
    calls: list[tuple[str | None, str, Any]]  # (id, name, arguments)
    responses: list[tuple[str | None, str]]  # (tool call id, response text)
    ptr: str  # pointer of the message ("" when the ref is the span's line range)


def _semconv_messages(sp: _Span, key: str) -> list[_Msg]:
    raw = _parse_json(sp.attrs.get(key))
    if not isinstance(raw, list):
        return []
    base = sp.attr_ptr.get(key, "")
    # The attribute holds JSON text: "#/<i>" points into it (OTLP values sit under /stringValue).
    inner = (f"{base}/stringValue" if base.endswith("/value") else base) if base else ""
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            continue
        texts: list[str] = []
        calls: list[tuple[str | None, str, Any]] = []
        resps: list[tuple[str | None, str]] = []
        for part in m.get("parts") or []:
            if not isinstance(part, dict):
                continue
            ptype = part.get("type")
            if ptype == "text":
                texts.append(str(part.get("content") or ""))
            elif ptype == "tool_call":
                calls.append((part.get("id"), str(part.get("name") or ""), part.get("arguments")))
            elif ptype == "tool_call_response":
                resp = part.get("response", part.get("result"))
                resps.append((part.get("id"), resp if isinstance(resp, str) else json_text(resp)))
            elif ptype in ("reasoning", "thinking"):
                continue
            else:
                texts.append(json_text(part))
        if "content" in m and not m.get("parts"):
            texts.append(m["content"] if isinstance(m["content"], str) else json_text(m["content"]))
        out.append(_Msg(str(m.get("role") or ""), "\n".join(texts), calls, resps, f"{inner}#/{i}" if inner else ""))
    return out


def _indexed_messages(sp: _Span, prefix: str) -> list[_Msg]:
    """Messages spelled as flat attributes: ``llm.input_messages.0.message.role`` and the like."""
    groups: dict[int, dict[str, Any]] = {}
    first_key: dict[int, str] = {}
    for key, value in sp.attrs.items():
        m = _INDEXED.match(key)
        if m is None or m.group(1) != prefix:
            continue
        i = int(m.group(2))
        groups.setdefault(i, {})[m.group(3).removeprefix("message.")] = value
        first_key.setdefault(i, key)
    out = []
    for i in sorted(groups):
        g = groups[i]
        calls: dict[str, dict[str, Any]] = {}
        for k, v in g.items():
            cm = re.match(r"^tool_calls\.(\d+)\.(?:tool_call\.)?(.+)$", k)
            if cm:
                calls.setdefault(cm.group(1), {})[cm.group(2)] = v
        call_list = [
            (
                c.get("id"),
                str(c.get("function.name") or c.get("name") or ""),
                c.get("function.arguments", c.get("arguments")),
            )
            for _, c in sorted(calls.items(), key=lambda kv: int(kv[0]))
        ]
        role = str(g.get("role") or "")
        text = g.get("content")
        text = text if isinstance(text, str) else ("" if text is None else json_text(text))
        resps: list[tuple[str | None, str]] = []
        if role == "tool":
            resps = [(g.get("tool_call_id"), text)]
        out.append(_Msg(role, text, call_list, resps, sp.attr_ptr.get(first_key[i], "")))
    return out


def _messages(sp: _Span, side: str) -> list[_Msg]:
    if side == "input":
        return (
            _semconv_messages(sp, "gen_ai.input.messages")
            or _indexed_messages(sp, "llm.input_messages")
            or _indexed_messages(sp, "gen_ai.prompt")
        )
    return (
        _semconv_messages(sp, "gen_ai.output.messages")
        or _indexed_messages(sp, "llm.output_messages")
        or _indexed_messages(sp, "gen_ai.completion")
    )


def _load(bundle: Path, files: list[str]) -> dict[str, _Parsed]:
    out = {}
    for rel in files:
        p = _parse(bundle, rel)
        if p is not None:
            out[rel] = p
    return out


def discover(bundle: Path, paths: list[str]) -> Discovery:
    """One cell per trace id, over every file holding spans of it."""
    skipped: list[tuple[str, str]] = []
    warnings: list[tuple[str, str]] = []
    traces: dict[str, list[_Span]] = {}
    for rel in paths:
        if not rel.endswith(_SUFFIXES):
            skipped.append((rel, "not an OTel trace export (.json/.jsonl/.txt/.log)"))
            continue
        parsed = _parse(bundle, rel)
        if parsed is None:
            skipped.append((rel, "holds no OpenTelemetry spans"))
            continue
        if parsed.bad_lines:
            lines = parsed.bad_lines
            shown = ", ".join(str(n) for n in lines[:5]) + (f" and {len(lines) - 5} more" if len(lines) > 5 else "")
            warnings.append((rel, f"{len(lines)} line(s) are not spans and were skipped (line {shown})"))
        for sp in parsed.spans:
            traces.setdefault(sp.trace, []).append(sp)
    cells = []
    for trace, spans in traces.items():
        files = sorted({sp.rel for sp in spans})
        ordered = _ordered(spans)
        ids = {sp.span for sp in spans}
        root = next((sp for sp in ordered if not sp.parent or sp.parent not in ids), ordered[0])
        unknown = sum(1 for sp in ordered if _kind(_op(sp)) == "other")
        if unknown:
            kinds = sorted({_op(sp) or sp.name for sp in ordered if _kind(_op(sp)) == "other"})
            shown = ", ".join(kinds[:5]) + (" …" if len(kinds) > 5 else "")
            warnings.append(
                (files[0], f"trace {trace}: {unknown} span(s) of no GenAI kind read as other events ({shown})")
            )
        usage = [sp.attrs.get(k) for sp in ordered for k in ("gen_ai.usage.input_tokens", "llm.token_count.prompt")]
        cells.append(
            CellSource(
                run_id=trace,
                task_id=_agent_name(root) or root.name or PurePosixPath(files[0]).stem,
                path=files[0],
                selector={
                    "trace": trace,
                    "spans": [[sp.span, sp.parent, sp.name] for sp in ordered],
                },
                files=files,
                harness=_harness(ordered),
                step_index_base=0,
                source_steps=len(ordered),
                outcome={
                    "label": None,
                    "root_status": "ERROR" if root.error else "OK",
                    "root_status_message": root.status_msg or None,
                    "spans": len(ordered),
                    "error_spans": sum(1 for sp in ordered if sp.error),
                    "input_tokens": sum(int(u) for u in usage if isinstance(u, int)) or None,
                },
            )
        )
    return Discovery(
        cells=cells, skipped=skipped, harness=_harness([s for v in traces.values() for s in v]), warnings=warnings
    )


def _harness(spans: list[_Span]) -> str:
    for sp in spans:
        if "openinference.span.kind" in sp.attrs:
            return "OpenTelemetry trace (OpenInference)"
    for sp in spans:
        if "traceloop.span.kind" in sp.attrs:
            return "OpenTelemetry trace (OpenLLMetry)"
    return "OpenTelemetry trace (GenAI semconv)"


def _ordered(spans: list[_Span]) -> list[_Span]:
    for n, sp in enumerate(spans):
        sp.order = n
    return sorted(spans, key=lambda s: (s.start_ns is None, s.start_ns or 0, s.order))


class _Builder:
    """Events of one trace: the refs, the actor of each span, what was said already."""

    def __init__(self, bundle: Path, parsed: dict[str, _Parsed], spans: list[_Span]) -> None:
        self.parsed = parsed
        self.by_id = {sp.span: sp for sp in spans}
        self.step = {sp.span: n for n, sp in enumerate(spans)}
        self.seen: set[str] = set()
        self.tool_spans = any(_kind(_op(sp)) == "tool" for sp in spans)
        self.out: list[tuple[int, int, SourceEvent]] = []  # (time, tie-break, event)
        self.deferred: list[tuple[_Span, str]] = []

    def agent_of(self, sp: _Span) -> str:
        """The span's own agent name when it is an agent span, else the nearest agent ancestor's."""
        cur: _Span | None = sp
        while cur is not None:
            if _kind(_op(cur)) == "agent" and _agent_name(cur):
                return str(_agent_name(cur))
            cur = self.by_id.get(cur.parent) if cur.parent else None
        own = sp.attrs.get("gen_ai.agent.name")
        if own:
            return str(own)
        return sp.service if sp.service and not sp.service.startswith("unknown_service") else "assistant"

    def parent_agent(self, sp: _Span) -> str | None:
        cur = self.by_id.get(sp.parent) if sp.parent else None
        while cur is not None:
            if _kind(_op(cur)) == "agent":
                return _agent_name(cur)
            cur = self.by_id.get(cur.parent) if cur.parent else None
        return None

    def emit(self, sp: _Span, kind: str, ptr: str, at: int | None, **fields: Any) -> None:
        parsed = self.parsed[sp.rel]
        if sp.lines is not None or parsed.jf is None:
            ls, le = sp.lines or (1, 1)
            pointer = None
        else:
            loc = parsed.jf.locate((ptr or sp.ptr).split("#", 1)[0], sp.line)
            ls, le = loc.line_start, loc.line_end
            pointer = ptr or sp.ptr or None
        ev = SourceEvent(
            kind=kind,
            source_path=sp.rel,
            line_start=ls,
            line_end=le,
            json_pointer=pointer,
            ts=_ts(at),
            session_id=sp.trace,
            step_index=self.step[sp.span],
            **fields,
        )
        self.out.append((at if at is not None else -1, len(self.out), ev))

    def message_events(self, sp: _Span, msgs: list[_Msg], at: int | None, actor: str, *, output: bool) -> int:
        n = 0
        for m in msgs:
            key = digest([m.role, m.text, [(c[1], json_text(c[2])) for c in m.calls]])
            if not output and key in self.seen:
                continue
            self.seen.add(key)
            who = actor if m.role == "assistant" else ("environment" if m.role == "tool" else m.role or "user")
            ptr = m.ptr
            if m.text and m.role != "tool":
                self.emit(sp, "message", ptr, at, actor=who, detail=m.role or None, text=m.text)
                n += 1
            for cid, name, args in m.calls:
                if self.tool_spans or (cid and f"call:{cid}" in self.seen):
                    continue  # the tool span says it (with its result)
                self.seen.add(f"call:{cid}")
                text = args if isinstance(args, str) else json_text(args)
                self.emit(sp, "tool_call", ptr, at, actor=actor, tool_name=name, call_id=cid,
                          args_digest=args_digest(args), text=f"{name} {text}")  # fmt: skip
                n += 1
            for cid, resp in m.responses:
                if self.tool_spans or f"result:{cid}" in self.seen:
                    continue
                self.seen.add(f"result:{cid}")
                self.emit(sp, "tool_result", ptr, at, actor="environment", call_id=cid, text=resp,
                          result_digest=sha256_text(resp))  # fmt: skip
                n += 1
        return n

    def span_events(self, sp: _Span) -> None:
        op = _op(sp)
        kind = _kind(op)
        actor = self.agent_of(sp)
        a = sp.attrs
        before = len(self.out)
        if kind == "agent":
            parent = self.parent_agent(sp)
            if parent and parent != actor:
                self.emit(
                    sp, "handoff", "", sp.start_ns, actor=parent, target=actor, detail=op, text=f"{parent} -> {actor}"
                )
            else:
                self.emit(sp, "other", "", sp.start_ns, actor=actor, detail=op, text=f"agent {actor} started")
            self.message_events(sp, _messages(sp, "input"), sp.start_ns, actor, output=False)
        elif kind == "handoff":
            src = str(a.get("gen_ai.handoff.from_agent") or actor)
            dst = str(a.get("gen_ai.handoff.to_agent") or sp.name.removeprefix("handoff to ").strip())
            self.emit(sp, "handoff", "", sp.start_ns, actor=src, target=dst, detail=op, text=f"{src} -> {dst}")
        elif kind == "chat":
            self.message_events(sp, _messages(sp, "input"), sp.start_ns, actor, output=False)
            self.message_events(sp, _messages(sp, "output"), sp.end_ns, actor, output=True)
        elif kind == "tool":
            self.tool_events(sp, actor, op)
        if kind == "agent":  # said at the agent's end: after its chat spans have said theirs
            self.deferred.append((sp, actor))
        if sp.error and kind != "tool":
            text = "; ".join([sp.status_msg, *sp.exceptions]).strip("; ") or "span status ERROR"
            self.emit(sp, "error", "", sp.end_ns, actor=actor, detail=f"span_error:{op or sp.name}", text=text)
        if len(self.out) == before:  # every span is at least one event
            model = a.get("gen_ai.request.model") or a.get("llm.model_name")
            text = f"{op or 'span'} {sp.name}" + (f" (model {model})" if model else "")
            self.emit(sp, "other", "", sp.start_ns, actor=actor, detail=op or sp.name, text=text)

    def tool_events(self, sp: _Span, actor: str, op: str) -> None:
        a = sp.attrs
        name = str(a.get("gen_ai.tool.name") or a.get("tool.name") or a.get("traceloop.entity.name") or "")
        if not name:
            name = sp.name.removeprefix("execute_tool ").strip()
        if name.startswith("handoff to ") or (op == "TOOL" and sp.name.startswith("handoff to ")):
            dst = str(a.get("output.value") or name.removeprefix("handoff to "))
            self.emit(
                sp, "handoff", "", sp.start_ns, actor=actor, target=dst, detail="handoff", text=f"{actor} -> {dst}"
            )
            return
        args_key = next(
            (k for k in ("gen_ai.tool.call.arguments", "input.value", "traceloop.entity.input") if k in a), None
        )
        res_key = next(
            (k for k in ("gen_ai.tool.call.result", "output.value", "traceloop.entity.output") if k in a), None
        )
        args = a.get(args_key) if args_key else None
        cid = a.get("gen_ai.tool.call.id") or a.get("tool_call.id") or sp.span
        text = args if isinstance(args, str) else json_text(args)
        self.emit(sp, "tool_call", sp.attr_ptr.get(args_key, "") if args_key else "", sp.start_ns, actor=actor,
                  tool_name=name, call_id=str(cid), args_digest=args_digest(args), text=f"{name} {text}",
                  detail=op)  # fmt: skip
        result = a.get(res_key) if res_key else None
        out = result if isinstance(result, str) else ("" if result is None else json_text(result))
        if sp.error:
            out = "\n".join(x for x in (sp.status_msg, *sp.exceptions, out) if x)
        if res_key is None and not sp.error:
            return  # no output was recorded for this call
        self.emit(sp, "error" if sp.error else "tool_result", sp.attr_ptr.get(res_key, "") if res_key else "",
                  sp.end_ns, actor="environment", call_id=str(cid), text=out, result_digest=sha256_text(out),
                  detail="tool_error" if sp.error else None, tool_name=name)  # fmt: skip


def read(bundle: Path, cell: dict[str, Any]) -> Iterator[SourceEvent]:
    """Events of one trace, in time order (ties keep span order)."""
    sel = cell.get("selector") or {}
    trace = sel.get("trace")
    parsed = _load(bundle, list(cell.get("files") or [cell["path"]]))
    spans = _ordered([sp for p in parsed.values() for sp in p.spans if sp.trace == trace])
    b = _Builder(bundle, parsed, spans)
    for sp in spans:
        b.span_events(sp)
    for sp, actor in b.deferred:
        b.message_events(sp, _messages(sp, "output"), sp.end_ns, actor, output=False)
    timed = all(t >= 0 for t, _, _ in b.out)
    events = [e for _, _, e in (sorted(b.out, key=lambda x: (x[0], x[1])) if timed else b.out)]
    yield from events


ADAPTER = Adapter(
    name=NAME,
    description="OpenTelemetry GenAI traces: OTLP/JSON and SDK span JSON (GenAI semconv, OpenInference, OpenLLMetry)",
    sniff=sniff,
    discover=discover,
    read=read,
    score=score,
    detects="OTLP/JSON resourceSpans exports and SDK span JSON (to_json lines or console dumps)",
)
