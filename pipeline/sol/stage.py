"""The Sol stage: one model call over the whole batch, then the deterministic checks, then the shortlist.

Sol sees the pattern groups, the coverage, every eligible cell with its outcome (Sol may see
outcomes; Luna never does), the successful cells as negatives, and a compact timeline of
controller-level events per cell so it can cite refs for counter-evidence. The checks' errors go
back through the model client's ``check`` hook for a re-ask; a weakness that still fails is
dropped with its reasons in the shortlist's ``dropped`` list, never silently.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.artifacts.run_info import run_pilot
from pipeline.core.canonical import digest, sha256_file
from pipeline.core.errors import Blocked
from pipeline.core.listing import some
from pipeline.core.memory import give_back
from pipeline.ir.digests import ir_digest
from pipeline.models import CallOutcome, ModelClient, PlannedCall, template_hash
from pipeline.models.budget import RoleBudget, count_text, role_budget
from pipeline.sol.cards import (
    Dropped,
    ReduceAnswer,
    SolAnswer,
    SolCall,
    SolPlan,
    SupportDraft,
    WeaknessCard,
    WeaknessDraft,
)
from pipeline.sol.checks import EvidenceIndex, answer_errors, check_answer, cited_refs
from pipeline.sol.corpus import (
    GROUPS_FILE,
    TIMELINE_BUDGET_CHARS,
    Batch,
    group_cells,
    group_id,
    load_batch,
    read_groups,
    timeline_budget,
)
from pipeline.sol.evidence import shown_among, shown_events
from pipeline.sol.merge import pack, premerge
from pipeline.sol.partition import CELL_HEADER, Renderer, outcome_of
from pipeline.sol.plan import (
    MAP_ROLE,
    REDUCE_ROLE,
    ROLE,
    MapCall,
    SolPlanDraft,
    maps_digest,
    plan_sol,
    reduce_budget,
    reduce_tokens,
)
from pipeline.sol.reduce import Draft, assemble, draft_blocks, map_calls_text, reduce_context, reduce_errors
from pipeline.sol.reuse import MapAnswers, PlanInputs, StoredMap, map_key
from pipeline.sol.shortlist import SHORTLIST_FILE, Denominator, Shortlist, write_shortlist
from pipeline.sol.timeline import TIMELINE_KINDS, fit_timelines

if TYPE_CHECKING:
    from pipeline.core.context import RunContext

OUTPUT_TOKENS = 3000
MAP_OUTPUT_TOKENS = 2500
REDUCE_OUTPUT_TOKENS = 3000
DRAFTS_PER_MAP_ESTIMATE = 3  # dry run: drafts assumed per map call to size the reduce request
__all__ = [
    "GROUPS_FILE",
    "TIMELINE_BUDGET_CHARS",
    "TIMELINE_KINDS",
    "build_context",
    "fit_timelines",
    "group_cells",
    "group_id",
    "make_shortlist",
    "mine",
    "plan",
    "read_groups",
    "single_context",
    "stage",
]


# -- the single call -------------------------------------------------------------------------------


def single_context(batch: Batch) -> dict[str, Any]:
    """The template context of the one call over the whole batch (the batch fits the model).

    Every value is the text the template shows (tables and lines, no indented JSON), so
    :func:`pipeline.sol.evidence.shown_events` of this context is what the request shows.
    """
    eligible = batch.eligible
    cells = [str(c["cell_id"]) for c in eligible]
    raw_lines = batch.timeline.lines(cells)  # the whole batch's: made only when the batch may fit one call
    timelines, omitted = fit_timelines(raw_lines, timeline_budget())
    renderer = Renderer(batch)
    outcome = {c["cell_id"]: f"{c['task_id']}, {outcome_of(c)}" for c in eligible}
    return {
        "run_id": batch.run_id,
        "harnesses": batch.harnesses,
        "eligible_count": len(eligible),
        **batch.pilot_context,  # a pilot: the prompt says its cells are a subset of the batch
        "cell_header": CELL_HEADER,
        "cells_text": "\n".join(renderer.cell_line(c) for c in cells),
        "excluded_text": "\n".join(f"{e['cell_id']}: {e['reason'] or '-'}" for e in batch.excluded) or "none",
        "negatives": batch.negatives,
        "groups_text": renderer.groups_text(cells),
        "timelines_note": (
            "complete"
            if not omitted
            else f"trimmed to fit the prompt: {omitted} of {sum(len(v) for v in raw_lines.values())} events "
            "omitted (marked in place); cite only events shown in this request"
        ),
        "timelines_text": "\n\n".join(
            f"### {cell} ({outcome.get(cell, '')})\n" + "\n".join(lines) for cell, lines in sorted(timelines.items())
        ),
    }


def build_context(run_dir: Path, ir_path: Path) -> tuple[dict[str, Any], EvidenceIndex]:
    """The single call's template context and the evidence index its answer is checked against."""
    batch = load_batch(run_dir, ir_path)
    try:
        return single_context(batch), batch.index
    finally:
        batch.close()


