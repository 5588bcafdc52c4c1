"""OpenAI Codex CLI rollouts: ``~/.codex/sessions/YYYY/MM/DD/rollout-<time>-<uuid>.jsonl``, one cell per file.

Two line shapes, both read:

- **current** (Codex CLI 0.4x and later): every line is ``{timestamp, type, payload}`` with ``type``
  one of ``session_meta`` (id, cwd, cli_version, originator, git), ``turn_context`` (cwd, model,
  approval and sandbox policy), ``response_item`` (``payload.type``: ``message``, ``reasoning``,
  ``function_call`` / ``custom_tool_call`` / ``local_shell_call`` and their ``*_output``),
  ``event_msg`` (``user_message``, ``agent_message``, ``exec_command_end`` with ``exit_code``,
  ``token_count``, ``task_complete``, ``turn_aborted``, ``error``, ...) and ``compacted``.
- **legacy** (mid 2025): a bare header ``{id, timestamp, instructions, git}``, ``{"record_type":
  "state"}`` markers, and bare response items with no ``payload`` wrapper and no timestamps.
- **``codex exec --json`` output** (what CI jobs capture): ``thread.started``, ``turn.started``,
  ``item.started`` / ``item.updated`` / ``item.completed`` (``item.type``: ``agent_message``,
  ``reasoning``, ``command_execution`` with ``command``, ``aggregated_output`` and ``exit_code``,
  ``file_change``, ``mcp_tool_call``, ``web_search``, ``todo_list``, ``error``),
  ``turn.completed`` (usage, to the sidecar), ``turn.failed`` and ``error``. A completed item is
  read (a command: its call and its result); started / updated items are ``other`` events.

Events: messages by role (``developer`` is ``system``; the injected ``<environment_context>`` /
``<user_instructions>`` turns are messages with ``detail = context``), reasoning summaries as
``message``/``thinking``, tool calls with their shell command unwrapped (``bash -lc "X"`` is
``X``), outputs as ``tool_result`` or ``error`` — the exit code decides (the output's own
``metadata.exit_code`` or ``Exit code: N`` line, else the matching ``exec_command_end``).
``event_msg`` lines that repeat a response item (``user_message``, ``agent_message``,
``agent_reasoning``) and bookkeeping (``token_count``, ``task_started``) are ``other`` events;
``turn_aborted``, ``error`` and ``stream_error`` are ``error`` events; ``compacted`` is a
``state_change``. A line of a type this adapter does not know is an ``other`` event too, counted
in one warning per file. Token totals, aborted turns and the final ``task_complete`` go to the
sidecar (Codex records no task success flag: the label stays null).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from pipeline.adapters.base import (
    Adapter,
    CellSource,
    Discovery,
    Emitter,
    Score,
    args_digest,
    as_dict,
    as_text,
    json_text,
    load_json,
    skipped_lines_warning,
    tool_result_event,
)
from pipeline.adapters.contract import SourceEvent
from pipeline.adapters.embedded import command_digest, command_tool, shell_command
from pipeline.core.canonical import digest

NAME = "codex"
_TOP = {"session_meta", "turn_context", "response_item", "event_msg", "compacted"}
_ITEMS = {
    "message",
    "reasoning",
    "function_call",
    "function_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
    "local_shell_call",
    "local_shell_call_output",
    "web_search_call",
}
_ECHO_EVENTS = {"user_message", "agent_message", "agent_reasoning", "agent_reasoning_raw_content"}
_BOOK_EVENTS = {
    "token_count",
    "task_started",
    "task_complete",
    "exec_command_begin",
    "exec_command_end",
    "patch_apply_begin",
    "patch_apply_end",
    "mcp_tool_call_begin",
    "mcp_tool_call_end",
    "turn_diff",
    "entered_review_mode",
    "exited_review_mode",
    "web_search_end",
    "view_image_tool_call",
    "item_completed",
}
_ERROR_EVENTS = {"turn_aborted", "error", "stream_error"}
_EXEC_TOP = {"thread.started", "turn.started", "turn.completed", "turn.failed", "item.started", "item.updated",
             "item.completed", "error"}  # fmt: skip
_EXEC_ITEMS = {"agent_message", "reasoning", "command_execution", "file_change", "mcp_tool_call", "web_search",
               "todo_list", "error"}  # fmt: skip
_OPENING = re.compile(
    r'\{\s*"timestamp"\s*:\s*"[^"]*"\s*,\s*"type"\s*:\s*"(session_meta|response_item|turn_context|event_msg)"\s*,'
    r'\s*"payload"\s*:\s*\{'
)
_EXIT_LINE = re.compile(r"^(?:Exit code|Process exited with code):?\s*(-?\d+)", re.MULTILINE)
_CONTEXT_TAGS = ("<environment_context>", "<user_instructions>", "<permissions instructions>", "# AGENTS.md")


def _first_docs(head: str, n: int = 4) -> list[Any]:
    out = []
    for line in head.split("\n")[: n + 2]:
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            break
        if len(out) >= n:
            break
    return out


def score(rel: str, head: str) -> Score:
    """Codex's own line shapes: ``{timestamp, type: session_meta|response_item, payload}``, or the legacy header."""
    if not rel.endswith((".jsonl", ".json")):
        return 0.0, ""
    docs = [d for d in _first_docs(head) if isinstance(d, dict)]
    if not docs:
        # A session_meta line longer than the sniffed head (it carries the base instructions, tens of
        # kB in current versions) does not parse: its opening still says what it is.
        m = _OPENING.match(head)
        return (0.9, f"a rollout line opening with type {m.group(1)} (Codex rollout)") if m else (0.0, "")
    tops = [d.get("type") for d in docs if isinstance(d.get("payload"), dict)]
    if "session_meta" in tops:
        return 0.95, "a session_meta line with payload (Codex rollout)"
    if "response_item" in tops or "turn_context" in tops:
        return 0.9, "response_item / turn_context lines with payload (Codex rollout)"
    if docs[0].get("type") == "thread.started" and "thread_id" in docs[0]:
        return 0.9, "a thread.started line (codex exec --json output)"
    if any(d.get("type") in ("item.completed", "item.started") and isinstance(d.get("item"), dict) for d in docs):
        return 0.7, "item.completed lines with an item (codex exec --json output)"
    first = docs[0]
    states = sum(1 for d in docs if d.get("record_type") == "state")
    if {"id", "timestamp"} <= first.keys() and ("instructions" in first or states):
        return 0.9, "a legacy Codex rollout header and record_type state lines"
    items = [d for d in docs[1:] if d.get("type") in _ITEMS]
    if {"id", "timestamp"} <= first.keys() and items:
        return 0.6, "an id/timestamp header then bare response items"
    return 0.0, ""


