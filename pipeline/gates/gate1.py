"""Human gates as receipts: compare-and-set on what the decider read.

A decision (gate 1: confirm root causes; gate 2: select a proposal) binds to two things the decider
read: the digest of its subject (the shortlist, the proposals) and the gate's decision chain, i.e.
the decision that stands on the gate (its operation id, or ``none``; the *base*). :func:`commit`,
under the run's file lock (read, check and write are one step),

1. returns the stored receipt unchanged when the same operation id was already committed with
   the same request (idempotent replay; the same id with another request is refused);
2. refuses with ``needs_rebase`` (exit 4) when the subject's digest is not the one decided on,
   naming what changed; or when the base is not the decision standing now, or a decision stands
   and the decider did not say ``supersede``, naming who decided what and when, and the command
   that replaces it;
3. writes the receipt to ``runs/<id>/gates/<gate>-<operation>.json`` with exclusive creation,
   recording the base and the decision it supersedes, then applies the state change to the handoff
   (revision + 1) and records the receipt in the ledger.

Twenty deciders racing on the same base: exactly one wins, whatever their names; the others are
told who did. The default operation id includes the base, so a change of mind (a new decision on
a new base) is a new operation while an identical retry is a replay.

Silence is never approval: nothing after a gate proceeds without a receipt.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pipeline.artifacts import rundir
from pipeline.artifacts.run_info import Pilot, run_command
from pipeline.artifacts.schemas import load_artifact
from pipeline.artifacts.versions import VERSIONS
from pipeline.core.canonical import atomic_create_bytes, digest, pretty_json, read_json, sha256_file
from pipeline.core.errors import BadInput, Blocked, NeedsRebase
from pipeline.sol.shortlist import read_shortlist
from pipeline.state import handoff
from pipeline.state.ledger import Ledger

GATES_DIR = rundir.GATES_DIR
RECEIPT_SCHEMA_VERSION = VERSIONS["gate-receipt"]


class Subject(BaseModel):
    """What a decision was made on: an artifact of the run and its digest."""

    model_config = ConfigDict(extra="forbid")

    artifact: str
    digest: str


class Superseded(BaseModel):
    """The decision a superseding receipt replaced: who decided what, and when."""

    model_config = ConfigDict(extra="forbid")

    operation_id: str
    by: str
    decided_at: str
    result: dict[str, Any]
    receipt: str = Field(description="its receipt, relative to the run")


class CitedAsk(BaseModel):
    """The ask a gate-1 decision was made with (``lunasol confirm --ask``): what it asked and what it found."""

    model_config = ConfigDict(extra="forbid")

    ask_id: str
    question: str = Field(description="as sent to the model (redacted)")
    weakness_id: str | None = Field(default=None, description="the card the question was made from (--weakness)")
    answer_kind: str
    cells: int = Field(description="cells asked")
    answered: int
    failed: int
    counts: dict[str, int] | None = Field(default=None, description="answered cells per answer (None: a number)")
    mean: float | None = Field(default=None, description="a number ask's mean")
    pilot: dict[str, int] | None = Field(default=None, description="a pilot's sample size and seed")
    digest: str = Field(description="digest of the ask's definition and every cell's answer and cited events")


class Receipt(BaseModel):
    """Proof of one gate decision, bound to the exact subject digest and the decision chain it was made on."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = RECEIPT_SCHEMA_VERSION
    gate: str
    operation_id: str
    run_id: str
    by: str
    decided_at: str
    base_revision: int
    new_revision: int
    subject: Subject
    request: dict[str, Any]
    request_digest: str
    result: dict[str, Any] = Field(description="the handoff fields this decision set")
    base_decision: str = Field(
        default=handoff.NO_DECISION,
        description="the gate's standing decision it was made on (its operation id), or none",
    )
    supersedes: Superseded | None = Field(default=None, description="the decision it replaced (--supersede)")
    ask: CitedAsk | None = Field(default=None, description="the ask the decision cites (gate 1, --ask)")
    pilot: Pilot | None = Field(
        default=None,
        description="gate 1 decided on a pilot's shortlist: a subset of the cells (--where / --sample), not the batch",
    )
    receipt_digest: str = ""

    def dump(self) -> dict[str, Any]:
        """The receipt as written: an absent ask or pilot is left out, so a receipt with neither reads as before."""
        absent = {name for name in ("ask", "pilot") if getattr(self, name) is None}
        return self.model_dump(mode="json", exclude=absent or None)


