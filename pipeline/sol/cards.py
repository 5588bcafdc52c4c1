"""The weakness card: what Sol answers (a draft) and what the shortlist keeps (a checked card).

The model writes :class:`WeaknessDraft` cards. It never writes support counts, task or run
lists: those are computed from the cells and refs it cites (:mod:`pipeline.sol.checks`) and the
checked :class:`WeaknessCard` carries them. Both forbid extra fields, so an answer that tries to
add its own counts is re-asked.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pipeline.core.empties import empty_reason_error

Confidence = Literal["high", "medium", "low"]
_WEAKNESS_ID = re.compile(r"W-\d{2,}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Where(_Strict):
    """Where the first divergence happened."""

    stage: str = Field(description="workflow stage, e.g. review")
    actor: str = Field(description="who acted, e.g. reviewer or controller")
    what: str = Field(description="what happened there, described, not judged")


class FirstDivergence(_Strict):
    """The earliest point where behaviour left the path that would have worked."""

    where: Where
    cells: list[str] = Field(description="cell ids where this divergence is seen")
    event_refs: list[str] = Field(description="event ids (C004-e0012) or source refs (PATH#Lx-Ly)")


class HarnessAttribution(_Strict):
    """Whether the weakness is the harness's (not the model's, the task's or the environment's), and why."""

    attributed: bool
    why: str


class SupportDraft(_Strict):
    """What the model cites as support; counts are never the model's."""

    cells: list[str] = Field(description="cell ids that support the weakness")
    pattern_groups: list[str] = Field(default_factory=list, description="pattern group ids")
    event_refs: list[str] = Field(default_factory=list, description="event ids or source refs")


class CounterItem(_Strict):
    """One piece of counter-evidence: a cell (successful ones included) that argues against the weakness."""

    cell: str
    refs: list[str] = Field(description="event ids or source refs in that cell")
    note: str


class CounterEvidence(_Strict):
    """Counter-evidence from the same harness, or an explicit reason why there is none."""

    items: list[CounterItem] = Field(default_factory=list)
    none_reason: str | None = Field(default=None, description="required when items is empty")


class WeaknessDraft(_Strict):
    """One weakness as Sol proposes it. Sol explains why; it never prescribes a change."""

    # Checked after parsing, not as a JSON-schema "pattern": llama.cpp and other local servers
    # cannot compile regex patterns into a grammar (the server dies or answers 500).
    weakness_id: str = Field(description="W- and at least two digits: W-01, W-02, ...")
    statement: str
    first_divergence: FirstDivergence
    harness_attribution: HarnessAttribution
    support: SupportDraft
    alternative_explanations: list[str]
    counter_evidence: CounterEvidence
    counterfactual_prediction: str = Field(description="falsifiable: what would be observed if this is wrong")
    confidence: Confidence

    @field_validator("weakness_id")
    @classmethod
    def _weakness_id(cls, v: str) -> str:
        if not _WEAKNESS_ID.fullmatch(v):
            raise ValueError(f"weakness_id {v!r} must be W- and at least two digits (W-01)")
        return v


NO_WEAKNESS = (
    "weaknesses [] and none_reason saying what in the evidence shown argues that the harness has no "
    'weakness here (a sentence about these cells; "none" or "n/a" is sent back, and an empty answer without '
    "a reason fails the call)"
)
_NONE_REASON = "required when weaknesses is empty: what in the evidence shown argues that there is no weakness"


def _no_weakness_is_said(weaknesses: list[Any], none_reason: str | None) -> None:
    if not weaknesses:
        problem = empty_reason_error(
            "weaknesses", "none_reason", none_reason, "what in the evidence shown argues that there is no weakness"
        )
        if problem:
            raise ValueError(problem)