def sniff(rel: str, head: str) -> bool:
    """Looks like a Codex rollout (see :func:`score`)."""
    return score(rel, head)[0] >= 0.5


def _records(bundle: Path, rel: str) -> tuple[list[tuple[int, dict[str, Any]]], list[int]] | None:
    try:
        jf = load_json(bundle / rel, 1, rel)
    except (ValueError, UnicodeDecodeError):
        return None
    if not jf.jsonl and not isinstance(jf.docs[0][1], dict):
        return None
    recs = [(ln or 1, d) for ln, d in jf.docs if isinstance(d, dict)]
    other = sorted(jf.bad_lines + [ln or 0 for ln, d in jf.docs if not isinstance(d, dict)])
    return recs, other


def _kind_of(rec: dict[str, Any]) -> tuple[str, dict[str, Any], str]:
    """(top type, item, pointer of the item) of one line, for both shapes."""
    if isinstance(rec.get("payload"), dict) and "type" in rec:
        return str(rec["type"]), rec["payload"], "/payload"
    if "record_type" in rec:
        return "state_marker", rec, ""
    if str(rec.get("type")) in _EXEC_TOP or isinstance(rec.get("item"), dict):
        return "exec", rec, ""
    if "type" in rec:
        return "response_item", rec, ""  # legacy: a bare response item
    return "header", rec, ""