def receipt_path(run_dir: Path, gate: str, operation_id: str) -> Path:
    """Where the receipt of one operation lives."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in operation_id)
    return run_dir / GATES_DIR / f"{gate}-{safe}.json"


def _binding(gate: str, subject_digest: str, request: Mapping[str, Any], by: str, base: str) -> dict[str, Any]:
    bound: dict[str, Any] = {"gate": gate, "subject": subject_digest, "request": request, "by": by}
    if base != handoff.NO_DECISION:  # a first decision keeps the id it had before chains were bound
        bound["base"] = base
    return bound


def default_operation_id(
    gate: str, subject_digest: str, request: Mapping[str, Any], by: str, base: str = handoff.NO_DECISION
) -> str:
    """A stable id for a decision on a base: repeating the command replays; deciding again on a new base does not."""
    return "op-" + digest(_binding(gate, subject_digest, request, by, base)).split(":")[1][:16]


def _load_receipt(path: Path) -> Receipt:
    # Through the schema registry: a receipt written by a newer lunasol is refused, an older one upgraded.
    return load_artifact(path, "gate-receipt", Receipt)


def standing(run_dir: Path, gate: str, current: handoff.Handoff | None = None) -> Receipt | None:
    """The decision that stands on ``gate`` now (the head of its chain), or None."""
    rel = handoff.standing_receipt(run_dir, gate, current)
    return _load_receipt(run_dir / rel) if rel else None


OUTCOME_FIELD = {"gate1": "userRootCauseConfirmation", "gate2": "proposalSelection"}  # a gate's outcome


def outcome(gate: str, result: Mapping[str, Any]) -> str:
    """The outcome a decision's result names (``confirmed``, ``selected``...)."""
    return str(result.get(OUTCOME_FIELD.get(gate, ""), "decided"))


def summary(receipt: Receipt) -> str:
    """Who decided what and when, in a few words: ``alice recorded confirmed (W-01=confirm) at T``."""
    req = receipt.request
    if isinstance(req.get("decisions"), dict):
        what = ", ".join(f"{w}={d.get('decision')}" for w, d in req["decisions"].items() if isinstance(d, dict))
    else:
        what = str(req.get("proposal_id") or req.get("choice") or "")
    did = outcome(receipt.gate, receipt.result)
    return f"{receipt.by} recorded {did} ({what}) at {receipt.decided_at} (receipt {receipt.operation_id})"


CommandFor = Callable[[str], str]  # base -> the decider's own command on that base (with --supersede when not none)


