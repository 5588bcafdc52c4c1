"""Block receipts: when a run cannot go on, say what blocked it, what was tried, and how to unblock it.

``runs/<id>/block-receipt.json`` holds the blocking constraint and its class, every
action tried with its real outcome (the error carries them: retries, re-asks, fallbacks), why no
path is left, the exact command that unblocks, and the work already kept. A later successful run
keeps the old receipt as ``block-receipts/<n>.json`` (resolved), never deletes it.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from pipeline.artifacts.rundir import BLOCK
from pipeline.artifacts.schemas import upgrade
from pipeline.artifacts.versions import VERSIONS
from pipeline.core.canonical import read_json, write_json
from pipeline.core.errors import Blocked
from pipeline.state.ledger import Ledger

BLOCK_RECEIPT = BLOCK.filename
RESOLVED_DIR = "block-receipts"
BLOCK_SCHEMA_VERSION = VERSIONS["block-receipt"]

# the constraint classes a block receipt names; anything else a Blocked error names is kept as given.
CONSTRAINT_CLASSES = ("permission", "missing_data", "external_system", "destructive_risk", "credential", "user_stop")


class BlockReceipt(BaseModel):
    """The whole ``block-receipt.json``: constraint, class, what was tried, why no path is left, how to unblock."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = BLOCK_SCHEMA_VERSION
    run_id: str
    stage: str
    blocked_at: str = Field(description="UTC, YYYY-MM-DDTHH:MM:SSZ")
    blocking_constraint: str
    constraint_class: str = Field(description="one of " + ", ".join(CONSTRAINT_CLASSES) + " (or as the error names it)")
    error: str = Field(description="the error class")
    details: dict[str, str | int | float | bool | None] = Field(default_factory=dict)
    tried_actions: list[dict[str, Any]] = Field(default_factory=list)
    why_all_paths_dead: str
    requested_unblock: str
    command: str | None = None
    work_kept: list[str] = Field(default_factory=list, description="verified ledger entries")
    repeats: int | None = Field(default=None, description="how many times in a row the same block happened")


def build_receipt(
    run_dir: Path, exc: Blocked, *, stage: str, unblock: str, command: str | None = None
) -> dict[str, Any]:
    """The content of a block receipt for ``exc`` raised by ``stage``."""
    ledger = Ledger(run_dir)
    kept = [e["name"] for e in ledger.summary() if e["state"] == "verified"]
    tried = [dict(t) for t in exc.tried]
    extra = {k: v for k, v in exc.data.items() if isinstance(v, str | int | float | bool) or v is None}
    return {
        "schema_version": BLOCK_SCHEMA_VERSION,
        "run_id": run_dir.name,
        "stage": stage,
        "blocked_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "blocking_constraint": exc.one_line(),
        "constraint_class": exc.reason,
        "error": type(exc).__name__,
        "details": extra,
        "tried_actions": tried,
        "why_all_paths_dead": (
            "; ".join(str(t.get("outcome", "")) for t in tried if t.get("outcome"))
            or "no automatic path left: the next step needs the command below"
        ),
        "requested_unblock": unblock,
        "command": command,
        "work_kept": kept,
    }


def write_block_receipt(run_dir: Path, exc: Blocked, *, stage: str, unblock: str, command: str | None = None) -> Path:
    """Write ``block-receipt.json`` atomically and return its path."""
    path = run_dir / BLOCK_RECEIPT
    receipt = build_receipt(run_dir, exc, stage=stage, unblock=unblock, command=command)
    previous = read_block_receipt(run_dir)
    if previous and (previous.get("stage"), previous.get("blocking_constraint")) == (
        stage,
        receipt["blocking_constraint"],
    ):
        # the same wall twice with nothing new tried is not persistence, it is a loop
        receipt["repeats"] = int(previous.get("repeats", 1)) + 1
        receipt["why_all_paths_dead"] = (
            f"the same block {receipt['repeats']} times in a row; retrying changes nothing. "
            + str(receipt["why_all_paths_dead"])
        )
    write_json(path, receipt)
    return path


def resolve_block_receipt(run_dir: Path) -> Path | None:
    """Move a stale block receipt to ``block-receipts/`` once the run went past it (kept, never deleted)."""
    path = run_dir / BLOCK_RECEIPT
    if not path.is_file():
        return None
    dest_dir = run_dir / RESOLVED_DIR
    dest_dir.mkdir(parents=True, exist_ok=True)
    n = len(list(dest_dir.glob("*.json"))) + 1
    dest = dest_dir / f"{n:03d}.json"
    os.replace(path, dest)
    return dest


def read_block_receipt(run_dir: Path) -> dict[str, Any] | None:
    """The current block receipt, if the run is blocked."""
    path = run_dir / BLOCK_RECEIPT
    if not path.is_file():
        return None
    raw = read_json(path)
    if not isinstance(raw, dict):
        return None

    return upgrade(raw, "block-receipt", str(path))[0]
