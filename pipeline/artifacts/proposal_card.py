"""The proposal card: exactly the fixed proposal-card schema, nothing more.

Six functional areas: identity (proposal_id / parent_harness / source_weakness),
``evidence``, ``root_cause``, ``strategy_change``, ``expected_effect`` and
``rejection_conditions`` / ``regression_risks``. Every model forbids extra fields so a card
cannot smuggle in a target file or a patch under a field of its own.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from pipeline.core.empties import empty_reason_error

# Non-empty text: whitespace-only counts as empty. Strict: YAML numbers are not text.
Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, strict=True)]
Confidence = Literal["high", "medium", "low"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ObservedImpact(_Strict):
    """What was observed on each outcome metric (observed figures are allowed here)."""

    quality: Text
    completion: Text
    cost: Text
    stability: Text


class Evidence(_Strict):
    """Which tasks and runs support the card, and the impact actually observed."""

    summary: Text
    affected_tasks: list[Text] = Field(min_length=1)
    affected_runs: list[Text] = Field(min_length=1)
    observed_impact: ObservedImpact


class RootCause(_Strict):
    """The causal hypothesis taken from the confirmed weakness, with its confidence."""

    hypothesis: Text
    confidence: Confidence


class StrategyChange(_Strict):
    """The current strategy, the one lever changed, and why it hits the root cause."""

    current_strategy: Text
    proposed_strategy: Text
    rationale: Text


class ExpectedMetrics(_Strict):
    """Expected direction on each outcome metric; no invented figures."""

    quality: Text
    completion: Text
    cost: Text
    stability: Text


class ExpectedEffect(_Strict):
    """The behaviour to observe first, the pattern that should change, and metric expectations."""

    behavioral_change: Text
    targeted_pattern_change: Text
    expected_metrics: ExpectedMetrics


class ProposalCard(_Strict):
    """One single-lever change proposal derived from one confirmed weakness."""

    proposal_id: Text
    parent_harness: Text
    source_weakness: Text
    evidence: Evidence
    root_cause: RootCause
    strategy_change: StrategyChange
    expected_effect: ExpectedEffect
    rejection_conditions: list[Text] = Field(min_length=1)
    regression_risks: list[Text] = Field(min_length=1)


class ProposalList(BaseModel):
    """What the proposer returns for one weakness: zero or more cards.

    ``proposals`` is required and zero cards need a ``note``, so an empty answer (``{}``) is invalid
    and "no card" is always an explicit, reasoned answer.
    """

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "nothing_found": "proposals [] and note saying why no clear single-lever strategy follows from the "
            'evidence (a sentence about this weakness; "none" or "n/a" is sent back, and an empty answer '
            "without a reason fails the call)"
        },
    )

    proposals: list[ProposalCard] = Field(description="0..N cards; [] only with a note saying why")
    note: str | None = Field(
        default=None,
        description="required when no card is proposed: why no clear single-lever strategy follows from the evidence",
    )

    @model_validator(mode="after")
    def _no_card_is_explained(self) -> ProposalList:
        if not self.proposals:
            problem = empty_reason_error("proposals", "note", self.note, "why no single-lever strategy follows")
            if problem:
                raise ValueError(problem)
        return self


def card_json_schema() -> dict[str, Any]:
    """The JSON Schema of one card, exported from the model (the model is the source of truth)."""
    return ProposalCard.model_json_schema()


FIELD_ORDER: tuple[str, ...] = tuple(ProposalCard.model_fields)
"""Top-level field order of the card schema, kept when writing YAML."""
