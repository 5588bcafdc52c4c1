"""tau-bench run records: ``{task_id, reward, info, traj: [OpenAI chat messages], trial}``.

A file holds one record or a list of them (tau-bench's results files); one cell per record.
``traj`` messages have ``role`` (system/user/assistant/tool), ``content``, assistant
``tool_calls`` (``function.arguments`` a JSON string or an object) and tool ``tool_call_id`` /
``name``. AgentRx copies carry a 1-based ``index`` per message: then the step index is that
``index`` (base 1), else the position in ``traj`` (base 0).

Labels: ``reward`` and ``info`` (the task's ground-truth actions, the user simulator's
instruction, ``reward_info``) go to the sidecar only; events carry only ``traj``.
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
    joined_harnesses,
    json_text,
    score_label,
    tool_result_event,
)
from pipeline.adapters.contract import SourceEvent
from pipeline.adapters.spans import pointer
from pipeline.core.canonical import canonical_json, digest

NAME = "tau"


def _is_record(doc: Any) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get("traj"), list) and "task_id" in doc


def _records(doc: Any) -> list[tuple[str, dict[str, Any]]]:
    if _is_record(doc):
        return [("", doc)]
    if isinstance(doc, list):
        return [(pointer(i), r) for i, r in enumerate(doc) if _is_record(r)]
    return []


def sniff(rel: str, head: str) -> bool:
    """A JSON record with ``traj`` and ``task_id``."""
    return rel.endswith(".json") and '"traj"' in head and '"task_id"' in head


def score(rel: str, head: str) -> Score:
    """A run record with ``traj`` and ``task_id`` (``reward`` makes it sure)."""
    if not sniff(rel, head):
        return 0.0, ""
    return (
        (0.85, "records with traj, task_id and reward")
        if '"reward"' in head
        else (0.6, "records with traj and task_id")
    )


def _base(traj: list[Any]) -> int:
    idx = [m.get("index") for m in traj if isinstance(m, dict)]
    return 1 if idx and all(isinstance(i, int) for i in idx) and idx[0] == 1 else 0


def discover(bundle: Path, paths: list[str]) -> Discovery:
    """One cell per run record."""
    cells: list[CellSource] = []
    skipped: list[tuple[str, str]] = []
    for rel, doc in first_docs(bundle, paths, skipped, max_depth=3):
        recs = _records(doc)
        if not recs:
            skipped.append((rel, "no tau-bench record (traj + task_id)"))
            continue
        for ptr, rec in recs:
            info = rec.get("info") or {}
            env = "retail" if "retail" in canonical_json(rec["traj"][:1]).lower() else None
            if env is None and "airline" in canonical_json(rec["traj"][:1]).lower():
                env = "airline"
            reward = rec.get("reward")
            quality = None if reward is None else float(reward)
            labels = {k: v for k, v in rec.items() if k != "traj"}
            task = info.get("task") if isinstance(info, dict) else None
            label_texts = [canonical_json(info.get("reward_info"))] if isinstance(info, dict) else []
            if isinstance(task, dict) and task.get("instruction"):
                label_texts.append(str(task["instruction"]))
            cells.append(
                CellSource(
                    # Not the file name: upstream names can state the failure category (a label).
                    run_id=f"{env or 'tau'}-task{rec['task_id']}-trial{rec.get('trial', 0)}{ptr.replace('/', '-')}",
                    task_id=f"{env or 'tau'}-{rec['task_id']}",
                    path=rel,
                    selector={"pointer": ptr},
                    files=[rel],
                    harness=f"tau-bench {env}" if env else "tau-bench",
                    step_index_base=_base(rec["traj"]),
                    source_steps=len(rec["traj"]),
                    outcome={"label": score_label(quality), "quality": quality, **labels},
                    label_texts=label_texts,
                    content_key=digest([str(rec["task_id"]), rec["traj"]]),
                    label_keys=[str(rec["task_id"])],
                )
            )
    return Discovery(cells=cells, skipped=skipped, harness=joined_harnesses(cells))


def _args(fn: dict[str, Any]) -> Any:
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            return json.loads(args)
        except json.JSONDecodeError:
            return args
    return args


def read(bundle: Path, cell: dict[str, Any]) -> Iterator[SourceEvent]:
    """Events of one record's ``traj``: messages, tool calls (one per call) and tool results."""
    em = Emitter(bundle, cell["path"], max_depth=5)
    base = str(cell.get("selector", {}).get("pointer", ""))
    rec = em.doc()
    for tok in [t for t in base.split("/") if t]:
        rec = rec[int(tok)]
    traj = rec["traj"]
    one_based = cell.get("step_index_base") == 1
    for i, m in enumerate(traj):
        ptr = f"{base}/traj/{i}"
        step = int(m["index"]) if one_based else i
        role = str(m.get("role", ""))
        text = as_text(m.get("content"))
        if role == "tool":
            yield tool_result_event(
                em,
                ptr,
                text,
                is_error=None,
                actor="tool",
                step_index=step,
                tool_name=m.get("name"),
                call_id=m.get("tool_call_id"),
            )
            continue
        calls = m.get("tool_calls") or []
        if text or not calls:
            yield em.event("message", ptr, actor=role, step_index=step, text=text)
        for j, call in enumerate(calls):
            fn = call.get("function") or {}
            args = _args(fn)
            name = fn.get("name")
            yield em.event(
                "tool_call",
                f"{ptr}/tool_calls/{j}",
                actor=role,
                step_index=step,
                tool_name=name,
                call_id=call.get("id"),
                args_digest=args_digest(args),
                text=f"{name}({json_text(args)})",
            )


ADAPTER = Adapter(
    name=NAME,
    description="tau-bench run records (OpenAI chat messages with tool_calls; reward/info as labels)",
    sniff=sniff,
    score=score,
    detects="*.json records {task_id, reward, info, traj, trial}",
    discover=discover,
    read=read,
)
