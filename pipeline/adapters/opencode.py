"""OpenCode storage trees: one JSON file per session, message and part.

Layouts read (``~/.local/share/opencode/``):

- 0.6+ / 1.x: ``storage/session/<project>/<ses>.json``, ``storage/message/<ses>/<msg>.json``,
  ``storage/part/<msg>/<prt>.json`` (and ``storage/session_diff/<ses>.json``: the session's file
  changes, an outcome);
- up to 0.5: ``project/<slug>/storage/session/info/<ses>.json``, ``…/session/message/<ses>/<msg>.json``,
  ``…/session/part/<ses>/<msg>/<prt>.json``; messages that hold their ``parts`` inline are read too.

Files are recognised by content (ids ``ses_`` / ``msg_`` / ``prt_``, ``sessionID`` / ``messageID``),
not by where they sit. One cell per session: its messages in creation order, each message's parts in
id order. Parts: ``text`` (a message; ``synthetic`` ones say so in ``detail``), ``reasoning``
(thinking), ``tool`` (a ``tool_call`` from ``state.input``, then by ``state.status``: ``completed``
→ ``tool_result`` from ``state.output`` (``error`` when ``metadata.exit`` is not 0), ``error`` →
``error`` from ``state.error``; ``pending`` / ``running`` → no result, the call stands alone),
``agent`` / ``subtask`` (handoffs), ``snapshot`` / ``compaction`` (state changes), ``retry`` (an API
error), ``patch`` (an artifact), ``step-start`` / ``step-finish`` / ``file`` (other). A message's
own ``error`` is an ``error`` event; a message with no parts is one ``other`` event. A part type this
adapter does not know is an ``other`` event, counted in one warning. Costs, tokens, finish reasons
and the session's diff summary go to the sidecar.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
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
)
from pipeline.adapters.contract import SourceEvent
from pipeline.core.canonical import digest, sha256_text

NAME = "opencode"
_SESSION_KEYS = ("title", "version", "directory", "parentID")
_KNOWN_PARTS = {
    "text",
    "reasoning",
    "tool",
    "agent",
    "subtask",
    "snapshot",
    "compaction",
    "retry",
    "patch",
    "step-start",
    "step-finish",
    "file",
}


def score(rel: str, head: str) -> tuple[float, str]:
    """How sure the head of a file is an OpenCode storage file (0..1) and why."""
    if not rel.endswith(".json"):
        return 0.0, "not a .json file"
    flat = head.replace(" ", "")
    if '"id":"prt_' in flat and '"messageID":"msg_' in flat:
        return 0.95, "a part: prt_ id with its messageID"
    if '"id":"msg_' in flat and '"sessionID":"ses_' in flat and '"role"' in flat:
        return 0.9, "a message: msg_ id, role and sessionID"
    if '"id":"ses_' in flat and '"version"' in flat and '"time"' in flat and '"title"' in flat:
        return 0.85, "a session: ses_ id with version, title and time"
    if rel.split("/")[-2:-1] == ["session_diff"] and head.lstrip().startswith("["):
        return 0.6, "a session_diff file beside OpenCode storage"
    return 0.0, "no ses_/msg_/prt_ records"


def sniff(rel: str, head: str) -> bool:
    """An OpenCode session, message or part file."""
    return score(rel, head)[0] >= 0.5


def _doc(bundle: Path, rel: str) -> Any:
    try:
        jf = load_json(bundle / rel, 1, rel)
    except (ValueError, UnicodeDecodeError):
        return None
    return jf.docs[0][1] if not jf.jsonl else None


def _kind(doc: Any) -> str | None:
    if not isinstance(doc, dict) or not isinstance(doc.get("id"), str):
        return None
    i = doc["id"]
    if i.startswith("prt") and "type" in doc:
        return "part"
    if i.startswith("msg") and "role" in doc:
        return "message"
    if i.startswith("ses") and "time" in doc and "role" not in doc:
        return "session"
    return None


def _index(bundle: Path, paths: list[str]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """Sessions, messages by session and parts by message, from files recognised by content."""
    sessions: dict[str, str] = {}
    messages: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    parts: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    diffs: dict[str, str] = {}
    skipped: list[tuple[str, str]] = []
    for rel in paths:
        if not rel.endswith(".json"):
            skipped.append((rel, "not an OpenCode JSON file"))
            continue
        doc = _doc(bundle, rel)
        kind = _kind(doc)
        if kind == "session":
            sessions[doc["id"]] = rel
        elif kind == "message":
            messages.setdefault(str(doc.get("sessionID") or ""), []).append((rel, doc))
        elif kind == "part":
            parts.setdefault(str(doc.get("messageID") or ""), []).append((rel, doc))
        elif isinstance(doc, list) and rel.split("/")[-2:-1] == ["session_diff"]:
            diffs[rel.rsplit("/", 1)[-1].removesuffix(".json")] = rel
        else:
            skipped.append((rel, "not an OpenCode session, message or part"))
    return {"sessions": sessions, "messages": messages, "parts": parts, "diffs": diffs}, skipped


def _msg_key(item: tuple[str, dict[str, Any]]) -> tuple[int, str]:
    t = as_dict(item[1].get("time")).get("created")
    return (t if isinstance(t, int) else 0, str(item[1].get("id")))


def discover(bundle: Path, paths: list[str]) -> Discovery:
    """One cell per session (a session file, or messages naming a session without one)."""
    idx, skipped = _index(bundle, paths)
    warnings: list[tuple[str, str]] = []
    cells: list[CellSource] = []
    aux: list[str] = []
    for sid in sorted(set(idx["sessions"]) | {s for s in idx["messages"] if s}):
        srel = idx["sessions"].get(sid)
        msgs = sorted(idx["messages"].get(sid, []), key=_msg_key)
        if srel is None and not msgs:
            continue
        info = as_dict(_doc(bundle, srel)) if srel else {}
        files = ([srel] if srel else []) + [m for m, _ in msgs]
        steps = 1 if srel else 0  # as read() numbers them: the session, each part, each message's own event
        unknown: Counter[str] = Counter()
        for _, m in msgs:
            ps = idx["parts"].get(str(m["id"]), [])
            files += [p for p, _ in ps]
            inline = m.get("parts") if isinstance(m.get("parts"), list) else []
            steps += len(ps) + len(inline) + (1 if m.get("error") or not (ps or inline) else 0)
            for d in [d for _, d in ps] + [as_dict(x) for x in inline]:
                if d.get("type") not in _KNOWN_PARTS:
                    unknown[str(d.get("type"))] += 1
        if unknown:
            shown = ", ".join(f"{t} ×{n}" for t, n in unknown.most_common(5))
            what = f"{sum(unknown.values())} part(s) of unknown type read as other events ({shown})"
            warnings.append((files[0], f"session {sid}: {what}"))
        diff = idx["diffs"].get(sid)
        if diff:
            aux.append(diff)
        version = info.get("version")
        first_user = next((m for _, m in msgs if m.get("role") == "user"), None)
        title = str(info.get("title") or "")
        cells.append(
            CellSource(
                run_id=sid,
                task_id=sid,
                path=files[0],
                selector={"session": sid, "parent": info.get("parentID")},
                files=files,
                harness=f"OpenCode {version}" if version else "OpenCode",
                task_summary=title[:200],
                step_index_base=0,
                source_steps=steps,
                outcome=_outcome(info, [m for _, m in msgs], _doc(bundle, diff) if diff else None, first_user),
            )
        )
    claimed = {f for c in cells for f in c.files} | set(aux)
    skipped += [(p, "OpenCode file of no session here") for p in paths if p.endswith(".json") and p not in claimed
                and all(p != s for s, _ in skipped)]  # fmt: skip
    harness = " + ".join(sorted({c.harness for c in cells if c.harness})) or "OpenCode"
    return Discovery(cells=cells, skipped=skipped, harness=harness, warnings=warnings, aux=aux)


def _outcome(
    info: dict[str, Any], msgs: list[dict[str, Any]], diff: Any, first_user: dict[str, Any] | None
) -> dict[str, Any]:
    """Cost, tokens, finish reasons, errors and the session's file changes: sidecar only."""
    assistants = [m for m in msgs if m.get("role") == "assistant"]
    tokens = [as_dict(m.get("tokens")) for m in assistants]
    out: dict[str, Any] = {
        "label": None,
        "cost": sum(float(m.get("cost") or 0) for m in assistants) if assistants else None,
        "input_tokens": sum(int(t.get("input") or 0) for t in tokens) or None,
        "output_tokens": sum(int(t.get("output") or 0) for t in tokens) or None,
        "finish": [m.get("finish") for m in assistants if m.get("finish")],
        "message_errors": sum(1 for m in assistants if m.get("error")),
        "last_assistant_completed": bool(assistants and as_dict(assistants[-1].get("time")).get("completed")),
        "summary": info.get("summary"),
    }
    if isinstance(diff, list):
        out["diff_files"] = [as_dict(d).get("file") for d in diff]
    if first_user is not None:
        out["agent"] = first_user.get("agent")
    return out


