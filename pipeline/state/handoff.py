"""``runs/<id>/handoff.json``: the run's state machine, with a revision number for compare-and-set.

Progress: created → exported → patterns → aggregated → rootCausesMined, then
``userRootCauseConfirmation`` (pending → confirmed / partially_confirmed / rejected),
``proposalGeneration`` (not_started → done) and ``proposalSelection``
(not_started → pending → selected / none / redo). Every change bumps ``revision``; an update
that changes nothing does not. Gate decisions are compare-and-set on that revision
(:mod:`pipeline.gates.gate1`). All writes happen under one exclusive lock file per run.

A gate's *standing* decision (:func:`standing_receipt`) is the head of its decision chain: the
latest receipt, while the ledger holds it verified and it was made on the subject that is current.
The printed gate commands carry it as ``--base`` (or ``none``).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from filelock import FileLock
from pydantic import BaseModel, ConfigDict, Field

from pipeline.artifacts.run_info import run_command
from pipeline.artifacts.rundir import HANDOFF, HANDOFF_LOCK, SHORTLIST, VALIDATION, RunDir
from pipeline.artifacts.schemas import load_artifact, load_document
from pipeline.artifacts.versions import VERSIONS
from pipeline.core.canonical import write_json
from pipeline.core.errors import BadInput, NeedsRebase
from pipeline.state.ledger import Ledger

HANDOFF_FILE = HANDOFF.filename
LOCK_FILE = HANDOFF_LOCK
HANDOFF_SCHEMA_VERSION = VERSIONS["handoff"]
NO_DECISION = "none"  # the base of a gate on which no decision stands
GATE_SUBJECT = {"gate1": "shortlist_digest", "gate2": "proposals_digest"}  # the handoff field each decides on

Phase = Literal["created", "exported", "patterns", "aggregated", "rootCausesMined"]
PHASES: tuple[Phase, ...] = ("created", "exported", "patterns", "aggregated", "rootCausesMined")
Confirmation = Literal["not_started", "pending", "confirmed", "partially_confirmed", "rejected"]
Generation = Literal["not_started", "done"]
Selection = Literal["not_started", "pending", "selected", "none", "redo"]


class HistoryEvent(BaseModel):
    """One change of the state machine."""

    model_config = ConfigDict(extra="forbid")

    revision: int
    event: str
    changes: dict[str, Any] = Field(default_factory=dict)


class Handoff(BaseModel):
    """The state machine of one analysis run."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = HANDOFF_SCHEMA_VERSION
    run_id: str
    revision: int = 0
    phase: Phase = "created"
    userRootCauseConfirmation: Confirmation = "not_started"
    proposalGeneration: Generation = "not_started"
    proposalSelection: Selection = "not_started"
    shortlist_digest: str | None = None
    proposals_digest: str | None = None
    receipts: dict[str, str] = Field(default_factory=dict, description="gate -> latest receipt path (run-relative)")
    history: list[HistoryEvent] = Field(default_factory=list)


@contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Exclusive lock over a run's state (handoff and gate receipts); released even on a crash.

    An OS file lock (flock, through filelock), so deciders in other processes wait their turn and
    the read-check-write of a gate decision is one step; the kernel releases it when a process dies.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(run_dir / LOCK_FILE, mode=0o644):
        yield


def load(run_dir: Path) -> Handoff:
    """The run's handoff (a fresh one when none was written yet)."""
    path = run_dir / HANDOFF_FILE
    if not path.is_file():
        return Handoff(run_id=run_dir.name)
    return load_artifact(path, "handoff", Handoff)  # newer refused (exit 2), older upgraded


def _apply(handoff: Handoff, changes: Mapping[str, Any], event: str) -> bool:
    """Apply field changes; bump the revision and log them when something changed."""
    actual = {k: v for k, v in changes.items() if getattr(handoff, k) != v}
    if not actual:
        return False
    data = handoff.model_dump()
    data.update(actual)
    updated = Handoff.model_validate(data)  # validates the new values (literals) before anything is written
    for k in actual:
        setattr(handoff, k, getattr(updated, k))
    handoff.revision += 1
    handoff.history.append(HistoryEvent(revision=handoff.revision, event=event, changes=dict(actual)))
    return True


def update(run_dir: Path, changes: Mapping[str, Any], event: str, *, expected_revision: int | None = None) -> Handoff:
    """Change the state machine atomically under the run lock (compare-and-set when a revision is expected)."""
    with run_lock(run_dir):
        return update_locked(run_dir, changes, event, expected_revision=expected_revision)


def update_locked(
    run_dir: Path, changes: Mapping[str, Any], event: str, *, expected_revision: int | None = None
) -> Handoff:
    """:func:`update` for callers that already hold :func:`run_lock`."""
    handoff = load(run_dir)
    if expected_revision is not None and handoff.revision != expected_revision:
        raise NeedsRebase(
            f"needs_rebase: handoff is at revision {handoff.revision}, expected {expected_revision}; "
            f"since then: {changes_since(handoff, expected_revision)}",
            current_revision=handoff.revision,
        )
    if _apply(handoff, changes, event) or not (run_dir / HANDOFF_FILE).is_file():
        write_json(run_dir / HANDOFF_FILE, handoff.model_dump(mode="json"))
    return handoff


def changes_since(handoff: Handoff, revision: int) -> str:
    """One line listing the events after ``revision``."""
    events = [f"r{h.revision} {h.event}" for h in handoff.history if h.revision > revision]
    return "; ".join(events) if events else "nothing recorded"


