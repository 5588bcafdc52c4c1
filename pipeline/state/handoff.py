"""``runs/<id>/handoff.json``: the run's state machine, with a revision number for compare-and-set.

Progress: created → exported → patterns → aggregated → rootCausesMined, then
``userRootCauseConfirmation`` (pending → confirmed / partially_confirmed / rejected),
``proposalGeneration`` (not_started → done) and ``proposalSelection``
(not_started → pending → selected / none / redo). Every change bumps ``revision``; an update
that changes nothing does not. Gate decisions are compare-and-set on that revision
(:mod:`pipeline.gates.gate1`). All writes happen under one exclusive lock file per run.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pipeline.artifacts.run_info import run_command
from pipeline.artifacts.schemas import load_artifact
from pipeline.artifacts.versions import VERSIONS
from pipeline.core.canonical import read_json, write_json
from pipeline.core.errors import NeedsRebase

HANDOFF_FILE = "handoff.json"
LOCK_FILE = ".lunasol.lock"
HANDOFF_SCHEMA_VERSION = VERSIONS["handoff"]

Phase = Literal["created", "exported", "patterns", "aggregated", "rootCausesMined"]
PHASES: tuple[Phase, ...] = ("created", "exported", "patterns", "aggregated", "rootCausesMined")
Confirmation = Literal["not_started", "pending", "confirmed", "partially_confirmed", "rejected"]
Generation = Literal["not_started", "done"]
Selection = Literal["not_started", "pending", "selected", "none", "redo"]

# Which stage's success moves the run to which phase.
STAGE_PHASE: dict[str, Phase] = {
    "export": "exported",
    "luna": "patterns",
    "coordinator": "aggregated",
    "sol": "rootCausesMined",
}


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
    """Exclusive lock over a run's state (handoff and gate receipts); released even on a crash."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


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
    path = run_dir / "weakness-shortlist.json"
    if not path.is_file():
        return []
    raw = read_json(path)
    return [str(w.get("weakness_id")) for w in raw.get("weaknesses", []) if isinstance(w, dict)]


def confirm_command(run_dir: Path, handoff: Handoff) -> str:
    """The exact gate-1 command, with one decision placeholder per weakness and the digest."""
    parts = ["lunasol", "confirm", str(run_dir)]
    for wid in weakness_ids(run_dir) or ["W-01"]:
        parts += ["--decision", f"{wid}=confirm|reject|unresolved|amend"]
    parts += ["--by", "NAME"]
    if handoff.shortlist_digest:
        parts += ["--digest", handoff.shortlist_digest]
    return " ".join(shlex.quote(p) if "|" not in p else f"'{p}'" for p in parts)


def _proposal_outcome(run_dir: Path) -> tuple[list[str], list[str]]:
    """(accepted card ids, weaknesses whose proposer call failed) from ``validation.json`` ([] and [] without it)."""
    try:
        data = json.loads((run_dir / "validation.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return [], []
    if not isinstance(data, dict):
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
        if (run_dir / "weakness-shortlist.json").is_file() and not weakness_ids(run_dir):
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
        digest_part = f" --digest {h.proposals_digest}" if h.proposals_digest else ""
        pick = f"--proposal {ids[0]} | " if ids else ""  # never a card that does not exist
        return f"lunasol select {run} ({pick}--none | --redo) --by NAME{digest_part}"
    return f"lunasol report {run}"
