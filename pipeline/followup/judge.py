"""The judged part of a follow-up: the ``judge`` role reads the child run's evidence, per rejection condition.

One structured call through the same :class:`~pipeline.models.ModelClient` as every role (record,
replay, call log, budget and preflight unchanged). The request carries the card's behavioural
prediction and rejection conditions, the child's pattern groups relevant to the weakness (the
matched ones first, with event ids and refs), and the child's controller lines per cell — never the
sidecar outcomes nor the statistics (like Luna, the judge describes logs, it is not told results).

Evidence rules (as Sol's): every cited ref must resolve to an event of an eligible child cell of the
covered task families. The client's ``check`` hook sends an answer with an unresolved ref, a missing
condition or a determinate status without refs back to the model; what still fails after the
re-asks is recorded as ``undetermined`` with the problem, never kept.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pipeline.artifacts.rundir import RunDir
from pipeline.core import roles
from pipeline.core.errors import Blocked
from pipeline.core.settings import ModelSettings
from pipeline.followup.inputs import RunSide, ir_rows
from pipeline.followup.schema import ConditionResult, Conflict, JudgeBlock, JudgeView
from pipeline.models import ModelClient, render
from pipeline.models.budget import request_tokens, role_budget
from pipeline.models.preflight import preflight
from pipeline.proposals.proposer import group_line
from pipeline.sol.checks import EvidenceIndex, load_index
from pipeline.state.blocking import write_block_receipt

ROLE = roles.JUDGE.name
Row = dict[str, Any]
REPEAT_TYPES = frozenset({"repeated_exploration", "zero_information_gain"})
EVENT_CHARS = 240  # a controller line is short; a longer one is cut (the ref still shows it whole)
_DETERMINATE = frozenset({"triggered", "not_triggered", "observed", "not_observed"})


class JudgedCondition(BaseModel):
    """The judge's answer for one rejection condition."""

    model_config = ConfigDict(extra="forbid")

    index: int = Field(description="the condition's number")
    status: Literal["triggered", "not_triggered", "undetermined"]
    refs: list[str] = Field(default_factory=list, description="event ids or source refs that show it")
    reason: str = Field(min_length=1, description="what the cited lines show, in one or two sentences")


class JudgedBehaviour(BaseModel):
    """The judge's answer for the card's predicted behavioural change."""

    model_config = ConfigDict(extra="forbid")

    status: Literal["observed", "not_observed", "undetermined"]
    refs: list[str] = Field(default_factory=list, description="event ids or source refs that show it")
    reason: str = Field(min_length=1)


class JudgeAnswer(BaseModel):
    """The judge's whole answer: the behavioural change and every rejection condition."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "nothing_found": 'every condition is still answered, by its number: status "undetermined" with a '
            "reason saying what the logs do not show; the behavioural change likewise"
        },
    )

    behavioral_change: JudgedBehaviour
    conditions: list[JudgedCondition]


@dataclass
class JudgeEvidence:
    """What the judge may cite: the child's IR index restricted to the covered, eligible cells."""

    index: EvidenceIndex
    cells: set[str]

    def source_ref(self, ref: str) -> tuple[str | None, str | None, str | None]:
        """(cell, its raw-bytes ref PATH#Lx-Ly[/pointer], problem) of one cited ref."""
        cell, why = self.index.resolve(ref)
        if cell is None:
            return None, None, why
        if cell not in self.cells:
            return None, None, f"{ref}: cell {cell} is not an eligible cell of the covered task families"
        return cell, self.index.source_ref(ref.strip()) or ref.strip(), None


def make_check(evidence: JudgeEvidence, n_conditions: int) -> Callable[[JudgeAnswer], list[str]]:
    """The client's ``check`` hook: every condition once, refs that resolve, refs behind every determinate status."""

    def check(answer: JudgeAnswer) -> list[str]:
        errors: list[str] = []
        seen = [c.index for c in answer.conditions]
        missing = sorted(set(range(1, n_conditions + 1)) - set(seen))
        if missing:
            errors.append(f"conditions: no answer for condition(s) {', '.join(map(str, missing))}")
        extra = sorted({i for i in seen if not 1 <= i <= n_conditions or seen.count(i) > 1})
        if extra:
            errors.append(f"conditions: condition number(s) {', '.join(map(str, extra))} unknown or repeated")
        items: list[tuple[str, str, list[str]]] = [("behavioral_change", answer.behavioral_change.status,
                                                    answer.behavioral_change.refs)]  # fmt: skip
        items += [(f"conditions[{c.index}]", c.status, c.refs) for c in answer.conditions]
        for where, status, refs in items:
            if status in _DETERMINATE and not refs:
                errors.append(f"{where}: status {status} needs at least one ref from the evidence shown")
            for ref in refs:
                problem = evidence.source_ref(ref)[2]
                if problem:
                    errors.append(f"{where}: {problem}")
        return errors

    return check


