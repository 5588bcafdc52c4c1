"""How an older artifact is read: one ordered list of steps, plus the rule every artifact shares.

Version 0 means "written before the artifact carried ``schema_version``": the same fields with no
version, so 0 -> 1 is the same step for every artifact (:func:`steps` adds it). A change of fields
is a new entry in :data:`MIGRATIONS` (numbers unique, never reused; a shipped step is never edited,
a fix is a new step). See docs/schemas.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Doc = dict[str, Any]


@dataclass(frozen=True)
class Migration:
    """One numbered step: ``artifact`` from ``from_version`` to ``to_version``."""

    number: int
    artifact: str
    from_version: int
    to_version: int
    upgrade: Callable[[Doc], Doc]
    summary: str


def _add_version(doc: Doc) -> Doc:
    return {**doc, "schema_version": 1}


def _shortlist_plan(doc: Doc) -> Doc:
    # v2 adds the optional ``plan`` (which Sol call saw which cells); a v1 file simply has none.
    return dict(doc)


def _followup_judge(doc: Doc) -> Doc:
    # v2 adds the judged part: ``judge`` and ``conflicts`` at the top, ``decided_by`` / ``judge`` per
    # condition. A v1 file was made by counts alone: its settled conditions were decided by the count,
    # the rest were left to a human, and no judge was asked.
    out = dict(doc)
    out.setdefault("judge", None)
    out.setdefault("conflicts", [])
    conditions = []
    for c in doc.get("conditions") or []:
        if isinstance(c, dict):
            c = {"decided_by": "human" if c.get("status") == "undetermined" else "count", "judge": None, **c}
        conditions.append(c)
    out["conditions"] = conditions
    return out


def _shortlist_reused(doc: Doc) -> Doc:
    # v3 adds ``reused`` to each of the plan's calls (a map answer taken again); a v2 call was always made.
    return dict(doc)


def _shortlist_stable_digest(doc: Doc) -> Doc:
    # v4 seals the digest without call metadata (``call``; the plan calls' keys, attempts, errors,
    # reused, ok, request tokens); the fields are the same, and an older file keeps the digest it was
    # sealed with (read_shortlist checks it against the content as written).
    return dict(doc)


def _receipt_chain(doc: Doc) -> Doc:
    # v2 binds a decision to the gate's decision chain: ``base_decision`` (the standing decision it
    # was made on) and ``supersedes``. A v1 receipt was made without looking at the chain: none.
    return {"base_decision": "none", "supersedes": None, **doc}


def _run_pilot(doc: Doc) -> Doc:
    # v2 adds the optional ``pilot`` (a run on a subset of cells: --where / --sample); a v1 run was a full run.
    return dict(doc)


def _shortlist_pilot(doc: Doc) -> Doc:
    # v5 adds the optional ``pilot`` (the cells a pilot run took); a v4 shortlist was made on every eligible
    # cell. The fields are the same otherwise, and the file keeps the digest it was sealed with.
    return dict(doc)


def _receipt_ask_pilot(doc: Doc) -> Doc:
    # v3 adds ``ask`` (the ask a gate-1 decision cites: ``lunasol confirm --ask``) and ``pilot`` (the decision
    # was made on a pilot's shortlist, a subset of cells); a v2 receipt cited no ask and was on every cell.
    return {"ask": None, "pilot": None, **doc}


# Artifact-specific steps, in number order.
MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "weakness-shortlist", 1, 2, _shortlist_plan, "v2 adds plan (Sol's calls and the cells each saw)"),
    Migration(2, "followup", 1, 2, _followup_judge, "v2 adds the judged part (judge, conflicts, decided_by)"),
    Migration(3, "weakness-shortlist", 2, 3, _shortlist_reused, "v3 adds reused to plan calls (map answers)"),
    Migration(
        4, "weakness-shortlist", 3, 4, _shortlist_stable_digest, "v4's digest leaves out call metadata (same fields)"
    ),
    Migration(5, "gate-receipt", 1, 2, _receipt_chain, "v2 adds base_decision and supersedes (the decision chain)"),
    Migration(6, "run", 1, 2, _run_pilot, "v2 adds pilot (a run on a subset: --where / --sample)"),
    Migration(7, "weakness-shortlist", 4, 5, _shortlist_pilot, "v5 adds pilot (the subset a pilot run analysed)"),
    Migration(
        8, "gate-receipt", 2, 3, _receipt_ask_pilot, "v3 adds ask (the ask gate 1 cites) and pilot (decided on a pilot)"
    ),
)


def v0_rule(artifact: str) -> Migration:
    """The 0 -> 1 step every artifact shares: add ``schema_version``; nothing else changed."""
    return Migration(0, artifact, 0, 1, _add_version, "v0 had no schema_version: add it")


def steps(artifact: str) -> list[Migration]:
    """Every step of one artifact, in order: the shared v0 rule, then its numbered migrations."""
    return [v0_rule(artifact), *(m for m in MIGRATIONS if m.artifact == artifact)]


__all__ = ["MIGRATIONS", "Doc", "Migration", "steps", "v0_rule"]
