"""SWE-agent ``.traj`` files, all three shapes.

1. ``{environment, trajectory, history, info}`` with ``state`` a JSON string (older runs);
2. the same plus ``replay_config``, ``state`` a dict, ``execution_time`` (newer runs);
3. ``{history}`` only (function-calling demonstrations).

With a ``trajectory``, a step is one element of it (0-based): the agent's thought (``message``),
its action (``tool_call``, tool = the command's first word), the observation (``tool_result``,
or ``error`` when it visibly failed) and a ``state_change`` when ``state`` changed. The history
entries before the first assistant turn (system prompt, demonstrations, the issue) come first as
context messages without a step index. Without a trajectory, each history entry is one step.

``info`` (exit status, submission, model stats) goes to the sidecar only.
"""

from __future__ import annotations

import json
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
    as_text,
    first_docs,
    tool_result_event,
)
from pipeline.adapters.contract import SourceEvent
from pipeline.core.canonical import digest

NAME = "swe-agent"


def sniff(rel: str, head: str) -> bool:
    """A ``.traj`` file, or JSON that opens with SWE-agent's keys."""
    return rel.endswith(".traj")


def score(rel: str, head: str) -> Score:
    """A ``.traj`` file (SWE-agent's own extension)."""
    if not rel.endswith(".traj"):
        return 0.0, ""
    if '"trajectory"' in head or '"history"' in head:
        return 0.9, ".traj file with trajectory/history"
    return 0.7, ".traj file"


def discover(bundle: Path, paths: list[str]) -> Discovery:
    """One cell per ``.traj`` file."""
    cells: list[CellSource] = []
    skipped: list[tuple[str, str]] = []
    for rel in paths:
        if rel.endswith(".traj.json"):
            skipped.append((rel, "a mini-SWE-agent trajectory: import it with format mini-swe-agent"))
    paths = [p for p in paths if not p.endswith(".traj.json")]
    for rel, doc in first_docs(bundle, paths, skipped, max_depth=2, suffix=".traj", wrong_suffix="not a .traj file"):
        if not isinstance(doc, dict) or not isinstance(doc.get("history") or doc.get("trajectory"), list):
            skipped.append((rel, "no trajectory or history"))
            continue
        traj = doc.get("trajectory")
        info = doc.get("info") or {}
        stats = info.get("model_stats") or {}
        cost = stats.get("instance_cost") if isinstance(stats, dict) else None
        stem = rel.rsplit("/", 1)[-1].removesuffix(".traj")
        shape = "history-only" if not isinstance(traj, list) else ("replay" if "replay_config" in doc else "classic")
        cells.append(
            CellSource(
                run_id=rel.removeprefix("raw/").removesuffix(".traj"),
                task_id=stem,
                path=rel,
                selector={"shape": shape},
                files=[rel],
                harness="SWE-agent",
                step_index_base=0,
                source_steps=len(traj) if isinstance(traj, list) else len(doc["history"]),
                outcome={
                    "label": None,
                    "cost": float(cost) if isinstance(cost, int | float) else None,
                    "exit_status": info.get("exit_status"),
                    "info": info,
                },
                label_texts=[],
            )
        )
    return Discovery(cells=cells, skipped=skipped, harness="SWE-agent")


def _tool_of(action: str) -> str:
    words = action.strip().split(None, 1)
    return words[0] if words else ""


def _state(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _calls(value: Any) -> list[dict[str, Any]]:
    return [c for c in value if isinstance(c, dict)] if isinstance(value, list) else []


def _read_history(em: Emitter, history: list[Any], stepped: bool) -> Iterator[SourceEvent]:
    for i, h in enumerate(history):
        ptr = f"/history/{i}"
        step = i if stepped else None
        actor = str(h.get("agent") or h.get("role") or "")
        role = h.get("role")
        text = as_text(h.get("content"))
        mtype = h.get("message_type")
        if role == "tool" or (mtype == "observation" and role != "user" and stepped):
            ids = h.get("tool_call_ids") or []
            yield tool_result_event(
                em, ptr, text, is_error=None, actor="environment", step_index=step, call_id=ids[0] if ids else None
            )
            continue
        yield em.event(
            "message", ptr, actor=role if role != "assistant" else actor, detail=mtype, step_index=step, text=text
        )
        if role == "assistant":
            calls = _calls(h.get("tool_calls"))
            for j, call in enumerate(calls):
                fn = call.get("function") or {}
                yield em.event(
                    "tool_call",
                    f"{ptr}/tool_calls/{j}",
                    actor=actor,
                    step_index=step,
                    tool_name=fn.get("name"),
                    call_id=call.get("id"),
                    args_digest=args_digest(fn.get("arguments")),
                    text=str(h.get("action") or fn.get("name")),
                )
            if not calls and h.get("action"):
                action = str(h["action"])
                yield em.event(
                    "tool_call",
                    f"{ptr}/action",
                    actor=actor,
                    step_index=step,
                    tool_name=_tool_of(action),
                    args_digest=args_digest(action),
                    text=action,
                )


def read(bundle: Path, cell: dict[str, Any]) -> Iterator[SourceEvent]:
    """Events of one ``.traj`` (see module doc)."""
    em = Emitter(bundle, cell["path"], max_depth=4)
    doc = em.doc()
    traj = doc.get("trajectory")
    history = doc.get("history") or []
    if not isinstance(traj, list):
        yield from _read_history(em, history, stepped=True)
        return
    first_assistant = next((i for i, h in enumerate(history) if h.get("role") == "assistant"), len(history))
    yield from _read_history(em, history[:first_assistant], stepped=False)
    last_state: str | None = None
    for i, step in enumerate(traj):
        ptr = f"/trajectory/{i}"
        thought = step.get("thought") or step.get("response") or ""
        key = "thought" if step.get("thought") else "response"
        yield em.event("message", f"{ptr}/{key}", actor="agent", step_index=i, text=as_text(thought))
        action = as_text(step.get("action"))
        if action:
            yield em.event(
                "tool_call",
                f"{ptr}/action",
                actor="agent",
                step_index=i,
                tool_name=_tool_of(action),
                args_digest=args_digest(action),
                text=action,
            )
        if "observation" in step:
            obs = as_text(step.get("observation"))
            yield tool_result_event(
                em,
                f"{ptr}/observation",
                obs,
                is_error=None,
                actor="environment",
                step_index=i,
                tool_name=_tool_of(action),
            )
        if "state" in step:
            state = digest(_state(step["state"]))
            if state != last_state:
                last_state = state
                yield em.event(
                    "state_change",
                    f"{ptr}/state",
                    actor="environment",
                    step_index=i,
                    state_digest=state,
                    text=as_text(_state(step["state"])),
                )


ADAPTER = Adapter(
    name=NAME,
    description="SWE-agent .traj files (classic, replay_config and history-only shapes)",
    sniff=sniff,
    score=score,
    detects="*.traj (classic, replay_config, history-only)",
    discover=discover,
    read=read,
)