def _view(status: str, reason: str, refs: list[str], evidence: JudgeEvidence, fallback: str) -> JudgeView:
    """One answer with its refs normalised; unresolved refs (after the re-asks) make it ``fallback``."""
    cells: set[str] = set()
    out: list[str] = []
    problems: list[str] = []
    for ref in refs:
        cell, src, problem = evidence.source_ref(str(ref))
        if problem:
            problems.append(problem)
        elif cell and src:
            cells.add(cell)
            if src not in out:
                out.append(src)
    if status in _DETERMINATE and not out:
        problems.append(f"status {status} cited no ref that resolves")
    if problems:
        return JudgeView(status=fallback, reason=reason, cells=sorted(cells), refs=out, problems=problems)
    return JudgeView(status=status, reason=reason, cells=sorted(cells), refs=out)


# -- the request ------------------------------------------------------------------------------------


@dataclass
class JudgeRequest:
    """The context of the judge's call and the cells whose controller lines it shows."""

    context: dict[str, Any]
    full_cells: list[str] = field(default_factory=list)
    view: str = "refs"  # how the groups' occurrences are listed (:func:`groups_text`)
    occurrences: int = 0  # every occurrence of the relevant groups (each is listed)


def _controller_lines(child: RunSide, cells: list[str]) -> dict[str, list[tuple[str, str, str]]]:
    if not cells:
        return {}
    rows = ir_rows(
        child.run_dir,
        "SELECT cell_id, event_id, coalesce(detail, kind), coalesce(text, '') FROM events "
        "WHERE list_contains(?, cell_id) AND actor = 'controller' ORDER BY cell_id, seq",
        [cells],
    )
    out: dict[str, list[tuple[str, str, str]]] = {}
    for cell, eid, detail, text in rows:
        out.setdefault(str(cell), []).append((str(eid), str(detail), " ".join(str(text).split())))
    return out


def _line(eid: str, text: str, chars: int) -> str:
    return f"{eid} {text if len(text) <= chars else text[: chars - 1] + '…'}"


def _relevant_groups(child: RunSide, matched: list[tuple[Row, Row | None, float | None]]) -> list[Row]:
    """The child's matched groups first, then its other loops: groups of the weakness's types over a transition.

    A loop that came back under another key (review->design instead of review->review) is what an
    "equivalent loop" condition asks about; single-target repeats elsewhere in the batch are not.
    """
    first = [m for _, m, _ in matched if m is not None]
    types = {str(p.get("type")) for p, _, _ in matched} | REPEAT_TYPES
    ids = {id(g) for g in first}
    rest = [
        g
        for g in child.groups
        if id(g) not in ids and str(g.get("type")) in types and str(g.get("concerns") or "").startswith("transition:")
    ]
    return first + rest


OccurrenceView = Literal["refs", "events", "ids"]


def groups_text(groups: list[Row], view: OccurrenceView = "refs") -> str:
    """Every occurrence of every group the judge reads: never a sample.

    ``refs``: a line per occurrence with all its event ids and source refs; ``events``: the event ids
    only (each is citable, its ref resolves from it); ``ids``: the occurrence ids alone, said to be
    left out for the request's budget (the last step of :func:`fit_request`, labelled in the prompt).
    """
    out: list[str] = []
    for g in groups:
        occ = [o for o in g.get("occurrences") or [] if isinstance(o, dict)]
        out.append(group_line(g, occ))
        if view == "ids":
            ids = ", ".join(str(o.get("occurrence_id")) for o in occ)
            out.append(f"  {len(occ)} occurrence(s), their events left out for this request's token budget: {ids}")
            continue
        for o in occ:
            line = f"  {o.get('occurrence_id')} {o.get('cell_id')}: events {', '.join(o.get('events') or [])}"
            if view == "refs":
                line += f"; refs {', '.join(o.get('refs') or [])}"
            out.append(line)
    return "\n".join(out)


