"""OpenHands event streams.

Shapes: a JSON list of events (``tests/runtime/trajs``), and evaluation / resolver outputs (JSON
Lines, one record per run, events in ``history``). New-style events carry ``id``, ``timestamp``,
``source`` and either ``action`` or ``observation`` (``cause`` links an observation to its
action); old-style resolver events have only ``action`` / ``observation`` with their arguments
inline. Step index = the event ``id`` when present (0-based), else the position in the stream.

A run record's ``error`` (e.g. "Agent reached maximum iteration") is the harness's own log line
and becomes an ``error`` event; ``test_result``, ``report``, ``success``, ``metrics``,
``instance`` and the other record fields are outcomes (sidecar only).
"""

from __future__ import annotations

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
    flag_label,
    joined_harnesses,
    load_json,
    skipped_lines_warning,
    tool_result_event,
)
from pipeline.adapters.contract import SourceEvent
from pipeline.adapters.openhands_v1 import V1_KINDS, event_folders, is_v1_event, is_v1_stream, read_stream, v1_event
from pipeline.core.canonical import digest, sha256_text

NAME = "openhands"
_V1_KIND = re.compile(r'"kind":\s*"(?:' + "|".join(sorted(V1_KINDS)) + ')"')
_MESSAGE_ACTIONS = {"message", "system", "finish", "think", "recall"}
_NOT_LABELS = {"history", "instruction", "issue", "issue_type", "base_commit"}


def _is_event(e: Any) -> bool:
    return isinstance(e, dict) and ("action" in e or "observation" in e)


def _is_stream(items: Any) -> bool:
    return (isinstance(items, list) and bool(items) and all(_is_event(e) for e in items)) or is_v1_stream(items)


def sniff(rel: str, head: str) -> bool:
    """JSON(L) with OpenHands event keys, or an evaluation record (its metadata names the agent class)."""
    return rel.endswith((".json", ".jsonl")) and (
        ('"observation"' in head and '"action"' in head)
        # output.jsonl of OpenHands' benchmarks: the patch and instruction come first, the events
        # may start past the sniffed head; the record's metadata is OpenHands' own
        or ('"agent_class"' in head and '"history"' in head)
        or '"agent_state' in head
        or '"tool_call_metadata"' in head
        or bool(_V1_KIND.search(head))
    )


def score(rel: str, head: str) -> Score:
    """OpenHands' V1 event kinds, its evaluation records, or V0 action/observation events."""
    if not rel.endswith((".json", ".jsonl")):
        return 0.0, ""
    if _V1_KIND.search(head):
        return 0.9, "software-agent-sdk event kinds (ActionEvent, ObservationEvent, ...)"
    if '"agent_class"' in head and '"history"' in head:
        return 0.85, "evaluation record with agent_class and history"
    if '"tool_call_metadata"' in head:
        return 0.8, "events with tool_call_metadata"
    if '"agent_state' in head:
        return 0.7, "agent_state changes"
    if '"observation"' in head and '"action"' in head:
        return 0.6, "events with action and observation"
    return 0.0, ""


