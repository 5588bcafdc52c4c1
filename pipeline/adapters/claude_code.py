"""Claude Code logs: ``--output-format stream-json`` output and on-disk session JSONL.

stream-json (one object per line): ``system`` (``init``, ``api_retry``, ...), ``assistant``
(``message.content`` parts: ``thinking``, ``text``, ``tool_use``), ``user`` (``tool_result``
parts) and the final ``result`` (the agent's closing claim; cost and turns go to the sidecar).
Lines with ``parent_tool_use_id`` come from a sub-agent (actor ``subagent:<id>``).

On-disk sessions (``~/.claude/projects/.../<session>.jsonl``): records with ``uuid``,
``parentUuid``, ``sessionId``, ``timestamp``, ``type`` and ``message``. One cell per
``sessionId``: the main file plus its sub-agent files (``agent-*.jsonl``, ``isSidechain``),
merged by timestamp, each file its own session (``<sessionId>`` or ``<sessionId>/<agent>``).
Compaction (``system``/``compact_boundary``) becomes a ``state_change``; the compact summary a
message with ``detail = compact_summary``; ``/clear`` a ``state_change`` with ``detail = clear``.

Step index = 0-based record (non-blank line) number within its file, so (session, step) is
unique. Harbor trial folders (``<trial>/agent/claude-code.txt``) add verifier outcomes to the
sidecar. Terminal-Bench-1 tmux pane captures (hard-wrapped, mixed with debug output) are
copied but not read.
"""

from __future__ import annotations

import json
import re
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
from pipeline.adapters.harbor import trial_dir, trial_files, trial_outcome
from pipeline.adapters.spans import JsonFile
from pipeline.core.canonical import digest

NAME = "claude-code"


def sniff(rel: str, head: str) -> bool:
    """JSON Lines with Claude Code's record keys."""
    if not rel.endswith((".jsonl", ".txt", ".json")):
        return False
    first = head.split("\n", 1)[0]
    return ('"session_id"' in first and '"type"' in first) or ('"sessionId"' in first and '"parentUuid"' in first)


_INIT_OPENING = re.compile(r'\{\s*"type"\s*:\s*"system"\s*,\s*"subtype"\s*:\s*"init"\s*,')
_STREAM_TYPES = ("system", "assistant", "user", "result", "stream_event")


def score(rel: str, head: str) -> Score:
    """On-disk records (``sessionId`` + ``parentUuid``), or stream-json lines of Claude Code's own types.

    A line with ``session_id`` and some ``type`` is not enough: Codex CLI rollouts and other JSONL
    logs carry both. The type must be one of stream-json's, and ``init``'s tools or a
    ``message`` of the Anthropic shape must be there.
    """
    if not rel.endswith((".jsonl", ".txt", ".json")):
        return 0.0, ""
    lines = [ln for ln in head.split("\n")[:6] if ln.strip()]
    if any('"sessionId"' in ln and '"parentUuid"' in ln for ln in lines):
        return 0.9, "records with sessionId and parentUuid"
    first = _first_object(lines)
    if first is None and lines and _INIT_OPENING.match(lines[0]) and '"session_id"' in lines[0]:
        return 0.9, "a stream-json system/init line with session_id (longer than the sniffed head)"
    if first is None or "session_id" not in first:
        return 0.0, ""
    kind = first.get("type")
    if kind == "system" and first.get("subtype") == "init" and ("tools" in first or "model" in first):
        return 0.95, "stream-json system/init line with session_id"
    if kind in _STREAM_TYPES:
        msg = first.get("message")
        if isinstance(msg, dict) and "role" in msg:
            return 0.8, f"stream-json {kind} line with session_id and a message"
        return 0.4, f"a {kind} line with session_id"
    return 0.1, f"session_id and an unknown type {str(kind)[:30]!r}"


def _first_object(lines: list[str]) -> dict[str, Any] | None:
    if not lines:
        return None
    try:
        doc = json.loads(lines[0])
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _records(bundle: Path, rel: str) -> tuple[list[tuple[int, dict[str, Any]]], list[int]] | None:
    """(records, line numbers that are not records) of one log; None when the file is no Claude Code log."""
    try:
        jf = load_json(bundle / rel, 1)
    except (ValueError, UnicodeDecodeError):
        return None
    recs, other = _split_records(jf)
    if not recs or not all("session_id" in d or "sessionId" in d or d.get("type") == "summary" for _, d in recs):
        return None
    return recs, other


