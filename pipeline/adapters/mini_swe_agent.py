"""mini-SWE-agent trajectories (``*.traj.json``): chat messages with the actions in their text.

Shapes: ``{"info": {exit_status, submission, model_stats, mini_version, config}, "messages": [...],
"trajectory_format": "mini-swe-agent-1" | "mini-swe-agent-1.1"}`` (v1 and v2), and a bare list
of ``{role, content}`` messages (copies that kept only the conversation). Messages follow the
OpenAI chat format; v2 adds an ``extra`` field and, with tool-calling models, ``tool_calls`` and
``role: tool`` results, and ends with a ``role: exit`` message.

One cell per file; step index = 0-based message position. An assistant message is a ``message``
plus, for its one fenced action block (```` ```bash ```` in v1, ```` ```mswea_bash_command ```` in
v2 text mode), a ``tool_call`` whose ref is the block's lines inside the message
(``/messages/5/content#L3-L5``), tool = the command's first word. The next user (or ``tool``)
message is its observation: ``<returncode>N</returncode>`` with ``<output>`` -> ``tool_result``,
or ``error`` when N != 0, an ``<exception>`` is shown or the command timed out. The harness's
own complaints (wrong number of action blocks) are ``error`` events with ``detail =
format_error``. ``info`` (exit status, submission, cost) goes to the sidecar only.

Detection is by content, not by name: the ``trajectory_format`` / ``mini_version`` keys, or, for a
bare list, mini-SWE-agent's action and observation markers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
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
    first_docs,
    joined_harnesses,
)
from pipeline.adapters.contract import SourceEvent
from pipeline.adapters.embedded import call_event, code_blocks, command_tool, exit_code
from pipeline.core.canonical import digest, sha256_text

NAME = "mini-swe-agent"
_MARKERS = (
    '"trajectory_format": "mini-swe-agent',
    '"mini_version"',
    "<returncode>",
    "mswea_bash_command",
    "MINI_SWE_AGENT_FINAL_OUTPUT",
    "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT",
)
_ACTION_LANGS = {"bash", "sh", "mswea_bash_command", ""}
_FORMAT_ERROR = re.compile(r"Please always provide EXACTLY ONE action|found \d+ actions", re.IGNORECASE)
_TIMEOUT = re.compile(r"timed out|TimeoutExpired", re.IGNORECASE)


def _messages(doc: Any) -> tuple[list[Any], str]:
    if isinstance(doc, dict) and isinstance(doc.get("messages"), list):
        return doc["messages"], "/messages"
    if isinstance(doc, list):
        return doc, ""
    return [], ""


def _is_mini(doc: Any) -> bool:
    if isinstance(doc, dict):
        info = as_dict(doc.get("info"))
        return str(doc.get("trajectory_format", "")).startswith("mini-swe-agent") or "mini_version" in info
    msgs, _ = _messages(doc)
    if not msgs or not all(isinstance(m, dict) and "role" in m for m in msgs):
        return False
    text = "\n".join(as_text(m.get("content")) for m in msgs[:12] if isinstance(m, dict))
    return ("<returncode>" in text) or any(k in text for k in _MARKERS[3:])


def sniff(rel: str, head: str) -> bool:
    """JSON with mini-SWE-agent's format keys, or a message list with its action/observation markers."""
    return rel.endswith(".json") and any(k in head for k in _MARKERS)


def score(rel: str, head: str) -> Score:
    """mini-SWE-agent's ``trajectory_format`` / ``mini_version``, else its action markers."""
    if not rel.endswith(".json"):
        return 0.0, ""
    if _MARKERS[0] in head or _MARKERS[1] in head:
        return 0.95, "trajectory_format mini-swe-agent / mini_version"
    hit = next((m for m in _MARKERS[2:] if m in head), None)
    return (0.75, f"mini-SWE-agent's {hit} marker") if hit else (0.0, "")


def discover(bundle: Path, paths: list[str]) -> Discovery:
    """One cell per trajectory file."""
    cells: list[CellSource] = []
    skipped: list[tuple[str, str]] = []
    for rel, doc in first_docs(bundle, paths, skipped, max_depth=2):
        if not _is_mini(doc):
            skipped.append((rel, "not a mini-SWE-agent trajectory"))
            continue
        msgs, _ = _messages(doc)
        info = as_dict(doc.get("info")) if isinstance(doc, dict) else {}
        cost = as_dict(info.get("model_stats")).get("instance_cost")
        name = rel.rsplit("/", 1)[-1]
        stem = name.removesuffix(".json").removesuffix(".traj")
        version = info.get("mini_version")
        cells.append(
            CellSource(
                run_id=rel.removeprefix("raw/").removesuffix(".json"),
                task_id=stem,
                path=rel,
                selector={"messages": "/messages" if isinstance(doc, dict) else ""},
                files=[rel],
                harness=f"mini-SWE-agent {version}" if version else "mini-SWE-agent",
                task_summary="",
                step_index_base=0,
                source_steps=len(msgs),
                outcome={
                    "label": None,  # "Submitted" says the agent stopped, not that the task was solved
                    "cost": float(cost) if isinstance(cost, int | float) else None,
                    "exit_status": info.get("exit_status"),
                    "info": info,
                },
                label_texts=[s for s in [as_text(info.get("submission"))] if len(s) > 40],
                content_key=digest(msgs),
                label_keys=[stem],
            )
        )
    return Discovery(cells=cells, skipped=skipped, harness=joined_harnesses(cells))