def phase_reached(handoff: Handoff, phase: Phase) -> bool:
    """Whether the run got at least as far as ``phase``."""
    return PHASES.index(handoff.phase) >= PHASES.index(phase)


def weakness_ids(run_dir: Path) -> list[str]:
    """Ids of the weaknesses in the run's shortlist (empty when there is none)."""
    doc = RunDir(run_dir).document(SHORTLIST) or {}
    return [str(w.get("weakness_id")) for w in doc.get("weaknesses") or [] if isinstance(w, dict)]


def standing_receipt(run_dir: Path, gate: str, handoff: Handoff | None = None) -> str | None:
    """The run-relative path of the decision that stands on ``gate`` (the head of its chain), or None.

    A receipt stands while it is the gate's latest, the ledger holds it verified (a rerun, or a
    superseding gate-1 decision, voids it) and it was made on the subject that is current now.
    """
    h = handoff or load(run_dir)
    rel = h.receipts.get(gate)
    if not rel or not (run_dir / rel).is_file():
        return None
    entry = Ledger(run_dir).get(gate)
    if entry is None or entry.state != "verified":
        return None
    raw, _ = load_document(run_dir / rel, "gate-receipt")  # a damaged receipt is one line (exit 2), not "none"
    subject = raw.get("subject")
    field = GATE_SUBJECT.get(gate)
    if field and (not isinstance(subject, dict) or subject.get("digest") != getattr(h, field)):
        return None
    return rel


def chain_base(run_dir: Path, gate: str, handoff: Handoff | None = None) -> str:
    """What a decider reading the run now decides on: the standing decision's operation id, or ``none``."""
    rel = standing_receipt(run_dir, gate, handoff)
    if rel is None:
        return NO_DECISION
    return str(load_document(run_dir / rel, "gate-receipt")[0].get("operation_id") or NO_DECISION)


def _base_args(run_dir: Path, gate: str, handoff: Handoff) -> list[str]:
    base = chain_base(run_dir, gate, handoff)
    return ["--base", base] if base == NO_DECISION else ["--base", base, "--supersede"]


def _quote(parts: list[str]) -> str:
    return " ".join(shlex.quote(p) if "|" not in p else f"'{p}'" for p in parts)


def confirm_command(run_dir: Path, handoff: Handoff) -> str:
    """The exact gate-1 command: one decision placeholder per weakness, the digest and the chain base."""
    parts = ["lunasol", "confirm", str(run_dir)]
    for wid in weakness_ids(run_dir) or ["W-01"]:
        parts += ["--decision", f"{wid}=confirm|reject|unresolved|amend"]
    parts += ["--by", "NAME"]
    if handoff.shortlist_digest:
        parts += ["--digest", handoff.shortlist_digest]
    return _quote(parts + _base_args(run_dir, "gate1", handoff))


def select_command(run_dir: Path, handoff: Handoff, choice: str = "(--proposal P-01 | --none | --redo)") -> str:
    """The exact gate-2 command: the choice, the proposals digest and the chain base."""
    digest_part = f" --digest {handoff.proposals_digest}" if handoff.proposals_digest else ""
    base = " ".join(_base_args(run_dir, "gate2", handoff))
    return f"lunasol select {shlex.quote(str(run_dir))} {choice} --by NAME{digest_part} {base}"


def _proposal_outcome(run_dir: Path) -> tuple[list[str], list[str]]:
    """(accepted card ids, weaknesses whose proposer call failed) from ``validation.json`` ([] and [] without it)."""
    try:
        data = RunDir(run_dir).document(VALIDATION)
    except BadInput:
        return [], []
    if data is None:
        return [], []
    cards = [c for c in data.get("cards") or [] if isinstance(c, dict)]
    ids = [str(c["proposal_id"]) for c in cards if c.get("status") == "accepted" and c.get("proposal_id")]
    failed = [
        str(w.get("weakness_id"))
        for w in data.get("weaknesses") or []
        if isinstance(w, dict) and isinstance(w.get("call"), dict) and w["call"].get("ok") is False
    ]
    return ids, failed


def next_command(run_dir: Path, handoff: Handoff | None = None) -> str:
    """The exact next command for a run, given its state."""
    h = handoff or load(run_dir)
    run = shlex.quote(str(run_dir))
    if h.phase != "rootCausesMined":
        return run_command(run_dir)
    if h.userRootCauseConfirmation in ("pending", "not_started"):
        if RunDir(run_dir).shortlist.is_file() and not weakness_ids(run_dir):
            return "# the shortlist holds no weakness: nothing to confirm. Rerun the analysis: " + run_command(
                run_dir, resume=False
            )
        return confirm_command(run_dir, h)
    if h.userRootCauseConfirmation == "rejected":
        return f"# every weakness was rejected; nothing to propose. Rerun the analysis: {run_command(run_dir)}"
    if h.proposalGeneration == "not_started" or h.proposalSelection == "redo":
        return f"lunasol propose {run}"
    if h.proposalSelection in ("pending", "not_started"):
        ids, failed = _proposal_outcome(run_dir)
        if failed:
            return f"lunasol propose {run}   # the proposer failed for {', '.join(failed)}: their cards are missing"
        pick = f"--proposal {'|'.join(ids)} | " if ids else ""  # every accepted card, never one that does not exist
        return select_command(run_dir, h, f"({pick}--none | --redo)")
    return f"lunasol report {run}"
