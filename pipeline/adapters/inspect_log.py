"""Inspect AI eval logs: ``.json`` logs and ``.eval`` zip logs.

A log holds ``eval`` (task, model, ...), ``status`` and ``samples``; a ``.eval`` zip holds
``header.json`` and one ``samples/<id>_epoch_<n>.json`` member per sample. One cell per sample
(id, epoch). Events are the sample's ``messages`` in order (step index = 0-based message
position): system / user / assistant messages, assistant ``tool_calls`` (one ``tool_call`` each)
and ``tool`` messages (``error`` when the message has an ``error``, else ``tool_result``). A
sample-level ``error`` is a harness ``error`` event.

Refs into a ``.eval`` name the zip file as the source (its sha256 is in the manifest) and the
member in the JSON pointer: ``/samples/1_epoch_1.json!/messages/3``, with the member's own line
numbers. ``target``, ``scores``, ``output``, ``metadata`` and ``store`` go to the sidecar only.
A log without samples (e.g. cancelled before any ran) is listed as skipped.
"""

from __future__ import annotations

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
    json_text,
    load_json,
    score_label,
    tool_result_event,
)
from pipeline.adapters.contract import SourceEvent
from pipeline.adapters.spans import JsonFile
from pipeline.core.canonical import canonical_json, sha256_text
from pipeline.core.limits import parse_json, read_member
from pipeline.core.zips import ZIP_ERRORS, open_zip

NAME = "inspect"
_LABEL_KEYS = (
    "target",
    "scores",
    "output",
    "metadata",
    "store",
    "model_usage",
    "total_time",
    "working_time",
    "error_retries",
)


def sniff(rel: str, head: str) -> bool:
    """A ``.eval`` zip, or JSON with Inspect's top-level keys."""
    if rel.endswith(".eval"):
        return head.startswith("PK")
    return rel.endswith(".json") and '"eval"' in head and '"version"' in head and '"status"' in head


def score(rel: str, head: str) -> Score:
    """An ``.eval`` zip, or JSON with Inspect's ``eval``/``version``/``status``."""
    if rel.endswith(".eval"):
        return (0.95, ".eval zip") if head.startswith("PK") else (0.0, "")
    if not sniff(rel, head):
        return 0.0, ""
    if '"eval"' in head and ('"task"' in head or '"task_id"' in head):
        return 0.85, "top-level eval (with task), version and status"
    return 0.6, "top-level eval, version and status"


class _MemberEmitter(Emitter):
    """An Emitter over one JSON member of a zip; pointers carry the member name."""

    def __init__(self, bundle: Path, rel: str, member: str) -> None:
        self.rel = rel
        self.member = member
        with open_zip(bundle / rel) as zf:
            where = f"{rel} member {member}"
            self.jf = JsonFile(read_member(zf, member, rel).decode("utf-8"), max_depth=5, source=where)

    def ref_pointer(self, ptr: str) -> str | None:
        """``/member!pointer``: the zip file is the source, the member and pointer say where in it."""
        return f"/{self.member}!{ptr}"


# Inspect's score value constants (inspect_ai.scorer: CORRECT, INCORRECT, PARTIAL, NOANSWER) and the
# words its value_to_float accepts; any other string is a label without a number (kept, quality None).
_SCORE_WORDS = {"C": 1.0, "I": 0.0, "P": 0.5, "N": 0.0, "yes": 1.0, "no": 0.0, "true": 1.0, "false": 0.0}


def score_value(value: Any) -> float | None:
    """A scorer's value as a number, as Inspect's ``value_to_float`` reads it (None when it is no number)."""
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        word = value.strip()
        if word in _SCORE_WORDS or word.lower() in _SCORE_WORDS:
            return _SCORE_WORDS.get(word, _SCORE_WORDS.get(word.lower()))
        try:
            return float(word)
        except ValueError:
            return None
    return None


