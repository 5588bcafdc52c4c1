"""GitHub Copilot CLI sessions: ``~/.copilot/session-state/<id>/events.jsonl``.

Every line is ``{type, data, id, timestamp, parentId}``. Read: ``session.start`` (version, model,
cwd), ``user.message`` / ``system.message``, ``assistant.message`` (text, ``reasoningText``, and
``toolRequests``: the tool calls), ``tool.execution_complete`` (``success``, ``result.content``,
``error.message``, ``shellExecution.exitCode``: a failed call or a non-zero exit is an ``error``),
``session.error`` (an ``error`` of the harness), ``subagent.*`` (handoffs), model / mode changes,
compaction and truncation (state changes). ``tool.execution_start``, turn boundaries, usage records,
hooks and the closing ``session.shutdown`` are ``other`` events; a type this adapter does not know
is an ``other`` event too, counted in one warning (version drift is never a refusal). Accounting
(premium requests, code changes, shutdown kind, token totals) goes to the sidecar. One cell per
events file; step index = 0-based record number.
"""

from __future__ import annotations

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
    args_digest,
    as_dict,
    as_text,
    json_text,
    load_json,
    skipped_lines_warning,
)
from pipeline.adapters.contract import SourceEvent
from pipeline.core.canonical import digest, sha256_text

NAME = "copilot-cli"
_EXIT = re.compile(r"<(?:exited with|shellId: \d+ completed with) exit code (\d+)>\s*$")
_STATE = {
    "session.start",
    "session.resume",
    "session.model_change",
    "session.mode_changed",
    "session.plan_changed",
    "session.compaction_complete",
    "session.truncation",
    "abort",
}
_OTHER = {
    "tool.execution_start",
    "tool.execution_partial_result",
    "tool.execution_progress",
    "tool.user_requested",
    "assistant.turn_start",
    "assistant.turn_end",
    "assistant.intent",
    "assistant.usage",
    "assistant.reasoning",
    "session.usage_record",
    "session.shutdown",
    "session.idle",
    "session.info",
    "session.warning",
    "session.title_changed",
    "session.context_changed",
    "session.compaction_start",
    "session.workspace_file_changed",
    "hook.start",
    "hook.end",
    "skill.invoked",
    "pending_messages.modified",
}


def score(rel: str, head: str) -> tuple[float, str]:
    """How sure the head of a file is a Copilot CLI events log (0..1) and why."""
    if not rel.endswith(".jsonl"):
        return 0.0, "not a .jsonl file"
    first = head.split("\n", 1)[0]
    if '"producer":"copilot-agent"' in first.replace(" ", "") and '"session.start"' in first:
        return 0.98, "first line is session.start from producer copilot-agent"
    if '"copilotVersion"' in head and '"type"' in head:
        return 0.9, "records carry copilotVersion"
    dotted = sum(
        head.count(f'"type":"{t}"') + head.count(f'"type": "{t}"') for t in ("user.message", "assistant.message")
    )
    if dotted and '"parentId"' in head and '"data"' in head:
        return 0.7, "{type, data, id, parentId} records of user.message / assistant.message"
    return 0.0, "no Copilot CLI session records"


def sniff(rel: str, head: str) -> bool:
    """A Copilot CLI events.jsonl."""
    return score(rel, head)[0] >= 0.5


def _records(jf: Any) -> tuple[list[tuple[int, dict[str, Any]]], list[int]]:
    recs = [(ln or 1, d) for ln, d in jf.docs if isinstance(d, dict) and isinstance(d.get("type"), str)]
    other = sorted(jf.bad_lines + [ln or 1 for ln, d in jf.docs if not (isinstance(d, dict) and "type" in d)])
    return recs, other


def _is_copilot(recs: list[tuple[int, dict[str, Any]]]) -> bool:
    types = {d["type"] for _, d in recs}
    return bool(types & {"session.start", "user.message", "assistant.message"}) and all("data" in d for _, d in recs)