def _ts(ms: Any) -> str | None:
    if not isinstance(ms, int | float) or isinstance(ms, bool):
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(ms) % 1000:03d}Z"


def _part_events(
    em: Emitter, base: str, part: dict[str, Any], common: dict[str, Any], actor: str
) -> Iterator[SourceEvent]:
    ptype = str(part.get("type"))
    # Every event of a message carries the message's creation time: part and tool times are
    # stamped when each part is finalised (a streamed text after the tool call it preceded), so
    # they would not keep the parts' order; the raw part still holds them.
    c = common
    if ptype == "text":
        detail = "synthetic" if part.get("synthetic") else ("ignored" if part.get("ignored") else "text")
        yield em.event("message", f"{base}/text" if "text" in part else base, actor=actor, detail=detail,
                       text=as_text(part.get("text")), **c)  # fmt: skip
    elif ptype == "reasoning":
        yield em.event("message", f"{base}/text" if "text" in part else base, actor=actor, detail="thinking",
                       text=as_text(part.get("text")), **c)  # fmt: skip
    elif ptype == "tool":
        yield from _tool_events(em, base, part, common, actor)
    elif ptype in ("agent", "subtask"):
        name = str(part.get("name") or part.get("agent") or "")
        yield em.event("handoff", base, actor=actor, target=f"agent:{name}", detail=ptype,
                       text=as_text(part.get("prompt") or part.get("description") or name), **c)  # fmt: skip
    elif ptype in ("snapshot", "compaction"):
        yield em.event("state_change", base, actor="harness", detail=ptype, text=json_text(part),
                       state_digest=digest([ptype, part.get("snapshot") or part.get("id")]), **c)  # fmt: skip
    elif ptype == "retry":
        yield em.event("error", base, actor="harness", detail="retry", text=json_text(part.get("error") or part), **c)
    elif ptype == "patch":
        files: list[Any] = part["files"] if isinstance(part.get("files"), list) else []
        yield em.event("artifact", base, actor=actor, detail="patch", text="\n".join(str(f) for f in files),
                       result_digest=str(part.get("hash") or digest(files)), **c)  # fmt: skip
    else:
        detail = ptype if ptype in _KNOWN_PARTS else f"unknown:{ptype}"
        yield em.event("other", base, actor=actor if ptype != "step-finish" else "harness", detail=detail,
                       text=json_text({k: v for k, v in part.items() if k not in ("id", "sessionID", "messageID")}),
                       **c)  # fmt: skip


