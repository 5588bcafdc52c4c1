"""What Luna answers and what a run keeps: behaviour patterns of one cell, and the checks on them.

Luna says *what* happened in one cell, never *why*: an answer naming a root cause or a fix is
rejected by a deterministic phrase check (English and Chinese) and re-asked. Every cited event id
must be an event Luna was shown for that cell. Quoted text (log excerpts in quotes or backticks)
is exempt from the phrase check, so quoting a log line that says "should" is not a violation.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pipeline.artifacts.versions import VERSIONS
from pipeline.core.empties import MIN_REASON_WORDS, says_nothing
from pipeline.probes.engine import ProbeHit, normalise_key
from pipeline.probes.files import PatternType

Confidence = Literal["high", "medium", "low"]


def _lean(nothing_found: str | None = None) -> Callable[[dict[str, Any]], None]:
    """``json_schema_extra`` that keeps a model's answer schema to what the model needs.

    Each property's ``title`` (its name again, capitalised) and the class docstring (written for
    readers of this code; the tool keeps its first line) go: the schema travels with every request
    and is counted in its budget (150 of Luna's ~1,200 schema tokens).
    """

    def extra(schema: dict[str, Any]) -> None:
        schema.pop("description", None)
        for prop in (schema.get("properties") or {}).values():
            prop.pop("title", None)
        if nothing_found:
            schema["nothing_found"] = nothing_found

    return extra


PATTERN_TYPES: tuple[PatternType, ...] = ("omission", "repeated_exploration", "zero_information_gain")


class LunaPattern(BaseModel):
    """One pattern as Luna writes it (the model's output schema)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_lean())

    type: PatternType
    concerns: str = Field(
        min_length=3,
        description="short key of what it concerns: 'obligation:<id>', 'target:<artifact, file or tool:target>' "
        "or 'transition:<from>-><to>'",
    )
    observed: str = Field(min_length=10, description="what happened, citing the events (no cause, no remedy)")
    definition_fit: str = Field(
        min_length=10,
        description="why it meets its type's definition (omission: the obligation and the opportunity; "
        "repeated_exploration: no external change in between; zero_information_gain: the cost, and nothing gained)",
    )
    evidence: list[str] = Field(min_length=1, description="event ids of this cell, as shown")
    state_changed: bool = Field(
        description="did the source, an artifact, the controller state or the operator's input change between the "
        "first and the last evidence event?"
    )
    candidates: list[str] = Field(default_factory=list, description="probe candidate ids this pattern confirms")
    confidence: Confidence


class CandidateRejection(BaseModel):
    """A probe candidate Luna does not take up, and what it observed instead."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_lean())

    candidate: str = Field(description="the probe candidate id as shown")
    observation: str = Field(min_length=5, description="what in the events makes it not a pattern")
    state_changed: bool = Field(description="does the rejection rest on a change of source, artifact, state or input?")


class LunaAnswer(BaseModel):
    """Luna's whole answer for one cell (or one part of a split cell).

    Every field that says something is required, so an answer like ``{}`` is invalid (re-asked), and
    "nothing found" is an explicit statement: an empty ``patterns`` list needs a ``none_reason``.
    """

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra=_lean(
            'patterns [] and none_reason a sentence about this log ("none" or "n/a" is sent back); '
            "rejected_candidates still lists every probe candidate"
        ),
    )

    patterns: list[LunaPattern] = Field(description="the patterns this log shows; [] only with a none_reason")
    rejected_candidates: list[CandidateRejection] = Field(
        description="every probe candidate not confirmed by a pattern, with what you observed; [] when none"
    )
    none_reason: str | None = Field(
        default=None,
        description="required when patterns is empty: what in the log shows none of the three patterns",
    )

    @model_validator(mode="after")
    def _nothing_found_is_said(self) -> LunaAnswer:
        if self.patterns:
            return self
        reason = (self.none_reason or "").strip()
        if not reason:
            raise ValueError(
                "patterns is empty but none_reason is missing: say what in the log shows none of the three "
                "patterns, or report the patterns you see"
            )
        if says_nothing(reason):
            # A small model's "No reason" must not pass as "looked, found nothing" (a cell reported ok).
            raise ValueError(
                f"none_reason {reason!r} says nothing: say what in the log shows none of the three patterns "
                f"(at least {MIN_NONE_REASON_WORDS} words about this log), or report the patterns you see"
            )
        return self


MIN_NONE_REASON_WORDS = MIN_REASON_WORDS  # one rule for every role's "nothing found" (pipeline.core.empties)


class Pattern(BaseModel):
    """A pattern kept by the run (``patterns.jsonl`` and table ``patterns``)."""

    model_config = ConfigDict(extra="forbid")

    pattern_id: str = Field(description="'<cell>-P<nn>', in the stable order cell, type, first evidence seq")
    cell_id: str
    type: PatternType
    concerns: str = Field(description="normalised concerns key")
    observed: str
    definition_fit: str
    evidence: list[str] = Field(min_length=1)
    confidence: Confidence
    state_changed: bool
    probe_hits: list[str] = Field(default_factory=list, description="probe hits this pattern confirms")
    origin: Literal["luna", "probe"] = "luna"
    overruled: bool = Field(
        default=False, description="a deterministic probe overruled the model's claim that state changed"
    )

    @field_validator("concerns")
    @classmethod
    def _norm(cls, v: str) -> str:
        return normalise_key(v)


PATTERN_ROW_SCHEMA_VERSION = VERSIONS["patterns"]


class PatternRow(Pattern):
    """One line of ``patterns.jsonl``: a :class:`Pattern` with the file's schema version on every row."""

    schema_version: int = PATTERN_ROW_SCHEMA_VERSION


# --- the "what, never why" check ------------------------------------------------------------------

# Phrases that give a cause or prescribe a change. Kept narrow: common descriptive words
# ("needs", "due", "fixture") must not trip it.
_WHY_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (label, re.compile(rx, re.IGNORECASE))
    for label, rx in (
        ("because", r"\bbecause\b"),
        ("root cause", r"\broot[- ]causes?\b"),
        ("caused by", r"\bcaused by\b"),
        ("should", r"\bshould(?:n't| not)?\b"),
        ("ought to", r"\bought to\b"),
        # "fix" only as a remedy ("should be fixed", "the fix would"), not as a description ("fixed the import")
        (
            "fix",
            r"\b(?:should|must|could|would|needs? to|ought to|to be)(?: be)? fix(?:ed)?\b"
            r"|\b(?:the|a) fix (?:is|would|will|could)\b",
        ),
        ("recommend", r"\brecommend(?:s|ed|ation|ations)?\b"),
        ("suggest", r"\bsuggest(?:s|ed|ion|ions)?\b"),
        ("would have", r"\bwould have (?:prevented|avoided|helped|caught)\b"),
        ("the harness needs", r"\b(?:harness|controller|workflow) (?:needs|must|lacks)\b"),
        ("根因", r"根因|根本原因"),
        ("原因是", r"原因是|是因为|因为|由于"),
        ("应该", r"应该|应当|理应"),
        ("建议", r"建议"),
        ("修复", r"(?:需要|应|可以|必须)修复|修复(?:方案|建议)|需要修改"),
    )
)

_QUOTED = re.compile(r"\"[^\"]*\"|“[^”]*”|「[^」]*」|`[^`]*`")


def why_phrases(text: str) -> list[str]:
    """Cause or remedy phrases found in ``text`` outside quotes (empty when it only says what)."""
    bare = _QUOTED.sub(" ", text)
    return [label for label, rx in _WHY_PATTERNS if rx.search(bare)]


def check_answer(
    answer: LunaAnswer,
    *,
    cell_id: str,
    shown_ids: set[str],
    candidates: list[ProbeHit],
) -> list[str]:
    """Every reason to re-ask ``answer`` (empty when it passes).

    Checks: cited ids exist among the events shown for this cell; repeated exploration cites at
    least two events and does not claim a change of state; no cause or remedy phrases; every probe
    candidate is either confirmed by a pattern or rejected with an observation, and only real
    candidate ids are named.
    """
    errors: list[str] = []
    cand_ids = {c.hit_id for c in candidates}
    confirmed: set[str] = set()
    for i, p in enumerate(answer.patterns, 1):
        where = f"pattern {i} ({p.type}, {p.concerns!r})"
        bad = [e for e in p.evidence if e not in shown_ids]
        if bad:
            errors.append(
                f"{where}: evidence {', '.join(sorted(set(bad)))} is not an event of cell {cell_id} shown to you"
            )
        if p.type == "repeated_exploration":
            if len(set(p.evidence)) < 2:
                errors.append(f"{where}: repeated_exploration needs at least two distinct evidence events")
            if p.state_changed:
                errors.append(
                    f"{where}: repeated_exploration requires that external state did not change in between, "
                    "but state_changed is true; drop it or use another type"
                )
        for field_name in ("concerns", "observed", "definition_fit"):
            found = why_phrases(getattr(p, field_name))
            if found:
                errors.append(
                    f"{where}: {field_name} names a cause or a remedy ({', '.join(found)}); "
                    "say only what happened and why it meets the definition"
                )
        unknown = [c for c in p.candidates if c not in cand_ids]
        if unknown:
            errors.append(f"{where}: candidates {', '.join(unknown)} are not probe candidates of this cell")
        confirmed.update(c for c in p.candidates if c in cand_ids)
    rejected: set[str] = set()
    for r in answer.rejected_candidates:
        if r.candidate not in cand_ids:
            errors.append(f"rejected candidate {r.candidate} is not a probe candidate of this cell")
        rejected.add(r.candidate)
    both = confirmed & rejected
    if both:
        errors.append(f"candidates {', '.join(sorted(both))} are both confirmed and rejected")
    missing = sorted(cand_ids - confirmed - rejected)
    if missing:
        errors.append(
            f"probe candidates {', '.join(missing)} are neither confirmed by a pattern (list them in its "
            "'candidates') nor rejected (in 'rejected_candidates')"
        )
    return errors
