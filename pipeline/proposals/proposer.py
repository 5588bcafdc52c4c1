"""The Proposer: per confirmed weakness, one model call that returns 0..N proposal cards.

Flow of :func:`propose`:

1. Gate 1 must have a valid receipt on the current shortlist (silence is never approval):
   otherwise a usage error (exit 2, no block receipt: it is an ordering mistake) with the exact
   ``lunasol confirm`` command.
2. For each confirmed (or amended) weakness, in shortlist order: one call of ``prompts/proposer.j2``
   with the weakness card, its support, the cells of the run and the pattern groups it cites.
   The answer (:class:`ProposalList`) is checked by the deterministic validator with the run's
   facts; invalid cards go back to the model with the rule messages (the client's ``check``
   re-ask loop), and whatever still fails is kept out with its reasons.
3. All accepted cards are validated once more together (two weaknesses may yield the same
   strategy); survivors are numbered P-01, P-02, ... in shortlist order, rejected cards R-01, ...
4. ``proposals.yaml`` and ``validation.json`` are written atomically; the handoff moves to
   ``proposalGeneration: done`` / ``proposalSelection: pending`` with the proposals digest.
   A weakness whose call failed (no answer passed its checks) is not an honest zero: the
   summary says FAILED, and the ledger's ``proposals`` entry stays pending until a rerun of
   ``lunasol propose`` answers it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pipeline.artifacts.proposal_card import ProposalCard, ProposalList
from pipeline.artifacts.proposals_file import write_cards
from pipeline.artifacts.run_info import analysis_run_id, read_run_info
from pipeline.artifacts.rundir import GROUPS, PROPOSALS, SHORTLIST, VALIDATION, RunDir
from pipeline.artifacts.versions import VERSIONS
from pipeline.core import roles
from pipeline.core.canonical import canonical_json, read_json, sha256_file, write_json
from pipeline.core.errors import BadInput, Blocked
from pipeline.core.phrases import one_phrase
from pipeline.core.settings import ModelSettings
from pipeline.core.urls import is_shown, unusable
from pipeline.gates.gate1 import confirmed_weaknesses
from pipeline.models import ModelClient, render, template_hash
from pipeline.models.budget import request_tokens, role_budget
from pipeline.models.errors import ContextExceeded
from pipeline.models.preflight import preflight
from pipeline.sol.shortlist import SHORTLIST_FILE, read_shortlist
from pipeline.state import handoff
from pipeline.state.blocking import write_block_receipt
from pipeline.state.ledger import Ledger
from pipeline.validator import PROMPT_RULES, RunFacts, load_run_facts, validate_entries

ROLE = roles.PROPOSER.name
PROPOSALS_FILE = PROPOSALS.filename
VALIDATION_FILE = VALIDATION.filename
VALIDATION_SCHEMA_VERSION = VERSIONS["validation"]
GROUPS_FILE = GROUPS.filename
OCCURRENCE_SAMPLE = 8  # occurrences of a cited group shown with refs when the full view does not fit


class ValidatedCard(BaseModel):
    """One card the proposer produced: accepted (``P-nn``) or rejected (``R-nn``, with findings and the card)."""

    model_config = ConfigDict(extra="forbid")

    proposal_id: str
    model_proposal_id: Any = Field(default=None, description="the id the model gave a rejected card")
    source_weakness: str
    status: Literal["accepted", "rejected"]
    valid: bool
    findings: list[dict[str, Any]] = Field(default_factory=list, description="validator findings (rule id, path)")
    card: Any = Field(default=None, description="the rejected entry as the model wrote it")


class WeaknessOutcome(BaseModel):
    """What the proposer made of one confirmed weakness."""

    model_config = ConfigDict(extra="forbid")

    weakness_id: str
    decision: str
    call: dict[str, Any]
    accepted: list[str]
    rejected: list[str]
    zero_cards: bool
    note: str | None = None


class ValidationCounts(BaseModel):
    """Totals of ``validation.json``."""

    model_config = ConfigDict(extra="forbid")

    accepted: int
    rejected: int
    weaknesses: int


class Validation(BaseModel):
    """The whole ``validation.json``."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = VALIDATION_SCHEMA_VERSION
    run_id: str
    shortlist_digest: str | None
    proposals_digest: str | None = None
    weaknesses: list[WeaknessOutcome]
    cards: list[ValidatedCard]
    counts: ValidationCounts