def _split_records(jf: JsonFile) -> tuple[list[tuple[int, dict[str, Any]]], list[int]]:
    # A record is an object with a "type"; anything else on a line ("oops", 42, [1], a cut-off
    # line) is left out and reported by line number, never read as a record.
    if not jf.jsonl:
        doc = jf.docs[0][1]
        return ([(1, doc)] if isinstance(doc, dict) and "type" in doc else []), []
    recs = [(ln or 0, d) for ln, d in jf.docs if isinstance(d, dict) and "type" in d]
    other = sorted(jf.bad_lines + [ln or 0 for ln, d in jf.docs if not (isinstance(d, dict) and "type" in d)])
    return recs, other


def discover(bundle: Path, paths: list[str]) -> Discovery:
    """One cell per stream-json file, and per on-disk sessionId (with its sub-agent files)."""
    cells: list[CellSource] = []
    skipped: list[tuple[str, str]] = []
    warnings: list[tuple[str, str]] = []
    aux: list[str] = []
    sessions: dict[str, list[tuple[str, bool, int]]] = {}
    for rel in paths:
        found = _records(bundle, rel) if rel.endswith((".jsonl", ".txt", ".json")) else None
        if found is None:
            reason = "tmux pane capture, not a log" if "/panes/" in rel else "not a Claude Code log"
            skipped.append((rel, reason))
            continue
        recs, other = found
        if other:
            warnings.append(skipped_lines_warning(rel, other, "Claude Code records"))
        if any("session_id" in d for _, d in recs):  # stream-json: one run per file
            trial = trial_dir(bundle, rel)
            out, texts, task = trial_outcome(bundle, trial)
            aux.extend(trial_files(bundle, trial))
            result = next((d for _, d in reversed(recs) if d.get("type") == "result"), None)
            if result is not None:
                if out.get("cost") is None and isinstance(result.get("total_cost_usd"), int | float):
                    out["cost"] = float(result["total_cost_usd"])
                out["result_subtype"] = result.get("subtype")
                out["num_turns"] = result.get("num_turns")
            else:
                out["result_subtype"] = None  # the stream ended without a result line (e.g. timeout)
            run = trial.name if trial else rel.removeprefix("raw/")
            cells.append(
                CellSource(
                    run_id=run,
                    task_id=task or (run.split("__")[0] if trial else PurePosixPath(rel).stem),
                    path=rel,
                    selector={"kind": "stream-json", "files": [[rel, None]]},
                    files=[rel],
                    harness="Claude Code",
                    step_index_base=0,
                    source_steps=len(recs),
                    outcome=out,
                    label_texts=texts,
                )
            )
            continue
        sid = next(str(d["sessionId"]) for _, d in recs if "sessionId" in d)
        side = all(bool(d.get("isSidechain")) for _, d in recs if d.get("type") in ("user", "assistant"))
        sessions.setdefault(sid, []).append((rel, side, len(recs)))
    for sid, files in sessions.items():
        files.sort(key=lambda f: (f[1], f[0]))  # main file first, then sub-agents
        main = files[0][0]
        spec = [[rel, None if not side else PurePosixPath(rel).stem] for rel, side, _ in files]
        cells.append(
            CellSource(
                run_id=sid,
                task_id=PurePosixPath(main).stem,
                path=main,
                selector={"kind": "session", "files": spec},
                files=[f[0] for f in files],
                harness="Claude Code",
                step_index_base=0,
                source_steps=sum(n for _, _, n in files),
                outcome={"label": None},
            )
        )
    return Discovery(cells=cells, skipped=skipped, harness="Claude Code", warnings=warnings, aux=aux)


