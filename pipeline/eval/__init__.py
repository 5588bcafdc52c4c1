"""``lunasol eval``: score a run's findings against the human labels in its outcome sidecar.

Decisive-step labels (Who&When: ``mistake_step``, 0-based, and ``mistake_agent``): per
prediction source, exact step accuracy, within ±1 and ±3, agent accuracy, and the labelled cells
with no prediction (listed, never dropped: they count as wrong in every accuracy). Steps match
exactly as integers in the labels' numbering, never by substring.

Failure-mode labels (MAST: annotators' votes, 2-of-3 majority per mode): per source and mode,
precision and recall over the labelled cells.

Every report also carries ``checks``: the foreign-data deterministic checks of
:mod:`pipeline.eval.checks` over all eligible cells (labelled or not).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb

from pipeline.adapters import cell_block
from pipeline.artifacts.rundir import RunDir
from pipeline.core import duck
from pipeline.core.errors import BadInput
from pipeline.eval import agentrx
from pipeline.eval.checks import run_checks, summarise
from pipeline.eval.events import Event
from pipeline.eval.predict import (
    PROBE_MODES,
    Prediction,
    baseline_first_error,
    baseline_first_error_cause,
    baseline_first_step,
    baseline_last_step,
    from_probe_hits,
    from_weakness_cards,
    load_events,
    mode_checks,
    normalise_agent,
    read_json_field,
)
from pipeline.eval.stats import precision_recall, with_rates
from pipeline.ir.export import run_bundle

LABEL_FORMATS = ("who-and-when", "mast", "agentrx")
# Where a step label lies by position alone: printed beside every source so that nobody takes a
# positional effect (the last step is often the decisive one) for analysis.
POSITIONAL = ("baseline_first_step", "baseline_last_step")
# Deterministic step pickers every label source is scored against (report keys, in report order).
BASELINES = {
    "baseline_first_error": baseline_first_error,
    "baseline_first_error_cause": baseline_first_error_cause,
    "baseline_first_step": baseline_first_step,
    "baseline_last_step": baseline_last_step,
}
__all__ = ["LABEL_FORMATS", "evaluate", "normalise_agent", "score_steps"]


def score_steps(labels: dict[str, tuple[int, str]], preds: dict[str, Prediction], offset: int = 0) -> dict[str, Any]:
    """Decisive-step scores of one source. ``offset`` maps IR step numbers onto the labels' numbering."""
    n = len(labels)
    exact = within1 = within3 = agent_ok = 0
    missing: list[str] = []
    no_step: list[str] = []
    for cell, (step, agent) in sorted(labels.items()):
        p = preds.get(cell)
        if p is None:
            missing.append(cell)
            continue
        if normalise_agent(p.agent) == normalise_agent(agent):
            agent_ok += 1
        if p.step is None:
            no_step.append(cell)
            continue
        d = abs((p.step - offset) - step)
        exact += d == 0
        within1 += d <= 1
        within3 += d <= 3

    counts = {"exact": exact, "within_1": within1, "within_3": within3, "agent": agent_ok}
    return {
        "labelled": n,
        "predicted": n - len(missing),
        "no_prediction": len(missing),
        "no_prediction_cells": missing,
        "prediction_without_step": no_step,
        **counts,
        **with_rates(counts, n),
    }


def score_modes(labels: dict[str, set[str]], preds: dict[str, set[str]] | None) -> dict[str, Any]:
    """Per-mode precision / recall over the labelled cells (None where undefined)."""
    if preds is None:
        return {"available": False}
    modes = sorted({m for s in labels.values() for m in s} | {m for c, s in preds.items() if c in labels for m in s})
    per: dict[str, Any] = {}
    for m in modes:
        tp = sum(1 for c in labels if m in labels[c] and m in preds.get(c, set()))
        fp = sum(1 for c in labels if m not in labels[c] and m in preds.get(c, set()))
        fn = sum(1 for c in labels if m in labels[c] and m not in preds.get(c, set()))
        per[m] = precision_recall(tp, fp, fn)
    return {"available": True, "cells_with_prediction": sum(1 for c in labels if preds.get(c)), "modes": per}


def _positional(sources: dict[str, Any], metrics: tuple[str, ...]) -> dict[str, Any]:
    """The positional baselines' rates (with n and standard error), to print beside every source."""
    out: dict[str, Any] = {}
    for name in POSITIONAL:
        s = sources.get(name) or {}
        out[name] = {"labelled": s.get("labelled")} | {
            f"{m}_{k}": s.get(f"{m}_{k}") for m in metrics for k in ("acc", "se")
        }
    return out


def _int_or_zero(value: Any) -> int:
    return value if isinstance(value, int) else 0