def _observation(text: str) -> tuple[bool, str | None]:
    """(failed?, detail) of a user / tool message answering an action."""
    code = exit_code(text)
    if "<exception>" in text:
        return True, "exception"
    if code is not None:
        return code != 0, f"returncode {code}"
    if _TIMEOUT.search(text[:1000]):
        return True, "timeout"
    return False, None


def _assistant(em: Emitter, ptr: str, m: dict[str, Any], step: int) -> tuple[list[SourceEvent], str | None, str | None]:
    """Events of one assistant message, and the (call id, tool) its observation answers."""
    text = as_text(m.get("content"))
    events = [em.event("message", ptr, actor="agent", step_index=step, text=text)]
    calls = [c for c in m.get("tool_calls") or [] if isinstance(c, dict)]
    if calls:  # v2 tool-calling models: the action is structured
        cid: str | None = None
        tool: str | None = None
        for j, call in enumerate(calls):
            fn = as_dict(call.get("function"))
            args = fn.get("arguments")
            command = _command(args)
            cid = str(call.get("id") or f"m{step}-{j}")
            tool = command_tool(command) if command else str(fn.get("name") or "")
            events.append(
                em.event(
                    "tool_call",
                    f"{ptr}/tool_calls/{j}",
                    actor="agent",
                    step_index=step,
                    tool_name=tool or None,
                    call_id=cid,
                    args_digest=args_digest(command if command else args),
                    text=command or as_text(args),
                )
            )
        return events, cid, tool
    blocks = [b for b in code_blocks(text) if b.lang in _ACTION_LANGS and b.code.strip()]
    if len(blocks) != 1:  # the harness rejects zero or several actions (a format error follows)
        return events, None, None
    cid = f"m{step}"
    ev = call_event(em, f"{ptr}/content", blocks[0], call_id=cid, actor="agent", step=step)
    ev.detail = "action"
    events.append(ev)
    return events, cid, ev.tool_name


def _command(args: Any) -> str:
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return str(args)
    return str(args.get("command") or "") if isinstance(args, dict) else ""


def read(bundle: Path, cell: dict[str, Any]) -> Iterator[SourceEvent]:
    """Events of one trajectory (see module doc)."""
    em = Emitter(bundle, cell["path"], max_depth=4)
    msgs, base = _messages(em.doc())
    pending: tuple[str, str | None] | None = None  # (call id, tool) awaiting its observation
    for i, m in enumerate(msgs):
        ptr = f"{base}/{i}"
        if not isinstance(m, dict):
            continue
        role = str(m.get("role") or "")
        text = as_text(m.get("content"))
        if role == "assistant":
            events, cid, tool = _assistant(em, ptr, m, i)
            yield from events
            pending = (cid, tool) if cid else None
            continue
        if role == "tool" or (role == "user" and pending is not None):
            failed, detail = _observation(text)
            cid = str(m.get("tool_call_id") or (pending[0] if pending else "")) or None
            yield em.event(
                "error" if failed else "tool_result",
                ptr,
                actor="environment",
                step_index=i,
                tool_name=pending[1] if pending else None,
                call_id=cid,
                result_digest=sha256_text(text),
                text=text,
                detail="tool_error" if failed else detail,
            )
            pending = None
            continue
        if role == "user" and _FORMAT_ERROR.search(text):
            yield em.event("error", ptr, actor="harness", step_index=i, text=text, detail="format_error")
            continue
        if role == "exit":
            status = as_text(as_dict(m.get("extra")).get("exit_status"))
            kind = "error" if status == "LimitsExceeded" else "other"
            yield em.event(kind, ptr, actor="harness", step_index=i, text=text or status, detail=status or "exit")
            continue
        yield em.event("message", ptr, actor=role or None, step_index=i, text=text)


ADAPTER = Adapter(
    name=NAME,
    description="mini-SWE-agent trajectories (.traj.json: v1/v2 message lists, actions parsed from the text)",
    sniff=sniff,
    score=score,
    detects="*.traj.json (trajectory_format mini-swe-agent-1.x), message lists with <returncode> markers",
    discover=discover,
    read=read,
)
