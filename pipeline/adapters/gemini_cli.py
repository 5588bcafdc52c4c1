"""Google Gemini CLI sessions: ``~/.gemini/tmp/<project hash>/chats/session-*.json[l]`` and ``logs.json``.

- **chat JSON**: one document ``{sessionId, projectHash, startTime, lastUpdated, messages[]}``;
  each message has ``id``, ``timestamp``, ``type`` (``user``, ``gemini``, ``info``, ``error``,
  ``warning``), ``content``, and for ``gemini`` its ``thoughts[]``, ``tokens``, ``model`` and
  ``toolCalls[]`` (``name``, ``args``, ``result[].functionResponse.response``, ``status``
  success / error / cancelled, ``resultDisplay``). One cell per session.
- **JSON Lines** (newer versions, append-only): a metadata line with ``sessionId`` /
  ``projectHash`` / ``startTime``, then message records, each rewritten in full whenever its tool
  calls, results or tokens change (the last version is read; earlier ones are ``other`` events
  naming the line that supersedes them), ``{"$set": {...}}`` metadata patches (``other``; a
  ``$set`` of ``messages`` replaces the model's context: a ``state_change``) and
  ``{"$rewindTo": id}`` truncation markers (a ``state_change``, ``detail = rewind``).
- **logs.json**: ``[{sessionId, messageId, type, message, timestamp}]``, the prompts the user typed.
  Its sessions that no chat file holds become cells of user messages; otherwise it is kept as an
  outcome-free auxiliary file.

Events: user and model messages, thoughts (``message``/``thinking``), one ``tool_call`` per tool
call (``run_shell_command``'s ``command`` as its text) and its result (``error`` when the status is
error or cancelled, or the output visibly failed; ``Exit Code: N`` in the output decides when it is
there), ``error`` messages as harness ``error`` events, ``info`` / ``warning`` as ``other``. A
message of a type this adapter does not know is an ``other`` event, counted in one warning.
Token totals and models go to the sidecar.
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
    tool_result_event,
)
from pipeline.adapters.contract import SourceEvent
from pipeline.adapters.embedded import command_digest, command_tool, shell_command
from pipeline.core.canonical import digest

NAME = "gemini-cli"
_KNOWN = {"user", "gemini", "model", "info", "error", "warning"}
_EXIT = re.compile(r"Exit Code:\s*(-?\d+)")
_SHELL_TOOLS = {"run_shell_command", "shell"}


def score(rel: str, head: str) -> Score:
    """Gemini CLI's session keys (``sessionId`` + ``projectHash``), or logs.json's ``sessionId`` + ``messageId``."""
    if not rel.endswith((".json", ".jsonl")):
        return 0.0, ""
    start = head.lstrip()[:1]
    first = head.split("\n", 1)[0]
    if start == "{" and '"projectHash"' in head[:2000] and '"sessionId"' in head[:2000]:
        if '"messages"' in head:
            return 0.95, "sessionId, projectHash and messages (Gemini CLI chat)"
        if '"projectHash"' in first and '"startTime"' in first:
            return 0.9, "a sessionId / projectHash / startTime header line (Gemini CLI chat JSONL)"
        return 0.6, "sessionId and projectHash"
    if start == "[" and '"sessionId"' in head[:1500] and '"messageId"' in head[:1500]:
        return 0.85, "records with sessionId and messageId (Gemini CLI logs.json)"
    return 0.0, ""


def sniff(rel: str, head: str) -> bool:
    """Looks like a Gemini CLI session (see :func:`score`)."""
    return score(rel, head)[0] >= 0.5


def _session(bundle: Path, rel: str) -> tuple[dict[str, Any], list[tuple[int | None, str, dict[str, Any]]]] | None:
    """(header, [(line, pointer, message)]) of a chat file, or None when it is not one."""
    try:
        jf = load_json(bundle / rel, 3, rel)
    except (ValueError, UnicodeDecodeError):
        return None
    if not jf.jsonl:
        doc = jf.docs[0][1]
        if not (isinstance(doc, dict) and isinstance(doc.get("messages"), list) and "sessionId" in doc):
            return None
        msgs: list[tuple[int | None, str, dict[str, Any]]] = [
            (None, f"/messages/{i}", m) for i, m in enumerate(doc["messages"]) if isinstance(m, dict)
        ]
        return doc, msgs
    docs = [(ln, d) for ln, d in jf.docs if isinstance(d, dict)]
    if not docs or "sessionId" not in docs[0][1] or "id" in docs[0][1]:
        return None
    return docs[0][1], [(ln, "", d) for ln, d in docs[1:]]


def _logs(bundle: Path, rel: str) -> list[tuple[int, dict[str, Any]]] | None:
    try:
        jf = load_json(bundle / rel, 2, rel)
    except (ValueError, UnicodeDecodeError):
        return None
    doc = jf.docs[0][1]
    if jf.jsonl or not isinstance(doc, list) or not doc:
        return None
    if not all(isinstance(d, dict) and "sessionId" in d and "messageId" in d for d in doc):
        return None
    return list(enumerate(doc))


def discover(bundle: Path, paths: list[str]) -> Discovery:
    """One cell per chat session; logs.json sessions no chat file holds become cells of prompts."""
    cells: list[CellSource] = []
    skipped: list[tuple[str, str]] = []
    warnings: list[tuple[str, str]] = []
    aux: list[str] = []
    logs: list[tuple[str, list[tuple[int, dict[str, Any]]]]] = []
    seen: set[str] = set()
    for rel in paths:
        if not rel.endswith((".json", ".jsonl")):
            skipped.append((rel, "not a Gemini CLI session (.json / .jsonl)"))
            continue
        found = _session(bundle, rel)
        if found is None:
            entries = _logs(bundle, rel)
            if entries is not None:
                logs.append((rel, entries))
            else:
                skipped.append((rel, "no sessionId with messages (nor a logs.json list)"))
            continue
        header, msgs = found
        sid = str(header.get("sessionId"))
        seen.add(sid)
        unknown = Counter(str(m.get("type")) for _, _, m in msgs if m.get("type") not in _KNOWN and not _control(m))
        if unknown:
            kinds = ", ".join(f"{k} x{n}" for k, n in unknown.most_common(5))
            warnings.append((rel, f"{sum(unknown.values())} message(s) of types this adapter does not know, "
                                  f"read as other events: {kinds}"))  # fmt: skip
        first = next((as_text(m.get("content")) for _, _, m in msgs if m.get("type") == "user"), "")
        extra = 1 if msgs and msgs[0][0] is not None else 0  # the JSONL header line is a step too
        cells.append(
            CellSource(
                run_id=sid,
                task_id=PurePosixPath(rel).stem,
                path=rel,
                selector={"kind": "chat"},
                files=[rel],
                harness="Gemini CLI",
                task_summary=first[:300],
                step_index_base=0,
                source_steps=len(msgs) + extra,
                outcome=_outcome(header, [m for _, _, m in msgs]),
                content_key=digest(["gemini-cli", sid, len(msgs)]),
            )
        )
    for rel, entries in logs:
        by_sid: dict[str, list[int]] = {}
        for i, d in entries:
            by_sid.setdefault(str(d.get("sessionId")), []).append(i)
        kept = False
        for sid, idx in by_sid.items():
            if sid in seen:
                continue
            kept = True
            cells.append(
                CellSource(
                    run_id=sid,
                    task_id=f"{PurePosixPath(rel).stem}-{sid}",
                    path=rel,
                    selector={"kind": "logs", "session": sid, "index": idx},
                    files=[rel],
                    harness="Gemini CLI",
                    task_summary=as_text(entries[idx[0]][1].get("message"))[:300],
                    step_index_base=0,
                    source_steps=len(idx),
                    outcome={"label": None, "source": "logs.json (user prompts only)"},
                )
            )
        if not kept:
            aux.append(rel)  # every session it lists is read from its chat file
    return Discovery(cells=cells, skipped=skipped, harness="Gemini CLI", warnings=warnings, aux=aux)


def _outcome(header: dict[str, Any], msgs: list[dict[str, Any]]) -> dict[str, Any]:
    totals: Counter[str] = Counter()
    models: set[str] = set()
    statuses: Counter[str] = Counter()
    for m in msgs:
        for k, v in as_dict(m.get("tokens")).items():
            if isinstance(v, int | float):
                totals[k] += int(v)
        if isinstance(m.get("model"), str):
            models.add(m["model"])
        for tc in m.get("toolCalls") or []:
            if isinstance(tc, dict):
                statuses[str(tc.get("status"))] += 1
    return {
        "label": None,  # Gemini CLI records no task success flag
        "tokens": dict(totals) or None,
        "models": sorted(models),
        "tool_call_status": dict(statuses),
        "start_time": header.get("startTime"),
        "last_updated": header.get("lastUpdated"),
    }


def read(bundle: Path, cell: dict[str, Any]) -> Iterator[SourceEvent]:
    """Events of one chat session (or of one session's prompts in logs.json)."""
    rel = cell["path"]
    sel = cell.get("selector") or {}
    em = Emitter(bundle, rel, max_depth=3)
    if sel.get("kind") == "logs":
        doc = em.doc()
        for step, i in enumerate(sel.get("index") or []):
            d = doc[i]
            actor = "user" if d.get("type") == "user" else "assistant"
            yield em.event("message", f"/{i}", actor=actor, step_index=step, session_id=sel.get("session"),
                           ts=d.get("timestamp"), text=as_text(d.get("message")))  # fmt: skip
        return
    found = _session(bundle, rel)
    if found is None:
        return
    header, msgs = found
    sid = str(header.get("sessionId"))
    step = 0
    if msgs and msgs[0][0] is not None:  # JSONL: the header line is a step
        shown = {k: header.get(k) for k in ("sessionId", "projectHash", "startTime") if k in header}
        yield em.event("other", "", line=1, actor="harness", detail="session_header", step_index=0, session_id=sid,
                       ts=header.get("startTime"), text=json_text(shown))  # fmt: skip
        step = 1
    last_line: dict[str, int] = {}
    for line, _, m in msgs:
        if line is not None and m.get("id") is not None:
            last_line[str(m["id"])] = line
    for line, ptr, m in msgs:
        common: dict[str, Any] = {"line": line, "step_index": step, "session_id": sid, "ts": m.get("timestamp")}
        step += 1
        mid = str(m.get("id")) if m.get("id") is not None else None
        if line is not None and mid is not None and last_line.get(mid, line) != line:
            yield em.event("other", ptr, actor="harness", detail=f"superseded by line {last_line[mid]}",
                           text=as_text(m.get("content"))[:2000], **common)  # fmt: skip
            continue
        yield from _message_events(em, ptr, m, common)


def _control(m: dict[str, Any]) -> bool:
    """A JSONL record that is no message: a ``$set`` metadata patch or a ``$rewindTo`` marker."""
    return "$set" in m or "$rewindTo" in m


def _message_events(em: Emitter, ptr: str, m: dict[str, Any], common: dict[str, Any]) -> Iterator[SourceEvent]:
    if "$rewindTo" in m:  # the CLI truncated the conversation back to this message (a rewind)
        target = str(m["$rewindTo"])
        yield em.event("state_change", ptr, actor="harness", detail="rewind", state_digest=digest(["rewind", target]),
                       text=f"rewind to message {target}", **common)  # fmt: skip
        return
    if "$set" in m:
        patch = as_dict(m["$set"])
        if "messages" in patch:  # the model's context replaced (resume, compression, a rolled-back turn)
            n = len(patch["messages"]) if isinstance(patch["messages"], list) else 0
            yield em.event("state_change", ptr, actor="harness", detail="set_messages",
                           state_digest=digest(["set_messages", common.get("step_index")]),
                           text=f"context replaced: {n} message(s)", **common)  # fmt: skip
        else:
            yield em.event("other", ptr, actor="harness", detail="set_metadata", text=json_text(patch)[:2000], **common)
        return
    mtype = str(m.get("type"))
    text = as_text(m.get("content"))
    if mtype == "user":
        yield em.event("message", ptr, actor="user", text=text, **common)
        return
    if mtype == "error":
        yield em.event("error", ptr, actor="harness", detail="gemini_error", text=text, **common)
        return
    if mtype in ("info", "warning"):
        yield em.event("other", ptr, actor="harness", detail=mtype, text=text, **common)
        return
    if mtype not in ("gemini", "model"):
        yield em.event("other", ptr, actor="harness", detail=f"unknown:{mtype}", text=json_text(m)[:2000], **common)
        return
    for k, th in enumerate(m.get("thoughts") or []):
        if isinstance(th, dict):
            body = "\n".join(x for x in (as_text(th.get("subject")), as_text(th.get("description"))) if x)
            yield em.event("message", f"{ptr}/thoughts/{k}", actor="assistant", detail="thinking", text=body, **common)
    if text or not m.get("toolCalls"):
        yield em.event("message", ptr if not m.get("thoughts") and not m.get("toolCalls") else f"{ptr}/content",
                       actor="assistant", text=text, **common)  # fmt: skip
    for k, tc in enumerate(m.get("toolCalls") or []):
        if isinstance(tc, dict):
            yield from _tool_events(em, f"{ptr}/toolCalls/{k}", tc, common)


def _tool_events(em: Emitter, ptr: str, tc: dict[str, Any], common: dict[str, Any]) -> Iterator[SourceEvent]:
    name = str(tc.get("name") or "tool")
    args = tc.get("args")
    argd = as_dict(args)
    tool, via, digest_ = name, None, args_digest(args)
    if name in _SHELL_TOOLS and isinstance(argd.get("command"), str | list):
        script = shell_command(argd["command"])
        # named after the command it runs (what the probes classify), digested over its commands
        tool, via, digest_ = command_tool(script) or name, name, command_digest(script, argd.get("directory"))
        shown = f"{name} {script}"
    else:
        shown = f"{name} {json_text(args)}"
    target = argd.get("file_path") or argd.get("absolute_path") or argd.get("path")
    call_id = tc.get("id")
    yield em.event("tool_call", ptr, actor="assistant", tool_name=tool, call_id=call_id, args_digest=digest_,
                   detail=via, text=shown, target=target if isinstance(target, str) else None, **common)  # fmt: skip
    out, where = _result(tc)
    status = tc.get("status")
    m = _EXIT.search(out[:4000])
    is_error: bool | None
    if status in ("error", "cancelled"):
        is_error = True
    elif m:
        is_error = int(m.group(1)) != 0
    else:
        is_error = None if status in (None, "success") else False
    if status == "success" and not m:
        is_error = None  # success is the call's, not the command's: let the output speak
    yield tool_result_event(em, f"{ptr}{where}", out, is_error=is_error, actor="environment", call_id=call_id,
                            detail=f"status={status}" if status else None, **common)  # fmt: skip


def _result(tc: dict[str, Any]) -> tuple[str, str]:
    """(output text, pointer suffix of the element it comes from) of one tool call."""
    for k, r in enumerate(tc.get("result") or []):
        resp = as_dict(as_dict(as_dict(r).get("functionResponse")).get("response"))
        if resp:
            val = resp.get("output", resp.get("error", resp))
            return (val if isinstance(val, str) else json.dumps(val, ensure_ascii=False)), f"/result/{k}"
    if "resultDisplay" in tc:
        return as_text(tc.get("resultDisplay")), "/resultDisplay"
    return "", ""


ADAPTER = Adapter(
    name=NAME,
    description="Google Gemini CLI chats (JSON with messages[] and toolCalls[], the JSONL form) and logs.json",
    sniff=sniff,
    discover=discover,
    read=read,
    score=score,
    detects="chats/session-*.json {sessionId, projectHash, messages[]}; JSONL with that header line; logs.json",
)