def _unknown(rec: dict[str, Any]) -> str | None:
    top, item, _ = _kind_of(rec)
    if top in ("state_marker", "header", "session_meta", "turn_context", "compacted"):
        return None
    sub = str(item.get("type"))
    if top == "response_item":
        return None if sub in _ITEMS or sub.endswith("_output") else f"response_item/{sub}"
    if top == "event_msg":
        return None if sub in _ECHO_EVENTS | _BOOK_EVENTS | _ERROR_EVENTS else f"event_msg/{sub}"
    if top == "exec":
        if str(item.get("type")) not in _EXEC_TOP:
            return str(item.get("type"))
        kind = as_dict(item.get("item")).get("type")
        return None if kind is None or kind in _EXEC_ITEMS else f"item/{kind}"
    return top


def discover(bundle: Path, paths: list[str]) -> Discovery:
    """One cell per rollout file; token totals, aborted turns and task_complete to the sidecar."""
    cells: list[CellSource] = []
    skipped: list[tuple[str, str]] = []
    warnings: list[tuple[str, str]] = []
    for rel in paths:
        if not rel.endswith((".jsonl", ".json")):
            skipped.append((rel, "not a Codex rollout (.jsonl)"))
            continue
        found = _records(bundle, rel)
        if found is None or not found[0]:
            skipped.append((rel, "not JSON Lines"))
            continue
        recs, other = found
        head = "\n".join(json.dumps(d) for _, d in recs[:4])
        if score(rel, head)[0] < 0.5:
            skipped.append((rel, "no Codex session_meta / response_item lines nor a legacy rollout header"))
            continue
        if other:
            warnings.append(skipped_lines_warning(rel, other, "Codex rollout lines"))
        unknown = Counter(u for _, d in recs if (u := _unknown(d)) is not None)
        if unknown:
            kinds = ", ".join(f"{k} x{n}" for k, n in unknown.most_common(6))
            warnings.append(
                (
                    rel,
                    f"{sum(unknown.values())} line(s) of types this adapter does not know, read as other events: "
                    + kinds,
                )
            )
        meta = _meta(recs)
        sid = str(meta.get("id") or PurePosixPath(rel).stem)
        cells.append(
            CellSource(
                run_id=sid,
                task_id=PurePosixPath(rel).stem,
                path=rel,
                selector={"kind": "rollout"},
                files=[rel],
                harness="Codex CLI" + (f" {meta['cli_version']}" if meta.get("cli_version") else ""),
                task_summary=_first_prompt(recs)[:300],
                step_index_base=0,
                source_steps=len(recs),
                outcome=_outcome(recs, meta),
                content_key=digest(["codex", sid, len(recs)]),
            )
        )
    return Discovery(cells=cells, skipped=skipped, harness="Codex CLI", warnings=warnings)