# -- the stage --------------------------------------------------------------------------------------


def _made_from(
    ctx: RunContext, context: dict[str, Any] | str, extra: dict[str, str] | None = None
) -> dict[str, str | None]:
    """What the shortlist was made from; ``context``: the calls' context, or its digest already made."""
    groups = ctx.run_dir / GROUPS_FILE
    made: dict[str, str | None] = {
        "ir": ir_digest(ctx.ir_path),
        "pattern_groups": sha256_file(groups) if groups.is_file() else None,
        "context": (
            context
            if isinstance(context, str)
            else digest({k: v for k, v in context.items() if not k.endswith("_json")})
        ),
        "template": template_hash(ROLE),
        "model": ctx.options.models.model,
    }
    made.update(extra or {})
    return made


def make_shortlist(
    run_id: str,
    index: EvidenceIndex,
    drafts: list[WeaknessDraft],
    *,
    made_from: dict[str, str | None],
    call: dict[str, Any],
    plan: SolPlan | None = None,
    dropped_before: list[Dropped] | None = None,
    shown: set[str] | None = None,
) -> Shortlist:
    """Check the drafts and assemble the shortlist (cards that pass, the rest dropped with reasons).

    ``shown``: the event ids the request that wrote the drafts showed; a card citing another is dropped.
    """
    cards, failed = check_answer(drafts, index, shown)
    dropped = [
        Dropped(weakness_id=d.weakness_id, statement=d.statement, reasons=failed[d.weakness_id])
        for d in drafts
        if d.weakness_id in failed
    ]
    # a repeated id appears once among the drafts that failed; keep one dropped entry per id
    seen: set[str] = set()
    dropped = [d for d in dropped if not (d.weakness_id in seen or seen.add(d.weakness_id))]  # type: ignore[func-returns-value]
    excluded = {c: info.exclusion_reason for c, info in sorted(index.cells.items()) if not info.eligible}
    return Shortlist(
        run_id=run_id,
        denominator=Denominator(eligible_cells=len(index.denominator), cells=index.denominator, excluded=excluded),
        weaknesses=cards,
        dropped=[*(dropped_before or []), *dropped],
        made_from=made_from,
        call=call,
        plan=plan,
    )


def _no_answer(outcome: CallOutcome[Any], what: str) -> Blocked:
    return Blocked(
        f"{what} gave no answer that parses after {outcome.attempts} attempts: {'; '.join(outcome.errors)[:300]}",
        reason="external_system",
        unblock="lunasol run BUNDLE --model OTHER_MODEL --resume  (this model's answers do not parse)",
        tried=[
            {
                "ladder_step": "alt_path",
                "action": f"re-asked {what} {max(outcome.attempts - 1, 0)} times with the validation errors",
                "outcome": "; ".join(outcome.errors)[:500] or "no parseable answer",
            },
        ],
    )


def _record(call_id: str, role: str, outcome: CallOutcome[Any], tokens: int, **what: Any) -> SolCall:
    return SolCall(
        call_id=call_id,
        role=role,
        request_tokens=tokens,
        ok=outcome.ok,
        attempts=outcome.attempts,
        key=outcome.key,
        errors=list(outcome.errors),
        **what,
    )


