"""Deterministic checks for foreign logs, where the probes' controller-state evidence is missing.

The probes (:mod:`pipeline.probes`) only claim "nothing changed" when the IR carries controller
state; most public formats carry none, so these weaker checks fill in for evaluation:

* ``repeated_tool_call``: the same tool with the same arguments digest called twice or more;
* ``repeated_message``: one actor sending the same (whitespace-normalised, >= 40 chars) text again;
* ``error_result``: tool results that failed or printed an error, harness errors;
* ``step_cap``: the run hit an iteration / step / cost cap (the harness says so in the log);
* ``success_claim_failing_verifier``: the agent's last word claims success while the sidecar's
  verifier / reward says 0. The outcome is read here, at evaluation time only; it never reaches
  an event or a Luna prompt.

Each check returns, per cell, the evidence event ids.
"""

from __future__ import annotations

import re
from typing import Any

from pipeline.eval.events import USER_ACTORS, Event

CHECKS = ("repeated_tool_call", "repeated_message", "error_result", "step_cap", "success_claim_failing_verifier")
STEP_CAP = re.compile(
    r"maximum iteration|max(?:imum)?[ _]?(?:turns|steps|iterations) (?:reached|exceeded)|reached the maximum|"
    r"Executing step (\d+)/\1\b|exit_cost|step limit|"
    r"(?:message|token|turn|time|working|cost) limit (?:exceeded|reached)",  # Inspect's sample limits
    re.IGNORECASE,
)
_SUCCESS = re.compile(
    r"\b(done|completed?|success(?:ful(?:ly)?)?|fixed|solved|resolved|all tests pass(?:ed)?|task is complete)\b",
    re.IGNORECASE,
)


def _repeats(events: list[Event], key_of: Any) -> list[str]:
    groups: dict[Any, list[str]] = {}
    for e in events:
        key = key_of(e)
        if key is not None:
            groups.setdefault(key, []).append(e.event_id)
    return [eid for ids in groups.values() if len(ids) > 1 for eid in ids]


def _tool_key(e: Event) -> tuple[str | None, str] | None:
    return (e.tool_name, e.args_digest) if e.kind == "tool_call" and e.args_digest else None


def _message_key(e: Event) -> tuple[str | None, str] | None:
    text = " ".join(e.text.split())
    return (e.actor, text) if e.kind == "message" and len(text) >= 40 else None


def verifier_failed(outcome: dict[str, Any]) -> bool:
    """True when the outcome's verifier / reward / quality says the run failed (0)."""
    for key in ("verifier_reward", "reward_txt", "reward", "quality"):
        value = outcome.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value) <= 0.0
    return False


def final_claim(events: list[Event]) -> Event | None:
    """The agent's last message, when it claims success."""
    agent_msgs = [e for e in events if e.kind == "message" and (e.actor or "").lower() not in USER_ACTORS]
    if agent_msgs and _SUCCESS.search(agent_msgs[-1].text[-2000:]):
        return agent_msgs[-1]
    return None


def run_checks(events: list[Event], outcome: dict[str, Any]) -> dict[str, list[str]]:
    """Evidence event ids per check for one cell (checks that found nothing are left out)."""
    found: dict[str, list[str]] = {
        "repeated_tool_call": _repeats(events, _tool_key),
        "repeated_message": _repeats(events, _message_key),
        "error_result": [e.event_id for e in events if e.kind == "error"],
        "step_cap": [e.event_id for e in events if e.kind != "tool_call" and STEP_CAP.search(e.text)],
    }
    claim = final_claim(events)
    if claim is not None and verifier_failed(outcome):
        found["success_claim_failing_verifier"] = [claim.event_id]
    return {k: v for k, v in found.items() if v}


def summarise(per_cell: dict[str, dict[str, list[str]]]) -> dict[str, dict[str, Any]]:
    """Per check: how many cells, which, and the first evidence event of each."""
    out: dict[str, dict[str, Any]] = {}
    for check in CHECKS:
        cells = {c: ev[check][0] for c, ev in sorted(per_cell.items()) if check in ev}
        out[check] = {"cells": len(cells), "first_evidence": cells}
    return out