def _meta(recs: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    for _, d in recs[:3]:
        top, item, _ = _kind_of(d)
        if top == "session_meta":
            return as_dict(item.get("meta")) or item  # 0.4x wraps it once more in some versions
        if top == "header":
            return d
        if top == "exec" and d.get("type") == "thread.started":
            return {"id": d.get("thread_id"), "originator": "codex exec --json"}
    return {}


def _first_prompt(recs: list[tuple[int, dict[str, Any]]]) -> str:
    for _, d in recs:
        top, item, _ = _kind_of(d)
        if top == "response_item" and item.get("type") == "message" and item.get("role") == "user":
            text = as_text(item.get("content"))
            if not text.lstrip().startswith(_CONTEXT_TAGS):
                return text
    return ""


def _outcome(recs: list[tuple[int, dict[str, Any]]], meta: dict[str, Any]) -> dict[str, Any]:
    tokens: Any = None
    aborted = 0
    complete: dict[str, Any] | None = None
    errors = 0
    usage: Counter[str] = Counter()
    for _, d in recs:
        top, item, _ = _kind_of(d)
        if top == "exec":
            if d.get("type") == "turn.completed":
                usage.update({k: v for k, v in as_dict(d.get("usage")).items() if isinstance(v, int)})
            elif d.get("type") in ("turn.failed", "error"):
                errors += 1
            continue
        if top != "event_msg":
            continue
        sub = item.get("type")
        if sub == "token_count" and isinstance(item.get("info"), dict):
            tokens = item["info"].get("total_token_usage", tokens)
        elif sub == "turn_aborted":
            aborted += 1
        elif sub in ("error", "stream_error"):
            errors += 1
        elif sub == "task_complete":
            complete = {k: v for k, v in item.items() if k != "last_agent_message"}
    return {
        "label": None,  # Codex records no task success flag
        "total_token_usage": tokens if tokens is not None else (dict(usage) or None),
        "aborted_turns": aborted,
        "error_events": errors,
        "task_complete": complete,
        "cli_version": meta.get("cli_version"),
        "originator": meta.get("originator"),
    }


def _exit_codes(recs: list[tuple[int, dict[str, Any]]]) -> dict[str, int]:
    """call_id -> exit code from ``exec_command_end`` (and legacy local shell outputs)."""
    out: dict[str, int] = {}
    for _, d in recs:
        top, item, _ = _kind_of(d)
        if top == "event_msg" and item.get("type") == "exec_command_end" and isinstance(item.get("exit_code"), int):
            out[str(item.get("call_id"))] = item["exit_code"]
    return out


def _output_text(raw: Any) -> tuple[str, int | None]:
    """(output text, exit code when the output states one) of a function_call_output."""
    exit_code: int | None = None
    text = raw
    if isinstance(raw, dict):  # some versions: {"content": ..., "success": bool}
        text = raw.get("content", json_text(raw))
        if raw.get("success") is False:
            exit_code = 1
    if isinstance(text, str):
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and ("output" in parsed or "metadata" in parsed):
            meta = as_dict(parsed.get("metadata"))
            if isinstance(meta.get("exit_code"), int):
                exit_code = meta["exit_code"]
            text = as_text(parsed.get("output"))
        m = _EXIT_LINE.search(text[:500])
        if m and exit_code is None:
            exit_code = int(m.group(1))
        return text, exit_code
    return as_text(text), exit_code


_SHELL_TOOLS = ("shell", "exec_command", "local_shell", "container.exec", "shell_command")


def _call_fields(item: dict[str, Any]) -> tuple[str, str | None, str, str]:
    """(tool name, the harness's tool when it was a shell, arguments digest, text) of a tool call.

    A shell call is named after the command it runs (``cat``, ``pytest``: what the probes classify
    as a read or a check), its digest is over the normalised commands and working folder, and its
    text is the command itself (``bash -lc "X"`` is ``X``).
    """
    name = str(item.get("name") or item.get("type") or "tool")
    if item.get("type") == "local_shell_call":
        args: Any = as_dict(item.get("action"))
        name = "shell"
    else:
        raw = item.get("arguments", item.get("input"))
        try:
            args = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            args = raw
    cmd = args.get("command", args.get("cmd")) if isinstance(args, dict) else None
    if cmd is not None and name in _SHELL_TOOLS:
        script = shell_command(cmd)
        workdir = args.get("workdir") if isinstance(args, dict) else None
        return command_tool(script) or name, name, command_digest(script, workdir), f"{name} {script}"
    text = f"{name} {args if isinstance(args, str) else json_text(args)}"
    return name, None, args_digest(args), text


def read(bundle: Path, cell: dict[str, Any]) -> Iterator[SourceEvent]:
    """Events of one rollout, one or more per line (every line is a step)."""
    rel = cell["path"]
    em = Emitter(bundle, rel, max_depth=3)
    recs = [(ln or 1, d) for ln, d in em.jf.docs if isinstance(d, dict)]
    codes = _exit_codes(recs)
    meta = _meta(recs)
    session = str(meta.get("id") or "")
    for step, (line, rec) in enumerate(recs):
        ts = rec.get("timestamp") if isinstance(rec.get("timestamp"), str) else None
        yield from _events(em, line if em.jf.jsonl else None, rec, step, session, ts, codes)


def _events(
    em: Emitter,
    line: int | None,
    rec: dict[str, Any],
    step: int,
    session: str,
    ts: str | None,
    codes: dict[str, int],
) -> Iterator[SourceEvent]:
    top, item, ptr = _kind_of(rec)
    common: dict[str, Any] = {"line": line, "step_index": step, "session_id": session, "ts": ts}
    sub = str(item.get("type") or "")
    if top in ("session_meta", "header"):
        shown = {k: item.get(k) for k in ("id", "cwd", "cli_version", "originator", "source", "model") if k in item}
        yield em.event("other", ptr, actor="harness", detail="session_meta", text=json_text(shown), **common)
    elif top == "turn_context":
        ctx = {k: item.get(k) for k in ("cwd", "model", "approval_policy", "effort") if k in item}
        yield em.event("other", ptr, actor="harness", detail="turn_context", text=json_text(ctx), **common)
    elif top == "state_marker":
        yield em.event("other", ptr, actor="harness", detail="state", text="", **common)
    elif top == "compacted":
        yield em.event(
            "state_change",
            ptr,
            actor="harness",
            detail="compacted",
            state_digest=digest(["compacted", step]),
            text=as_text(item.get("message")),
            **common,
        )
    elif top == "response_item":
        yield from _item_events(em, ptr, item, sub, common, codes)
    elif top == "event_msg":
        yield _event_msg(em, ptr, item, sub, common)
    elif top == "exec":
        yield from _exec_events(em, rec, common)
    else:
        yield em.event("other", "", actor="harness", detail=f"unknown:{top}", text=json_text(rec)[:2000], **common)


def _item_events(
    em: Emitter, ptr: str, item: dict[str, Any], sub: str, common: dict[str, Any], codes: dict[str, int]
) -> Iterator[SourceEvent]:
    if sub == "message":
        role = str(item.get("role") or "user")
        text = as_text(item.get("content"))
        actor = "system" if role in ("developer", "system") else role
        detail = "context" if role == "user" and text.lstrip().startswith(_CONTEXT_TAGS) else None
        yield em.event("message", ptr, actor=actor, detail=detail, text=text, **common)
    elif sub == "reasoning":
        summary = "\n".join(as_text(s.get("text")) for s in item.get("summary") or [] if isinstance(s, dict))
        text = summary or as_text(item.get("content"))
        yield em.event("message", ptr, actor="assistant", detail="thinking", text=text, **common)
    elif sub in ("function_call", "custom_tool_call", "local_shell_call", "web_search_call"):
        name, via, digest_, text = _call_fields(item)
        args = item.get("arguments")
        try:
            parsed = json.loads(args) if isinstance(args, str) else args
        except ValueError:
            parsed = None
        target = as_dict(parsed).get("path") or as_dict(parsed).get("file_path") or as_dict(parsed).get("workdir")
        yield em.event(
            "tool_call",
            ptr,
            actor="assistant",
            tool_name=name,
            call_id=item.get("call_id") or item.get("id"),
            args_digest=digest_,
            detail=via,
            text=text,
            target=target if isinstance(target, str) else None,
            **common,
        )
    elif sub.endswith("_output"):
        call_id = str(item.get("call_id") or "")
        text, code = _output_text(item.get("output"))
        if code is None:
            code = codes.get(call_id)
        is_error = None if code is None else code != 0
        ev = tool_result_event(em, ptr, text, is_error=is_error, actor="environment", call_id=call_id or None, **common)
        if code is not None:
            ev.detail = f"exit_code={code}"  # the exit code is what decided the kind: keep it visible
        yield ev
    else:  # a response item this adapter does not know (counted at import)
        body = json_text(item)[:2000]
        yield em.event("other", ptr, actor="harness", detail=f"unknown:response_item/{sub}", text=body, **common)


def _exec_events(em: Emitter, rec: dict[str, Any], common: dict[str, Any]) -> Iterator[SourceEvent]:
    """One line of ``codex exec --json`` output."""
    top = str(rec.get("type"))
    item = as_dict(rec.get("item"))
    kind = str(item.get("type") or "")
    if top in ("turn.failed", "error"):
        err = as_dict(rec.get("error"))
        text = as_text(err.get("message") or rec.get("message") or json_text(rec))
        yield em.event("error", "", actor="harness", detail=top, text=text, **common)
        return
    if top != "item.completed" or not item:
        detail = f"{top}/{kind}" if kind else top
        known = top in _EXEC_TOP and (not kind or kind in _EXEC_ITEMS)
        body = {k: v for k, v in rec.items() if k != "type"}
        yield em.event("other", "", actor="harness", detail=detail if known else f"unknown:{detail}",
                       text=json_text(body)[:2000], **common)  # fmt: skip
        return
    cid = str(item.get("id") or "") or None
    if kind == "agent_message":
        yield em.event("message", "/item", actor="assistant", text=as_text(item.get("text")), **common)
    elif kind == "reasoning":
        yield em.event(
            "message", "/item", actor="assistant", detail="thinking", text=as_text(item.get("text")), **common
        )
    elif kind == "error":
        yield em.event(
            "error", "/item", actor="harness", detail="item_error", text=as_text(item.get("message")), **common
        )
    elif kind == "command_execution":
        script = shell_command(item.get("command"))
        yield em.event("tool_call", "/item", actor="assistant", tool_name=command_tool(script) or "shell",
                       call_id=cid, args_digest=command_digest(script), detail="command_execution",
                       text=f"shell {script}", **common)  # fmt: skip
        code = item.get("exit_code")
        where = "/item/aggregated_output" if "aggregated_output" in item else "/item"
        ev = tool_result_event(em, where, as_text(item.get("aggregated_output")),
                               is_error=None if not isinstance(code, int) else code != 0, actor="environment",
                               call_id=cid, **common)  # fmt: skip
        if isinstance(code, int):
            ev.detail = f"exit_code={code}"
        yield ev
    elif kind in ("mcp_tool_call", "file_change", "web_search"):
        if kind == "mcp_tool_call":
            name, args = f"{item.get('server')}.{item.get('tool')}", item.get("arguments")
        elif kind == "file_change":
            name, args = "apply_patch", item.get("changes")
        else:
            name, args = "web_search", item.get("query")
        shown = f"{name} {json_text(args)}"
        yield em.event("tool_call", "/item", actor="assistant", tool_name=name, call_id=cid,
                       args_digest=args_digest(args), detail=kind, text=shown, **common)  # fmt: skip
        failed = item.get("status") == "failed" or bool(item.get("error"))
        out = item.get("result", item.get("error", item.get("status")))
        yield tool_result_event(em, "/item", as_text(out), is_error=failed if "status" in item else None,
                                actor="environment", call_id=cid, **common)  # fmt: skip
    else:
        known = kind in _EXEC_ITEMS
        yield em.event("other", "/item", actor="harness", detail=f"item/{kind}" if known else f"unknown:item/{kind}",
                       text=json_text(item)[:2000], **common)  # fmt: skip


def _event_msg(em: Emitter, ptr: str, item: dict[str, Any], sub: str, common: dict[str, Any]) -> SourceEvent:
    if sub in _ERROR_EVENTS:
        text = as_text(item.get("message") or item.get("reason") or json_text(item))
        return em.event("error", ptr, actor="harness", detail=sub, text=text, **common)
    if sub == "exec_command_end":
        code = item.get("exit_code")
        out = as_text(item.get("aggregated_output") or item.get("stdout") or item.get("formatted_output") or "")
        return em.event("other", ptr, actor="environment", detail=f"exec_command_end exit_code={code}",
                        call_id=item.get("call_id"), text=out[:4000], **common)  # fmt: skip
    if sub in _ECHO_EVENTS:  # the response_item of the same turn carries it as a message
        text = as_text(item.get("message") or item.get("text"))
        return em.event("other", ptr, actor="harness", detail=f"event_msg/{sub}", text=text, **common)
    if sub == "token_count":  # usage bookkeeping: one short line (the totals go to the sidecar)
        total = as_dict(as_dict(item.get("info")).get("total_token_usage")).get("total_tokens")
        return em.event("other", ptr, actor="harness", detail="event_msg/token_count", text=f"total_tokens {total}",
                        **common)  # fmt: skip
    known = sub in _BOOK_EVENTS
    body = {k: v for k, v in item.items() if k not in ("type", "rate_limits")}
    return em.event("other", ptr, actor="harness", detail=f"event_msg/{sub}" if known else f"unknown:event_msg/{sub}",
                    text=json_text(body)[:2000], **common)  # fmt: skip


ADAPTER = Adapter(
    name=NAME,
    description="OpenAI Codex CLI rollouts (session_meta / response_item / event_msg lines, and the legacy shape)",
    sniff=sniff,
    discover=discover,
    read=read,
    score=score,
    detects="rollout-*.jsonl lines {timestamp, type: session_meta|turn_context|response_item|event_msg, payload}; "
    "legacy {id, timestamp, instructions} header + record_type lines",
)
