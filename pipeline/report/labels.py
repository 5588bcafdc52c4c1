"""Human labels for the fields of a run's cards, shared by the HTML report and ``lunasol show``.

A reader deciding at a gate should read "First divergence", not ``first_divergence``; a field
this table does not know is still shown, with its name turned into words.
"""

from __future__ import annotations

LABELS: dict[str, str] = {
    # weakness cards
    "statement": "Statement",
    "confidence": "Confidence",
    "first_divergence": "First divergence",
    "where": "Where",
    "what": "What happens",
    "actor": "Actor",
    "stage": "Stage",
    "harness_attribution": "Attributed to the harness?",
    "attributed": "Attributed",
    "why": "Why",
    "support": "Support",
    "counts": "Counts",
    "counter_evidence": "Counter-evidence",
    "items": "Items",
    "none_reason": "Why there is none",
    "alternative_explanations": "Other explanations",
    "counterfactual_prediction": "Falsifiable prediction",
    "event_refs": "Events",
    "pattern_groups": "Pattern groups",
    "cells": "Cells",
    "tasks": "Task families",
    "runs": "Runs",
    "cell": "Cell",
    "note": "Note",
    "refs": "Refs",
    # patterns and groups
    "type": "Pattern type",
    "concerns": "Concerns",
    "observed": "Observed",
    "definition_fit": "Why it fits the definition",
    "evidence": "Evidence",
    "state_changed": "State changed?",
    "candidates": "Probe candidates",
    "probe_hits": "Probe hits",
    "origin": "Origin",
    "overruled": "Overruled",
    "occurrences": "Occurrences",
    "negatives": "In successful cells",
    "collapsed_lines": "Collapsed duplicate lines",
    # proposals
    "parent_harness": "Parent harness",
    "source_weakness": "From weakness",
    "summary": "Summary",
    "affected_tasks": "Affected task families",
    "affected_runs": "Affected runs",
    "observed_impact": "Observed impact",
    "root_cause": "Root cause",
    "hypothesis": "Hypothesis",
    "strategy_change": "Strategy change",
    "current_strategy": "Current strategy",
    "proposed_strategy": "Proposed strategy",
    "rationale": "Rationale",
    "expected_effect": "Expected effect",
    "behavioral_change": "Behavioural change",
    "targeted_pattern_change": "Targeted pattern change",
    "expected_metrics": "Expected metrics",
    "rejection_conditions": "Rejection conditions",
    "regression_risks": "Regression risks",
    "quality": "Quality",
    "completion": "Completion",
    "cost": "Cost",
    "stability": "Stability",
    # receipts
    "decision": "Decision",
    "decisions": "Decisions",
    "by": "Decided by",
    "decided_at": "Decided at",
    "base_revision": "From revision",
    "new_revision": "To revision",
    "operation_id": "Operation id",
    "subject": "Decided on",
    "artifact": "Artifact",
    "digest": "Digest",
    "userRootCauseConfirmation": "Root-cause confirmation",
    "proposalGeneration": "Proposal generation",
    "proposalSelection": "Proposal selection",
}

# The order a reader wants; every other field follows in name order.
WEAKNESS_ORDER = (
    "statement",
    "first_divergence",
    "harness_attribution",
    "support",
    "counter_evidence",
    "alternative_explanations",
    "counterfactual_prediction",
)
PROPOSAL_ORDER = (
    "source_weakness",
    "parent_harness",
    "root_cause",
    "strategy_change",
    "expected_effect",
    "evidence",
    "rejection_conditions",
    "regression_risks",
)
PATTERN_ORDER = ("type", "confidence", "concerns", "observed", "definition_fit", "evidence")


def label(name: str) -> str:
    """The human label of a field (unknown names become words: ``foo_bar`` -> "Foo bar")."""
    if name in LABELS:
        return LABELS[name]
    words = name.replace("_", " ").replace("-", " ").strip()
    return words[:1].upper() + words[1:] if words else name


def ordered(keys: list[str], order: tuple[str, ...]) -> list[str]:
    """``keys`` with those in ``order`` first (in that order), the rest sorted."""
    first = [k for k in order if k in keys]
    return first + sorted(k for k in keys if k not in order)