def discover(bundle: Path, paths: list[str]) -> Discovery:
    """One cell per events file."""
    cells: list[CellSource] = []
    skipped: list[tuple[str, str]] = []
    warnings: list[tuple[str, str]] = []
    for rel in paths:
        if not rel.endswith(".jsonl"):
            skipped.append((rel, "not a Copilot CLI events.jsonl"))
            continue
        try:
            jf = load_json(bundle / rel, 1, rel)
        except (ValueError, UnicodeDecodeError):
            skipped.append((rel, "not valid JSON Lines"))
            continue
        recs, other = _records(jf) if jf.jsonl or isinstance(jf.docs[0][1], dict) else ([], [])
        if not recs or not _is_copilot(recs):
            skipped.append((rel, "not a Copilot CLI session (no session.start / user.message / assistant.message)"))
            continue
        if other:
            warnings.append(skipped_lines_warning(rel, other, "Copilot CLI records"))
        unknown = Counter(d["type"] for _, d in recs if not _known(d["type"]))
        if unknown:
            shown = ", ".join(f"{t} ×{n}" for t, n in unknown.most_common(5))
            warnings.append((rel, f"{sum(unknown.values())} record(s) of unknown type read as other events ({shown})"))
        start = next((as_dict(d.get("data")) for _, d in recs if d["type"] == "session.start"), {})
        sid = str(start.get("sessionId") or PurePosixPath(rel).parent.name or PurePosixPath(rel).stem)
        first_user = next((as_dict(d.get("data")).get("content") for _, d in recs if d["type"] == "user.message"), "")
        version = start.get("copilotVersion")
        cells.append(
            CellSource(
                run_id=sid,
                task_id=sid,
                path=rel,
                selector={"kind": "events"},
                files=[rel],
                harness=f"GitHub Copilot CLI {version}" if version else "GitHub Copilot CLI",
                task_summary=str(first_user or "")[:200],
                step_index_base=0,
                source_steps=len(recs),
                outcome=_outcome(recs),
            )
        )
    harness = " + ".join(sorted({c.harness for c in cells if c.harness})) or "GitHub Copilot CLI"
    return Discovery(cells=cells, skipped=skipped, harness=harness, warnings=warnings)


def _known(rtype: str) -> bool:
    return (
        rtype in _STATE
        or rtype in _OTHER
        or rtype in ("user.message", "system.message", "assistant.message", "tool.execution_complete", "session.error")
        or rtype.startswith("subagent.")
    )


