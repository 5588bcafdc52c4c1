"""OpenHands V1 (software-agent-sdk) event streams, read by the ``openhands`` adapter next to V0.

V1 events are typed by ``kind``: ``SystemPromptEvent``, ``MessageEvent`` (``llm_message``),
``ActionEvent`` (``tool_name``, ``tool_call_id``, ``tool_call``, ``action``, ``thought``),
``ObservationEvent`` (``observation`` with ``content`` parts, ``is_error``, ``exit_code``),
``AgentErrorEvent``, ``UserRejectObservation``, ``ConversationStateUpdateEvent`` (``key``,
``value``), ``ConversationErrorEvent``, ``ConversationIterationLimitEvent``, ``Condensation``,
``PauseEvent`` ... Every event has ``id`` (a uuid), ``timestamp`` and ``source``.

Containers: a JSON list of events, ``{"items": [...]}`` (the agent server's search answer), JSON
Lines with one event per line, an evaluation record whose ``history`` holds V1 events, and the
SDK's own persistence: one ``event-<n>-<id>.json`` file per event in a conversation's
``events/`` folder (one cell per folder; each file its own ref, its number the step).

Step index = position in the stream (0-based; V1 ids are uuids).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any

from pipeline.adapters.base import Emitter, args_digest, as_dict, as_text, tool_result_event
from pipeline.adapters.contract import SourceEvent
from pipeline.core.canonical import digest, sha256_text

V1_KINDS = {
    "SystemPromptEvent",
    "MessageEvent",
    "ActionEvent",
    "ObservationEvent",
    "AgentErrorEvent",
    "UserRejectObservation",
    "ConversationStateUpdateEvent",
    "ConversationErrorEvent",
    "ConversationIterationLimitEvent",
    "Condensation",
    "CondensationRequest",
    "CondensationSummaryEvent",
    "PauseEvent",
    "TokenEvent",
}
EVENT_FILE = re.compile(r"(^|/)event-(?P<n>\d+)(?:-[^/]*)?\.json$")
_MESSAGE_TOOLS = {"finish", "think"}


def is_v1_event(e: Any) -> bool:
    """A V1 SDK event: an object whose ``kind`` is one of the SDK's event classes."""
    return isinstance(e, dict) and e.get("kind") in V1_KINDS


def is_v1_stream(items: Any) -> bool:
    """A non-empty list of V1 events."""
    return isinstance(items, list) and bool(items) and all(is_v1_event(e) for e in items)


def event_folders(paths: list[str]) -> dict[str, list[tuple[int, str]]]:
    """Per-event files grouped by folder: folder -> [(event number, path)] in number order."""
    out: dict[str, list[tuple[int, str]]] = {}
    for rel in paths:
        m = EVENT_FILE.search(rel)
        if m:
            out.setdefault(str(PurePosixPath(rel).parent), []).append((int(m.group("n")), rel))
    return {k: sorted(v) for k, v in out.items()}


def _parts_text(content: Any) -> str:
    return as_text(content)


