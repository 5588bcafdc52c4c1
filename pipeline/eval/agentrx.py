"""AgentRx labels: every failure step, its category and agent, and which failure is the root cause.

The sidecar's ``agentrx`` block (joined at import from AgentRx ground-truth files) holds
``failures: [{failure_id, step_number, failure_category, failed_agent, ...}]`` and
``root_cause: {failure_id}``. AgentRx numbers steps from 1 (one step per message, or the tau-bench
message ``index``); the IR's ``step_index_base`` of each cell maps its steps onto that numbering.

Scores per prediction source, over the labelled cells (no prediction counts as wrong):

* root-cause step: exact, within ±1, within ±3;
* any failure step (AgentRx's own step metric: the distance to the *nearest* labelled failure):
  exact, within ±1, within ±3;
* agent: the predicted step's actor against the root cause's ``failed_agent``;
* category precision and recall per category (root-cause category), for sources that predict one:
  the deterministic ``baseline_error_category`` maps the first error onto the taxonomy (a tool's
  error result -> Invalid Invocation; a harness / API error -> System Failure). Weakness cards and
  probes carry no AgentRx category and are reported as such.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pipeline.eval.events import Event
from pipeline.eval.predict import Prediction, normalise_agent
from pipeline.eval.stats import precision_recall, with_rates

LABEL_BASE = 1
INVALID_INVOCATION = "Invalid Invocation"
SYSTEM_FAILURE = "System Failure"
_HARNESS_ERRORS = {"api_retry", "run_error", "agent_error", "conversation_error", "harness_traceback", "sample_error"}


@dataclass(frozen=True)
class Gold:
    """One labelled run: the root cause's step, agent and category, and every failure step."""

    root_step: int | None
    steps: tuple[int, ...]
    agent: str
    category: str


def normalise_category(name: str | None) -> str:
    """Categories compare without case, spaces and punctuation ("Instruction/Plan Adherence Failure")."""
    return re.sub(r"[^a-z0-9]+", "", (name or "").lower())


def gold_of(extra: dict[str, Any]) -> Gold | None:
    """The labels of one cell's ``agentrx`` sidecar block (None when it has none usable)."""
    block = extra.get("agentrx")
    if not isinstance(block, dict):
        return None
    failures = [f for f in block.get("failures") or [] if isinstance(f, dict)]
    steps = tuple(int(f["step_number"]) for f in failures if isinstance(f.get("step_number"), int))
    if not steps:
        return None
    root_id = (block.get("root_cause") or {}).get("failure_id")
    root = next((f for f in failures if f.get("failure_id") == root_id), failures[0])
    step = root.get("step_number")
    return Gold(
        root_step=step if isinstance(step, int) else None,
        steps=steps,
        agent=str(root.get("failed_agent") or ""),
        category=str(root.get("failure_category") or ""),
    )


def score(gold: dict[str, Gold], preds: dict[str, Prediction], offsets: dict[str, int]) -> dict[str, Any]:
    """Step and agent scores of one source; ``offsets[cell]`` = IR step numbering minus AgentRx's."""
    n = len(gold)
    counts = dict.fromkeys(("root_exact", "root_within_1", "root_within_3", "any_exact", "any_within_1"), 0)
    counts |= {"any_within_3": 0, "agent": 0}
    missing: list[str] = []
    for cell, g in sorted(gold.items()):
        p = preds.get(cell)
        if p is None:
            missing.append(cell)
            continue
        counts["agent"] += normalise_agent(p.agent) == normalise_agent(g.agent)
        if p.step is None:
            continue
        step = p.step - offsets.get(cell, 0)
        if g.root_step is not None:
            d = abs(step - g.root_step)
            counts["root_exact"] += d == 0
            counts["root_within_1"] += d <= 1
            counts["root_within_3"] += d <= 3
        near = min(abs(step - s) for s in g.steps)
        counts["any_exact"] += near == 0
        counts["any_within_1"] += near <= 1
        counts["any_within_3"] += near <= 3
    return {
        "labelled": n,
        "predicted": n - len(missing),
        "no_prediction": len(missing),
        "no_prediction_cells": missing,
        **counts,
        **with_rates(counts, n),
    }


def baseline_error_category(events: list[Event]) -> str | None:
    """The AgentRx category the first error suggests: a tool's error -> Invalid Invocation, harness -> System."""
    first = next((e for e in events if e.kind == "error"), None)
    if first is None:
        return None
    if (first.actor or "").lower() == "harness" or (first.detail or "") in _HARNESS_ERRORS:
        return SYSTEM_FAILURE
    return INVALID_INVOCATION


def score_categories(gold: dict[str, Gold], preds: dict[str, str | None] | None) -> dict[str, Any]:
    """Per root-cause category: precision and recall (with standard errors) over the labelled cells."""
    if preds is None:
        return {"available": False}
    names: dict[str, str] = {}
    for g in gold.values():
        names.setdefault(normalise_category(g.category), g.category)
    for c, p in preds.items():
        if c in gold and p:
            names.setdefault(normalise_category(p), p)
    per: dict[str, Any] = {}
    for key, shown in sorted(names.items(), key=lambda kv: kv[1]):
        tp = sum(
            1 for c, g in gold.items() if normalise_category(g.category) == key == normalise_category(preds.get(c))
        )
        fp = sum(
            1 for c, g in gold.items() if normalise_category(preds.get(c)) == key != normalise_category(g.category)
        )
        fn = sum(
            1 for c, g in gold.items() if normalise_category(g.category) == key != normalise_category(preds.get(c))
        )
        per[shown] = precision_recall(tp, fp, fn)
    return {"available": True, "cells_with_prediction": sum(1 for c in gold if preds.get(c)), "categories": per}