def _mine_single(ctx: RunContext, batch: Batch, decision: SolPlanDraft, client: ModelClient) -> Shortlist:
    index = batch.index
    context = decision.single_context or {}
    shown = shown_events(context)

    def check(answer: SolAnswer) -> list[str]:
        return answer_errors(answer.weaknesses, index, shown)

    outcome = asyncio.run(client.call(role=ROLE, cell_id=None, context=context, response_model=SolAnswer, check=check))
    if outcome.ok and outcome.value is not None:
        drafts = outcome.value.weaknesses
    elif outcome.last_answer is not None:
        drafts = SolAnswer.model_validate(outcome.last_answer).weaknesses  # failing cards get dropped below
    else:
        raise _no_answer(outcome, "Sol")
    call = {"ok": outcome.ok, "attempts": outcome.attempts, "errors": list(outcome.errors), "key": outcome.key}
    if not drafts and outcome.value is not None:
        call["none_reason"] = outcome.value.none_reason  # an empty answer always states why (SolAnswer)
    plan = SolPlan(
        mode="single",
        budget_tokens=decision.budget.input_tokens,
        context=decision.budget.limits.describe(),
        calls=[
            _record(
                "sol",
                ROLE,
                outcome,
                decision.single_tokens,
                cells=index.denominator,
                outputs=[d.weakness_id for d in drafts],
            )
        ],
    )
    return make_shortlist(
        batch.run_id, index, drafts, made_from=_made_from(ctx, context), call=call, plan=plan, shown=shown
    )


def _outside(answer: SolAnswer, seen: set[str]) -> list[str]:
    """Errors for cells a map answer cites outside the partition its call was shown."""
    errs: list[str] = []
    for d in answer.weaknesses:
        cited = [("support.cells", d.support.cells), ("first_divergence.cells", d.first_divergence.cells)]
        cited.append(("counter_evidence.items", [i.cell for i in d.counter_evidence.items]))
        for path, cells in cited:
            errs += [
                f"{d.weakness_id}: {path}[{i}]: {c} is not one of the cells this call was shown"
                for i, c in enumerate(cells)
                if c not in seen
            ]
    return errs


def _reused(stored: StoredMap, call_id: str, thash: str) -> CallOutcome[SolAnswer]:
    """The outcome of a map call answered from its stored answer: no exchange, nothing spent."""
    return CallOutcome(
        ok=True,
        value=stored.answer,
        errors=[],
        attempts=stored.attempts,
        keys=list(stored.keys),
        prompt_tokens=0,
        completion_tokens=0,
        cost_usd=0.0,
        role=MAP_ROLE,
        cell_id=call_id,
        template_hash=thash,
    )


def _said(call_id: str, outcome: CallOutcome[Any]) -> str:
    """``call_id: why`` of a call that answered no weakness (its stated reason), else empty."""
    value = outcome.value
    if value is None or value.weaknesses or not value.none_reason:
        return ""
    return f"{call_id}: {value.none_reason}" if call_id else str(value.none_reason)


def _shown(context: dict[str, Any], answer: SolAnswer, batch: Batch) -> set[str]:
    """What a check of ``answer`` reads of ``shown_events(context)``: the shown events among those it cites."""
    refs = [r for d in answer.weaknesses for r in cited_refs(d)]
    batch.index.load(refs)
    return shown_among(context, {e for r in refs for e in batch.index.events_of(r)})


