"""``lunasol status``: the run's state machine, its ledger, a block receipt if any, and the exact next command."""

from __future__ import annotations

import asyncio
import shlex
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.artifacts.run_info import ModelInputs, Pilot, made_unredacted, read_run_info, run_command, run_pilot
from pipeline.artifacts.rundir import RunDir
from pipeline.artifacts.schemas import load_document
from pipeline.core.errors import BadInput
from pipeline.core.settings import ModelSettings
from pipeline.core.urls import is_shown, unusable
from pipeline.gates.gate2 import selection_status
from pipeline.ir.redact import NO_REDACT_NOTE
from pipeline.models.batch_api import TERMINAL, BatchEndpoint
from pipeline.models.batch_submit import read_batches
from pipeline.sol.shortlist import SHORTLIST_FILE, read_shortlist
from pipeline.state import handoff
from pipeline.state.blocking import read_block_receipt
from pipeline.state.ledger import Ledger


def _shortlist_rows(
    run_dir: Path,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str | None, Pilot | None]:

    path = run_dir / SHORTLIST_FILE
    if not path.is_file():
        return [], [], None, None
    try:
        sl = read_shortlist(path)
    except BadInput as exc:
        return [], [{"weakness_id": "-", "reasons": [exc.one_line()]}], None, None
    rows = [
        {
            "weakness_id": w.weakness_id,
            "confidence": w.confidence,
            "cells": w.support.counts.cells,
            "tasks": w.support.counts.tasks,
            "runs": w.support.counts.runs,
            "pattern_groups": w.support.counts.pattern_groups,
            "counter_evidence": len(w.counter_evidence.items),
            "statement": w.statement,
        }
        for w in sl.weaknesses
    ]
    dropped = [{"weakness_id": d.weakness_id, "reasons": d.reasons} for d in sl.dropped]
    return rows, dropped, sl.digest, sl.pilot


def batch_rows(run_dir: Path, *, poll: bool = False) -> list[dict[str, Any]]:
    """The run's provider batches (``batches.json``); ``poll`` asks the provider about unfinished ones.

    Polling is a provider call, so it happens only when asked (``lunasol status RUN --poll``);
    it changes nothing in the run: ``lunasol run ... --resume`` collects.
    """
    rows = [{"id": b["id"], "requests": len(b["keys"]), "status": b["status"]} for b in read_batches(run_dir)]
    # a "submitting" row has no id yet (interrupted submit): the next --resume settles it, poll cannot
    open_rows = [r for r in rows if r["id"] and r["status"] not in TERMINAL]
    if not (poll and open_rows):
        return rows
    inputs = read_run_info(run_dir).inputs
    models = (inputs.models if inputs else None) or ModelInputs()
    if not models.model:
        raise BadInput(f"{RunDir(run_dir).run_json} names no model: cannot ask the provider about its batches")
    api_base = models.api_base
    if is_shown(api_base):  # kept without its credentials: from LUNASOL_API_BASE (or the config files)
        api_base = ModelSettings.from_env().api_base
        if not api_base:
            raise unusable(str(models.api_base))
    endpoint = BatchEndpoint(str(models.model), api_base=api_base)

    async def poll_all() -> None:
        for r in open_rows:
            state = await endpoint.retrieve(r["id"])
            r["provider"] = {"status": state.status, "completed": state.completed, "total": state.total}

    asyncio.run(poll_all())
    return rows


BATCH_LINES = 8
"""Batches listed a line each by ``lunasol status``; past it, a line per status and the open ones (``--json``: all)."""


def format_batches(batches: Sequence[dict[str, Any]]) -> list[str]:
    """The provider batches, a line each; a 10,000-cell run's dozens to hundreds summed by status instead.

    Finished batches need nothing from the reader, so past :data:`BATCH_LINES` they are counted
    per status, and only the batches still open (the ones ``--poll`` asks about) keep a line each.
    """

    def line(b: dict[str, Any]) -> str:
        p = b.get("provider")
        now = f"; provider now: {p['status']} ({p['completed']}/{p['total']} answered)" if p else ""
        return f"batch {b['id']}: {b['requests']} requests, {b['status']} when last seen{now}"

    if len(batches) <= BATCH_LINES:
        return [line(b) for b in batches]
    by_status: dict[str, list[int]] = {}
    for b in batches:
        counts = by_status.setdefault(str(b["status"]), [0, 0])
        counts[0] += 1
        counts[1] += int(b["requests"])
    sums = ", ".join(f"{st} {n:,} ({req:,} requests)" for st, (n, req) in sorted(by_status.items()))
    out = [f"batches: {len(batches):,} when last seen: {sums}"]
    still_open = [b for b in batches if b["status"] not in TERMINAL]
    out.extend("  " + line(b) for b in still_open[:BATCH_LINES])
    if len(still_open) > BATCH_LINES:
        more = len(still_open) - BATCH_LINES
        out.append(f"  ... and {more:,} more open (lunasol status RUN --json lists every batch)")
    return out


