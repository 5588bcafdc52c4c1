"""The card's words meet the counts: predicted directions, outcome metrics, rejection conditions.

Only what a deterministic count can settle is settled here; everything else is listed for a
human (status ``undetermined``, ``check`` None). Two rejection conditions have a count that
speaks to them (a determinate result is recorded, never a guess):

- ``unchanged_recheck`` — a condition about the same check re-run with nothing changed (or the
  old loop coming back): triggered when any child cell still shows one of the weakness's repeat
  groups (repeated exploration / zero information gain, matched by type and key), with the child
  refs of those occurrences; not triggered when no child cell does.
- ``metric_regression`` — a condition about a sidecar metric (completion, quality, cost,
  stability) regressing: not triggered when none it names fell significantly; when one did,
  whether the fall is *attributable* to the change is left to a human (undetermined). A condition
  that also names measures the sidecars lack (tests, the judge) is left to a human.

A card's expected metric counts as a prediction only when its text commits to a direction without
hedging ("may", "no ... presumed", "unchanged"...): only then must the metric improve.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pipeline.followup.inputs import RunSide
from pipeline.followup.schema import ConditionResult, MetricResult
from pipeline.followup.stats import Direction, two_means, two_proportions

Row = dict[str, Any]
Metric = Literal["quality", "completion", "cost", "stability"]
METRICS: tuple[Metric, ...] = ("quality", "completion", "cost", "stability")
BETTER: dict[Metric, Direction] = {"quality": "up", "completion": "up", "cost": "down", "stability": "up"}
REPEAT_TYPES = frozenset({"repeated_exploration", "zero_information_gain"})
REFS_PER_CELL = 3  # enough lines to see the repeat; the report links every one

_UP = re.compile(r"\b(improves?|improved|rises?|increases?|increased|higher|more often)\b|提高|提升|增加|上升")
_DOWN = re.compile(
    r"\b(drops?|falls?|decreases?|decreased|lower|fewer|rarer|less often|disappears?|reduced?|reduces|"
    r"saves?|savings?)\b|降低|减少|下降|消失"
)
_HEDGE = re.compile(r"\b(may|might|could|no|not|none|presumed|unchanged|hold|holds|same)\b|可能|不|无|未")


def predicted_direction(text: str) -> Direction | None:
    """The direction a card's sentence commits to, or None when it hedges, denies or names none."""
    low = " ".join(text.casefold().split())
    if _HEDGE.search(low):
        return None
    up, down = bool(_UP.search(low)), bool(_DOWN.search(low))
    if up == down:
        return None
    return "up" if up else "down"


def _values(side: RunSide, metric: Metric, cells: set[str]) -> list[float]:
    out = []
    for cell, row in sorted(side.outcomes.items()):
        value = row.get(metric)
        if cell in cells and isinstance(value, int | float) and not isinstance(value, bool):
            out.append(float(value))
    return out


def metric_results(parent: RunSide, child: RunSide, covered: set[str], expected: Row) -> list[MetricResult]:
    """Each sidecar metric, parent vs child over the covered families; binary metrics as proportions."""
    pc = {c for c, t in parent.cells.items() if t in covered}
    cc = {c for c, t in child.cells.items() if t in covered}
    out = []
    for metric in METRICS:
        text = str(expected.get(metric) or "")
        predicted = predicted_direction(text)
        better = BETTER[metric]
        a, b = _values(parent, metric, pc), _values(child, metric, cc)
        prop = mean = None
        if not a or not b:
            outcome: Literal["improved", "worsened", "no significant change", "no data"] = "no data"
        else:
            if set(a) | set(b) <= {0.0, 1.0}:
                prop = two_proportions(int(sum(a)), len(a), int(sum(b)), len(b), predicted)
                sig, diff = prop.significant, prop.difference or 0.0
            else:
                mean = two_means(a, b)
                sig, diff = mean.significant, mean.difference or 0.0
            if not sig or diff == 0:
                outcome = "no significant change"
            else:
                outcome = "improved" if (diff > 0) == (better == "up") else "worsened"
        out.append(
            MetricResult(
                metric=metric, better=better, card_expectation=text, predicted=predicted,
                required=predicted == better, proportion=prop, mean=mean, outcome=outcome,
            )
        )  # fmt: skip
    return out


