"""``lunasol followup``: judge the parent's selected proposal on the next generation's run.

:func:`followup` loads both runs (refusing what cannot be judged, see :mod:`.inputs`), counts the
targeted pattern in both (:mod:`.prevalence`), compares the sidecar metrics and settles the
rejection conditions a count speaks to (:mod:`.conditions`), then states one verdict:

- ``rejected``: a rejection condition is triggered with child evidence; or the targeted pattern
  changed significantly against the prediction; or a metric the card predicted to improve got
  significantly worse; or the sample could detect the predicted change and the child's rate is
  still clearly above the predicted end point (its 95% interval excludes it);
- ``supported``: the targeted pattern changed significantly (Fisher, p < 0.05) in the predicted
  direction, no condition is triggered, and every metric the card predicted to improve improved;
- ``inconclusive``: everything else — above all an underpowered sample (the minimum detectable
  difference is larger than the change the card predicts), which is never reported as support.

The result is written to ``CHILD_RUN/followup.json`` (a child implements exactly one proposal;
atomic, canonical JSON, sealed by its own digest).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline.artifacts.schemas import load_artifact
from pipeline.core.canonical import atomic_write_text, pretty_json
from pipeline.core.errors import BadInput
from pipeline.core.settings import ModelSettings
from pipeline.followup.conditions import evaluate_conditions, metric_results, predicted_direction
from pipeline.followup.inputs import RunSide, check_lineage, load_selection, load_side
from pipeline.followup.judge import judge, merge, not_asked
from pipeline.followup.prevalence import families, targeted_change
from pipeline.followup.schema import (
    FOLLOWUP_FILE,
    ChildBinding,
    ConditionResult,
    Families,
    Followup,
    JudgeView,
    MetricResult,
    ParentBinding,
    ProposalRef,
    TargetedChange,
    Verdict,
    VerdictBlock,
)
from pipeline.proposals.proposer import run_model_settings

METHOD = {
    "prevalence": "cells with any of the source weakness's pattern groups / eligible cells Luna analysed, "
    "over the task families present in both generations",
    "matching": "a parent group matches the child group of the same type and concerns key "
    "(else the nearest key of that type with character-bigram similarity >= 0.75), greedily, best first",
    "tests": "Fisher's exact test (two-sided) decides significance at alpha 0.05; the pooled two-proportion z "
    "is reported beside it (the usual ruler for two pass rates); Welch's t for metrics that are not 0/1",
    "interval": "95% Wald interval of child rate - parent rate",
    "power": "minimum detectable difference: the smallest change in the predicted direction the pooled z-test "
    "finds with 80% power at alpha 0.05 for these sample sizes (normal approximation); none when even the "
    "largest possible change stays below 80%",
    "judge": "one call of the judge role on the child's pattern groups and controller lines; every cited ref must "
    "resolve in the child's IR (unresolved refs are re-asked, then the answer is undetermined); a determinate "
    "count overrides the judge on the same condition and the disagreement is recorded in conflicts",
}


@dataclass
class FollowupResult:
    """What :func:`followup` wrote and computed."""

    path: Path
    doc: Followup


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def decide(
    targeted: TargetedChange,
    metrics: list[MetricResult],
    conditions: list[ConditionResult],
    fams: Families,
    behaviour: JudgeView | None = None,
) -> VerdictBlock:
    """The verdict and its one-sentence reason, from the computed parts (see the module docstring)."""
    t = targeted.overall
    figures = (
        f"{t.a_hits}/{t.a_n} ({_pct(t.a_rate)}) -> {t.b_hits}/{t.b_n} ({_pct(t.b_rate)}), "
        f"Fisher p={t.p_fisher}, z={t.z}, MDD={'none reachable' if t.mdd is None else _pct(t.mdd)}"
    )
    pending = [c.index for c in conditions if c.status == "undetermined"]
    scope = f"over {len(fams.covered)} task famil{'y' if len(fams.covered) == 1 else 'ies'}"
    triggered = [c for c in conditions if c.status == "triggered"]
    sign = 0 if not t.difference else (1 if t.difference > 0 else -1)
    predicted_sign = -1 if targeted.predicted == "down" else 1
    required = [m for m in metrics if m.required]

    def block(verdict: Verdict, reason: str) -> VerdictBlock:
        return VerdictBlock(
            verdict=verdict,
            reason=reason,
            covers=fams.covered,
            does_not_cover=sorted(fams.parent_only + fams.child_only),
            pending_human=pending,
        )

    if t.a_n == 0 or t.b_n == 0:
        return block("inconclusive", "no task family has eligible analysed cells in both generations")
    if triggered:
        c = triggered[0]
        return block("rejected", f"rejection condition {c.index} is triggered: {c.reason} ({figures}).")
    if t.significant and sign == -predicted_sign:
        return block("rejected", f"the targeted pattern changed significantly against the prediction ({figures}).")
    worse = [m.metric for m in required if m.outcome == "worsened"]
    if worse:
        return block("rejected", f"{', '.join(worse)}, predicted to improve, got significantly worse ({figures}).")
    if t.significant and sign == predicted_sign:
        missing = [m.metric for m in required if m.outcome != "improved"]
        if missing:
            return block(
                "inconclusive",
                f"the targeted pattern changed as predicted but {', '.join(missing)}, which the card predicted to "
                f"improve, did not improve significantly ({figures}).",
            )
        if behaviour is not None and behaviour.status == "not_observed":
            return block(
                "inconclusive",
                f"the targeted pattern changed as predicted but the judge found the predicted behavioural change "
                f"not shown ({figures}).",
            )
        tail = f"; {len(pending)} rejection condition(s) await a human" if pending else ""
        return block("supported", f"the targeted pattern changed significantly as predicted {scope} ({figures}){tail}.")
    # The predicted end point as a difference: the pattern gone (rate 0) or everywhere (rate 1).
    end = -(t.a_rate or 0.0) if predicted_sign < 0 else 1.0 - (t.a_rate or 0.0)
    excluded = t.ci95 is not None and (t.ci95[0] > end if predicted_sign < 0 else t.ci95[1] < end)
    if t.powered and excluded:
        return block(
            "rejected",
            f"the sample could detect the predicted change but the targeted pattern did not change significantly "
            f"and the interval excludes its disappearance ({figures}).",
        )
    if not t.powered:
        return block(
            "inconclusive",
            f"underpowered: even the pattern's full disappearance would be detected with only "
            f"{_pct(t.power_at_full_change)} power {scope} ({figures}).",
        )
    return block("inconclusive", f"the targeted pattern did not change significantly {scope} ({figures}).")


def followup(
    parent_dir: Path,
    proposal_id: str,
    child_dir: Path,
    out: Path | None = None,
    *,
    settings: ModelSettings | None = None,
    ask_judge: bool = True,
    log: Callable[[str], None] = lambda _m: None,
) -> FollowupResult:
    """Judge ``proposal_id`` (selected at the parent's gate 2) on ``child_dir``; write and return followup.json.

    The judged part asks the ``judge`` role with ``settings`` (default: the child run's own model
    settings, so a replayed child replays its judge too); ``ask_judge=False`` leaves the conditions
    no count settles to a human.
    """
    selection = load_selection(parent_dir, proposal_id)
    parent = load_side(parent_dir, "parent")
    child = load_side(child_dir, "child")
    card = selection.card
    check_lineage(parent, child, card)
    weakness = next((w for w in parent.shortlist.weaknesses if w.weakness_id == card.source_weakness), None)
    if weakness is None:
        raise BadInput(f"parent run {parent_dir}: {proposal_id}'s weakness {card.source_weakness} is not in it")
    fams = families(parent, child)
    predicted = predicted_direction(card.expected_effect.targeted_pattern_change) or "down"
    targeted, matched = targeted_change(parent, child, list(weakness.support.pattern_groups), fams, predicted)
    covered = set(fams.covered)
    metrics = metric_results(parent, child, covered, card.expected_effect.expected_metrics.model_dump())
    counted = evaluate_conditions(list(card.rejection_conditions), child, matched, metrics, covered)
    if ask_judge:
        command = f"lunasol followup {parent_dir} --proposal {proposal_id} --child {child_dir}"
        settings = settings or run_model_settings(child_dir)
        if settings.model is None and settings.effective_mode() != "replay":
            raise BadInput(
                "the judge needs a model and the child run names none: pass --model, --replay DIR, "
                "or --no-judge (counts settle what they can, the rest is left to a human)"
            )
        judged = judge(child, card, matched, covered, settings, command, log)
    else:
        judged = not_asked("not asked (--no-judge): the conditions no count settles are left to a human")
    conditions, conflicts = merge(counted, judged)
    doc = Followup(
        parent=_parent_binding(parent, selection.proposals_digest, selection.receipt_path, selection.receipt_digest),
        child=_child_binding(child),
        proposal=ProposalRef(
            proposal_id=card.proposal_id,
            source_weakness=card.source_weakness,
            card_digest=selection.card_digest,
            behavioral_change=card.expected_effect.behavioral_change,
            targeted_pattern_change=card.expected_effect.targeted_pattern_change,
        ),
        families=fams,
        targeted=targeted,
        metrics=metrics,
        conditions=conditions,
        judge=judged.block,
        conflicts=conflicts,
        verdict=decide(targeted, metrics, conditions, fams, judged.block.behavioral_change),
        method=METHOD,
    ).sealed()
    path = out or child_dir / FOLLOWUP_FILE
    atomic_write_text(path, pretty_json(doc.model_dump(mode="json")))
    return FollowupResult(path=path, doc=doc)


def _parent_binding(side: RunSide, proposals_digest: str, receipt: str, receipt_digest: str) -> ParentBinding:
    return ParentBinding(
        run_id=side.run_id,
        harness=side.request.parent_harness,
        generation=side.request.generation,
        bundle_digest=side.bundle_digest,
        shortlist_digest=side.shortlist.digest,
        proposals_digest=proposals_digest,
        gate2_receipt=receipt,
        gate2_receipt_digest=receipt_digest,
    )


def _child_binding(side: RunSide) -> ChildBinding:
    impl = side.request.implements
    assert impl is not None  # check_lineage refused a child without it
    return ChildBinding(
        run_id=side.run_id,
        harness=", ".join(side.harnesses) or None,
        generation=side.request.generation,
        bundle_digest=side.bundle_digest,
        shortlist_digest=side.shortlist.digest,
        implements_harness=impl.parent_harness,
        implements_proposal=impl.proposal_id,
    )


def read_followup(run_dir: Path) -> Followup | None:
    """The run's followup.json (for the report and status), or None when it has none."""
    path = run_dir / FOLLOWUP_FILE
    if not path.is_file():
        return None
    return load_artifact(path, "followup", Followup)