async def _run_maps(
    client: ModelClient, batch: Batch, decision: SolPlanDraft, run_dir: Path, said: list[str]
) -> tuple[list[Draft], list[SolCall], list[Dropped]]:
    answers = MapAnswers(run_dir)
    thash = template_hash(MAP_ROLE)

    keyed: list[tuple[MapCall, str, StoredMap | None]] = []
    bound = client.max_tokens(MAP_ROLE)  # what each map request carries (keyed on it, not on the role's own bound)
    for m in decision.maps:
        key = map_key(
            m.canonical_sha,  # = digest(m.context), made when planned (or the last plan's, for an unchanged partition)
            template_hash=thash,
            model=client.model,
            instructor_mode=client.instructor_mode,
            settings=client.settings,
            max_tokens=bound,
        )
        keyed.append((m, key, answers.get(m.chunk.call_id, key)))
    # every stored answer is checked again below: the events they cite are read in one query
    batch.index.load([r for _, _, s in keyed if s is not None for d in s.answer.weaknesses for r in cited_refs(d)])

    async def one(m: MapCall, key: str, stored: StoredMap | None) -> _MapResult:
        seen = set(m.chunk.cells)
        # The context is rendered here at most once and dropped when the call is done: at most the calls in
        # flight hold theirs, never the whole batch's.
        held: list[dict[str, Any]] = []

        def shown_for(answer: SolAnswer) -> set[str] | None:
            # a call taken from the last plan and not rendered: its stored answer was checked against the same
            # request (same digest), so its shown events are not read again; every other check is made again
            if m.lazy and not held:
                return None
            if not held:
                held.append(m.context)
            return _shown(held[0], answer, batch)

        def check(answer: SolAnswer) -> list[str]:
            return _outside(answer, seen) + answer_errors(answer.weaknesses, batch.index, shown_for(answer))

        cid = m.chunk.call_id
        if stored is not None and not check(stored.answer):  # same request, and today's checks still pass
            return _map_result(batch, m, _reused(stored, cid, thash), shown_for, reused=True)
        if not held:
            held.append(m.context)
        out = await client.call(role=MAP_ROLE, cell_id=cid, context=held[0], response_model=SolAnswer, check=check)
        if out.ok and out.value is not None:
            answers.put(
                cid,
                key,
                StoredMap(out.value, out.attempts, list(out.keys)),
                inputs={"template": thash, "model": client.model},
            )
        return _map_result(batch, m, out, shown_for, reused=False)

    results = await client.gather([one(*k) for k in keyed], label="sol map")
    drafts = [d for r in results for d in r.drafts]
    calls = [r.call for r in results]
    dropped = [d for r in results for d in r.dropped]
    outcomes = [r.outcome for r in results]
    if all(not c.ok and not c.outputs for c in calls) and not any(o.last_answer for o in outcomes):
        raise _no_answer(outcomes[0], "Sol (every map call)")
    said.extend(_said(m.chunk.call_id, o) for m, o in zip(decision.maps, outcomes, strict=True) if _said("", o))
    return drafts, calls, dropped


@dataclass
class _MapResult:
    outcome: CallOutcome[SolAnswer]
    drafts: list[Draft]
    dropped: list[Dropped]
    call: SolCall


def _map_result(
    batch: Batch,
    m: MapCall,
    out: CallOutcome[SolAnswer],
    shown_for: Callable[[SolAnswer], set[str] | None],
    *,
    reused: bool,
) -> _MapResult:
    """A map call's checked drafts, the drafts it dropped and its record (``shown_for``: the cited events shown)."""
    cid = m.chunk.call_id
    answer = out.value if out.ok else (SolAnswer.model_validate(out.last_answer) if out.last_answer else None)
    made: list[str] = []
    drafts: list[Draft] = []
    dropped: list[Dropped] = []
    if answer is not None:
        cards, failed = check_answer(answer.weaknesses, batch.index, shown_for(answer))
        outside = _outside(answer, set(m.chunk.cells))
        for card in cards:
            bad = [e for e in outside if e.startswith(f"{card.weakness_id}:")]
            if bad:
                failed[card.weakness_id] = bad
                continue
            drafts.append(Draft(f"{cid}/{card.weakness_id}", cid, card, list(m.chunk.cells)))
            made.append(f"{cid}/{card.weakness_id}")
        by_id = {d.weakness_id: d for d in answer.weaknesses}
        dropped += [
            Dropped(weakness_id=f"{cid}/{wid}", statement=by_id[wid].statement, reasons=reasons)
            for wid, reasons in sorted(failed.items())
            if wid in by_id
        ]
    call = _record(cid, MAP_ROLE, out, m.tokens, tasks=m.chunk.tasks, cells=m.chunk.cells, outputs=made, reused=reused)
    return _MapResult(out, drafts, dropped, call)


STALLED_ROUNDS = 3  # reduce rounds in a row that merge nothing (each packed anew) before the packs' answers stand