def build_request(
    child: RunSide, card: Any, matched: list[tuple[Row, Row | None, float | None]], covered: set[str],
    *, full: int | None = None, chars: int = EVENT_CHARS, view: OccurrenceView = "refs", others: bool = True,
) -> JudgeRequest:  # fmt: skip
    """The judge's context; ``full`` caps the cells shown in full (priority order), ``chars`` each line.

    ``others=False`` leaves out the last-line view of the cells not shown in full (their count is said);
    ``view``: how each group occurrence is listed (:func:`groups_text`; every occurrence, always).
    """
    cells = sorted(c for c, t in child.cells.items() if t in covered)
    groups = _relevant_groups(child, matched)
    in_groups = {str(o.get("cell_id")) for g in groups for o in g.get("occurrences", []) if isinstance(o, dict)}
    lines = _controller_lines(child, cells)

    def notable(cell: str) -> str | None:
        if cell in in_groups:
            return "in a pattern group above"
        details = [d for _, d, _ in lines.get(cell, [])]
        if any("sent_back" in d or "blocked" in d for d in details):
            return "a checker sent work back"
        finished = [t for _, d, t in lines.get(cell, []) if "finished" in d]
        if not finished or ": done" not in finished[-1]:
            return "the run did not finish"
        return None

    ranked = sorted(cells, key=lambda c: (0 if c in in_groups else 1 if notable(c) else 2, c))
    chosen = [c for c in ranked if notable(c)][: full if full is not None else None]
    shown = []
    for cell in cells:
        evs = lines.get(cell, [])
        if cell not in chosen and not others:
            continue
        if cell in chosen:
            shown.append({"cell_id": cell, "task_id": child.cells[cell], "note": notable(cell) or "",
                          "events": [_line(e, t, chars) for e, _, t in evs]})  # fmt: skip
        else:
            tail = [_line(e, t, chars) for e, _, t in evs[-1:]]
            shown.append({"cell_id": cell, "task_id": child.cells[cell], "note": "last controller line",
                          "events": tail})  # fmt: skip
    text = card.rejection_conditions
    shown_groups = groups_text(groups, view) if groups else "none: no child group of these types"
    context = {
        "run_id": child.request.analysis_run_id or child.run_id,
        "generation": child.request.generation,
        "proposal_id": card.proposal_id,
        "parent_harness": card.parent_harness,
        "child_harness": ", ".join(child.harnesses) or "the next harness",
        "proposed_strategy": card.strategy_change.proposed_strategy.strip(),
        "behavioral_change": card.expected_effect.behavioral_change.strip(),
        "targeted_pattern_change": card.expected_effect.targeted_pattern_change.strip(),
        "conditions": [{"index": i, "text": t.strip()} for i, t in enumerate(text, 1)],
        "groups": shown_groups,
        "cells": shown,
        "omitted": len(cells) - len(shown),
    }
    n_occ = sum(1 for g in groups for o in g.get("occurrences") or [] if isinstance(o, dict))
    return JudgeRequest(context=context, full_cells=sorted(chosen), view=view, occurrences=n_occ)


def fit_request(
    child: RunSide, card: Any, matched: list[tuple[Row, Row | None, float | None]], covered: set[str],
    settings: ModelSettings,
) -> JudgeRequest:  # fmt: skip
    """The judge's request within its whole-request budget, shrunk step by step until it fits.

    Every occurrence of the relevant groups is listed at every step (it was a sample of 8 a group).
    Shorter lines first; then the other cells' last lines go (their count is said); then occurrences
    by event ids without their refs; then fewer cells in full (the targeted pattern's cells first), one
    at last with lines of 80 characters; last, each group's occurrences by id, said in the prompt to be
    left out for the budget.
    """
    budget = role_budget(settings, ROLE)

    def fits(req: JudgeRequest) -> bool:
        messages = render(ROLE, req.context, response_model=JudgeAnswer).messages
        return budget.fits(request_tokens(budget, messages, JudgeAnswer))

    steps: list[dict[str, Any]] = [{}, {"chars": 120}, {"chars": 120, "others": False},
                                   {"chars": 120, "others": False, "view": "events"}]  # fmt: skip
    for kw in steps:
        req = build_request(child, card, matched, covered, **kw)
        if fits(req):
            return req
    n = len(req.full_cells)
    while n > 1:
        n //= 2
        req = build_request(child, card, matched, covered, full=n, chars=120, others=False, view="events")
        if fits(req):
            return req
    for view in ("events", "ids"):  # one cell in full, its lines at 80 characters; last, occurrences by id
        req = build_request(child, card, matched, covered, full=1, chars=80, others=False, view=view)
        if fits(req):
            return req
    return req  # if even this does not fit, the client refuses it before sending (ContextExceeded)