_RECHECK = re.compile(
    r"(re-?run|re-?check|re-?review|again|repeat|loop)[^.]*?(unchanged|nothing changed|same|equivalent)|"
    r"(unchanged|same|equivalent)[^.]*?(re-?run|re-?check|re-?review|loop)|"
    r"重复|原地|等价"
)
_REGRESS = re.compile(r"\b(regress\w*|loss|lose[sd]?|falls?|drops?|worse\w*)\b|下降|退化|损失")
_METRIC_WORDS: dict[Metric, re.Pattern[str]] = {
    "completion": re.compile(r"\bcompletion\b|完成"),
    "quality": re.compile(r"\bquality\b|质量"),
    "cost": re.compile(r"\bcost\b|成本"),
    "stability": re.compile(r"\bstability\b|稳定"),
}
# Measures the sidecars do not carry: a condition naming one cannot be settled by the sidecar alone.
_OTHER_MEASURES = re.compile(r"\b(tests?|judge|review score)\b|测试|评审")


def _occurrence_refs(group: Row, cell: str) -> list[str]:
    refs: list[str] = []
    for occ in group.get("occurrences", []):
        if isinstance(occ, dict) and occ.get("cell_id") == cell:
            refs += [str(r) for r in occ.get("refs", [])]
    return refs


def evaluate_conditions(
    conditions: list[str],
    child: RunSide,
    matched: list[tuple[Row, Row | None, float | None]],
    metrics: list[MetricResult],
    covered: set[str],
) -> list[ConditionResult]:
    """Each rejection condition: settled by a count where one speaks to it, else left to a human."""
    repeats = [(p, m) for p, m, _ in matched if m is not None and p.get("type") in REPEAT_TYPES]
    n_child = sum(1 for t in child.cells.values() if t in covered)
    out = []
    for i, text in enumerate(conditions, 1):
        low = " ".join(text.casefold().split())
        if _RECHECK.search(low):
            cells: dict[str, list[str]] = {}
            for _, m in repeats:
                for occ in m.get("occurrences", []):
                    cell = str(occ.get("cell_id")) if isinstance(occ, dict) else ""
                    if child.cells.get(cell) in covered:
                        cells.setdefault(cell, []).extend(_occurrence_refs(m, cell))
            keys = sorted({f"{p.get('type')} {p.get('concerns')}" for p, _ in repeats})
            if cells:
                refs = [r for c in sorted(cells) for r in sorted(set(cells[c]))[:REFS_PER_CELL]]
                reason = (
                    f"{len(cells)}/{n_child} child cell(s) still show the weakness's repeat pattern "
                    f"({'; '.join(keys)}): {', '.join(sorted(cells))}"
                )
                out.append(ConditionResult(index=i, condition=text, check="unchanged_recheck", status="triggered",
                                           reason=reason, cells=sorted(cells), refs=refs))  # fmt: skip
            else:
                reason = f"no child cell (0/{n_child}) shows any of the weakness's repeat groups (type and key)"
                out.append(ConditionResult(index=i, condition=text, check="unchanged_recheck",
                                           status="not_triggered", reason=reason))  # fmt: skip
            continue
        named = [m for m in metrics if _METRIC_WORDS[m.metric].search(low)]
        if _REGRESS.search(low) and named and not _OTHER_MEASURES.search(low):
            worse = [m.metric for m in named if m.outcome == "worsened"]
            nodata = [m.metric for m in named if m.outcome == "no data"]
            if worse:
                out.append(ConditionResult(
                    index=i, condition=text, check="metric_regression", status="undetermined",
                    reason=f"{', '.join(worse)} fell significantly in the child; whether the change caused it "
                    "is for a human",
                ))  # fmt: skip
            elif nodata:
                out.append(ConditionResult(
                    index=i, condition=text, check="metric_regression", status="undetermined",
                    reason=f"the sidecars carry no {', '.join(nodata)} for both generations",
                ))  # fmt: skip
            else:
                said = "; ".join(f"{m.metric}: {m.outcome}" for m in named)
                out.append(ConditionResult(
                    index=i, condition=text, check="metric_regression", status="not_triggered",
                    reason=f"no significant regression to attribute ({said})",
                ))  # fmt: skip
            continue
        human = "no deterministic count speaks to this condition: for a human reviewer"
        out.append(ConditionResult(index=i, condition=text, check=None, status="undetermined", reason=human))
    return out