def commit(
    run_dir: Path,
    *,
    gate: str,
    artifact: str,
    by: str,
    request: Mapping[str, Any],
    apply: Callable[[handoff.Handoff], dict[str, Any]],
    expected_digest: str | None,
    expected_revision: int | None = None,
    operation_id: str | None = None,
    subject_digest: Callable[[], str] | None = None,
    expected_base: str | None = None,
    supersede: bool = False,
    command_for: CommandFor | None = None,
    ask: CitedAsk | None = None,
    pilot: Pilot | None = None,
) -> tuple[Receipt, bool]:
    """Commit one gate decision; return the receipt and whether it was a replay of an earlier commit.

    ``apply`` gets the current handoff and returns the fields to set (it may raise to refuse).
    ``expected_digest`` is the subject digest the decider saw (None: whatever is current);
    ``expected_base`` the gate's standing decision they saw (an operation id; None means ``none``:
    no decision stands). Deciding where a decision stands needs ``supersede``, and the base must be
    that decision. ``expected_revision`` (optional) also binds the handoff revision.
    ``subject_digest`` computes the subject's current digest (default: the file's sha256).
    ``command_for`` renders the decider's command on another base, for the refusal line.
    ``ask``: the ask the decision cites, recorded whole in the receipt (its id and digest are in ``request``).
    ``pilot``: the subject was made on a pilot's subset of cells (said in the receipt).
    """
    if not by.strip():
        raise BadInput("--by NAME is required: a decision needs a named person")
    base = (expected_base or handoff.NO_DECISION).strip() or handoff.NO_DECISION
    art_path = run_dir / artifact
    current_digest = subject_digest or (lambda: sha256_file(art_path))
    with handoff.run_lock(run_dir):
        if not art_path.is_file():
            raise BadInput(f"{art_path} not found: nothing to decide on yet")
        now_digest = current_digest()
        bound = _binding(gate, expected_digest or now_digest, request, by, base)
        op = operation_id or default_operation_id(gate, expected_digest or now_digest, request, by, base)
        req_digest = digest(bound)
        path = receipt_path(run_dir, gate, op)
        current = handoff.load(run_dir)
        if path.is_file():
            old = _load_receipt(path)
            if old.request_digest != req_digest:
                raise NeedsRebase(
                    f"needs_rebase: operation id {op} was already used for a different decision "
                    f"({path.name}); use a new --operation-id",
                    operation_id=op,
                )
            if current.revision == old.base_revision and current.receipts.get(gate) != str(path.relative_to(run_dir)):
                # A crash between the receipt and the handoff write: finish applying the same decision.
                _apply_receipt(run_dir, old, path)
            return old, True
        if expected_revision is not None and current.revision != expected_revision:
            raise NeedsRebase(
                f"needs_rebase: handoff is at revision {current.revision}, you decided on revision "
                f"{expected_revision}; since then: {handoff.changes_since(current, expected_revision)}",
                current_revision=current.revision,
            )
        if expected_digest is not None and expected_digest != now_digest:
            what = describe_change(run_dir, artifact, expected_digest)
            raise NeedsRebase(
                f"needs_rebase: {artifact} changed: you decided on {expected_digest}, it is now {now_digest}"
                + (f" ({what})" if what else ""),
                current_digest=now_digest,
            )
        head = standing(run_dir, gate, current)
        _check_chain(gate, head, base, supersede, command_for)
        result = apply(current)
        receipt = Receipt(
            gate=gate,
            operation_id=op,
            run_id=current.run_id,
            by=by,
            decided_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            base_revision=current.revision,
            new_revision=current.revision + 1,
            subject=Subject(artifact=artifact, digest=now_digest),
            request=dict(request),
            request_digest=req_digest,
            result=result,
            base_decision=base,
            pilot=pilot,
            supersedes=None
            if head is None
            else Superseded(
                operation_id=head.operation_id,
                by=head.by,
                decided_at=head.decided_at,
                result=head.result,
                receipt=str(receipt_path(run_dir, gate, head.operation_id).relative_to(run_dir)),
            ),
            ask=ask,
        )
        receipt.receipt_digest = digest({k: v for k, v in receipt.dump().items() if k != "receipt_digest"})
        if not atomic_create_bytes(path, pretty_json(receipt.dump()).encode("utf-8")):
            raise NeedsRebase(f"needs_rebase: another decision with operation id {op} was committed first")
        _apply_receipt(run_dir, receipt, path)
        return receipt, False