# -- the call and the merge ---------------------------------------------------------------------------


@dataclass
class Judged:
    """The judge's block and its answer per condition index (after the ref checks)."""

    block: JudgeBlock
    conditions: dict[int, JudgeView]


def not_asked(note: str) -> Judged:
    """No judge call (``--no-judge``): conditions no count settles stay with a human."""
    return Judged(block=JudgeBlock(asked=False, note=note), conditions={})


def judge(
    child: RunSide, card: Any, matched: list[tuple[Row, Row | None, float | None]], covered: set[str],
    settings: ModelSettings, command: str, log: Callable[[str], None] = lambda _m: None,
) -> Judged:  # fmt: skip
    """Ask the judge once; return its answers with every ref checked against the child's IR.

    ``command`` is the follow-up's own command line, for the block receipt of a blocked call.
    """
    evidence = JudgeEvidence(index=load_index(RunDir(child.run_dir).ir),
                             cells={c for c, t in child.cells.items() if t in covered})  # fmt: skip
    n = len(card.rejection_conditions)
    preflight(settings)  # a missing key or unknown model: one line, exit 2, before any call
    req = fit_request(child, card, matched, covered, settings)
    client = ModelClient(settings, child.run_dir, log=log)
    try:
        out = asyncio.run(client.call(role=ROLE, cell_id=None, context=req.context, response_model=JudgeAnswer,
                                      check=make_check(evidence, n)))  # fmt: skip
    except Blocked as exc:
        write_block_receipt(child.run_dir, exc, stage="followup", unblock=exc.unblock or command, command=command)
        raise
    answer: Row | None
    answer = out.value.model_dump(mode="json") if out.ok and out.value is not None else out.last_answer
    block = JudgeBlock(
        asked=True,
        note=f"one call of the judge role on {len(evidence.cells)} child cell(s); "
        f"{len(req.full_cells)} shown with every controller line; all {req.occurrences} occurrence(s) of the "
        "relevant groups listed"
        + (" by id only (their events left out for the token budget)" if req.view == "ids" else ""),
        ok=out.ok,
        attempts=out.attempts,
        errors=list(out.errors),
        key=out.key,
        model=client.model,
        template_hash=out.template_hash,
        evidence_cells=req.full_cells,
    )
    views: dict[int, JudgeView] = {}
    if answer is None:
        return Judged(block=block, conditions=views)
    seen: set[int] = set()
    for c in answer.get("conditions") or []:
        i = int(c.get("index", 0))
        if not 1 <= i <= n or i in seen:
            continue
        seen.add(i)
        views[i] = _view(str(c.get("status")), str(c.get("reason") or ""), list(c.get("refs") or []), evidence,
                         "undetermined")  # fmt: skip
    b = answer.get("behavioral_change") or {}
    behaviour = _view(str(b.get("status")), str(b.get("reason") or ""), list(b.get("refs") or []), evidence,
                      "undetermined")  # fmt: skip
    block = block.model_copy(update={"behavioral_change": behaviour})
    return Judged(block=block, conditions=views)


def merge(counted: list[ConditionResult], judged: Judged) -> tuple[list[ConditionResult], list[Conflict]]:
    """Each condition: a determinate count overrides the judge (the disagreement recorded), else the judge's answer."""
    out: list[ConditionResult] = []
    conflicts: list[Conflict] = []
    for c in counted:
        j = judged.conditions.get(c.index)
        if c.status != "undetermined":
            if j is not None and j.status in ("triggered", "not_triggered") and j.status != c.status:
                conflicts.append(Conflict(index=c.index, count_status=c.status, judge_status=j.status,
                                          count_reason=c.reason, judge_reason=j.reason))  # fmt: skip
            out.append(c.model_copy(update={"decided_by": "count", "judge": j}))
        elif j is not None and j.status in ("triggered", "not_triggered"):
            out.append(c.model_copy(update={"status": j.status, "reason": f"judge: {j.reason}", "cells": j.cells,
                                            "refs": j.refs, "decided_by": "judge", "judge": j}))  # fmt: skip
        else:
            out.append(c.model_copy(update={"decided_by": "human", "judge": j}))
    return out, conflicts