def status(run_dir: Path, *, poll: bool = False) -> dict[str, Any]:
    """Everything ``lunasol status`` shows, as data (``poll``: ask the provider about open batches)."""
    h = handoff.load(run_dir)
    rows, dropped, sdigest, made_on = _shortlist_rows(run_dir)
    pilot = run_pilot(run_dir)
    block = read_block_receipt(run_dir)
    nxt = handoff.next_command(run_dir, h)
    if block and block.get("requested_unblock") and h.phase != "rootCausesMined":
        nxt = str(block["requested_unblock"])
    missing = missing_outputs(run_dir)
    if missing:
        nxt = run_command(run_dir, resume=False)  # a rerun remakes exactly what is gone
    return {
        "run_id": run_dir.name,
        "run_dir": str(run_dir),
        "handoff": h.model_dump(mode="json", exclude={"history"}),
        "history": [e.model_dump(mode="json") for e in h.history[-10:]],
        "ledger": Ledger(run_dir).summary(),
        "shortlist": {
            "digest": sdigest,
            "weaknesses": rows,
            "dropped": dropped,
            # the shortlist's own header: the subset it was mined on (None: every eligible cell)
            "pilot": made_on.model_dump(mode="json") if made_on else None,
        },
        # the run's selection now (run.json): a pilot, or None for a full run
        "pilot": {**pilot.model_dump(mode="json"), "label": pilot.label()} if pilot else None,
        "block_receipt": block,
        "selection": _selection(run_dir),
        "gates": gate_rows(run_dir, h),
        "missing_outputs": missing,
        "batches": batch_rows(run_dir, poll=poll),
        "read_first": read_first(run_dir),
        "next_command": nxt,
        **({"redaction": "off"} if made_unredacted(run_dir) else {}),  # absent: redacted
    }


def missing_outputs(run_dir: Path, ledger: Ledger | None = None) -> list[str]:
    """Outputs the ledger calls verified that are no longer in the run directory ("path (stage)").

    A run whose artifacts were deleted or moved must not pass for a finished one. ``ledger``: the
    run's ledger already read (else it is read here).
    """
    out = []
    for name, entry in (ledger or Ledger(run_dir)).entries(per_cell=False):
        if entry.state != "verified":
            continue
        for rel in entry.outputs:
            path = rel.split("#", 1)[0]  # "ir.duckdb#content" names a file by its content digest
            if not (run_dir / path).is_file():
                out.append(f"{path} ({name})")
    return out


def gate_rows(run_dir: Path, h: handoff.Handoff) -> dict[str, dict[str, Any]]:
    """Each gate's latest receipt: whether it stands (the decision now) or was voided, and why."""
    ledger = Ledger(run_dir)
    rows: dict[str, dict[str, Any]] = {}
    for gate, rel in sorted(h.receipts.items()):
        raw = load_document(run_dir / rel, "gate-receipt")[0] if (run_dir / rel).is_file() else {}
        standing = handoff.standing_receipt(run_dir, gate, h) == rel
        voided = None
        if not standing:
            entry = ledger.get(gate)
            if not raw:
                voided = "the receipt file is missing"
            elif entry is not None and entry.state != "verified":
                voided = entry.reason or entry.state
            else:
                voided = "made on another subject than the current one"
        rows[gate] = {
            "receipt": rel,
            "standing": standing,
            "operation_id": raw.get("operation_id"),
            "by": raw.get("by"),
            "decided_at": raw.get("decided_at"),
            "result": raw.get("result"),
            "voided": voided,
        }
    return rows