def _agentrx(
    con: duckdb.DuckDBPyConnection,
    eligible: set[str],
    outcomes: dict[str, dict[str, Any]],
    events: dict[str, list[Event]],
    cards: dict[str, Prediction],
    cards_status: str,
    probes: dict[str, Prediction],
    probe_status: str,
) -> dict[str, Any]:
    """Report parts for AgentRx labels (see :mod:`pipeline.eval.agentrx`)."""
    gold = {c: g for c in sorted(eligible) if (g := agentrx.gold_of(outcomes.get(c, {}))) is not None}
    bases = dict(con.execute("SELECT cell_id, step_index_base FROM cells").fetchall())
    # Per cell: a mixed bundle holds 0-based (message position) and 1-based (tau index) cells.
    offsets = {c: _int_or_zero(bases.get(c)) - agentrx.LABEL_BASE for c in gold}
    sources: dict[str, tuple[dict[str, Prediction], str]] = {
        "weakness_cards": (cards, cards_status),
        "probe_hits": (probes, probe_status),
        **{
            name: ({c: p for c in gold if (p := baseline(events.get(c, [])))}, "deterministic")
            for name, baseline in BASELINES.items()
        },
    }
    categories: dict[str, dict[str, str | None] | None] = {
        "weakness_cards": None,
        "probe_hits": None,
        "baseline_error_category": {c: agentrx.baseline_error_category(events.get(c, [])) for c in gold},
    }
    scored = {
        name: {"status": status, **agentrx.score(gold, preds, offsets)} for name, (preds, status) in sources.items()
    }
    metrics = ("root_exact", "root_within_1", "any_exact", "any_within_1", "agent")
    return {
        "labelled_cells": len(gold),
        "label_step_base": agentrx.LABEL_BASE,
        "sources": scored,
        "positional": _positional(scored, metrics),
        "categories": {
            name: {
                "status": "deterministic (first error: tool error -> Invalid Invocation, harness -> System Failure)"
                if preds is not None
                else "carries no AgentRx category",
                **agentrx.score_categories(gold, preds),
            }
            for name, preds in categories.items()
        },
    }


def _offset(con: duckdb.DuckDBPyConnection, run_dir: Path, label_base: int) -> int:
    """IR step numbering minus the labels' numbering (0 when the IR does not say)."""
    bases = {r[0] for r in con.execute("SELECT DISTINCT step_index_base FROM cells").fetchall() if r[0] is not None}
    if len(bases) == 1:
        return int(next(iter(bases))) - label_base
    try:  # IR written before step_index_base was filled: ask the bundle's request
        bundle = run_bundle(run_dir)
        cell = con.execute("SELECT cell_id FROM cells LIMIT 1").fetchone()
        base = cell_block(bundle, cell[0]).get("step_index_base") if cell else None
        return int(base) - label_base if isinstance(base, int) else 0
    except Exception:
        return 0


def evaluate(run_dir: Path, labels: str) -> dict[str, Any]:
    """Scores of every prediction source against the run's sidecar labels (see module doc)."""
    if labels not in LABEL_FORMATS:
        raise BadInput(
            f"unknown label format {labels!r}; known: {', '.join(LABEL_FORMATS)}, or a FILE.csv|.parquet of your own"
        )
    ir = RunDir(run_dir).ir
    if not ir.is_file():
        raise BadInput(f"no IR in {run_dir} (run `lunasol export` first)")
    con = duck.connect(ir, read_only=True)
    try:
        events = load_events(con)
        outcomes = {r[0]: read_json_field(r[1]) for r in con.execute("SELECT cell_id, extra FROM outcomes").fetchall()}
        eligible = {
            r[0] for r in con.execute("SELECT cell_id FROM cells WHERE eligibility = 'valid_behavior'").fetchall()
        }
        cards, cards_status = from_weakness_cards(run_dir, events)
        probes, fired, probe_status = from_probe_hits(con, events)
        report: dict[str, Any] = {"run": run_dir.name, "labels": labels, "cells": len(eligible)}
        report["checks"] = summarise({c: run_checks(events.get(c, []), outcomes.get(c, {})) for c in sorted(eligible)})
        if labels == "who-and-when":
            gold: dict[str, tuple[int, str]] = {}
            unusable: list[str] = []
            for cell in sorted(eligible):
                extra = outcomes.get(cell, {})
                step = extra.get("mistake_step")
                if step is None or not str(step).strip().lstrip("-").isdigit():
                    unusable.append(cell)
                    continue
                gold[cell] = (int(str(step).strip()), str(extra.get("mistake_agent") or ""))
            offset = _offset(con, run_dir, 0)
            sources = {
                "weakness_cards": (cards, cards_status),
                "probe_hits": (probes, probe_status),
                **{
                    name: ({c: p for c in gold if (p := baseline(events.get(c, [])))}, "deterministic")
                    for name, baseline in BASELINES.items()
                },
            }
            report["labelled_cells"] = len(gold)
            report["cells_without_usable_label"] = unusable
            report["step_offset"] = offset
            report["sources"] = {
                name: {"status": status, **score_steps(gold, preds, offset)}
                for name, (preds, status) in sources.items()
            }
            report["positional"] = _positional(report["sources"], ("exact", "within_1", "within_3", "agent"))
        elif labels == "agentrx":
            report.update(_agentrx(con, eligible, outcomes, events, cards, cards_status, probes, probe_status))
        else:
            gold_modes: dict[str, set[str]] = {}
            for cell in sorted(eligible):
                fm = outcomes.get(cell, {}).get("failure_modes")
                if isinstance(fm, dict):
                    gold_modes[cell] = {m for m, v in fm.items() if isinstance(v, dict) and v.get("majority")}
            probe_modes = {c: {PROBE_MODES[p] for p in ps if p in PROBE_MODES} for c, ps in fired.items()}
            report["labelled_cells"] = len(gold_modes)
            report["sources"] = {
                "weakness_cards": {
                    "status": cards_status + "; cards carry no failure-mode label",
                    **score_modes(gold_modes, None),
                },
                "probe_hits": {"status": probe_status, **score_modes(gold_modes, probe_modes)},
                "baseline_mode_checks": {
                    "status": "deterministic (repeated identical message/tool call; stop at a step cap)",
                    **score_modes(gold_modes, {c: mode_checks(events.get(c, [])) for c in gold_modes}),
                },
            }
        return report
    finally:
        con.close()