def _scorers(scores: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every scorer: its value as written and as a number (a dict value: one number per key)."""
    out: dict[str, dict[str, Any]] = {}
    for name, s in scores.items():
        if not isinstance(s, dict):
            continue
        value = s.get("value")
        if isinstance(value, dict):
            number: Any = {k: score_value(v) for k, v in value.items()}
        elif isinstance(value, list):
            number = [score_value(v) for v in value]
        else:
            number = score_value(value)
        out[str(name)] = {"value": value, "quality": number}
    return out


def sample_limit(sample: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """(pointer, limit record) of the limit that stopped the sample, if one did.

    The ``sample_limit`` event (with its message) when the log has events, else the sample's
    ``limit`` field (``{"type": "message", "limit": 10}``).
    """
    for k, ev in enumerate(sample.get("events") or []):
        if isinstance(ev, dict) and ev.get("event") == "sample_limit":
            return f"/events/{k}", ev
    limit = sample.get("limit")
    return ("/limit", limit) if isinstance(limit, dict) else None


def _sample_outcome(sample: dict[str, Any], log_status: str | None) -> tuple[dict[str, Any], list[str]]:
    labels = {k: sample[k] for k in _LABEL_KEYS if k in sample}
    scores = as_dict(sample.get("scores"))
    scorers = _scorers(scores)
    # quality: the first scorer's number (Inspect lists the task's main scorer first)
    first = next(iter(scorers.values()), {}).get("quality")
    quality = first if isinstance(first, float) else None
    label = score_label(quality)
    error = sample.get("error")
    if error:
        label = "workflow_failed"  # the sample did not finish: a failed run, whatever was scored
    limit = sample_limit(sample)
    # The serialised scorer output must never reach events (its explanation may quote the answer,
    # and a correct answer contains the target, so those alone are no leak test).
    texts = [canonical_json(scores)] if scores else []
    out = {
        "label": label,
        "quality": quality,
        "log_status": log_status,
        **labels,
        "scorers": scorers,
    }
    if error:
        out["error"] = as_dict(error).get("message") or as_text(error)
    if limit is not None:
        out["limit"] = {"type": limit[1].get("type"), "limit": limit[1].get("limit")}
    return out, texts


def discover(bundle: Path, paths: list[str]) -> Discovery:
    """One cell per sample of every log."""
    cells: list[CellSource] = []
    skipped: list[tuple[str, str]] = []
    task_names: set[str] = set()  # kept apart: a sample id may hold "-" (task_id is "<task>-<id>")
    for rel in paths:
        samples: list[tuple[dict[str, Any], dict[str, Any]]] = []  # (selector, sample)
        if rel.endswith(".eval"):
            try:
                with open_zip(bundle / rel) as zf:
                    names = zf.namelist()
                    # Streamed and bounded (a zip bomb is refused at the limit), too deep is one clear line.
                    header = {}
                    if "header.json" in names:
                        header = parse_json(read_member(zf, "header.json", rel), f"{rel} member header.json")
                    for name in sorted(n for n in names if n.startswith("samples/") and n.endswith(".json")):
                        sample = parse_json(read_member(zf, name, rel), f"{rel} member {name}")
                        samples.append(({"member": name}, sample))
            except (*ZIP_ERRORS, KeyError, ValueError) as exc:
                skipped.append((rel, f"unreadable .eval zip ({exc})"))
                continue
        elif rel.endswith(".json"):
            try:
                header = load_json(bundle / rel, 3).docs[0][1]
            except (ValueError, UnicodeDecodeError):
                skipped.append((rel, "not valid JSON"))
                continue
            if not (isinstance(header, dict) and "eval" in header):
                skipped.append((rel, "not an Inspect log"))
                continue
            samples = [({"index": i}, s) for i, s in enumerate(header.get("samples") or [])]
        else:
            skipped.append((rel, "not an Inspect log"))
            continue
        ev = header.get("eval") or {}
        if not samples:
            skipped.append((rel, f"log has no samples (status {header.get('status')})"))
            continue
        task = str(ev.get("task") or "inspect-task")
        task_names.add(task)
        harness = f"inspect {task} ({ev.get('model')})"
        for sel, sample in samples:
            sid = f"{sample.get('id')}-epoch{sample.get('epoch', 1)}"
            out, texts = _sample_outcome(sample, header.get("status"))
            cells.append(
                CellSource(
                    run_id=f"{rel.removeprefix('raw/')}#{sid}",
                    task_id=f"{task}-{sample.get('id')}",
                    path=rel,
                    selector=sel,
                    files=[rel],
                    harness=harness,
                    task_summary=as_text(sample.get("input"))[:500],
                    step_index_base=0,
                    source_steps=len(sample.get("messages") or []),
                    outcome=out,
                    label_texts=texts,
                )
            )
    tasks = sorted(task_names)
    shown = ", ".join(tasks[:4]) + (f" and {len(tasks) - 4} more" if len(tasks) > 4 else "")
    return Discovery(cells=cells, skipped=skipped, harness=f"Inspect AI ({shown})" if cells else None)


def read(bundle: Path, cell: dict[str, Any]) -> Iterator[SourceEvent]:
    """Events of one sample's messages."""
    sel = cell.get("selector") or {}
    if "member" in sel:
        em: Emitter = _MemberEmitter(bundle, cell["path"], str(sel["member"]))
        sample = em.jf.docs[0][1]
        base = ""
    else:
        em = Emitter(bundle, cell["path"], max_depth=6)
        base = f"/samples/{int(sel['index'])}"
        sample = em.doc()["samples"][int(sel["index"])]
    for j, m in enumerate(sample.get("messages") or []):
        ptr = f"{base}/messages/{j}"
        role = str(m.get("role") or "")
        text = as_text(m.get("content"))
        if role == "tool":
            err = m.get("error")
            yield tool_result_event(
                em,
                ptr,
                text
                if not err
                else f"{text}\n[{err.get('type')}] {err.get('message')}"
                if isinstance(err, dict)
                else text,
                is_error=bool(err) if err is not None else None,
                actor="tool",
                step_index=j,
                tool_name=m.get("function"),
                call_id=m.get("tool_call_id"),
                detail=err.get("type") if isinstance(err, dict) else None,
            )
            continue
        calls = m.get("tool_calls") or []
        if text or not calls:
            yield em.event("message", ptr, actor=role, step_index=j, text=text, detail=m.get("source"))
        for k, call in enumerate(calls):
            args = call.get("arguments")
            name = call.get("function")
            yield em.event(
                "tool_call",
                f"{ptr}/tool_calls/{k}",
                actor=role,
                step_index=j,
                tool_name=name,
                call_id=call.get("id"),
                args_digest=args_digest(args),
                text=f"{name}({json_text(args)})",
            )
    limit = sample_limit(sample)
    if limit is not None:
        # What stopped the sample (message / token / time / working / cost limit): an event, so the
        # step-cap check and Luna see it; the sample_limit event's own message when there is one.
        ptr, rec = limit
        kind = as_text(rec.get("type")) or "unknown"
        text = as_text(rec.get("message") or rec.get("reason")) or f"{kind} limit reached ({rec.get('limit')})"
        yield em.event(
            "error", f"{base}{ptr}", actor="harness", detail=f"{kind}_limit", text=text, result_digest=sha256_text(text)
        )
    if sample.get("error"):
        error = sample["error"]
        # the message, not Inspect's traceback (tens of kB of the harness's own frames)
        err = as_text(error.get("message") or error) if isinstance(error, dict) else as_text(error)
        yield em.event(
            "error", f"{base}/error", actor="harness", detail="sample_error", text=err, result_digest=sha256_text(err)
        )


ADAPTER = Adapter(
    name=NAME,
    description="Inspect AI logs (.json and .eval zip; one cell per sample)",
    sniff=sniff,
    score=score,
    detects="*.eval zips; *.json with top-level eval, version, status",
    discover=discover,
    read=read,
)