@dataclass
class WeaknessResult:
    """What one weakness's call produced."""

    weakness_id: str
    decision: str
    call: dict[str, Any]
    note: str | None = None
    accepted: list[ProposalCard] = field(default_factory=list)
    rejected: list[tuple[dict[str, Any], list[dict[str, Any]]]] = field(default_factory=list)


@dataclass
class ProposeResult:
    """The outcome of ``lunasol propose``."""

    run_dir: Path
    cards: list[ProposalCard]
    validation: dict[str, Any]
    proposals_digest: str

    @property
    def failed(self) -> list[dict[str, Any]]:
        """The weaknesses whose call failed: no answer passed its checks (their cards are missing, not zero)."""
        return [w for w in self.validation["weaknesses"] if not w["call"]["ok"]]

    def incomplete(self) -> Blocked:
        """The block of a run whose proposer failed for some confirmed weakness (its cards are missing)."""
        why = "; ".join(
            f"{w['weakness_id']}: {one_phrase(w['call']['errors'][0]) if w['call'].get('errors') else 'no answer'}"
            for w in self.failed
        )
        ids = ", ".join(w["weakness_id"] for w in self.failed)
        return Blocked(
            f"the proposer failed for {ids} ({why}): their cards are missing, not zero; "
            f"{len(self.cards)} card(s) of the other weaknesses were kept",
            reason="external_system",
            unblock=f"lunasol propose {self.run_dir}",
            tried=[{"action": "proposer call with re-asks", "outcome": why}],
            failed=ids,
        )

    def summary(self) -> str:
        """One line: cards per weakness (FAILED for a failed call), rejected count, digest."""
        per = ", ".join(
            f"{w['weakness_id']}: {len(w['accepted']) if w['call']['ok'] else 'FAILED'}"
            + (f" (+{len(w['rejected'])} rejected)" if w["rejected"] else "")
            for w in self.validation["weaknesses"]
        )
        return (
            f"{len(self.cards)} proposal card(s) [{per or 'no confirmed weakness'}]; proposals {self.proposals_digest}"
        )


# -- settings -------------------------------------------------------------------------------------


def run_model_settings(run_dir: Path, **overrides: Any) -> ModelSettings:
    """The model settings the run was made with (run.json ``inputs.models``), flags overriding them."""
    recorded: dict[str, Any] = {}
    inputs = read_run_info(run_dir).inputs
    if inputs is not None and inputs.models is not None:
        models = inputs.models.model_dump(exclude_unset=True)
        recorded = {k: v for k, v in models.items() if k in ModelSettings.model_fields and v is not None}
    mode_override = overrides.get("mode")
    if mode_override is not None or overrides.get("model") is not None:
        # A new mode or model from the flags: the recorded store belongs to the recorded mode.
        if mode_override != recorded.get("mode"):
            recorded.pop("store", None)
        if mode_override is None:
            recorded.pop("mode", None)
    kept = recorded.get("api_base")
    if is_shown(kept):
        recorded.pop("api_base")  # kept without its credentials: --api-base or LUNASOL_API_BASE gives it whole
    recorded.update({k: v for k, v in overrides.items() if v is not None})
    settings = ModelSettings.from_env(**recorded)
    if is_shown(kept) and not settings.api_base and settings.effective_mode() != "replay":
        raise unusable(str(kept))
    return settings


# -- context --------------------------------------------------------------------------------------


def _groups_by_id(run_dir: Path) -> dict[str, Any]:
    path = run_dir / GROUPS_FILE
    if not path.is_file():
        return {}
    raw = read_json(path)
    if isinstance(raw, dict):
        raw = raw.get("pattern_groups", raw.get("groups", []))
    out: dict[str, Any] = {}
    for g in raw if isinstance(raw, list) else []:
        if isinstance(g, dict):
            gid = g.get("group_id", g.get("pattern_group_id", g.get("id")))
            if isinstance(gid, str):
                out[gid] = g
    return out