def _selection(run_dir: Path) -> dict[str, Any] | None:
    """Gate-2 state, which always says that a selection does not authorise implementation."""
    if not RunDir(run_dir).proposals.is_file():
        return None

    return selection_status(run_dir)


def _wrapped(head: str, text: str, width: int = 100) -> list[str]:
    # Whole statements, wrapped with a hanging indent: a gate is decided on what was read, not on a prefix.
    return textwrap.wrap(
        " ".join(text.split()),
        width,
        initial_indent=head,
        subsequent_indent=" " * len(head),
        break_on_hyphens=False,
        break_long_words=False,
    ) or [head.rstrip()]


def format_shortlist(
    rows: list[dict[str, Any]], dropped: list[dict[str, Any]], pilot: dict[str, Any] | None = None
) -> str:
    """The shortlist: a table of figures, then every statement in full (and dropped weaknesses with reasons).

    ``pilot``: the shortlist's pilot header (a dumped :class:`Pilot`): said first, the counts are over its subset.
    """
    head = [Pilot.model_validate(pilot).label()] if pilot else []
    if not rows and not dropped:
        return "\n".join([*head, "no weakness in the shortlist"])
    lines = [*head, f"{'id':<6} {'conf':<7} {'cells':>5} {'tasks':>5} {'runs':>5} {'groups':>6} {'counter':>7}"]
    for r in rows:
        lines.append(
            f"{r['weakness_id']:<6} {r['confidence']:<7} {r['cells']:>5} {r['tasks']:>5} {r['runs']:>5} "
            f"{r['pattern_groups']:>6} {r['counter_evidence']:>7}"
        )
    for r in rows:
        lines.append("")
        lines.extend(_wrapped(f"{r['weakness_id']}: ", r["statement"]))
    for d in dropped:
        reasons = d["reasons"] or ["no reason"]
        lines.append("")
        lines.extend(_wrapped(f"dropped {d['weakness_id']}: ", "; ".join(reasons)))
    return "\n".join(lines)


def format_proposals(cards: list[dict[str, Any]], validation: dict[str, Any], failed: Sequence[str] = ()) -> str:
    """The proposal cards as a table (id, source weakness, validation) with each proposed change in full.

    ``failed``: the weaknesses whose proposer call failed; with no card at all, the line says the
    cards are missing because of them, not that none was proposed.
    """
    status = {str(c.get("proposal_id")): c for c in validation.get("cards", []) if isinstance(c, dict)}
    if not cards and not status:
        return f"no proposal card: the proposer failed for {', '.join(failed)}" if failed else "no proposal card"
    lines = [f"{'id':<6} {'from':<6} {'validation':<11} rules"]
    ids = [str(c.get("proposal_id")) for c in cards] + sorted(set(status) - {str(c.get("proposal_id")) for c in cards})
    by_id = {str(c.get("proposal_id")): c for c in cards}
    for pid in ids:
        v = status.get(pid, {})
        rules = ", ".join(sorted({str(f.get("rule")) for f in v.get("findings", []) if isinstance(f, dict)})) or "-"
        src = by_id.get(pid, {}).get("source_weakness") or v.get("source_weakness") or "?"
        lines.append(f"{pid:<6} {src!s:<6} {v.get('status', 'unvalidated')!s:<11} {rules}")
    for c in cards:
        change = c.get("strategy_change")
        text = change.get("proposed_strategy") if isinstance(change, dict) else None
        if isinstance(text, str):
            lines.append("")
            lines.extend(_wrapped(f"{c.get('proposal_id')}: ", text))
    return "\n".join(lines)


def read_first(run_dir: Path) -> list[str]:
    """What to read before deciding at gate 1: the whole cards, then the page with their evidence."""
    ids = handoff.weakness_ids(run_dir)
    if not ids:
        return []
    run = shlex.quote(str(run_dir))
    others = f" (then {', '.join(ids[1:])})" if len(ids) > 1 else ""
    return [
        f"lunasol show {run} {ids[0]}{others}   # every field of the card; --evidence adds the raw lines",
        f"lunasol report {run}   # {RunDir(run_dir).report}: cards, timelines, raw lines beside the text",
    ]


