"""The report's "Asks" section: each ``lunasol ask`` of the run, counted per outcome and task, every "yes" linked.

A seam of its own: :func:`asks_section` reads the run's asks (``pipeline.ask.summary``) and returns
what the template block ``asks.html.j2`` shows, plus the event ids its answers cite, which the report
resolves with the rest of its evidence so each one is a link to its raw lines. Answers listed are
capped per ask (:data:`ANSWER_ROWS`); the counts always cover every cell.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.ask.summary import ask_ids, headline, summarise
from pipeline.gates import gate1

ANSWER_ROWS = 200
"""Answers listed per ask in the page (with their cited events); the rest: ``lunasol show RUN ASK_ID``."""


@dataclass
class AsksSection:
    """What the Asks block shows, and the event ids it cites (resolved with the report's evidence)."""

    asks: list[dict[str, Any]] = field(default_factory=list)
    cited: set[str] = field(default_factory=set)


def _shown_values(s: dict[str, Any]) -> list[str]:
    """The answers a reviewer looks for: supports/contradicts of a card, yes of a yes-no, every choice."""
    ask = s["ask"]
    if ask["answer_kind"] == "number":
        return []
    if ask.get("weakness_id"):
        return ["supports", "contradicts"]
    return ["yes"] if ask["answer_kind"] == "yes-no" else list(ask["choices"] or [])


def _quiet(s: dict[str, Any]) -> set[str]:
    # The uneventful answer, not listed cell by cell (it is in the counts).
    ask = s["ask"]
    return {"no"} if ask["answer_kind"] == "yes-no" else {"neither"} if ask.get("weakness_id") else set()


def _cited(run_dir: Path) -> dict[str, Any] | None:
    """The ask the standing gate-1 decision cites (``confirm --ask``): who decided, when, on which digest."""
    ids = ask_ids(run_dir)
    if not ids:
        return None
    receipt = gate1.standing(run_dir, gate1.GATE1)
    if receipt is None or receipt.ask is None:
        return None
    return {"ask_id": receipt.ask.ask_id, "digest": receipt.ask.digest, "by": receipt.by,
            "at": receipt.decided_at, "operation_id": receipt.operation_id}  # fmt: skip


def asks_section(run_dir: Path) -> AsksSection:
    """Every ask of the run, ready for the template (empty when the run has none)."""
    out = AsksSection()
    cited = _cited(run_dir)
    for ask_id in ask_ids(run_dir):
        s = summarise(run_dir, ask_id)
        quiet = _quiet(s)
        listed = [a for a in s["answers"] if a["status"] == "ok" and a["answer"] not in quiet]
        failed = [a for a in s["answers"] if a["status"] != "ok"]
        shown = listed[:ANSWER_ROWS]
        for a in shown:
            out.cited.update(a["evidence"])
        out.asks.append(
            {
                "head": headline(s),
                "shown": _shown_values(s),
                "overall": s["overall"],
                "by_outcome": s["by_outcome"],
                "by_task": s["by_task"],
                "answers": shown,
                "more": len(listed) - len(shown),
                "failed": failed[:ANSWER_ROWS],
                "where": s["ask"].get("where_sql"),
                # The gate-1 decision that cites this ask, and whether its answers are still those it read.
                "cited": None
                if cited is None or cited["ask_id"] != ask_id
                else {**cited, "same": cited["digest"] == s["digest"]},
                "model": s["ask"].get("model"),
            }
        )
    return out