def _outcome(recs: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """What the session says of how it ended: shutdown kind, accounting, code changes, errors."""
    out: dict[str, Any] = {"label": None}
    shut = next((as_dict(d.get("data")) for _, d in reversed(recs) if d["type"] == "session.shutdown"), None)
    out["shutdown"] = None if shut is None else shut.get("shutdownType", "routine")
    if shut:
        acct = as_dict(shut.get("accountingSnapshot")) or shut
        out["code_changes"] = acct.get("codeChanges")
        out["premium_requests"] = acct.get("totalPremiumRequests", acct.get("totalPremiumRequestCost"))
        out["api_duration_ms"] = acct.get("totalApiDurationMs")
    out["session_errors"] = sum(1 for _, d in recs if d["type"] == "session.error")
    usage = [as_dict(as_dict(d.get("data")).get("usage")) for _, d in recs if d["type"] == "session.usage_record"]
    if usage:
        out["input_tokens"] = sum(int(u.get("inputTokens") or 0) for u in usage)
        out["output_tokens"] = sum(int(u.get("outputTokens") or 0) for u in usage)
    return out


def _events(em: Emitter, line: int | None, rec: dict[str, Any], step: int, session: str) -> Iterator[SourceEvent]:
    rtype = str(rec["type"])
    data = as_dict(rec.get("data"))
    parent_call = data.get("parentToolCallId")
    agent = f"subagent:{data.get('agentName') or parent_call}" if parent_call else "assistant"
    common: dict[str, Any] = {"line": line, "step_index": step, "session_id": session, "ts": rec.get("timestamp")}
    if rtype in ("user.message", "system.message"):
        who = "user" if rtype == "user.message" else "system"
        yield em.event("message", "/data/content" if "content" in data else "/data", actor=who, detail=rtype,
                       text=as_text(data.get("content")), **common)  # fmt: skip
    elif rtype == "assistant.message":
        if data.get("reasoningText"):
            yield em.event("message", "/data/reasoningText", actor=agent, detail="thinking",
                           text=as_text(data["reasoningText"]), **common)  # fmt: skip
        requests: list[Any] = data["toolRequests"] if isinstance(data.get("toolRequests"), list) else []
        if data.get("content") or not requests:
            yield em.event("message", "/data/content" if "content" in data else "/data", actor=agent,
                           detail=rtype, text=as_text(data.get("content")), **common)  # fmt: skip
        for k, req in enumerate(requests):
            req = as_dict(req)
            name = str(req.get("name") or "")
            args = req.get("arguments")
            yield em.event("tool_call", f"/data/toolRequests/{k}", actor=agent, tool_name=name,
                           call_id=req.get("toolCallId"), args_digest=args_digest(args),
                           text=f"{name} {args if isinstance(args, str) else json_text(args)}",
                           target=_target(args), **common)  # fmt: skip
    elif rtype == "tool.execution_complete":
        yield _result(em, data, common)
    elif rtype == "session.error":
        yield em.event("error", "/data", actor="harness", detail=f"session.error:{data.get('errorType') or ''}",
                       text=as_text(data.get("message")) or json_text(data), **common)  # fmt: skip
    elif rtype.startswith("subagent."):
        name = str(data.get("agentName") or data.get("agentDisplayName") or parent_call or "subagent")
        yield em.event("handoff", "/data", actor="assistant", target=f"subagent:{name}", detail=rtype,
                       text=f"{rtype} {name}", call_id=parent_call, **common)  # fmt: skip
    elif rtype in _STATE:
        yield em.event("state_change", "/data", actor="harness", detail=rtype, text=json_text(data),
                       state_digest=digest([rtype, rec.get("id")]), **common)  # fmt: skip
    else:
        detail = rtype if rtype in _OTHER else f"unknown:{rtype}"
        text = json_text(data) if rtype not in ("tool.execution_start",) else _start_text(data)
        yield em.event("other", "", actor="harness", detail=detail, text=text, call_id=data.get("toolCallId"),
                       **common)  # fmt: skip


def _start_text(data: dict[str, Any]) -> str:
    args = data.get("arguments")
    return f"{data.get('toolName') or ''} {args if isinstance(args, str) else json_text(args)}".strip()


def _target(args: Any) -> str | None:
    if isinstance(args, dict):
        for k in ("path", "file_path", "filePath"):
            if isinstance(args.get(k), str):
                return str(args[k])
    return None


def _result(em: Emitter, data: dict[str, Any], common: dict[str, Any]) -> SourceEvent:
    result = as_dict(data.get("result"))
    err = as_dict(data.get("error"))
    exit_code = as_dict(data.get("shellExecution")).get("exitCode")
    if exit_code is None:  # before shellExecution (1.0.3x) the shell tool wrote it at the end of its output
        m = _EXIT.search(as_text(result.get("content"))[-200:])
        exit_code = int(m.group(1)) if m else None
    failed = data.get("success") is False or (isinstance(exit_code, int) and exit_code != 0)
    if data.get("success") is False:
        text = as_text(err.get("message")) or as_text(result.get("content")) or json_text(err)
        ptr = "/data/error" if err else "/data"
        detail: str | None = "tool_error"
    else:
        text = as_text(result.get("content")) if "content" in result else as_text(data.get("result"))
        ptr = "/data/result/content" if "content" in result else "/data"
        detail = f"exit_code={exit_code}" if exit_code is not None else None
        if failed:
            detail = f"tool_error exit_code={exit_code}"
    return em.event("error" if failed else "tool_result", ptr, actor="environment", detail=detail, text=text,
                    call_id=data.get("toolCallId"), result_digest=sha256_text(text), **common)  # fmt: skip


def read(bundle: Path, cell: dict[str, Any]) -> Iterator[SourceEvent]:
    """Events of one session, in file order."""
    rel = cell["path"]
    em = Emitter(bundle, rel, max_depth=4)
    recs, _ = _records(em.jf)
    start = next((as_dict(d.get("data")) for _, d in recs if d["type"] == "session.start"), {})
    session = str(start.get("sessionId") or PurePosixPath(rel).parent.name)
    for step, (line, rec) in enumerate(recs):
        yield from _events(em, line if em.jf.jsonl else None, rec, step, session)


ADAPTER = Adapter(
    name=NAME,
    description="GitHub Copilot CLI session-state/<id>/events.jsonl (messages, tool requests and results, exit codes)",
    sniff=sniff,
    discover=discover,
    read=read,
    score=score,
    detects="session-state/<id>/events.jsonl: {type, data, id, parentId} lines from producer copilot-agent",
)