def discover(bundle: Path, paths: list[str]) -> Discovery:
    """One cell per event-stream file or per run record with a ``history`` stream."""
    cells: list[CellSource] = []
    skipped: list[tuple[str, str]] = []
    warnings: list[tuple[str, str]] = []
    folders = event_folders(paths)
    in_folders = {rel for files in folders.values() for _, rel in files}
    for folder, files in folders.items():
        cell = _folder_cell(bundle, folder, files, skipped)
        if cell is not None:
            cells.append(cell)
    for rel in paths:
        if rel in in_folders:
            continue
        if not rel.endswith((".json", ".jsonl")):
            skipped.append((rel, "not JSON"))
            continue
        try:
            jf = load_json(bundle / rel, 2)
        except (ValueError, UnicodeDecodeError):
            skipped.append((rel, "not valid JSON"))
            continue
        found = 0
        other = list(jf.bad_lines)
        v1_lines = [ln for ln, d in jf.docs if ln is not None and is_v1_event(d)]
        if jf.jsonl and v1_lines:  # JSON Lines with one V1 event per line: the file is the stream
            cells.append(_lines_cell(rel, len(v1_lines)))
            other = sorted(other + [ln or 0 for ln, d in jf.docs if not is_v1_event(d)])
            if other:
                warnings.append(skipped_lines_warning(rel, other, "OpenHands events"))
            continue
        for line, doc in jf.docs:
            records: list[tuple[str, Any]] = []
            if _is_stream(doc):
                records.append(("", doc))
            elif isinstance(doc, dict) and _is_stream(doc.get("history")):
                records.append(("/history", doc))
            elif isinstance(doc, dict) and is_v1_stream(doc.get("items")):
                records.append(("/items", doc))
            elif line is not None:
                other.append(line)
            for hptr, rec in records:
                found += 1
                stream = rec if not hptr else rec[hptr[1:]]
                meta = as_dict(rec)
                metrics = as_dict(meta.get("metrics"))
                cost = metrics.get("accumulated_cost")
                success = meta.get("success")
                labels = {k: v for k, v in meta.items() if k not in _NOT_LABELS and k != "items"}
                inst = meta.get("instance_id") or (meta.get("instance") or {}).get("instance_id")
                stem = rel.rsplit("/", 1)[-1].rsplit(".", 1)[0]
                run_id = rel.removeprefix("raw/") + (f"#L{line}" if line else "")
                texts = [as_text(labels[k]) for k in ("test_result", "report", "result_explanation") if labels.get(k)]
                cells.append(
                    CellSource(
                        run_id=run_id,
                        task_id=str(inst or (f"{stem}-{line}" if line else stem)),
                        path=rel,
                        selector={"line": line, "history": hptr},
                        files=[rel],
                        harness=_v1_harness(stream),
                        task_summary=as_text(meta.get("instruction"))[:500],
                        step_index_base=0,
                        source_steps=len(stream),
                        outcome={
                            "label": flag_label(success),
                            "cost": float(cost) if isinstance(cost, int | float) else None,
                            **labels,
                        },
                        label_texts=[t for t in texts if len(t) > 20],
                    )
                )
        if not found:
            skipped.append((rel, "no OpenHands event stream"))
        elif other:
            warnings.append(skipped_lines_warning(rel, sorted(other), "OpenHands run records"))
    return Discovery(cells=cells, skipped=skipped, harness=joined_harnesses(cells), warnings=warnings)


def _v1_harness(stream: list[Any]) -> str:
    return "OpenHands V1" if stream and is_v1_event(stream[0]) else "OpenHands"


def _lines_cell(rel: str, n: int) -> CellSource:
    stem = rel.rsplit("/", 1)[-1].rsplit(".", 1)[0]
    return CellSource(
        run_id=rel.removeprefix("raw/"),
        task_id=stem,
        path=rel,
        selector={"v1_lines": True},
        files=[rel],
        harness="OpenHands V1",
        step_index_base=0,
        source_steps=n,
        outcome={"label": None},
    )


def _folder_cell(
    bundle: Path, folder: str, files: list[tuple[int, str]], skipped: list[tuple[str, str]]
) -> CellSource | None:
    """One conversation persisted as one ``event-<n>-<id>.json`` file per event."""
    kept: list[list[Any]] = []
    for n, rel in files:
        try:
            doc = load_json(bundle / rel, 1).docs[0][1]
        except (ValueError, UnicodeDecodeError):
            skipped.append((rel, "not valid JSON"))
            continue
        if not is_v1_event(doc):
            skipped.append((rel, "not an OpenHands V1 event"))
            continue
        kept.append([rel, n])
    if not kept:
        return None
    conv = PurePosixPath(folder)
    conv_id = conv.parent.name if conv.name == "events" else conv.name
    return CellSource(
        run_id=f"{conv.parent if conv.name == 'events' else conv}".removeprefix("raw/") or conv_id,
        task_id=conv_id,
        path=str(kept[0][0]),
        selector={"event_files": kept},
        files=[str(r) for r, _ in kept],
        harness="OpenHands V1",
        step_index_base=0,
        source_steps=len(kept),
        outcome={"label": None},
    )


def _action_event(em: Emitter, ptr: str, e: dict[str, Any], step: int, line: int | None) -> SourceEvent:
    action = str(e.get("action"))
    args = as_dict(e.get("args")) if isinstance(e.get("args"), dict) else {k: v for k, v in e.items() if k != "action"}
    meta = as_dict(e.get("tool_call_metadata"))
    actor = str(e.get("source") or "agent")
    thought = as_text(args.get("thought"))
    common: dict[str, Any] = {"ts": e.get("timestamp"), "actor": actor, "step_index": step, "detail": action}
    if action == "change_agent_state":
        state = str(args.get("agent_state"))
        return em.event("state_change", ptr, line=line, state_digest=digest(state), text=state, **common)
    if action in _MESSAGE_ACTIONS:
        body = as_text(args.get("content")) or as_text(e.get("message")) or thought
        if action == "finish" and not body:
            body = as_text(args.get("final_thought")) or as_text(args.get("outputs"))
        return em.event("message" if action != "recall" else "other", ptr, line=line, text=body, **common)
    call_args = {k: v for k, v in args.items() if k not in ("thought", "is_confirmed", "keep_prompt", "action_risk")}
    shown = as_text(call_args.get("command") or call_args.get("code") or call_args.get("path") or call_args)
    text = "\n".join(t for t in (thought, shown) if t)
    return em.event(
        "tool_call",
        ptr,
        line=line,
        tool_name=meta.get("function_name") or action,
        call_id=meta.get("tool_call_id") or (str(e["id"]) if "id" in e else None),
        args_digest=args_digest(call_args),
        text=text,
        target=call_args.get("path") if isinstance(call_args.get("path"), str) else None,
        **common,
    )


