"""``followup.json``: the selected proposal judged on the next generation's run (the model is the schema)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from pipeline.artifacts.rundir import FOLLOWUP
from pipeline.artifacts.versions import VERSIONS
from pipeline.core.canonical import digest
from pipeline.followup.stats import Direction, MeanTest, ProportionTest

FOLLOWUP_FILE = FOLLOWUP.filename
FOLLOWUP_SCHEMA_VERSION = VERSIONS["followup"]

Verdict = Literal["supported", "rejected", "inconclusive"]
ConditionStatus = Literal["triggered", "not_triggered", "undetermined"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ParentBinding(_Strict):
    """The parent run, pinned by the digests the follow-up was computed from."""

    run_id: str
    harness: str
    generation: int
    bundle_digest: str
    shortlist_digest: str
    proposals_digest: str
    gate2_receipt: str = Field(description="the gate-2 receipt that selected the proposal, relative to the run")
    gate2_receipt_digest: str


class ChildBinding(_Strict):
    """The child run (next generation), pinned the same way, and what its request says it implements."""

    run_id: str
    harness: str | None = Field(description="the harness the child's cells ran (cells.harness in its IR)")
    generation: int
    bundle_digest: str
    shortlist_digest: str
    implements_harness: str
    implements_proposal: str


class ProposalRef(_Strict):
    """The selected card, by id and content digest, with the two predictions judged here."""

    proposal_id: str
    source_weakness: str
    card_digest: str
    behavioral_change: str
    targeted_pattern_change: str


class Families(_Strict):
    """Task families in each generation; statistics use only those in both."""

    covered: list[str]
    parent_only: list[str]
    child_only: list[str]


class GroupMatch(_Strict):
    """One pattern group of the source weakness and its match in the child (type + concerns key)."""

    parent_group: str
    type: str
    concerns: str
    parent_cells: list[str]
    child_group: str | None
    child_concerns: str | None
    child_cells: list[str]
    score: float | None = Field(description="1.0: same key; lower: a near key (character-bigram similarity)")


class FamilyRow(_Strict):
    """Prevalence of the targeted pattern in one task family, parent vs child."""

    task_id: str
    test: ProportionTest


class TargetedChange(_Strict):
    """The card's targeted pattern change as prevalence: cells with any of the weakness's groups / cells."""

    predicted: Direction
    groups: list[GroupMatch]
    overall: ProportionTest
    per_family: list[FamilyRow]
    parent_cells: list[str] = Field(description="parent cells with the pattern (covered families)")
    child_cells: list[str] = Field(description="child cells with the pattern (covered families)")
    not_analysed: dict[str, list[str]] = Field(
        description="eligible cells left out of the denominators because Luna did not analyse them, per side"
    )


class MetricResult(_Strict):
    """One outcome metric from the sidecars, parent vs child."""

    metric: Literal["quality", "completion", "cost", "stability"]
    better: Direction = Field(description="which way is an improvement (cost: down)")
    card_expectation: str
    predicted: Direction | None = Field(description="the direction the card's text commits to, if it commits")
    required: bool = Field(description="the card predicted an improvement, so the verdict needs one")
    proportion: ProportionTest | None = None
    mean: MeanTest | None = None
    outcome: Literal["improved", "worsened", "no significant change", "no data"]


class JudgeView(_Strict):
    """What the judge model answered for one condition (or the behavioural change), after the ref checks."""

    status: str = Field(description="triggered / not_triggered / undetermined (behaviour: observed / not_observed)")
    reason: str
    cells: list[str] = Field(default_factory=list, description="child cells its cited refs belong to")
    refs: list[str] = Field(default_factory=list, description="its cited refs, as child source refs PATH#Lx-Ly")
    problems: list[str] = Field(
        default_factory=list, description="why an answer was set to undetermined (refs that did not resolve)"
    )


class ConditionResult(_Strict):
    """One rejection condition: settled by a count where one speaks to it, else by the judge, else by a human."""

    index: int
    condition: str
    check: str | None = Field(description="the deterministic check that evaluated it; None: no count speaks to it")
    status: ConditionStatus
    reason: str
    cells: list[str] = Field(default_factory=list, description="child cells the status rests on")
    refs: list[str] = Field(default_factory=list, description="child refs (PATH#Lstart-Lend) that show it")
    decided_by: Literal["count", "judge", "human"] = Field(
        default="count", description="count: a deterministic count; judge: the judge model; human: nobody yet"
    )
    judge: JudgeView | None = Field(default=None, description="the judge's answer, when it was asked")


class Conflict(_Strict):
    """A condition where the count and the judge both gave a determinate answer and disagree: the count wins."""

    index: int
    count_status: ConditionStatus
    judge_status: ConditionStatus
    count_reason: str
    judge_reason: str
    resolution: str = "the determinate count overrides the judge (seed 002's cascade)"


class JudgeBlock(_Strict):
    """The judged part: one call of the ``judge`` role on the child's evidence."""

    asked: bool
    note: str = Field(description="what was asked, or why the judge was not asked")
    ok: bool | None = None
    attempts: int = 0
    errors: list[str] = Field(default_factory=list)
    key: str | None = Field(default=None, description="replay key of the final exchange")
    model: str | None = None
    template_hash: str | None = None
    evidence_cells: list[str] = Field(default_factory=list, description="child cells whose controller lines it read")
    behavioral_change: JudgeView | None = None


class VerdictBlock(_Strict):
    """The verdict, its one-sentence reason, and how far it reaches."""

    verdict: Verdict
    reason: str
    covers: list[str] = Field(description="task families the verdict speaks for")
    does_not_cover: list[str] = Field(description="task families present in only one generation")
    pending_human: list[int] = Field(description="indexes of rejection conditions left to a human reviewer")


class Followup(_Strict):
    """``followup.json``: the selected proposal judged on the child run, bound by digest to both runs."""

    schema_version: int = FOLLOWUP_SCHEMA_VERSION
    parent: ParentBinding
    child: ChildBinding
    proposal: ProposalRef
    families: Families
    targeted: TargetedChange
    metrics: list[MetricResult]
    conditions: list[ConditionResult]
    judge: JudgeBlock | None = Field(default=None, description="the judged part (None: a v1 file, before it)")
    conflicts: list[Conflict] = Field(default_factory=list, description="count vs judge disagreements")
    verdict: VerdictBlock
    method: dict[str, str] = Field(description="how each figure was computed, in words")
    digest: str = Field(default="", description="sha256 of the canonical JSON of every other field")

    def content_digest(self) -> str:
        """The digest of everything but ``digest`` itself."""
        return digest(self.model_dump(mode="json", exclude={"digest"}))

    def sealed(self) -> Followup:
        """A copy carrying its own content digest."""
        return self.model_copy(update={"digest": self.content_digest()})
