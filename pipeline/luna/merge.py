"""From Luna's answers to the run's patterns: merge split parts, apply probe overrules, order and number.

The probe cascade (a determinate result outranks an observation): where a deterministic probe
proves that nothing changed between two events, a model claim that something did is overruled.
Two cases, both recorded as conflicts:

* a Luna pattern with ``state_changed`` true whose evidence lies inside a probe's proven span:
  the pattern is kept with ``state_changed`` false and ``overruled`` true;
* a probe candidate Luna rejected by claiming a change: the candidate is reinstated as a
  pattern (``origin='probe'``, ``overruled`` true).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict

from pipeline.luna.patterns import LunaAnswer, Pattern
from pipeline.probes.engine import ProbeHit


class Conflict(BaseModel):
    """A model claim a deterministic probe overruled (table ``probe_conflicts``)."""

    model_config = ConfigDict(extra="forbid")

    conflict_id: str
    cell_id: str
    hit_id: str
    pattern_id: str | None
    kind: Literal["pattern_claims_change", "rejection_claims_change"]
    model_claim: str
    probe_finding: str
    resolution: str


class Verdict(BaseModel):
    """What became of one probe candidate (table ``probe_verdicts``)."""

    model_config = ConfigDict(extra="forbid")

    cell_id: str
    hit_id: str
    verdict: Literal["confirmed", "rejected", "overruled"]
    observation: str | None = None


@dataclass
class CellPatterns:
    """One cell's merged result."""

    patterns: list[Pattern] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)


def _seq(event_id: str, seq_of: dict[str, int]) -> int:
    return seq_of.get(event_id, 1 << 30)


def merge_cell(cell_id: str, answers: list[LunaAnswer], hits: list[ProbeHit], seq_of: dict[str, int]) -> CellPatterns:
    """Merge the answers of one cell's parts, apply probe overrules, and number the patterns."""
    by_id = {h.hit_id: h for h in hits}
    proven = [h for h in hits if h.proves_unchanged]
    drafts: list[tuple[Pattern, str | None, str | None]] = []  # (pattern, overruling hit, model claim)
    verdicts: dict[str, Verdict] = {}
    for ans in answers:
        for p in ans.patterns:
            evidence = sorted(set(p.evidence), key=lambda e: (_seq(e, seq_of), e))
            cited = [c for c in p.candidates if c in by_id]
            overruler: ProbeHit | None = None
            if p.state_changed and len(evidence) >= 2:
                lo, hi = _seq(evidence[0], seq_of), _seq(evidence[-1], seq_of)
                overruler = next((h for h in proven if h.first_seq <= lo and hi <= h.last_seq), None)
            if overruler is not None and overruler.hit_id not in cited:
                cited.append(overruler.hit_id)
            pat = Pattern(
                pattern_id="",
                cell_id=cell_id,
                type=p.type,
                concerns=p.concerns,
                observed=p.observed,
                definition_fit=p.definition_fit,
                evidence=evidence,
                confidence=p.confidence,
                state_changed=p.state_changed and overruler is None,
                probe_hits=sorted(cited),
                origin="luna",
                overruled=overruler is not None,
            )
            claim = f"pattern says state changed: {p.observed}" if overruler is not None else None
            drafts.append((pat, overruler.hit_id if overruler else None, claim))
            for c in cited:
                verdicts.setdefault(c, Verdict(cell_id=cell_id, hit_id=c, verdict="confirmed"))
        for r in ans.rejected_candidates:
            hit = by_id.get(r.candidate)
            if hit is None:
                continue
            if r.state_changed and hit.proves_unchanged:
                verdicts[hit.hit_id] = Verdict(
                    cell_id=cell_id, hit_id=hit.hit_id, verdict="overruled", observation=r.observation
                )
                pat = Pattern(
                    pattern_id="",
                    cell_id=cell_id,
                    type=hit.type,
                    concerns=hit.key,
                    observed=hit.explanation,
                    definition_fit=f"deterministic probe {hit.probe_id}: {hit.explanation}",
                    evidence=sorted(hit.evidence, key=lambda e: (_seq(e, seq_of), e)),
                    confidence="high",
                    state_changed=False,
                    probe_hits=[hit.hit_id],
                    origin="probe",
                    overruled=True,
                )
                drafts.append((pat, hit.hit_id, f"rejected: {r.observation}"))
            else:
                rejected = Verdict(cell_id=cell_id, hit_id=hit.hit_id, verdict="rejected", observation=r.observation)
                verdicts.setdefault(hit.hit_id, rejected)
    drafts.sort(
        key=lambda d: (
            d[0].type,
            _seq(d[0].evidence[0], seq_of),
            d[0].concerns,
            d[0].evidence,
            d[0].origin,
            d[0].observed,
        )
    )
    out = CellPatterns()
    for n, (pat, hit_id, claim) in enumerate(drafts, 1):
        pat = pat.model_copy(update={"pattern_id": f"{cell_id}-P{n:02d}"})
        out.patterns.append(pat)
        if hit_id is not None and claim is not None:
            hit = by_id[hit_id]
            kind: Literal["pattern_claims_change", "rejection_claims_change"] = (
                "rejection_claims_change" if pat.origin == "probe" else "pattern_claims_change"
            )
            out.conflicts.append(
                Conflict(
                    conflict_id=f"{cell_id}-X{len(out.conflicts) + 1:02d}",
                    cell_id=cell_id,
                    hit_id=hit_id,
                    pattern_id=pat.pattern_id,
                    kind=kind,
                    model_claim=claim,
                    probe_finding=hit.explanation,
                    resolution="probe kept: state_changed set to false"
                    if kind == "pattern_claims_change"
                    else "probe kept: candidate reinstated as a pattern",
                )
            )
    out.verdicts = [verdicts[k] for k in sorted(verdicts)]
    return out