def build_context(
    run_dir: Path, weakness: Any, decision: dict[str, Any], facts: RunFacts, groups: dict[str, Any]
) -> dict[str, Any]:
    """The template context of one proposer call (the weakness card is a pipeline.sol WeaknessCard)."""
    card = weakness.model_dump(mode="json")
    cited = [groups[g] for g in weakness.support.pattern_groups if g in groups]
    return {
        "run_id": analysis_run_id(run_dir),
        "parent_harness": facts.parent_harness or "unknown",
        "weakness_id": weakness.weakness_id,
        "decision": str(decision.get("decision")),
        "note": decision.get("note") or "",
        # JSON without indentation: the card and each group on one line (a third of an indented copy's tokens)
        "weakness_json": canonical_json(card),
        "support_json": canonical_json(
            {"cells": weakness.support.cells, "tasks": weakness.support.tasks, "runs": weakness.support.runs}
        ),
        "cells": sorted(facts.cells),
        "pattern_groups_json": "\n".join(canonical_json(g) for g in cited) if cited else "none cited",
        "rules": [{"id": rule, "what": what} for rule, what in PROMPT_RULES.items()],
    }


def group_line(g: dict[str, Any], occ: list[dict[str, Any]]) -> str:
    """A pattern group's head line in a prompt: id, type, concerns, its ``occ`` count, cells and tasks."""
    support = g.get("support") or {}
    return (
        f"{g.get('group_id')} {g.get('type')} concerns={g.get('concerns')!r}: {len(occ)} occurrence(s) in "
        f"{support.get('n_cells', '?')} cell(s), tasks {', '.join(support.get('tasks') or [])}"
    )


def compact_groups(cited: list[dict[str, Any]]) -> str:
    """Cited pattern groups in a bounded form: a header each, a sample of occurrences with refs, the rest by id."""
    out: list[str] = []
    for g in cited:
        occ = [o for o in g.get("occurrences") or [] if isinstance(o, dict)]
        out.append(group_line(g, occ))
        for o in occ[:OCCURRENCE_SAMPLE]:
            refs = ", ".join(list(o.get("refs") or [])[:2])
            events = ", ".join(list(o.get("events") or [])[:4])
            out.append(f"  {o.get('occurrence_id')} {o.get('cell_id')}: events {events}; refs {refs}")
        if len(occ) > OCCURRENCE_SAMPLE:
            rest = ", ".join(str(o.get("occurrence_id")) for o in occ[OCCURRENCE_SAMPLE:])
            out.append(f"  {len(occ) - OCCURRENCE_SAMPLE} more occurrence(s), by id: {rest}")
    return "\n".join(out) or "none cited"


def fit_context(
    context: dict[str, Any], weakness: Any, groups: dict[str, Any], settings: ModelSettings
) -> dict[str, Any]:
    """The proposer's context within its whole-request budget: groups compact first, then only the cited cells."""
    budget = role_budget(settings, ROLE)

    def fits(ctx: dict[str, Any]) -> bool:
        messages = render(ROLE, ctx, response_model=ProposalList).messages
        return budget.fits(request_tokens(budget, messages, ProposalList))

    if fits(context):
        return context  # the full view, as always for a batch that fits
    cited = [groups[g] for g in weakness.support.pattern_groups if g in groups]
    smaller = {**context, "pattern_groups_json": compact_groups(cited)}
    if fits(smaller):
        return smaller
    named = sorted({*weakness.support.cells, *(i.cell for i in weakness.counter_evidence.items)})
    others = len(context["cells"]) - len(named)
    smallest = {**smaller, "cells": [*named, f"(and {others} other cells of the run, not cited by this weakness)"]}
    return smallest  # if even this does not fit, the client refuses it before sending (ContextExceeded)


# -- the calls ------------------------------------------------------------------------------------


def make_check(facts: RunFacts) -> Callable[[ProposalList], list[str]]:
    """The client's ``check`` hook: validator messages (rule id, path, explanation) for a re-ask."""

    def check(answer: ProposalList) -> list[str]:
        result = validate_entries([c.model_dump(mode="json") for c in answer.proposals], facts)
        return [f.line() for f in result.findings]

    return check


def _split(
    entries: list[dict[str, Any]], facts: RunFacts
) -> tuple[list[ProposalCard], list[tuple[dict[str, Any], list[dict[str, Any]]]]]:
    result = validate_entries(entries, facts)
    accepted, rejected = [], []
    for report, entry in zip(result.cards, entries, strict=True):
        if report.valid:
            accepted.append(ProposalCard.model_validate(entry))
        else:
            rejected.append((entry, [f.model_dump() for f in report.findings]))
    return accepted, rejected