def _check_chain(gate: str, head: Receipt | None, base: str, supersede: bool, command_for: CommandFor | None) -> None:
    """Refuse (needs_rebase) unless the decider's base is the decision standing now, and says supersede if one does."""
    name = gate.replace("gate", "gate ")
    head_id = head.operation_id if head is not None else handoff.NO_DECISION
    if head is None:
        if base == handoff.NO_DECISION:
            return
        retry = f": {command_for(head_id)}" if command_for else " (--base none)"
        raise NeedsRebase(
            f"needs_rebase: {name} has no standing decision now (the one you decided on, {base}, was voided "
            f"or never stood); decide on base none{retry}",
            current_base=head_id,
        )
    if base == head_id and supersede:
        return
    seen = "you decided on base none" if base == handoff.NO_DECISION else f"you decided on base {base}"
    if base == head_id:
        seen = "you did not say --supersede"
    retry = f": {command_for(head_id)}" if command_for else f" (--base {head_id} --supersede)"
    raise NeedsRebase(
        f"needs_rebase: {name} already decided: {summary(head)}; {seen}; to replace it{retry}",
        current_base=head_id,
    )


def describe_change(run_dir: Path, artifact: str, old_digest: str) -> str:
    """What changed in a shortlist since the version with ``old_digest`` (kept under superseded/), by weakness."""
    if artifact != SHORTLIST:
        return ""
    old: dict[str, Any] | None = None
    for p in sorted((run_dir / "superseded").glob(f"*-{SHORTLIST}")):
        raw = read_json(p)
        if isinstance(raw, dict) and raw.get("digest") == old_digest:
            old = raw
            break
    if old is None:
        return "the version you decided on is not kept"
    new = read_json(run_dir / artifact)
    before = {w["weakness_id"]: w for w in old.get("weaknesses", [])}
    after = {w["weakness_id"]: w for w in new.get("weaknesses", [])}
    parts = [f"{w} new" for w in sorted(set(after) - set(before))]
    parts += [f"{w} gone" for w in sorted(set(before) - set(after))]
    for w in sorted(set(before) & set(after)):
        fields = sorted(k for k in set(before[w]) | set(after[w]) if before[w].get(k) != after[w].get(k))
        if fields:
            parts.append(f"{w} changed: {', '.join(fields)}")
    return "; ".join(parts) or "same weaknesses; other fields changed (made_from, denominator or dropped)"


def _apply_receipt(run_dir: Path, receipt: Receipt, path: Path) -> None:
    """Apply a committed receipt to the handoff and the ledger (caller holds the run lock)."""
    rel = str(path.relative_to(run_dir))
    current = handoff.load(run_dir)
    changes = dict(receipt.result)
    changes["receipts"] = {**current.receipts, receipt.gate: rel}
    event = f"{receipt.gate} by {receipt.by} ({receipt.operation_id})"
    if receipt.supersedes is not None:
        event += f" superseding {receipt.supersedes.by}'s {receipt.supersedes.operation_id}"
    handoff.update_locked(run_dir, changes, event)
    Ledger(run_dir).mark_verified(
        receipt.gate,
        receipt.gate,
        {"subject": receipt.subject.digest, "base_revision": str(receipt.base_revision)},
        {rel: sha256_file(path)},
    )


def invalidate_gate(run_dir: Path, gate: str, reason: str) -> None:
    """Mark a gate's receipt invalidated in the ledger (the receipt file is kept)."""
    Ledger(run_dir).invalidate(gate, reason)


# -- gate 1: root-cause confirmation ---------------------------------------------------------------

Decision = Literal["confirm", "reject", "unresolved", "amend"]
DECISIONS: tuple[str, ...] = ("confirm", "reject", "unresolved", "amend")
GATE1 = "gate1"
LATER_DECISIONS = ("selected", "none", "redo")  # gate-2 states a new gate-1 decision would supersede
SHORTLIST = rundir.SHORTLIST.filename


def shortlist_digest(run_dir: Path) -> str:
    """The shortlist's own digest (the ``digest`` field, checked against its content)."""
    return read_shortlist(run_dir / SHORTLIST).digest


