"""``lunasol ask``: one structured call per selected cell (per part of a split cell), like Luna's.

The cell's IR is rendered exactly as for Luna (:mod:`pipeline.luna.render`, split by segment when
long) and sent through the same model client (live, record or replay; budget; concurrency). Each
answer's cited events must be ids shown to the model: an answer that cites others is re-asked,
and one that still does not resolve fails its cell, recorded with the reason — never kept.
The model never sees the outcome sidecar; outcomes are joined afterwards, for the counts only.

Results: tables ``asks`` (one row per ask) and ``ask_answers`` (one row per selected cell) in the
run's DuckDB; the rows of an ask asked again (same question, answer kind and filter) are replaced.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pipeline.artifacts.rundir import RunDir
from pipeline.ask.answer import AskSpec, answer_model, check_answer
from pipeline.core import duck
from pipeline.core.errors import BadInput
from pipeline.core.settings import ModelSettings
from pipeline.ir.redact import redact
from pipeline.ir.selection import sample_cells, select_cells
from pipeline.ir.store import insert_rows
from pipeline.luna.feed import CellFeed, prepare_in_chunks
from pipeline.luna.render import CellIR, Part, context_budget
from pipeline.models import CallOutcome, ModelClient, PlannedCall, render, template_hash
from pipeline.models.budget import request_tokens, role_budget
from pipeline.models.estimate import Estimate, estimate

ROLE = "ask"
PROMPT_OVERHEAD_TOKENS = 2_000  # the ask template, question and answer schema around the IR
OUTPUT_TOKENS = 250  # an answer: one value, one or two sentences, a few event ids (assumed by the dry run)
TABLES_DDL = """
CREATE TABLE IF NOT EXISTS asks (
    ask_id VARCHAR PRIMARY KEY,
    question VARCHAR NOT NULL,        -- as sent (redacted unless --no-redact)
    answer_kind VARCHAR NOT NULL,     -- yes-no / choice / number
    choices VARCHAR[] NOT NULL,
    where_sql VARCHAR,                -- the cell filter (over task_id, run_id, harness, outcome)
    sample INTEGER,                   -- a pilot: this many of the selected cells (NULL: all of them)
    seed INTEGER,
    weakness_id VARCHAR,              -- the card the question was made from (--weakness)
    model VARCHAR,
    template_hash VARCHAR NOT NULL,
    cells INTEGER NOT NULL,           -- selected cells
    answered INTEGER NOT NULL,
    failed INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS ask_answers (
    ask_id VARCHAR NOT NULL,
    cell_id VARCHAR NOT NULL,
    status VARCHAR NOT NULL,          -- ok / failed
    answer VARCHAR,                   -- yes / no / a choice / a number as text; NULL when failed
    explanation VARCHAR,
    evidence VARCHAR[] NOT NULL,      -- event ids, each shown to the model and checked
    parts INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    reason VARCHAR,                   -- why it failed (or how a split cell's parts were combined)
    PRIMARY KEY (ask_id, cell_id)
);
"""


@dataclass
class CellAnswer:
    """One cell's answer (or its failure)."""

    cell_id: str
    status: str = "ok"
    answer: str | None = None
    explanation: str | None = None
    evidence: list[str] = field(default_factory=list)
    parts: int = 1
    attempts: int = 0
    reason: str | None = None


def prompt_overhead(settings: ModelSettings, spec: AskSpec, question: str) -> int:
    """Tokens of an ask request without its log: the template, this question and the answer schema.

    Counted as the budget counts every request, with the longest part label and event count a split cell shows.
    """
    context = _fields(spec, question, "C000000", "T" * 24, "h" * 16, "99/99", 99, "", 99_999)
    model = answer_model(spec.kind, spec.choices)
    return request_tokens(role_budget(settings, ROLE), render(ROLE, context, response_model=model).messages, model,
                          exact=True)  # fmt: skip


def part_budget(settings: ModelSettings, spec: AskSpec | None = None, question: str = "") -> int:
    """Rendered-IR tokens per ask call: the role's request budget less the measured prompt around the log.

    Without a spec (tests, the bench) the prompt is taken as :data:`PROMPT_OVERHEAD_TOKENS`.
    """
    overhead = prompt_overhead(settings, spec, question) if spec is not None else PROMPT_OVERHEAD_TOKENS
    room = role_budget(settings, ROLE).input_tokens - overhead
    return max(min(context_budget(), room), 500)


def _number(v: Any) -> str:
    f = float(v)
    return str(int(f)) if f.is_integer() else repr(f)


def combine(spec: AskSpec, answers: list[BaseModel]) -> CellAnswer:
    """One cell's answer from its parts': yes when any part says yes; otherwise the parts must agree."""
    rows = [a.model_dump() for a in answers]
    values = [_number(r["answer"]) if spec.kind == "number" else str(r["answer"]) for r in rows]
    out = CellAnswer(cell_id="", parts=len(rows))
    if spec.kind == "yes-no" and "yes" in values:
        chosen = [r for r, v in zip(rows, values, strict=True) if v == "yes"]
        value = "yes"
    elif len(set(values)) == 1:
        chosen, value = rows, values[0]
    else:
        out.status = "failed"
        out.reason = f"the {len(rows)} parts of this split cell answered differently ({', '.join(values)})"
        return out
    out.answer = value
    out.explanation = " / ".join(str(r["explanation"]) for r in chosen)
    out.evidence = sorted({str(e) for r in chosen for e in r["evidence"]})
    if len(rows) > 1:
        out.reason = f"split into {len(rows)} parts; " + (
            "yes in at least one part" if value == "yes" and spec.kind == "yes-no" else "every part answered the same"
        )
    return out


def _context(spec: AskSpec, question: str, cell: CellIR, part: Part) -> dict[str, Any]:
    return _fields(spec, question, cell.cell_id, cell.task_id, cell.harness or "-", part.label, part.total, part.text,
                   part.events)  # fmt: skip


def _fields(
    spec: AskSpec, question: str, cell_id: str, task_id: str, harness: str, label: str, total: int, ir: str,
    events: int,
) -> dict[str, Any]:  # fmt: skip
    kind = {"yes-no": "answer yes or no", "number": "answer with a number"}.get(
        spec.kind, "answer with one of: " + ", ".join(spec.choices)
    )
    return {
        "cell_id": cell_id,
        "task_id": task_id,
        "harness": harness,
        "part": label,
        "part_total": total,
        "question": question,
        "answer_kind": kind,
        "ir": ir,
        "event_count": events,
    }


def _label(cell: CellIR, part: Part) -> str:
    """The call's cell id: the cell's, or 'C001#<part label>' for one part of a split cell (as Luna's)."""
    return cell.cell_id if part.total == 1 else f"{cell.cell_id}#{part.label}"


def _calls(
    ir: Path, spec: AskSpec, cells: list[str], settings: ModelSettings, question: str
) -> Iterator[tuple[CellIR, Part, dict[str, Any]]]:
    """Every (cell, part, template context) the ask makes, a chunk of cells at a time (never all in memory)."""
    con = duck.connect(ir, read_only=True)
    try:
        for cell, parts, _size in prepare_in_chunks(con, part_budget(settings, spec, question), cells):
            if not cell.seq_of:
                continue  # no events: the cell fails without a call
            for part in parts:
                yield cell, part, _context(spec, question, cell, part)
    finally:
        con.close()


@dataclass
class AskPlan:
    """What ``lunasol ask --dry-run`` found: the estimate of every call and how the cells split."""

    estimate: Estimate
    cells: int
    parts: dict[str, int]  # cell id -> parts (0: no events, no call)

    @property
    def split(self) -> int:
        """Cells read in more than one call."""
        return sum(n > 1 for n in self.parts.values())

    def describe(self) -> str:
        """One line: cells, calls, parts per cell."""
        most = max(self.parts.values(), default=0)
        empty = sum(n == 0 for n in self.parts.values())
        return (
            f"ask: {self.cells} cell(s), {sum(self.parts.values())} call(s); {self.split} cell(s) split, "
            f"at most {most} part(s) per cell" + (f"; {empty} cell(s) without events (no call)" if empty else "")
        )


def plan_ask(
    run_dir: Path, spec: AskSpec, settings: ModelSettings, *, redacting: bool = True,
    progress: Callable[[str], None] | None = None,
) -> AskPlan:  # fmt: skip
    """Render and count every call of ``spec`` as :func:`run_ask` would send it; call nothing, write nothing."""
    ir, question, cells = _selected(run_dir, spec, redacting)
    parts: dict[str, int] = dict.fromkeys(cells, 0)
    model = answer_model(spec.kind, spec.choices)

    def planned() -> Iterator[PlannedCall]:
        for cell, part, context in _calls(ir, spec, cells, settings, question):
            parts[cell.cell_id] = part.total
            yield PlannedCall(
                role=ROLE, cell_id=_label(cell, part), context=context, response_model=model,
                expected_output_tokens=OUTPUT_TOKENS,
            )  # fmt: skip

    est = estimate(planned(), settings, progress=progress)
    return AskPlan(estimate=est, cells=len(cells), parts=parts)


async def ask_cells(
    ir: Path, run_dir: Path, spec: AskSpec, cells: list[str], settings: ModelSettings, question: str,
    log: Callable[[str], None],
) -> tuple[list[CellAnswer], str | None]:  # fmt: skip
    """Ask every cell; return each cell's answer (or failure) and the model used."""
    client = ModelClient(settings, run_dir, log=log)
    model = answer_model(spec.kind, spec.choices)
    feed = CellFeed(ir, cells, part_budget(settings, spec, question))

    async def one_part(cell: CellIR, part: Part) -> CallOutcome[BaseModel]:
        def check(answer: BaseModel) -> list[str]:
            return check_answer(answer, kind=spec.kind, shown_ids=part.shown_ids)

        return await client.call(
            role=ROLE,
            cell_id=_label(cell, part),
            context=_context(spec, question, cell, part),
            response_model=model,
            check=check,
            soft_fail=True,  # one cell's failure fails that cell, never the ask
        )

    async def one_cell(cell_id: str) -> CellAnswer:
        cell, parts, _size = await feed.take(cell_id)
        if not cell.seq_of:
            return CellAnswer(cell_id, status="failed", parts=0, reason="no events in the IR: nothing to ask about")
        outs = await asyncio.gather(*[one_part(cell, p) for p in parts])
        attempts = sum(o.attempts for o in outs)
        failed = [(p, o) for p, o in zip(parts, outs, strict=True) if not o.ok or o.value is None]
        if failed:
            why = "; ".join(f"part {p.label}: {' | '.join(o.errors) or 'no answer'}" for p, o in failed)
            return CellAnswer(cell_id, status="failed", parts=len(parts), attempts=attempts, reason=why)
        res = combine(spec, [o.value for o in outs if o.value is not None])
        res.cell_id, res.attempts = cell_id, attempts
        return res

    def first_requests() -> Iterator[tuple[str | None, dict[str, Any], type[BaseModel]]]:
        # --batch: every request the cells below will make first, in one provider batch (as Luna's)
        for cell, part, context in _calls(ir, spec, cells, settings, question):
            yield _label(cell, part), context, model

    if client.batching(ROLE):
        await client.prefetch(ROLE, first_requests)
    results: list[CellAnswer] = await client.gather([one_cell(c) for c in cells], label="ask")
    return results, client.model


def _selected(run_dir: Path, spec: AskSpec, redacting: bool) -> tuple[Path, str, list[str]]:
    """The run's IR, the question as sent (redacted) and the cells asked (filtered, then sampled)."""
    ir = RunDir(run_dir).ir
    if not ir.is_file():
        raise BadInput(f"no IR in {run_dir} (run `lunasol export` or `lunasol run` first)")
    if not spec.question.strip():
        raise BadInput("the question is empty")
    # The question is the user's, but may be pasted from a log: it is redacted like the log text.
    question = redact(spec.question)[0] if redacting else spec.question
    # the pilot selection shared with `lunasol run` (pipeline.ir.selection): same filter, same seeded draw
    cells = sample_cells(select_cells(ir, spec.where), spec.sample, spec.seed)
    return ir, question, cells


def run_ask(
    run_dir: Path, spec: AskSpec, settings: ModelSettings, *, redacting: bool = True,
    log: Callable[[str], None] = lambda _m: None,
) -> tuple[str, list[CellAnswer]]:  # fmt: skip
    """Ask ``spec`` of the run's selected cells and write tables ``asks`` and ``ask_answers``; return the ask id."""
    ir, question, cells = _selected(run_dir, spec, redacting)
    results, model = asyncio.run(ask_cells(ir, run_dir, spec, cells, settings, question, log))
    write_tables(ir, spec, question, model, results)
    return spec.ask_id, results


def write_tables(ir: Path, spec: AskSpec, question: str, model: str | None, results: list[CellAnswer]) -> None:
    """Replace this ask's rows in ``asks`` and ``ask_answers`` (one transaction)."""
    ok = sum(r.status == "ok" for r in results)
    con = duck.connect(ir)
    try:
        con.execute(TABLES_DDL)
        con.execute("BEGIN")
        con.execute("DELETE FROM ask_answers WHERE ask_id = ?", [spec.ask_id])
        con.execute("DELETE FROM asks WHERE ask_id = ?", [spec.ask_id])
        con.execute(
            "INSERT INTO asks VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [spec.ask_id, question, spec.kind, list(spec.choices), spec.where, spec.sample,
             spec.seed if spec.sample is not None else None, spec.weakness, model, template_hash(ROLE),
             len(results), ok, len(results) - ok],
        )  # fmt: skip
        cols = ("ask_id", "cell_id", "status", "answer", "explanation", "evidence", "parts", "attempts", "reason")
        insert_rows(con, "ask_answers", cols, [
            (spec.ask_id, r.cell_id, r.status, r.answer, r.explanation, r.evidence, r.parts, r.attempts, r.reason)
            for r in results
        ])  # fmt: skip
        con.execute("COMMIT")
    finally:
        con.close()