async def _propose_all(
    run_dir: Path,
    settings: ModelSettings,
    facts: RunFacts,
    confirmed: dict[str, dict[str, Any]],
    log: Callable[[str], None],
    *,
    fresh: bool = False,
) -> list[WeaknessResult]:

    shortlist = read_shortlist(run_dir / SHORTLIST_FILE)
    groups = _groups_by_id(run_dir)
    weaknesses = [w for w in shortlist.weaknesses if w.weakness_id in confirmed]
    client = ModelClient(settings, run_dir, log=log, fresh=fresh)
    check = make_check(facts)
    coros = [
        client.call(
            role=ROLE,
            cell_id=w.weakness_id,
            context=fit_context(
                build_context(run_dir, w, confirmed[w.weakness_id], facts, groups), w, groups, settings
            ),
            response_model=ProposalList,
            check=check,
        )
        for w in weaknesses
    ]
    outcomes = await client.gather(coros, label="proposer")
    results: list[WeaknessResult] = []
    for w, out in zip(weaknesses, outcomes, strict=True):
        res = WeaknessResult(
            weakness_id=w.weakness_id,
            decision=str(confirmed[w.weakness_id].get("decision")),
            call={"ok": out.ok, "attempts": out.attempts, "errors": list(out.errors), "key": out.key},
        )
        if out.ok and out.value is not None:
            entries = [c.model_dump(mode="json") for c in out.value.proposals]
            res.note = out.value.note
        elif out.last_answer is not None:
            entries = [dict(c) for c in out.last_answer.get("proposals", [])]
            res.note = out.last_answer.get("note")
        else:
            entries = []  # no parseable answer: recorded in the call's errors, never silently
        res.accepted, res.rejected = _split(entries, facts)
        results.append(res)
    return results


# -- the stage ------------------------------------------------------------------------------------


def _renumber(card: ProposalCard, pid: str) -> ProposalCard:
    data = card.model_dump(mode="json")
    data["proposal_id"] = pid
    return ProposalCard.model_validate(data)


def assemble(
    run_dir: Path, results: list[WeaknessResult], facts: RunFacts
) -> tuple[list[ProposalCard], dict[str, Any]]:
    """Cross-check all accepted cards together, number them, and build validation.json."""
    pool = [(r.weakness_id, c) for r in results for c in r.accepted]
    numbered = [_renumber(c, f"P-{i + 1:02d}") for i, (_, c) in enumerate(pool)]
    together = validate_entries([c.model_dump(mode="json") for c in numbered], facts)
    final: list[ProposalCard] = []
    final_by_weakness: dict[str, list[str]] = {r.weakness_id: [] for r in results}
    late_rejects: dict[str, list[tuple[dict[str, Any], list[dict[str, Any]]]]] = {r.weakness_id: [] for r in results}
    for (wid, _), card, report in zip(pool, numbered, together.cards, strict=True):
        if report.valid:
            final.append(card)
        else:
            late_rejects[wid].append((card.model_dump(mode="json"), [f.model_dump() for f in report.findings]))
    # Number again so accepted ids have no gaps (a late reject leaves one).
    final = [_renumber(c, f"P-{i + 1:02d}") for i, c in enumerate(final)]
    cards_out: list[dict[str, Any]] = []
    weaknesses_out: list[dict[str, Any]] = []
    it = iter(final)
    r_no = 0
    for r in results:
        kept = [next(it) for _ in range(len(r.accepted) - len(late_rejects[r.weakness_id]))]
        final_by_weakness[r.weakness_id] = [c.proposal_id for c in kept]
        for c in kept:
            cards_out.append(
                {
                    "proposal_id": c.proposal_id,
                    "source_weakness": r.weakness_id,
                    "status": "accepted",
                    "valid": True,
                    "findings": [],
                }
            )
        rejected_ids = []
        for entry, findings in r.rejected + late_rejects[r.weakness_id]:
            r_no += 1
            rid = f"R-{r_no:02d}"
            rejected_ids.append(rid)
            cards_out.append(
                {
                    "proposal_id": rid,
                    "model_proposal_id": entry.get("proposal_id") if isinstance(entry, dict) else None,
                    "source_weakness": r.weakness_id,
                    "status": "rejected",
                    "valid": False,
                    "findings": findings,
                    "card": entry,
                }
            )
        weaknesses_out.append(
            {
                "weakness_id": r.weakness_id,
                "decision": r.decision,
                "call": r.call,
                "accepted": final_by_weakness[r.weakness_id],
                "rejected": rejected_ids,
                "zero_cards": not final_by_weakness[r.weakness_id] and not rejected_ids and r.call["ok"],
                "note": r.note,
            }
        )
    validation = {
        "schema_version": VALIDATION_SCHEMA_VERSION,
        "run_id": analysis_run_id(run_dir),
        "shortlist_digest": facts.shortlist_digest,
        "weaknesses": weaknesses_out,
        "cards": cards_out,
        "counts": {
            "accepted": len(final),
            "rejected": sum(1 for c in cards_out if c["status"] == "rejected"),
            "weaknesses": len(results),
        },
    }
    return final, validation