def _action_text(e: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    action = as_dict(e.get("action"))
    args = {k: v for k, v in action.items() if k != "kind"}
    if not args:  # a non-executable call keeps only the LLM's tool call
        raw = as_dict(e.get("tool_call")).get("arguments")
        args = raw if isinstance(raw, dict) else {"arguments": raw} if raw else {}
    shown = as_text(args.get("command") or args.get("code") or args.get("path") or args) if args else ""
    return shown, args


def v1_event(em: Emitter, ptr: str, e: dict[str, Any], step: int, line: int | None) -> SourceEvent:
    """The IR event of one V1 SDK event."""
    kind = str(e.get("kind"))
    source = str(e.get("source") or "")
    common: dict[str, Any] = {"line": line, "ts": e.get("timestamp"), "step_index": step}
    if kind == "SystemPromptEvent":
        text = as_text(as_dict(e.get("system_prompt")).get("text") or e.get("system_prompt"))
        return em.event("message", ptr, actor="system", detail="system_prompt", text=text, **common)
    if kind == "MessageEvent":
        msg = as_dict(e.get("llm_message"))
        role = str(msg.get("role") or source or "user")
        actor = "agent" if role == "assistant" else role
        return em.event("message", ptr, actor=actor, text=_parts_text(msg.get("content")), **common)
    if kind == "ActionEvent":
        tool = str(e.get("tool_name") or as_dict(e.get("tool_call")).get("name") or "")
        thought = _parts_text(e.get("thought"))
        shown, args = _action_text(e)
        if tool in _MESSAGE_TOOLS:  # finish / think carry the agent's words, not a command
            body = as_text(args.get("message") or args.get("thought")) or thought
            return em.event("message", ptr, actor="agent", detail=tool, text=body, **common)
        path = args.get("path")
        return em.event(
            "tool_call",
            ptr,
            actor="agent",
            detail=str(as_dict(e.get("action")).get("kind") or tool),
            tool_name=tool or None,
            call_id=str(e.get("tool_call_id") or e.get("id") or "") or None,
            args_digest=args_digest(args),
            target=path if isinstance(path, str) else None,
            text="\n".join(t for t in (thought, f"{tool} {shown}".strip()) if t),
            **common,
        )
    if kind == "ObservationEvent":
        obs = as_dict(e.get("observation"))
        text = _parts_text(obs.get("content"))
        meta = as_dict(obs.get("metadata"))
        code = obs.get("exit_code", meta.get("exit_code"))
        failed: bool | None = None  # None: the output itself decides (looks_like_error)
        nonzero = isinstance(code, int) and code not in (0, -1)  # -1: still running / no exit code
        if obs.get("is_error") is True or obs.get("timeout") is True or nonzero:
            failed = True
        elif obs.get("is_error") is False:
            failed = False
        return tool_result_event(
            em,
            ptr,
            text,
            is_error=failed,
            line=line,
            ts=e.get("timestamp"),
            step_index=step,
            actor="environment",
            detail=str(obs.get("kind") or "observation"),
            tool_name=e.get("tool_name"),
            call_id=e.get("tool_call_id"),
        )
    if kind in ("AgentErrorEvent", "UserRejectObservation"):
        text = as_text(e.get("error") or e.get("rejection_reason"))
        return em.event(
            "error",
            ptr,
            actor="harness" if kind == "AgentErrorEvent" else "user",
            detail="agent_error" if kind == "AgentErrorEvent" else "user_reject",
            tool_name=e.get("tool_name"),
            call_id=e.get("tool_call_id"),
            result_digest=sha256_text(text),
            text=text,
            **common,
        )
    if kind == "ConversationStateUpdateEvent":
        key = str(e.get("key") or "")
        value = e.get("value")
        if key in ("execution_status", "agent_status", "full_state"):
            status = as_dict(value).get("execution_status") if key == "full_state" else value
            text = as_text(status)
            st = "error" if text in ("error", "stuck") else "state_change"
            return em.event(st, ptr, actor="harness", detail=key, state_digest=digest(status), text=text, **common)
        return em.event("other", ptr, actor="harness", detail=f"state/{key}", text=as_text(value)[:2000], **common)
    if kind in ("ConversationErrorEvent", "ConversationIterationLimitEvent"):
        if kind == "ConversationIterationLimitEvent":
            it, mx = e.get("iteration"), e.get("max_iterations")
            text = f"maximum iterations reached ({it}/{mx}): {as_text(e.get('detail'))}"
            detail = "iteration_limit"
        else:
            text = f"{as_text(e.get('code'))}: {as_text(e.get('detail'))}".strip(": ")
            detail = "conversation_error"
        return em.event(
            "error", ptr, actor="harness", detail=detail, result_digest=sha256_text(text), text=text, **common
        )
    if kind == "CondensationSummaryEvent":
        text = as_text(e.get("summary"))
        return em.event("message", ptr, actor="harness", detail="condensation_summary", text=text, **common)
    return em.event("other", ptr, actor="harness", detail=kind, text=as_text(e.get("summary") or ""), **common)


def read_stream(em: Emitter, stream: list[Any], base: str, line: int | None) -> Iterator[SourceEvent]:
    """Events of one V1 stream (a list inside one document)."""
    for i, e in enumerate(stream):
        if is_v1_event(e):
            yield v1_event(em, f"{base}/{i}", e, i, line)