class SolAnswer(_Strict):
    """Sol's whole answer: the candidate weaknesses over the batch (or a partition of it).

    "No weakness" is a stated answer: an empty list needs a ``none_reason`` with content, so a model
    that answers ``{"weaknesses": []}`` is re-asked and, if it never says why, the call fails.
    """

    model_config = ConfigDict(extra="forbid", json_schema_extra={"nothing_found": NO_WEAKNESS})

    weaknesses: list[WeaknessDraft] = Field(description="the weaknesses the evidence shows; [] only with a none_reason")
    none_reason: str | None = Field(default=None, description=_NONE_REASON)

    @model_validator(mode="after")
    def _nothing_found_is_said(self) -> SolAnswer:
        _no_weakness_is_said(self.weaknesses, self.none_reason)
        return self


class SupportCounts(_Strict):
    """Counts computed from the cited refs."""

    cells: int
    tasks: int
    runs: int
    pattern_groups: int


class Support(_Strict):
    """Support of a checked card: cited cells and groups, and the tasks/runs/counts derived from the IR."""

    cells: list[str]
    tasks: list[str]
    runs: list[str]
    pattern_groups: list[str]
    event_refs: list[str]
    counts: SupportCounts


class WeaknessCard(_Strict):
    """A weakness that passed every deterministic check."""

    weakness_id: str
    statement: str
    first_divergence: FirstDivergence
    harness_attribution: HarnessAttribution
    support: Support
    alternative_explanations: list[str]
    counter_evidence: CounterEvidence
    counterfactual_prediction: str
    confidence: Confidence


class Dropped(_Strict):
    """A weakness that failed the checks: kept with its reasons, never dropped silently."""

    weakness_id: str
    statement: str
    reasons: list[str]


# -- map / reduce (batches that do not fit one call) -------------------------------------------------


class MergedWeakness(_Strict):
    """One weakness of the reduce step: drafts of the map calls merged, reasoned over the whole batch.

    Its support is not written here: it is the union of the merged drafts' checked support (the
    cells and refs the map calls cited and that resolved), so it is never the model's count.
    """

    weakness_id: str = Field(pattern=r"^W-\d{2,}$")
    merges: list[str] = Field(description="ids of the drafts this weakness merges (e.g. M01/W-02)")
    statement: str
    first_divergence: FirstDivergence
    harness_attribution: HarnessAttribution
    alternative_explanations: list[str]
    counter_evidence: CounterEvidence
    counterfactual_prediction: str = Field(description="falsifiable: what would be observed if this is wrong")
    confidence: Confidence


class ReduceAnswer(_Strict):
    """The reduce step's answer: the merged weaknesses of the whole batch (none only with a stated reason)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"nothing_found": NO_WEAKNESS})

    weaknesses: list[MergedWeakness] = Field(description="the merged weaknesses; [] only with a none_reason")
    none_reason: str | None = Field(default=None, description=_NONE_REASON)

    @model_validator(mode="after")
    def _nothing_found_is_said(self) -> ReduceAnswer:
        _no_weakness_is_said(self.weaknesses, self.none_reason)
        return self


class SolCall(_Strict):
    """One Sol model call and what it saw: which cells, which drafts it made or merged."""

    call_id: str
    role: str
    tasks: list[str] = Field(default_factory=list)
    cells: list[str] = Field(default_factory=list, description="cells whose evidence this call was shown")
    inputs: list[str] = Field(default_factory=list, description="draft ids a reduce call merged")
    outputs: list[str] = Field(default_factory=list, description="draft or weakness ids it answered")
    request_tokens: int = 0
    ok: bool = True
    attempts: int = 0
    key: str | None = None
    errors: list[str] = Field(default_factory=list)
    reused: bool = Field(
        default=False,
        description="a map call answered from its stored answer (runs/<id>/sol_map): the same request as a "
        "previous run's, and the answer passes this run's checks; no call was made",
    )


class SolPlan(_Strict):
    """How Sol covered the batch: one call, or map calls over partitions and reduce calls over drafts."""

    mode: Literal["single", "map_reduce"]
    budget_tokens: int = Field(description="whole-request token budget of one Sol call")
    context: str = Field(description="the model's context, where it comes from, how tokens are counted")
    calls: list[SolCall] = Field(default_factory=list)