def reduce_requests(
    batch: Batch,
    budget: RoleBudget,
    drafts: list[Draft],
    blocks: dict[str, str],
    summaries: list[dict[str, Any]],
    turn: int = 0,
) -> list[tuple[list[Draft], dict[str, Any], int]]:
    """The reduce requests of one round: packs measured in tokens, each rendered and counted whole.

    The part every request shares is bounded (:func:`pipeline.sol.reduce.reduce_context`); the
    room is what it leaves of the budget, and drafts are packed by their counted tokens
    (:func:`pipeline.sol.merge.pack`). A request that still does not fit is halved; a draft alone
    too large blocks with its size. Call ids are filled in by the caller (``call_id`` ``R?``).
    """
    fixed = reduce_tokens(budget, reduce_context(batch, [], {}, "R00-00", summaries))
    fixed += count_text(budget.limits, map_calls_text(drafts, summaries))  # the map calls a pack names, at most
    todo = pack(drafts, blocks, budget, fixed, turn)
    out: list[tuple[list[Draft], dict[str, Any], int]] = []
    while todo:
        p = todo.pop(0)
        rctx = reduce_context(batch, p, blocks, "R00-00", summaries)
        tokens = reduce_tokens(budget, rctx)
        if budget.fits(tokens):
            out.append((p, rctx, tokens))
        elif len(p) > 1:
            todo[:0] = [p[: len(p) // 2], p[len(p) // 2 :]]
        else:
            raise Blocked(
                f"Sol draft {p[0].draft_id} alone needs {tokens:,} tokens in a reduce request, over the budget "
                f"{budget.input_tokens:,} ({budget.limits.describe()})",
                reason="external_system",
                unblock="lunasol run BUNDLE --model MODEL_WITH_A_LARGER_CONTEXT --resume",
            )
    return out


def _as_final(cards: list[WeaknessCard]) -> list[WeaknessDraft]:
    """Checked cards as the final drafts of the shortlist, numbered W-01, W-02, ... in order."""
    out = []
    for i, c in enumerate(cards, 1):
        data = c.model_dump()
        s = c.support
        support = SupportDraft(cells=s.cells, pattern_groups=s.pattern_groups, event_refs=s.event_refs)
        data["support"] = support.model_dump()
        data["weakness_id"] = f"W-{i:02d}"
        out.append(WeaknessDraft.model_validate(data))
    return out


async def _reduce(
    client: ModelClient,
    batch: Batch,
    settings: Any,
    drafts: list[Draft],
    map_calls: list[SolCall],
    cpt: float,
    said: list[str],
) -> tuple[list[WeaknessDraft], list[SolCall], list[Dropped], set[str]]:
    """Reduce rounds until one call holds every remaining draft, or merging stops.

    Drafts of the same pattern groups or the same first divergence are pre-merged before any call
    (:func:`pipeline.sol.merge.premerge`), and again after every round. Each round packs at least two
    drafts per request, so the depth grows with log(drafts), with no ceiling. When
    :data:`STALLED_ROUNDS` rounds in a row merge nothing (each packed in another order), the
    calls judged every draft they were shown distinct: their weaknesses are the batch's.

    Returns the final weakness drafts, the calls, the drafts dropped, and the event ids the final
    calls showed (their requests, and what the drafts they merge cite: their map calls showed those).
    """
    del cpt  # room is counted in tokens (kept in the signature for callers)
    budget = reduce_budget(settings)
    summaries = [c.model_dump() for c in map_calls]
    calls: list[SolCall] = []
    dropped: list[Dropped] = []
    drafts = premerge(batch, drafts)
    round_no = 0
    stalls = 0
    while True:
        round_no += 1
        blocks = draft_blocks(batch, drafts)
        requests = reduce_requests(batch, budget, drafts, blocks, summaries, stalls)
        final = len(requests) == 1
        outs: list[tuple[str, list[Draft], set[str], int]] = []
        coros = []
        for i, (pack_, rctx, tokens) in enumerate(requests, 1):
            cid = "R" if final and round_no == 1 else f"R{round_no}-{i:02d}"
            rctx["call_id"] = cid
            tokens = reduce_tokens(budget, rctx)  # the id is in the prompt: count the named request
            by_id = {d.draft_id: d for d in pack_}
            shown = shown_events(rctx) | {
                e for d in pack_ for r in cited_refs(d.card) for e in batch.index.events_of(r)
            }

            def check(answer: ReduceAnswer, by_id: dict[str, Draft] = by_id, shown: set[str] = shown) -> list[str]:
                return reduce_errors(answer.weaknesses, by_id, batch, shown)

            coros.append(
                client.call(role=REDUCE_ROLE, cell_id=cid, context=rctx, response_model=ReduceAnswer, check=check)
            )
            outs.append((cid, pack_, shown, tokens))
        results = await client.gather(coros, label="sol reduce")
        merged_drafts: list[tuple[str, list[Draft], list[WeaknessDraft], set[str]]] = []
        for (cid, pack_, shown, tokens), out in zip(outs, results, strict=True):
            answer = (
                out.value if out.ok else (ReduceAnswer.model_validate(out.last_answer) if out.last_answer else None)
            )
            if answer is None:
                raise _no_answer(out, f"Sol reduce {cid}")
            by_id = {d.draft_id: d for d in pack_}
            used = {did for w in answer.weaknesses for did in w.merges}
            dropped += [
                Dropped(
                    weakness_id=d.draft_id,
                    statement=d.card.statement,
                    reasons=[f"{d.draft_id}: not merged into any weakness by the reduce call {cid}"],
                )
                for d in pack_
                if d.draft_id not in used
            ]
            seen = sorted({c for d in pack_ for c in d.seen_cells})
            calls.append(
                _record(
                    cid,
                    REDUCE_ROLE,
                    out,
                    tokens,
                    cells=seen,
                    inputs=[x for d in pack_ for x in (d.draft_id, *d.absorbed)],
                    outputs=[w.weakness_id for w in answer.weaknesses],
                )
            )
            merged_drafts.append((cid, pack_, [assemble(w, by_id) for w in answer.weaknesses], shown))
        if final:
            said.extend(x for cid, out in zip([o[0] for o in outs], results, strict=True) if (x := _said(cid, out)))
            return merged_drafts[0][2], calls, dropped, merged_drafts[0][3]
        # Not the last round: every pack's checked weaknesses become drafts of the next round.
        nxt: list[Draft] = []
        for cid, pack_, weaknesses, shown in merged_drafts:
            cards, failed = check_answer(weaknesses, batch.index, shown)
            seen = sorted({c for d in pack_ for c in d.seen_cells})
            sources = sorted({c for d in pack_ for c in d.map_calls})
            nxt += [Draft(f"{cid}/{c.weakness_id}", cid, c, seen, sources=sources) for c in cards]
            dropped += [
                Dropped(weakness_id=f"{cid}/{wid}", statement="", reasons=reasons)
                for wid, reasons in sorted(failed.items())
            ]
        nxt = premerge(batch, nxt)
        stalls = stalls + 1 if len(nxt) >= len(drafts) else 0
        if not nxt or stalls >= STALLED_ROUNDS:
            # Nothing merges any more however the drafts are packed: each call judged its drafts distinct.
            said.extend(x for cid, out in zip([o[0] for o in outs], results, strict=True) if (x := _said(cid, out)))
            shown_all = set().union(*(m[3] for m in merged_drafts))
            return _as_final([d.card for d in nxt]), calls, dropped, shown_all
        drafts = nxt


def _mine_map_reduce(ctx: RunContext, batch: Batch, decision: SolPlanDraft, client: ModelClient) -> Shortlist:
    said: list[str] = []  # what the calls that found no weakness said about why

    async def go() -> tuple[list[WeaknessDraft], list[SolCall], list[Dropped], set[str]]:
        drafts, map_calls, dropped = await _run_maps(client, batch, decision, ctx.run_dir, said)
        if not drafts:
            return [], map_calls, dropped, set()
        said.clear()  # the reduce's reason is the batch's, not the maps'
        final, reduce_calls, more, shown = await _reduce(
            client, batch, ctx.options.models, drafts, map_calls, decision.chars_per_token, said
        )
        return final, map_calls + reduce_calls, dropped + more, shown

    final, calls, dropped, shown = asyncio.run(go())
    plan = SolPlan(
        mode="map_reduce",
        budget_tokens=decision.budget.input_tokens,
        context=decision.budget.limits.describe(),
        calls=calls,
    )
    last = calls[-1]
    call = {
        "ok": all(c.ok for c in calls),
        "attempts": sum(c.attempts for c in calls),
        "errors": [f"{c.call_id}: {e}" for c in calls for e in c.errors],
        "key": last.key,
    }
    if not final and said:
        call["none_reason"] = " | ".join(said)
    extra = {f"template:{r}": template_hash(r) for r in (MAP_ROLE, REDUCE_ROLE)}
    return make_shortlist(
        batch.run_id,
        batch.index,
        final,
        made_from=_made_from(ctx, maps_digest(decision.maps), extra),  # digest({"maps": [contexts]})
        call=call,
        plan=plan,
        dropped_before=dropped,
        shown=shown,
    )


def _require_analysed_cells(batch: Batch) -> None:
    """Block before any Sol call when Luna analysed no eligible cell (every one failed).

    Sol would be paid to explain nothing, and whatever it answered (an empty list is a valid answer)
    would reach gate 1 looking like an analysis that found nothing. Some failed cells are fine: the
    run goes on with the others and the Luna stage stays pending.
    """
    failed = sorted(str(c["cell_id"]) for c in batch.coverage if c.get("luna_status") == "failed")
    if failed and len(failed) >= len(batch.index.denominator):
        raise Blocked(
            f"Luna analysed none of the {len(batch.index.denominator)} eligible cell(s) (all failed: {some(failed)}; "
            "see table luna_cells): Sol has nothing to explain, so no Sol call was made",
            reason="missing_data",
            unblock="lunasol run BUNDLE --resume  (asks exactly the failed cells again; or use another --model)",
        )


def mine(ctx: RunContext) -> Shortlist:
    """Mine the batch's weaknesses (one call, or map/reduce when it does not fit) and write the shortlist."""
    batch = load_batch(ctx.run_dir, ctx.ir_path)
    try:
        return _mine(ctx, batch)
    finally:
        batch.close()
        del batch
        give_back()  # the batch's rows, groups and renderer caches: freed, handed back before the next stage


def _mine(ctx: RunContext, batch: Batch) -> Shortlist:
    if not batch.index.denominator:
        raise Blocked("no eligible cell in this run: Sol has nothing to explain", reason="missing_data")
    _require_analysed_cells(batch)
    answers = MapAnswers(ctx.run_dir)
    limits = role_budget(ctx.options.models, MAP_ROLE).limits.describe()
    prior = PlanInputs(ctx.run_dir, limits)
    decision = plan_sol(
        batch, ctx.options.models, lambda: single_context(batch), known=answers.token_counts(limits), prior=prior
    )
    if decision.mode == "map_reduce":
        answers.put_counts(limits, decision.counts)
        prior.save()
        ctx.log(f"[sol] {decision.describe()}")
    client = ModelClient(ctx.options.models, ctx.run_dir, log=ctx.log)
    if decision.mode == "single":
        shortlist = _mine_single(ctx, batch, decision, client)
    else:
        shortlist = _mine_map_reduce(ctx, batch, decision, client)
    shortlist.pilot = run_pilot(ctx.run_dir)  # a pilot's shortlist says so in its header (and in its digest)
    return write_shortlist(ctx.run_dir / SHORTLIST_FILE, shortlist)


def stage(ctx: RunContext) -> str:
    """Runner stage: mine root causes; one-line summary."""
    sl = mine(ctx)
    kept = ", ".join(w.weakness_id for w in sl.weaknesses) or "none"
    if not sl.weaknesses and sl.call.get("none_reason"):
        kept = f"none: Sol says {sl.call['none_reason']}"
    how = ""
    if sl.plan is not None and sl.plan.mode == "map_reduce":
        maps = sum(1 for c in sl.plan.calls if c.role == MAP_ROLE)
        reds = sum(1 for c in sl.plan.calls if c.role == REDUCE_ROLE)
        again = sum(1 for c in sl.plan.calls if c.reused)
        how = f" via {maps} map + {reds} reduce call(s)"
        if again:
            how += f" ({again} map answer(s) reused: same request as last run)"
    return (
        f"{len(sl.weaknesses)} weakness(es) kept ({kept}){how}, {len(sl.dropped)} dropped with reasons; "
        f"shortlist {sl.digest[:19]}"
    )


def _dry_drafts(batch: Batch, decision: SolPlanDraft) -> list[Draft]:
    """Stand-in drafts to size the reduce request in a dry run (labelled an estimate by the caller)."""
    out: list[Draft] = []
    renderer = decision.renderer or Renderer(batch)
    for m in decision.maps:
        cells = m.chunk.cells
        groups = renderer.group_ids(cells)  # a map call cites the groups its partition shows
        for k in range(DRAFTS_PER_MAP_ESTIMATE):
            cited = groups[k::DRAFTS_PER_MAP_ESTIMATE][:3]
            card = WeaknessCard.model_validate(
                {
                    "weakness_id": f"W-{k + 1:02d}",
                    "statement": "x" * 300,
                    "first_divergence": {
                        "where": {"stage": "-", "actor": "-", "what": "x" * 200},
                        "cells": cells[:3],
                        "event_refs": [],
                    },
                    "harness_attribution": {"attributed": True, "why": "x" * 200},
                    "support": {
                        "cells": cells,
                        "tasks": sorted({batch.by_cell[c]["task_id"] for c in cells}),
                        "runs": [],
                        "pattern_groups": cited,
                        "event_refs": [],
                        "counts": {"cells": len(cells), "tasks": 0, "runs": 0, "pattern_groups": len(cited)},
                    },
                    "alternative_explanations": ["x" * 150, "x" * 150],
                    "counter_evidence": {"items": [], "none_reason": "x" * 100},
                    "counterfactual_prediction": "x" * 250,
                    "confidence": "medium",
                }
            )
            out.append(Draft(f"{m.chunk.call_id}/{card.weakness_id}", m.chunk.call_id, card, cells))
    return out


def plan(ctx: RunContext) -> Iterator[PlannedCall]:
    """For ``--dry-run``: the calls Sol would make over the pattern groups that exist (or the probe-based estimate).

    Made as they are counted: a map call's context is rendered when it is asked for, never every one
    held (10,764 map requests at 100,000 cells held 3.0 GiB as a list).
    """
    if not ctx.ir_path.is_file():
        return
    batch = load_batch(ctx.run_dir, ctx.ir_path)
    try:
        yield from _plan(ctx, batch)
    finally:
        batch.close()


def _plan(ctx: RunContext, batch: Batch) -> Iterator[PlannedCall]:
    if not batch.index.denominator:
        return
    decision = plan_sol(batch, ctx.options.models, lambda: single_context(batch))
    note = decision.describe()
    if decision.mode == "single":
        yield PlannedCall(
            role=ROLE,
            cell_id=None,
            context=decision.single_context or {},
            response_model=SolAnswer,
            expected_output_tokens=OUTPUT_TOKENS,
            note=note,
        )
        return
    for m in decision.maps:
        yield PlannedCall(
            role=MAP_ROLE,
            cell_id=m.chunk.call_id,
            context=m.context,
            response_model=SolAnswer,
            expected_output_tokens=MAP_OUTPUT_TOKENS,
            note=note,
        )
    drafts = _dry_drafts(batch, decision)
    summaries = [
        {"call_id": m.chunk.call_id, "tasks": m.chunk.tasks, "cells": m.chunk.cells, "outputs": []}
        for m in decision.maps
    ]
    drafts = premerge(batch, drafts)
    blocks = draft_blocks(batch, drafts)
    budget = reduce_budget(ctx.options.models)
    packs = reduce_requests(batch, budget, drafts, blocks, summaries)
    for i, (_pack, rctx, _tokens) in enumerate(packs, 1):
        cid = "R" if len(packs) == 1 else f"R1-{i:02d}"
        rctx["call_id"] = cid
        yield PlannedCall(
            role=REDUCE_ROLE,
            cell_id=cid,
            context=rctx,
            response_model=ReduceAnswer,
            expected_output_tokens=REDUCE_OUTPUT_TOKENS,
            note=f"estimate: {DRAFTS_PER_MAP_ESTIMATE} drafts assumed per map call"
            + ("" if len(packs) == 1 else f"; {len(packs)} first-round reduce calls, then a final one"),
        )