def _message_events(
    em: Emitter, line: int | None, rec: dict[str, Any], step: int, actor: str, session: str, ts: str | None
) -> Iterator[SourceEvent]:
    msg = as_dict(rec.get("message"))
    role = str(msg.get("role") or rec.get("type"))
    content = msg.get("content")
    common: dict[str, Any] = {"line": line, "step_index": step, "session_id": session, "ts": ts}
    who = actor if role == "assistant" else (actor if actor.startswith("subagent:") and role == "user" else role)
    if rec.get("isCompactSummary"):
        yield em.event("message", "/message", actor="user", detail="compact_summary", text=as_text(content), **common)
        return
    if isinstance(content, str) or content is None:
        text = as_text(content)
        if "<command-name>/clear</command-name>" in text:
            yield em.event(
                "state_change",
                "/message",
                actor="user",
                detail="clear",
                state_digest=digest(["clear", step]),
                text=text,
                **common,
            )
            return
        yield em.event("message", "/message", actor=who, text=text, **common)
        return
    for k, part in enumerate(content):
        ptr = f"/message/content/{k}"
        ptype = part.get("type") if isinstance(part, dict) else None
        if ptype == "tool_use":
            name = part.get("name")
            args = part.get("input")
            yield em.event(
                "tool_call",
                ptr,
                actor=who,
                tool_name=name,
                call_id=part.get("id"),
                args_digest=args_digest(args),
                text=f"{name} {json_text(args)}",
                target=(args or {}).get("file_path") if isinstance(args, dict) else None,
                **common,
            )
        elif ptype == "tool_result":
            yield tool_result_event(
                em,
                ptr,
                as_text(part.get("content")),
                is_error=bool(part.get("is_error")) if "is_error" in part else None,
                actor="environment",
                call_id=part.get("tool_use_id"),
                **common,
            )
        elif ptype in ("thinking", "redacted_thinking"):
            yield em.event("message", ptr, actor=who, detail="thinking", text=as_text(part.get("thinking")), **common)
        else:
            yield em.event("message", ptr, actor=who, detail=ptype, text=as_text([part]), **common)


def _record_events(
    em: Emitter, line: int | None, rec: dict[str, Any], step: int, session: str, agent: str | None
) -> Iterator[SourceEvent]:
    rtype = rec.get("type")
    ts = rec.get("timestamp")
    parent = rec.get("parent_tool_use_id")
    actor = f"subagent:{agent}" if agent else (f"subagent:{parent}" if parent else "assistant")
    if rtype in ("assistant", "user"):
        events = list(_message_events(em, line, rec, step, actor, session, ts))
        if not events:  # an empty content list still is a step of the source
            events = [
                em.event("message", "/message", line=line, actor=actor, step_index=step, session_id=session, ts=ts)
            ]
        yield from events
        return
    common: dict[str, Any] = {"line": line, "step_index": step, "session_id": session, "ts": ts}
    sub = rec.get("subtype")
    if rtype == "result":
        yield em.event(
            "message",
            "/result" if "result" in rec else "",
            actor=actor,
            detail="result",
            text=as_text(rec.get("result")),
            **common,
        )
    elif rtype == "system" and sub == "compact_boundary":
        meta = rec.get("compactMetadata")
        yield em.event(
            "state_change",
            "",
            actor="harness",
            detail="compact_boundary",
            state_digest=digest(["compact", rec.get("uuid")]),
            text=as_text(rec.get("content")) or as_text(meta),
            **common,
        )
    elif rtype == "system" and sub == "api_retry":
        yield em.event(
            "error",
            "",
            actor="harness",
            detail="api_retry",
            text=as_text({k: v for k, v in rec.items() if k not in ("type", "subtype", "session_id", "uuid")}),
            **common,
        )
    else:
        body = (
            rec.get("content")
            if "content" in rec
            else {k: rec.get(k) for k in ("model", "cwd", "permissionMode", "claude_code_version") if k in rec}
        )
        yield em.event(
            "other", "", actor="harness", detail=f"{rtype}/{sub}" if sub else str(rtype), text=as_text(body), **common
        )


def read(bundle: Path, cell: dict[str, Any]) -> Iterator[SourceEvent]:
    """Events of one stream or session (sub-agent files merged in by timestamp)."""
    sel = cell.get("selector") or {}
    out: list[SourceEvent] = []
    for rel, agent in sel.get("files") or [[cell["path"], None]]:
        em = Emitter(bundle, rel, max_depth=4)
        recs, _ = _split_records(em.jf)  # the lines left out were reported at import
        for step, (line, rec) in enumerate(recs):
            sid = str(rec.get("session_id") or rec.get("sessionId") or "")
            session = f"{sid}/{agent}" if agent else sid
            out.extend(_record_events(em, line if em.jf.jsonl else None, rec, step, session, agent))
    if len(sel.get("files") or []) > 1 and all(e.ts for e in out):
        out.sort(key=lambda e: e.ts or "")  # stable: same-time records keep file order
    yield from out


ADAPTER = Adapter(
    name=NAME,
    description="Claude Code stream-json output and on-disk session JSONL (sub-agents, compaction, /clear)",
    sniff=sniff,
    score=score,
    detects="stream-json lines (system/init, assistant, user, result with session_id); sessionId + parentUuid JSONL",
    discover=discover,
    read=read,
)