def gate_report(run_dir: Path) -> str:
    """What a run prints when it stops: the shortlist, what to read, and the exact next command."""
    s = status(run_dir)
    h = s["handoff"]
    out = []
    if h["phase"] == "rootCausesMined":
        out.append(f"weakness shortlist {s['shortlist']['digest']}:")
        out.append(format_shortlist(s["shortlist"]["weaknesses"], s["shortlist"]["dropped"], s["shortlist"]["pilot"]))
        out.append("")
        if h["userRootCauseConfirmation"] == "pending":
            out.append("gate 1: waiting for your decision on each weakness (silence is never approval)")
            out.extend(f"read first: {line}" for line in read_first(run_dir))
        else:
            out.append(f"gate 1: {h['userRootCauseConfirmation']}")
    out.append(f"next: {s['next_command']}")
    return "\n".join(out)


def format_status(s: dict[str, Any]) -> str:
    """Plain-text ``lunasol status``."""
    h = s["handoff"]
    lines = [
        f"run {s['run_id']}  revision {h['revision']}  phase {h['phase']}",
        *([f"  {s['pilot']['label']}"] if s.get("pilot") else []),
        f"  userRootCauseConfirmation: {h['userRootCauseConfirmation']}",
        f"  proposalGeneration:        {h['proposalGeneration']}",
        f"  proposalSelection:         {h['proposalSelection']}",
    ]
    if h.get("shortlist_digest"):
        lines.append(f"  shortlist digest:          {h['shortlist_digest']}")
    if h.get("proposals_digest"):
        lines.append(f"  proposals digest:          {h['proposals_digest']}")
    for gate, g in sorted((s.get("gates") or {}).items()):
        if g["standing"]:  # the decision now, by its operation id (what --base names)
            lines.append(f"  receipt {gate}: {g['receipt']} ({g['operation_id']}, by {g['by']} at {g['decided_at']})")
        else:  # never listed as current
            lines.append(f"  voided {gate}: {g['receipt']} ({g['voided']})")
    if s.get("redaction") == "off":
        lines.append(f"  {NO_REDACT_NOTE}")
    sel = s.get("selection")
    if sel and sel.get("proposalSelection") in ("selected", "none", "redo"):
        chosen = f" {sel['proposal_id']}" if sel.get("proposal_id") else ""
        lines.append(f"  gate 2: {sel['proposalSelection']}{chosen} by {sel.get('by')}; {sel['meaning']}")
    lines.append("ledger:")
    stage_rows = [r for r in s["ledger"] if "/" not in r["name"]]
    cell_rows = [r for r in s["ledger"] if "/" in r["name"]]
    for r in stage_rows:
        reason = f"  ({r['reason']})" if r["reason"] else ""
        lines.append(f"  {r['name']:<14} {r['state']:<12}{reason}")
    if cell_rows:
        counts: dict[str, dict[str, int]] = {}
        for r in cell_rows:
            per = counts.setdefault(r["name"].split("/", 1)[0], {})
            per[r["state"]] = per.get(r["state"], 0) + 1
        for prefix, by_state in sorted(counts.items()):
            states = ", ".join(f"{n} {st}" for st, n in sorted(by_state.items()))
            lines.append(f"  {prefix + '/<cell>':<14} {states}")
        for r in cell_rows:
            if r["state"] != "verified":
                lines.append(f"    {r['name']:<12} {r['state']:<12} ({r['reason']})")
    rows, dropped = s["shortlist"]["weaknesses"], s["shortlist"]["dropped"]
    if rows or dropped:
        lines.append("shortlist:")
        made_on = s["shortlist"].get("pilot")
        lines.extend("  " + ln if ln else "" for ln in format_shortlist(rows, dropped, made_on).splitlines())
    if s.get("missing_outputs"):
        lines.append(f"MISSING (deleted or moved outside lunasol): {', '.join(s['missing_outputs'])}")
    br = s.get("block_receipt")
    if br:
        lines.append(f"BLOCKED at {br.get('stage')}: {br.get('blocking_constraint')}")
        lines.append(f"  unblock: {br.get('requested_unblock')}")
    lines.extend(format_batches(s.get("batches") or []))
    if h["phase"] == "rootCausesMined" and h["userRootCauseConfirmation"] == "pending":
        lines.extend(f"read first: {line}" for line in s.get("read_first") or [])
    lines.append(f"next: {s['next_command']}")
    return "\n".join(lines)
