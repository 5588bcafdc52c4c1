"""Gate 2: the user selects one proposal, none, or asks for a redo - as a receipt.

The decision goes through :func:`pipeline.gates.gate1.commit`, the same compare-and-set as gate 1:
bound to the digest of ``proposals.yaml`` and to the gate's standing decision the decider saw (its
base; stale → ``needs_rebase``, exit 4; replacing a standing decision needs ``supersede``),
idempotent per operation id, receipts in ``runs/<id>/gates/``.

A selection is not an authorisation: it does not authorise implementing the change, running
an experiment, or touching the frozen evidence (gate 2 is a human's choice of what to try next,
nothing more). The receipt says so in its request (``authorises_implementation: false``) and
:func:`selection_status` says so too.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Literal

from pipeline.artifacts.proposals_file import read_entries
from pipeline.artifacts.rundir import PROPOSALS, RunDir
from pipeline.core.canonical import read_json, sha256_file
from pipeline.core.errors import BadInput, Blocked, NeedsRebase
from pipeline.gates import gate1 as gates
from pipeline.state import handoff

GATE2 = "gate2"
PROPOSALS_FILE = PROPOSALS.filename
NOT_AUTHORISATION = (
    "a selection is not an authorisation: it does not authorise implementing the change, "
    "running an experiment, or modifying the frozen evidence"
)
Choice = Literal["proposal", "none", "redo"]
_STATE = {"proposal": "selected", "none": "none", "redo": "redo"}


def proposal_ids(run_dir: Path) -> list[str]:
    """The ids of the cards in the run's proposals.yaml."""
    path = run_dir / PROPOSALS_FILE
    if not path.is_file():
        return []
    return [str(e.get("proposal_id")) for e in read_entries(path) if isinstance(e, dict)]


def select(
    run_dir: Path,
    *,
    choice: Choice,
    by: str,
    proposal_id: str | None = None,
    note: str | None = None,
    expected_digest: str | None = None,
    expected_revision: int | None = None,
    operation_id: str | None = None,
    require_digest: bool = False,
    expected_base: str | None = None,
    supersede: bool = False,
) -> tuple[Any, bool]:
    """Gate 2: commit the selection as a receipt; return (receipt, replayed).

    ``require_digest``: refuse without ``expected_digest`` (compare-and-set is not opt-in).
    ``expected_base``: the gate-2 decision the decider saw standing (operation id; None: none);
    replacing a standing decision needs ``supersede``.
    """
    if (choice == "proposal") != (proposal_id is not None):
        raise BadInput("choose exactly one of --proposal P-.., --none or --redo")
    if not (run_dir / PROPOSALS_FILE).is_file():
        raise Blocked(
            f"no {PROPOSALS_FILE} in {run_dir}: gate 2 has nothing to decide on",
            reason="missing_data",
            unblock=f"lunasol propose {run_dir}",
        )
    _check_made_from_current_shortlist(run_dir)
    ids = proposal_ids(run_dir)
    if proposal_id is not None and proposal_id not in ids:
        raise BadInput(f"no proposal {proposal_id} in {run_dir / PROPOSALS_FILE} (it has {', '.join(ids) or 'none'})")
    if require_digest and expected_digest is None:
        raise BadInput(
            "--digest is required: it binds your selection to the proposals you read (compare-and-set). "
            f"`lunasol status {run_dir}` prints the proposals digest; read each card first: "
            f"lunasol show {run_dir} {ids[0] if ids else 'P-01'}"
        )
    request = {
        "choice": choice,
        "proposal_id": proposal_id,
        "note": note or None,
        "authorises_implementation": False,
        "meaning": NOT_AUTHORISATION,
    }

    def apply(h: handoff.Handoff) -> dict[str, Any]:
        if h.proposalGeneration != "done":
            raise Blocked(
                "gate 2 is not open: no proposals were generated for the current state",
                reason="missing_data",
                unblock=f"lunasol propose {run_dir}",
            )
        return {"proposalSelection": _STATE[choice]}

    def command_for(base: str) -> str:
        parts = ["lunasol", "select", str(run_dir)]
        parts += ["--proposal", proposal_id] if proposal_id else [f"--{choice}"]
        parts += ["--by", by] + (["--note", note] if note else [])
        parts += ["--digest", expected_digest or sha256_file(run_dir / PROPOSALS_FILE), "--base", base]
        return shlex.join(parts + (["--supersede"] if base != handoff.NO_DECISION else []))

    return gates.commit(
        run_dir,
        gate=GATE2,
        artifact=PROPOSALS_FILE,
        by=by,
        request=request,
        apply=apply,
        expected_digest=expected_digest,
        expected_revision=expected_revision,
        operation_id=operation_id,
        expected_base=expected_base,
        supersede=supersede,
        command_for=command_for,
    )


def _check_made_from_current_shortlist(run_dir: Path) -> None:
    """Proposals made from an older shortlist cannot be selected: the ground under them moved."""
    path = RunDir(run_dir).validation
    if not path.is_file():
        return
    raw = read_json(path)
    made_from = raw.get("shortlist_digest") if isinstance(raw, dict) else None
    current = handoff.load(run_dir).shortlist_digest
    if made_from and current and made_from != current:
        raise NeedsRebase(
            f"needs_rebase: the proposals were made from shortlist {made_from}, the shortlist is now {current}; "
            f"regenerate them: lunasol propose {run_dir}"
        )


def selection_status(run_dir: Path) -> dict[str, Any]:
    """Gate 2 as ``lunasol status`` can show it: state, the chosen card, and what it does not authorise."""
    h = handoff.load(run_dir)
    rel = handoff.standing_receipt(run_dir, GATE2, h)  # a voided selection is not the selection
    out: dict[str, Any] = {
        "proposalSelection": h.proposalSelection,
        "proposals_digest": h.proposals_digest,
        "proposal_id": None,
        "receipt": rel,
        "authorises_implementation": False,
        "meaning": NOT_AUTHORISATION,
    }
    if rel:
        raw = read_json(run_dir / rel)
        request = raw.get("request", {}) if isinstance(raw, dict) else {}
        out["proposal_id"] = request.get("proposal_id")
        out["by"] = raw.get("by")
    return out