def _without_gate1(run_dir: Path, exc: Blocked) -> BadInput:
    # An ordering mistake, not a blocked run: no block receipt (status and runs would then show BLOCKED).
    ids = handoff.weakness_ids(run_dir)
    read = f"lunasol show {run_dir} {ids[0]}" if ids else f"lunasol report {run_dir}"
    return BadInput(f"{exc.one_line()}; read the cards first ({read}), then decide: {exc.unblock}")


def propose(run_dir: Path, settings: ModelSettings, log: Callable[[str], None] = print) -> ProposeResult:
    """Generate, validate and write the run's proposal cards (``lunasol propose``)."""
    if not RunDir(run_dir).shortlist.is_file():
        raise BadInput(f"{run_dir} has no {SHORTLIST.filename}: run the analysis up to gate 1 first")
    current = handoff.load(run_dir)
    if current.proposalSelection in ("selected", "none"):
        # Regenerating would silently change what gate 2 decided on.
        raise BadInput(
            f"gate 2 already decided ({current.proposalSelection}); to generate new proposals first record "
            f"a redo: {handoff.select_command(run_dir, current, '--redo')}"
        )
    try:
        confirmed = confirmed_weaknesses(run_dir)
    except Blocked as exc:
        raise _without_gate1(run_dir, exc) from None
    facts = load_run_facts(run_dir)
    preflight(settings, log)  # a missing key or unknown model: one line, exit 2, before any call
    try:
        # after gate 2's --redo the same requests must get new answers, not the stored ones
        fresh = current.proposalSelection == "redo"
        results = asyncio.run(_propose_all(run_dir, settings, facts, confirmed, log, fresh=fresh))
    except Blocked as exc:
        unblock = exc.unblock
        if isinstance(exc, ContextExceeded):  # the same budget flag, on this verb
            unblock = f"lunasol propose {run_dir} --context-tokens {exc.suggested_tokens}"
            exc.unblock = unblock
        write_block_receipt(run_dir, exc, stage="propose", unblock=unblock, command=f"lunasol propose {run_dir}")
        raise
    cards, validation = assemble(run_dir, results, facts)
    path = run_dir / PROPOSALS_FILE
    write_cards(path, cards)
    proposals_digest = sha256_file(path)
    validation["proposals_digest"] = proposals_digest
    write_json(run_dir / VALIDATION_FILE, validation)
    handoff.update(
        run_dir,
        {"proposalGeneration": "done", "proposalSelection": "pending", "proposals_digest": proposals_digest},
        f"proposals generated ({len(cards)} card(s))",
    )
    result = ProposeResult(run_dir=run_dir, cards=cards, validation=validation, proposals_digest=proposals_digest)
    inputs = {"shortlist": facts.shortlist_digest or "none", "template": _template_hash()}
    if result.failed:
        ids = ", ".join(w["weakness_id"] for w in result.failed)
        Ledger(run_dir).mark_pending("proposals", ROLE, inputs, reason=f"incomplete: the proposer failed for {ids}")
    else:
        outputs = {PROPOSALS_FILE: proposals_digest, VALIDATION_FILE: sha256_file(run_dir / VALIDATION_FILE)}
        Ledger(run_dir).mark_verified("proposals", ROLE, inputs, outputs)
    return result


def _template_hash() -> str:

    return template_hash(ROLE)