def _observation_event(em: Emitter, ptr: str, e: dict[str, Any], step: int, line: int | None) -> SourceEvent:
    obs = str(e.get("observation"))
    extras = as_dict(e.get("extras"))
    meta = as_dict(e.get("tool_call_metadata"))
    common: dict[str, Any] = {
        "ts": e.get("timestamp"),
        "actor": str(e.get("source") or "environment"),
        "step_index": step,
    }
    content = as_text(e.get("content"))
    if obs == "agent_state_changed":
        state = str(extras.get("agent_state"))
        kind = "error" if state == "error" else "state_change"
        return em.event(kind, ptr, line=line, detail=obs, state_digest=digest(state), text=state, **common)
    if obs == "error":
        return em.event("error", ptr, line=line, detail=obs, text=content or as_text(e.get("message")), **common)
    if obs in ("null", "recall"):
        return em.event("other", ptr, line=line, detail=obs, text=content or as_text(e.get("message")), **common)
    exit_code = (extras.get("metadata") or {}).get("exit_code") if isinstance(extras.get("metadata"), dict) else None
    if exit_code is None:
        exit_code = e.get("exit_code", extras.get("exit_code"))
    failed = None if exit_code is None else (str(exit_code) not in ("0", "-1"))
    cause = e.get("cause")
    return tool_result_event(
        em,
        ptr,
        content,
        is_error=failed,
        line=line,
        detail=obs,
        tool_name=meta.get("function_name") or obs,
        call_id=meta.get("tool_call_id") or (str(cause) if cause is not None else None),
        **common,
    )


def read(bundle: Path, cell: dict[str, Any]) -> Iterator[SourceEvent]:
    """Events of one stream, in stream order."""
    sel = cell.get("selector") or {}
    if sel.get("event_files"):
        for step, (rel, _n) in enumerate(sel["event_files"]):
            one = Emitter(bundle, rel, max_depth=3)
            yield v1_event(one, "", one.doc(), step, None)
        return
    em = Emitter(bundle, cell["path"], max_depth=3)
    if sel.get("v1_lines"):
        events = [(ln, d) for ln, d in em.jf.docs if ln is not None and is_v1_event(d)]
        for step, (ln, d) in enumerate(events):
            yield v1_event(em, "", d, step, ln)
        return
    line = sel.get("line")
    doc = em.doc(line)
    hptr = str(sel.get("history") or "")
    stream = doc[hptr[1:]] if hptr else doc
    if is_v1_stream(stream):
        yield from read_stream(em, stream, hptr, line)
        if hptr and isinstance(doc, dict) and doc.get("error"):
            yield _run_error(em, doc, line, None)
        return
    last_ts: str | None = None
    for i, e in enumerate(stream):
        ptr = f"{hptr}/{i}"
        last_ts = e.get("timestamp") or last_ts
        step = int(e["id"]) if str(e.get("id", "")).isdigit() else i
        if "action" in e:
            yield _action_event(em, ptr, e, step, line)
        else:
            yield _observation_event(em, ptr, e, step, line)
    if hptr and doc.get("error"):
        yield _run_error(em, doc, line, last_ts)


def _run_error(em: Emitter, doc: dict[str, Any], line: int | None, ts: str | None) -> SourceEvent:
    err = as_text(doc["error"])
    fields: dict[str, Any] = {"actor": "harness", "detail": "run_error", "text": err, "result_digest": sha256_text(err)}
    return em.event("error", "/error", line=line, ts=ts, **fields)


ADAPTER = Adapter(
    name=NAME,
    description="OpenHands event streams (runtime trajectories, evaluation and resolver outputs)",
    sniff=sniff,
    score=score,
    detects="V0 event lists (action/observation), eval/resolver output.jsonl, V1 sdk events (kind: ...Event)",
    discover=discover,
    read=read,
)