def parse_pairs(items: list[str], what: str) -> dict[str, str]:
    """``["W-01=confirm", ...]`` -> ``{"W-01": "confirm"}`` (bad shapes and repeats are bad input)."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise BadInput(f"{what} must look like W-01=VALUE, got {item!r}")
        if key in out:
            raise BadInput(f"{what} for {key} given twice")
        out[key] = value.strip()
    return out


def gate1_outcome(decisions: Mapping[str, str]) -> str:
    """The gate-1 state a set of decisions leads to.

    confirmed when every weakness is confirmed or amended, rejected when every one is rejected,
    pending when nothing was confirmed and some stay unresolved, partially_confirmed otherwise.
    """
    kinds = set(decisions.values())
    if kinds <= {"confirm", "amend"}:
        return "confirmed"
    if kinds == {"reject"}:
        return "rejected"
    if not kinds & {"confirm", "amend"}:
        return "pending"
    return "partially_confirmed"


def confirm(
    run_dir: Path,
    decisions: Mapping[str, str],
    *,
    by: str,
    notes: Mapping[str, str] | None = None,
    expected_digest: str | None = None,
    expected_revision: int | None = None,
    operation_id: str | None = None,
    require_digest: bool = False,
    supersede: bool = False,
    expected_base: str | None = None,
    ask: CitedAsk | None = None,
) -> tuple[Receipt, bool]:
    """Gate 1: record a decision on every weakness of the shortlist as a receipt (see :func:`commit`).

    ``require_digest``: refuse without ``expected_digest`` (a non-interactive decision must name the
    shortlist it was made on: compare-and-set is not opt-in). ``expected_base``: the gate-1 decision
    the decider saw standing (operation id; None: none). Replacing a standing decision needs
    ``supersede``; it voids the proposals and any gate-2 decision made under the old one.
    ``ask``: the ask the decider read (``--ask``); its id and digest bind the decision like the rest of it.
    """
    notes = dict(notes or {})
    ids = handoff.weakness_ids(run_dir)
    if not (run_dir / SHORTLIST).is_file():
        raise Blocked(
            f"no weakness shortlist in {run_dir}: gate 1 has nothing to decide on",
            reason="missing_data",
            unblock=run_command(run_dir),
        )
    if not ids:
        raise BadInput(
            "the shortlist holds no weakness: there is nothing to confirm (see its dropped list; "
            f"rerun with another model or prompt: {run_command(run_dir, resume=False)})"
        )
    bad = {k: v for k, v in decisions.items() if v not in DECISIONS}
    if bad:
        k, v = next(iter(bad.items()))
        raise BadInput(f"decision for {k} must be one of {', '.join(DECISIONS)}, got {v!r}")
    unknown = sorted(set(decisions) - set(ids))
    if unknown:
        raise BadInput(f"no such weakness in the shortlist: {', '.join(unknown)} (it has {', '.join(ids) or 'none'})")
    missing = [w for w in ids if w not in decisions]
    if missing:
        raise BadInput(f"no decision for {', '.join(missing)}: silence is never approval, decide on every weakness")
    stray = sorted(set(notes) - set(ids))
    if stray:
        raise BadInput(f"note for a weakness not in the shortlist: {', '.join(stray)}")
    for wid, d in decisions.items():
        if d == "amend" and not notes.get(wid, "").strip():
            raise BadInput(f'amending {wid} needs --note {wid}="the amended statement"')
    if require_digest and expected_digest is None:
        raise BadInput(
            "--digest is required: it binds your decision to the shortlist you read (compare-and-set). "
            f"`lunasol status {run_dir}` prints the shortlist digest with every statement; read each card "
            f"first: lunasol show {run_dir} {ids[0]}"
        )
    request: dict[str, Any] = {
        "decisions": {w: {"decision": decisions[w], "note": notes.get(w) or None} for w in ids},
    }
    if ask is not None:  # only then: a decision citing no ask keeps the request (and operation id) it had
        request["ask"] = {"ask_id": ask.ask_id, "digest": ask.digest}
    outcome = gate1_outcome(decisions)
    superseded: list[str] = []  # what this decision voids: the decision standing, a gate-2 decision

    def apply(h: handoff.Handoff) -> dict[str, Any]:
        if h.phase != "rootCausesMined":
            raise Blocked(
                f"gate 1 is not open: the run is at phase {h.phase}",
                reason="missing_data",
                unblock=run_command(run_dir),
            )
        if h.proposalSelection in LATER_DECISIONS:
            if not supersede:
                raise BadInput(
                    f"gate 2 already decided ({h.proposalSelection}, {h.receipts.get('gate2', 'receipt')}); a new "
                    "gate-1 decision would supersede it and the proposals it was made on: add --supersede to do so"
                )
            superseded.append(h.proposalSelection)
        if h.receipts.get(GATE1):
            superseded.append("gate1")
        # Every decision starts proposals afresh: those made under an earlier decision are not this one's.
        result: dict[str, Any] = {
            "userRootCauseConfirmation": outcome,
            "proposalGeneration": "not_started",
            "proposalSelection": "not_started",
        }
        if h.proposals_digest:
            result["proposals_digest"] = None
        return result

    def command_for(base: str) -> str:
        parts = ["lunasol", "confirm", str(run_dir)]
        for w in ids:
            parts += ["--decision", f"{w}={decisions[w]}"]
            if notes.get(w):
                parts += ["--note", f"{w}={notes[w]}"]
        parts += ["--ask", ask.ask_id] if ask is not None else []
        parts += ["--by", by, "--digest", expected_digest or shortlist_digest(run_dir), "--base", base]
        return shlex.join(parts + (["--supersede"] if base != handoff.NO_DECISION else []))

    receipt, replayed = commit(
        run_dir,
        gate=GATE1,
        artifact=SHORTLIST,
        by=by,
        request=request,
        apply=apply,
        expected_digest=expected_digest,
        expected_revision=expected_revision,
        operation_id=operation_id,
        subject_digest=lambda: shortlist_digest(run_dir),
        expected_base=expected_base,
        supersede=supersede,
        command_for=command_for,
        ask=ask,
        pilot=read_shortlist(run_dir / SHORTLIST).pilot,  # decided on a subset: the receipt says so
    )
    if superseded and not replayed:
        why = f"superseded by gate-1 decision {receipt.operation_id}"
        for name in ("proposals", "gate2"):
            invalidate_gate(run_dir, name, why)
    return receipt, replayed


def confirmed_weaknesses(run_dir: Path) -> dict[str, dict[str, Any]]:
    """For gate 2 / proposals: weakness id -> {decision, note} of the latest valid gate-1 receipt.

    Raises Blocked (exit 3, with the confirm command) when there is no valid receipt: silence is
    never approval.
    """
    h = handoff.load(run_dir)
    rel = h.receipts.get(GATE1)
    entry = Ledger(run_dir).get(GATE1)
    if (
        not rel
        or entry is None
        or entry.state != "verified"
        or h.userRootCauseConfirmation not in ("confirmed", "partially_confirmed")
    ):
        raise Blocked(
            "gate 1 has no valid confirmation: root causes must be confirmed before proposals",
            reason="user_stop",
            unblock=handoff.confirm_command(run_dir, h),
        )
    receipt = _load_receipt(run_dir / rel)
    if receipt.subject.digest != shortlist_digest(run_dir):
        raise Blocked(
            "the gate-1 receipt was made on another shortlist",
            reason="user_stop",
            unblock=handoff.confirm_command(run_dir, h),
        )
    decisions: dict[str, dict[str, Any]] = receipt.request["decisions"]
    return {w: d for w, d in decisions.items() if d["decision"] in ("confirm", "amend")}