def _tool_events(
    em: Emitter, base: str, part: dict[str, Any], common: dict[str, Any], actor: str
) -> Iterator[SourceEvent]:
    state = as_dict(part.get("state"))
    name = str(part.get("tool") or "")
    args = state.get("input")
    call_id = part.get("callID") or part.get("id")
    target = None
    if isinstance(args, dict):
        target = next((str(args[k]) for k in ("filePath", "path", "file_path") if isinstance(args.get(k), str)), None)
    yield em.event("tool_call", f"{base}/state/input" if "input" in state else base, actor=actor, tool_name=name,
                   call_id=call_id, args_digest=args_digest(args), target=target, detail=state.get("status"),
                   text=f"{name} {args if isinstance(args, str) else json_text(args)}", **common)  # fmt: skip
    status = state.get("status")
    end = common
    if status == "completed":
        out = as_text(state.get("output"))
        exit_code = as_dict(state.get("metadata")).get("exit")
        failed = isinstance(exit_code, int) and not isinstance(exit_code, bool) and exit_code != 0
        detail = f"exit_code={exit_code}" if isinstance(exit_code, int) else None
        yield em.event("error" if failed else "tool_result", f"{base}/state/output" if "output" in state else base,
                       actor="environment", call_id=call_id, tool_name=name, text=out, result_digest=sha256_text(out),
                       detail=f"tool_error {detail}" if failed else detail, **end)  # fmt: skip
    elif status == "error":
        err = as_text(state.get("error"))
        yield em.event("error", f"{base}/state/error" if "error" in state else base, actor="environment",
                       call_id=call_id, tool_name=name, text=err, result_digest=sha256_text(err), detail="tool_error",
                       **end)  # fmt: skip


