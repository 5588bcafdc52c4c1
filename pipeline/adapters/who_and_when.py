"""Who&When (Zhang et al., ICML 2025): one JSON document per failed multi-agent run.

Shape: ``{"history": [{"content", "role", "name"?}], "mistake_agent", "mistake_step" (string,
0-based index into history), "mistake_reason", "question", "question_ID", "ground_truth", ...}``.
Hand-Crafted files are Magentic-One (``role`` like ``"Orchestrator (thought)"``), Algorithm-Generated
files are CaptainAgent/AG2 (``name`` is the agent). A bare list of ``{content, role}`` (the AgentRx
copies of Magentic-One runs) reads the same way, without labels.

Step index = position in ``history`` (0-based, the labels' own numbering). Everything except
``history``, ``question``, ``question_ID``, ``level`` and ``system_prompt`` is an outcome label.
"""

from __future__ import annotations

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
    first_docs,
    flag_label,
    joined_harnesses,
)
from pipeline.adapters.chat_actions import ChatTurn, derive
from pipeline.adapters.contract import SourceEvent
from pipeline.adapters.spans import pointer
from pipeline.core.canonical import digest

NAME = "who-and-when"
_NOT_LABELS = {"history", "question", "question_ID", "level", "system_prompt"}
_ROLE = re.compile(r"^(?P<actor>[^()]+?)\s*\((?P<detail>.*)\)\s*$")
_MAGENTIC_ROLE = re.compile(r'"role":\s*"(?:Orchestrator|WebSurfer|FileSurfer|Coder|ComputerTerminal)\b')


def split_role(role: str) -> tuple[str, str | None, str | None]:
    """``"Orchestrator (-> WebSurfer)"`` -> (actor, detail, target); plain roles pass through."""
    m = _ROLE.match(role)
    if not m:
        return role, None, None
    detail = m.group("detail").strip()
    target = detail[2:].strip() if detail.startswith("->") else None
    return m.group("actor").strip(), detail, target


def agent_of(entry: dict[str, Any]) -> str:
    """The agent a history entry belongs to (``name`` when present, else the role's agent part)."""
    name = entry.get("name")
    if isinstance(name, str) and name:
        return name
    return split_role(str(entry.get("role", "")))[0]


def _history(doc: Any) -> tuple[list[Any], str]:
    if isinstance(doc, dict) and isinstance(doc.get("history"), list):
        return doc["history"], "/history"
    if isinstance(doc, list):
        return doc, ""
    return [], ""


def _is_history(items: list[Any]) -> bool:
    return bool(items) and all(isinstance(h, dict) and "content" in h and "role" in h for h in items)


def sniff(rel: str, head: str) -> bool:
    """A JSON document with a ``history`` list of {content, role} (or such a bare list)."""
    if not rel.endswith(".json"):
        return False
    start = head.lstrip()[:400]
    if start.startswith("{"):
        # The history may follow a long question, and the labels follow the history (past the
        # sniffed head in a long run, where the Magentic-One team's roles show instead).
        labelled = '"mistake_' in head or '"question' in head or '"is_correct' in head
        return '"history"' in head and (labelled or bool(_MAGENTIC_ROLE.search(head)))
    banned = ('"action"', '"observation"', '"trace"', '"traj"', '"tool_calls"', '"step_id"')
    if not (start.startswith("[") and '"content"' in start and '"role"' in start) or any(b in head for b in banned):
        return False
    # A bare message list is a Who&When-style copy only when Magentic-One's team speaks in it; any
    # other chat transcript is not claimed (auto then asks for --format instead of guessing).
    return bool(_MAGENTIC_ROLE.search(head))


def score(rel: str, head: str) -> Score:
    """A ``history`` with Who&When's labels, or a message list in which Magentic-One's team speaks."""
    if not sniff(rel, head):
        return 0.0, ""
    if '"mistake_' in head:
        return 0.9, "history with mistake_agent / mistake_step labels"
    return 0.7, "history of {content, role} in which Magentic-One's team speaks"


def discover(bundle: Path, paths: list[str]) -> Discovery:
    """One cell per file whose history is a list of {content, role}."""
    cells: list[CellSource] = []
    skipped: list[tuple[str, str]] = []
    for rel, doc in first_docs(bundle, paths, skipped, max_depth=2):
        items, _ = _history(doc)
        if not _is_history(items):
            skipped.append((rel, "no history list of {content, role}"))
            continue
        labels: dict[str, Any] = {}
        task_id = rel.rsplit("/", 1)[-1].removesuffix(".json")
        summary = ""
        if isinstance(doc, dict):
            labels = {k: v for k, v in doc.items() if k not in _NOT_LABELS}
            task_id = str(doc.get("question_ID") or task_id)
            summary = str(doc.get("question") or "")
        magentic = any(split_role(str(h.get("role")))[0] == "Orchestrator" for h in items)
        harness = "Magentic-One" if magentic else ("CaptainAgent (AG2)" if any("name" in h for h in items) else None)
        correct = labels.get("is_correct", labels.get("is_corrected"))
        outcome: dict[str, Any] = {
            "label": flag_label(correct),
            "quality": None if correct is None else (1.0 if correct else 0.0),
            **labels,
        }
        # Long label values only: a short ground truth ("8") legitimately occurs in any log.
        label_texts = [str(labels[k]) for k in ("mistake_reason", "ground_truth") if len(str(labels.get(k) or "")) > 20]
        cells.append(
            CellSource(
                run_id=rel.removeprefix("raw/").removesuffix(".json"),
                task_id=task_id,
                path=rel,
                files=[rel],
                harness=harness,
                task_summary=summary,
                step_index_base=0,
                source_steps=len(items),
                outcome=outcome,
                label_texts=label_texts,
                content_key=digest([task_id, items]),  # one log filed under two questions is two runs
                label_keys=[rel.rsplit("/", 1)[-1].removesuffix(".json"), task_id],
            )
        )
    return Discovery(cells=cells, skipped=skipped, harness=joined_harnesses(cells))


def read(bundle: Path, cell: dict[str, Any]) -> Iterator[SourceEvent]:
    """One event per history entry, in order (step_index = 0-based position), plus what the text shows.

    Executed code, executor results, browser / file actions, harness tracebacks and an agent's own
    "I cannot access ..." become tool-call / tool-result / error events inside their message
    (:mod:`pipeline.adapters.chat_actions`); an executor's reply is its tool result.
    """
    em = Emitter(bundle, cell["path"], max_depth=2)
    items, base = _history(em.doc())
    turns: list[ChatTurn] = []
    for i, h in enumerate(items):
        content = h.get("content")
        text = content if isinstance(content, str) else str(content)
        ptr = base + pointer(i) + ("/content" if isinstance(content, str) else "")
        turns.append(ChatTurn(step=i, actor=agent_of(h), text=text, ptr=ptr))
    extra, results = derive(em, turns)
    for i, h in enumerate(items):
        ptr = base + pointer(i)
        role = str(h.get("role", ""))
        actor = agent_of(h)
        _, detail, target = split_role(role)
        if "name" in h:  # AG2: role is user/assistant from the group chat's view, name is the agent
            detail = role
        if i in results:
            yield results[i]
            continue
        yield em.event("message", ptr, actor=actor, detail=detail, target=target, step_index=i, text=turns[i].text)
        yield from extra.get(i, [])


ADAPTER = Adapter(
    name=NAME,
    description="Who&When failure-attribution logs (JSON with history; labels mistake_agent/step/reason)",
    sniff=sniff,
    score=score,
    detects="*.json with history of {content, role} (mistake_* labels, Magentic-One roles)",
    discover=discover,
    read=read,
)