def read(bundle: Path, cell: dict[str, Any]) -> Iterator[SourceEvent]:
    """Events of one session: its messages in creation order, each message's parts in id order."""
    files = list(cell.get("files") or [cell["path"]])
    sid = str((cell.get("selector") or {}).get("session") or "")
    msgs: list[tuple[str, dict[str, Any]]] = []
    parts: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    srel = None
    for rel in files:
        doc = _doc(bundle, rel)
        kind = _kind(doc)
        if kind == "session":
            srel = rel
        elif kind == "message":
            msgs.append((rel, doc))
        elif kind == "part":
            parts.setdefault(str(doc.get("messageID")), []).append((rel, doc))
    step = 0
    if srel is not None:
        info = as_dict(_doc(bundle, srel))
        em = Emitter(bundle, srel, max_depth=2)
        yield em.event("other", "", actor="harness", detail="session", step_index=step, session_id=sid,
                       ts=_ts(as_dict(info.get("time")).get("created")),
                       text=json_text({k: info.get(k) for k in _SESSION_KEYS if k in info}))  # fmt: skip
        step += 1
    for mrel, m in sorted(msgs, key=_msg_key):
        role = str(m.get("role") or "")
        agent = m.get("agent") or m.get("mode")
        actor = "user" if role == "user" else (f"assistant:{agent}" if agent else role)
        common: dict[str, Any] = {"session_id": sid, "ts": _ts(as_dict(m.get("time")).get("created"))}
        own = sorted(parts.get(str(m["id"]), []), key=lambda p: str(p[1].get("id")))
        inline = m.get("parts") if isinstance(m.get("parts"), list) else []
        n = 0
        for prel, p in own:
            em = Emitter(bundle, prel, max_depth=3)
            for ev in _part_events(em, "", p, {**common, "step_index": step}, actor):
                n += 1
                yield ev
            step += 1
        if inline:
            em = Emitter(bundle, mrel, max_depth=4)
            for k, p in enumerate(inline):
                for ev in _part_events(em, f"/parts/{k}", as_dict(p), {**common, "step_index": step}, actor):
                    n += 1
                    yield ev
                step += 1
        err = m.get("error")
        if err:
            em = Emitter(bundle, mrel, max_depth=2)
            e = as_dict(err)
            text = as_text(as_dict(e.get("data")).get("message")) or as_text(e.get("name")) or json_text(err)
            done = _ts(as_dict(m.get("time")).get("completed")) or common["ts"]  # after the message's parts
            yield em.event("error", "/error", actor="harness", detail=f"message_error:{e.get('name') or ''}", text=text,
                           step_index=step, session_id=sid, ts=done)  # fmt: skip
            n += 1
        if n == 0:  # a message whose parts never arrived (a crash mid-turn) is still a record
            em = Emitter(bundle, mrel, max_depth=2)
            yield em.event("other", "", actor=actor, detail=f"{role} message without parts", step_index=step,
                           text=json_text({k: m.get(k) for k in ("modelID", "providerID", "finish") if k in m}),
                           **common)  # fmt: skip
        if err or n == 0:
            step += 1


ADAPTER = Adapter(
    name=NAME,
    description="OpenCode storage trees: session / message / part JSON files (tool parts with their state)",
    sniff=sniff,
    discover=discover,
    read=read,
    score=score,
    detects="storage/{session,message,part}/…/*.json with ses_/msg_/prt_ ids (and the 0.5 project/<slug> layout)",
)
