"""The Luna stage: one model call per eligible cell (or per part of a split cell), all concurrently.

Outputs ``runs/<id>/patterns.jsonl`` and, in the run's DuckDB, tables ``patterns``, ``luna_cells``
(every eligible cell with status ok / split / failed and the reason), ``probe_verdicts`` and
``probe_conflicts``. A cell whose answer still fails the checks after the re-asks is marked
failed and reported, never dropped. Luna never sees the outcome sidecar.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
from pydantic import TypeAdapter

import pipeline
from pipeline.artifacts.rundir import PATTERNS
from pipeline.bundle.request import load_request
from pipeline.core import duck, roles
from pipeline.core.canonical import canonical_json, digest
from pipeline.core.errors import BadInput
from pipeline.core.listing import SHOWN, some
from pipeline.core.memory import give_back
from pipeline.core.phrases import parts_phrase
from pipeline.core.settings import ModelSettings
from pipeline.ir.cache import cached_rows
from pipeline.ir.digests import content_digests
from pipeline.ir.redact import redact
from pipeline.ir.selection import eligible_before_pilot
from pipeline.luna.feed import LOAD_CELLS, CellFeed, prepare, prepare_in_chunks  # noqa: F401 - prepare: part of this module's API (tests)
from pipeline.luna.merge import CellPatterns, Conflict, Verdict, merge_cell
from pipeline.luna.outputs import CACHE_TABLE, PATTERN_LIST, LunaOutputs, discard_staged
from pipeline.luna.outputs import TABLES_DDL as TABLES_DDL  # re-exported: the Luna tables' DDL (tests, fixtures)
from pipeline.luna.patterns import LunaAnswer, check_answer
from pipeline.luna.render import (
    JSON_CHARS_PER_TOKEN,
    CellIR,
    Part,
    context_budget,
    explanation,
    load_cells,
    render_cell,
)
from pipeline.models import CallOutcome, ModelClient, PlannedCall, render, template_hash
from pipeline.models.budget import chars_per_token, count_text, request_tokens, role_budget
from pipeline.probes import run_probes, write_probe_hits
from pipeline.probes.cells import made_with as probe_set
from pipeline.state.ledger import CellResults, cell_key

if TYPE_CHECKING:
    from pipeline.core.context import RunContext

PATTERNS_FILE = PATTERNS.filename
ROLE = roles.LUNA.name
ELIGIBLE_SQL = "SELECT cell_id, task_id FROM cells WHERE eligibility = 'valid_behavior' ORDER BY cell_id"
FAILED_SQL = "SELECT cell_id, attempts, reason FROM luna_cells WHERE status = 'failed' ORDER BY cell_id"
SPLIT_SQL = "SELECT cell_id FROM luna_cells WHERE status = 'split' ORDER BY cell_id"
PARTS_DIR = "luna-parts"  # answered parts of split cells, kept until their whole cell is answered
SAMPLE_CELLS = 3  # cells rendered to measure the IR's characters per token
SAMPLE_CHARS = 60_000
SAMPLE_MARGIN = 0.9  # a cell may be denser than the sample: plan at 90% of the sample's characters per token
_CONFLICTS = TypeAdapter(list[Conflict])
_VERDICTS = TypeAdapter(list[Verdict])


@dataclass
class CellRun:
    """How one cell went."""

    cell_id: str
    status: str
    parts: int
    est_tokens: int
    attempts: int = 0
    reason: str | None = None
    reused: bool = False
    merged: CellPatterns = field(default_factory=CellPatterns)
    key: str | None = None  # the stored answer's key (None: no call was needed)
    summary: str = ""  # the task summary the prompt carried
    cached: bool = False  # taken from luna_cache: the cell was not rendered again
    cache_row: tuple[str | None, ...] | None = None  # its new luna_cache row (written by write_outputs)


# -- the per-cell cache: unchanged cells are neither rendered nor keyed again ------------------------


def cache_stamp(thash: str, model: str | None, budget: int | str) -> str:
    """What a cell's prompt depends on besides its IR content and task summary."""
    return digest(
        {
            "template": thash,
            "model": model,
            "budget": budget,
            "probes": probe_set(),
            "lunasol": pipeline.__version__,
        }
    )


def _cached_runs(
    con: duckdb.DuckDBPyConnection, stamp: str, summaries: dict[str, str], store: CellResults
) -> dict[str, str | None]:
    """Cells whose last result still holds (same IR content, summary and stamp, stored answer in place): their keys."""
    out: dict[str, str | None] = {}
    for cell_id, summary, key in cached_rows(con, CACHE_TABLE, "t.cell_id, t.summary, t.key", stamp):
        if cell_id not in summaries or summary != summaries[cell_id]:
            continue
        if key is not None and store.get(cell_id, key) is None:
            continue  # the answer file is gone or was made with another key: ask again
        out[cell_id] = key
    return out


def _add_cached(ir_path: Path, cached: dict[str, str | None], out: LunaOutputs) -> None:
    """Hand each cached cell's stored result to ``out``, ``LOAD_CELLS`` cells read at a time (never all at once)."""
    ids = sorted(cached)
    for start in range(0, len(ids), LOAD_CELLS):
        con = duck.connect(ir_path)
        try:
            rows = con.execute(
                f"SELECT cell_id, run FROM {CACHE_TABLE} WHERE cell_id IN (SELECT unnest(?)) ORDER BY cell_id",
                [ids[start : start + LOAD_CELLS]],
            ).fetchall()
        finally:
            con.close()
        for cell_id, raw in rows:
            data = json.loads(raw)
            merged = data["merged"]
            r = CellRun(cell_id, data["status"], data["parts"], data["est_tokens"], reason=data["reason"],
                        reused=cached[cell_id] is not None, cached=True, key=cached[cell_id],
                        merged=CellPatterns(
                            patterns=PATTERN_LIST.validate_python(merged["patterns"]),
                            conflicts=_CONFLICTS.validate_python(merged["conflicts"]),
                            verdicts=_VERDICTS.validate_python(merged["verdicts"]),
                        ))  # fmt: skip
            _hand_over(r, out)


def _hand_over(r: CellRun, out: LunaOutputs) -> None:
    """One finished cell's rows to the outputs (its ``luna_cells`` row, patterns, verdicts, cache row)."""
    row = (r.cell_id, r.status, r.parts, r.est_tokens, r.attempts, len(r.merged.patterns), r.reason, r.reused)
    out.add(row, r.merged, r.cache_row, cached=r.cached)


def _cache_row(r: CellRun, content_digest: str, stamp: str) -> tuple[str | None, ...]:
    """The ``luna_cache`` row of a cell just made (written with the outputs, in their connection)."""
    run = {
        "status": r.status,
        "parts": r.parts,
        "est_tokens": r.est_tokens,
        "reason": r.reason,
        "merged": {
            "patterns": [p.model_dump(mode="json") for p in r.merged.patterns],
            "conflicts": [c.model_dump(mode="json") for c in r.merged.conflicts],
            "verdicts": [v.model_dump(mode="json") for v in r.merged.verdicts],
        },
    }
    return (r.cell_id, content_digest, stamp, r.summary, r.key, canonical_json(run))


def _task_summaries(bundle: Path, redacting: bool = True) -> dict[str, str]:
    # Task summaries help Luna read obligations; they carry no outcome. Absent for IR-only runs.

    if not (bundle / "analysis-request.json").is_file():  # an IR-only run: the prompt says nothing then
        return {}
    # A request that no longer loads (edited after export) is one clear error, never a silent omission.
    # redacted like event text: an imported bundle's summaries come from the logs (a sample's input)
    # (not with --no-redact: then the IR's text is unredacted too)
    return {t.task_id: redact(t.summary)[0] if redacting else t.summary for t in load_request(bundle).tasks}


def part_context(cell: CellIR, part: Part, task_summary: str) -> dict[str, Any]:
    """The template context of one Luna call (pure data; the outcome is never part of it)."""
    return {
        "cell_id": cell.cell_id,
        "task_id": cell.task_id,
        "task_summary": task_summary,
        "run_id": cell.run_id,
        "harness": cell.harness or "-",
        "part": part.label,
        "part_total": part.total,
        "ir": part.text,
        "event_count": part.events,
        "candidates": [{**h.model_dump(mode="json"), "explanation": explanation(h)} for h in part.candidates],
    }


def _ensure_hits(con: duckdb.DuckDBPyConnection) -> None:

    if not duck.has_table(con, "probe_hits"):
        write_probe_hits(con, run_probes(con))


@dataclass(frozen=True)
class PartBudget:
    """How much of a cell one Luna call carries, from measurement (see :func:`part_budget`)."""

    tokens: int  # the log and the cell's probe candidates, per call
    chars_per_token: float  # of the rendered log (sizes are planned in characters)
    overhead: int  # the rest of the request: instructions, framing, output schema (counted)
    input_tokens: int  # the whole request's budget (context minus the answer's room)
    count: Callable[[str], int] | None = field(default=None, compare=False)  # tokens as the budget counts them

    def stamp(self) -> str:
        """What the cache depends on (a change re-renders the cells)."""
        return f"{self.tokens}@{self.chars_per_token:.3f}"

    def describe(self) -> str:
        """One line: per-call request budget, measured overhead, log share, characters per token."""
        return (
            f"luna: {self.input_tokens:,} tokens per request = {self.overhead:,} prompt (measured) + "
            f"up to {self.tokens:,} of log and probe candidates at {self.chars_per_token:.2f} chars/token"
        )


def prompt_overhead(settings: ModelSettings, summaries: dict[str, str] | None = None) -> int:
    """Tokens of a Luna request without its log and candidates, counted from the rendered template.

    Rendered with the longest task summary and the split note (a part's prompt is the longest), and
    counted with the output schema and message framing as the budget counts every request.
    """
    summary = max((summaries or {}).values(), key=len, default="")
    context = {
        "cell_id": "C000000", "task_id": "T" * 24, "task_summary": summary, "run_id": "r" * 32,
        "harness": "h" * 16, "part": "99/99", "part_total": 99, "ir": "", "event_count": 99_999, "candidates": [],
    }  # fmt: skip
    budget = role_budget(settings, ROLE)
    return request_tokens(budget, render(ROLE, context, response_model=LunaAnswer).messages, LunaAnswer, exact=True)


def ir_chars_per_token(settings: ModelSettings, sample: str) -> float:
    """Characters per token to plan the log with: measured on ``sample``, never above 2.0 without a known tokenizer.

    With the model's tokenizer (litellm knows it) the sample's own ratio, less a margin; without it the
    cl100k_base estimate's ratio is no proof for a small-vocabulary model, so the JSON-heavy default
    (:data:`~pipeline.luna.render.JSON_CHARS_PER_TOKEN`) caps it.
    """
    limits = role_budget(settings, ROLE).limits
    if not sample:
        return JSON_CHARS_PER_TOKEN
    measured = chars_per_token(limits, sample[:SAMPLE_CHARS])
    # the estimate's own ratio (cl100k_base x ESTIMATE_FACTOR) is already conservative: no margin on it
    return round(measured * SAMPLE_MARGIN if limits.exact else min(measured, JSON_CHARS_PER_TOKEN), 3)


def part_budget(settings: ModelSettings, summaries: dict[str, str] | None = None, sample: str = "") -> PartBudget:
    """Per-call log budget: the role's request budget less the measured prompt, capped by the part size."""
    overhead = prompt_overhead(settings, summaries)
    role = role_budget(settings, ROLE)
    room = min(context_budget(), role.input_tokens - overhead)
    limits = role.limits
    return PartBudget(
        max(room, 500), ir_chars_per_token(settings, sample), overhead, role.input_tokens,
        lambda text: count_text(limits, text),
    )  # fmt: skip


def _sample(con: duckdb.DuckDBPyConnection, ids: list[str]) -> str:
    """The first cells' rendered log, to measure characters per token on."""
    text = ""
    for cell in load_cells(con, ids[:SAMPLE_CELLS]):
        text += render_cell(cell) + "\n\n"
        if len(text) >= SAMPLE_CHARS:
            break
    return text


def plan(ctx: RunContext) -> Iterator[PlannedCall]:
    """Every Luna call this run would make (for ``--dry-run``), LOAD_CELLS cells at a time; calls nothing.

    A generator: the dry run counts each call's tokens as it comes, so at 10,000 cells the rendered
    prompts of the whole batch are never in memory at once (the run itself loads cells the same way).
    """
    summaries = _task_summaries(ctx.bundle, ctx.options.redact)
    con = duck.connect(ctx.ir_path)
    try:
        _ensure_hits(con)
        ids = [r[0] for r in con.execute(ELIGIBLE_SQL).fetchall()]
        budget = part_budget(ctx.options.models, summaries, _sample(con, eligible_before_pilot(con)))
        for cell, parts, _size in prepare_in_chunks(con, budget.tokens, ids, budget.chars_per_token, budget.count):
            for part in parts:
                yield PlannedCall(
                    role=ROLE,
                    cell_id=cell.cell_id,
                    context=part_context(cell, part, summaries.get(cell.task_id, "")),
                    response_model=LunaAnswer,
                )
    finally:
        con.close()


async def _call_part(client: ModelClient, cell: CellIR, part: Part, context: dict[str, Any]) -> CallOutcome[LunaAnswer]:
    def check(answer: LunaAnswer) -> list[str]:
        return check_answer(answer, cell_id=cell.cell_id, shown_ids=part.shown_ids, candidates=part.candidates)

    return await client.call(
        role=ROLE,
        cell_id=_part_label(cell, part),
        context=context,
        response_model=LunaAnswer,
        check=check,
        soft_fail=True,  # one cell's timeouts or empty answers fail that cell, not the run
    )


async def run_luna(ctx: RunContext) -> LunaOutputs:
    """Call Luna for every part of every eligible cell; merge, overrule, and hand each cell to the outputs.

    Each cell's answers are persisted (``runs/<id>/luna/<cell>.json``) as soon as its calls finish,
    so a crash or a block keeps every finished cell and ``--resume`` never asks it again. A cell
    whose IR, task summary and prompt inputs are unchanged since the last run (``luna_cache``)
    is neither rendered nor keyed again: its stored answer and merged result are taken as they are.
    Each finished cell's rows (and the new cache row of a cell made now) go to the returned
    :class:`~pipeline.luna.outputs.LunaOutputs` at once and are staged in the IR, so no cell's
    result is held until the end; :func:`write_outputs` then writes the Luna tables and the file.
    """
    summaries = _task_summaries(ctx.bundle, ctx.options.redact)
    client = ModelClient(ctx.options.models, ctx.run_dir, log=ctx.log)
    store = CellResults(ctx.run_dir, ROLE)
    part_store = CellResults(ctx.run_dir, PARTS_DIR)
    thash = template_hash(roles.LUNA.template)
    con = duck.connect(ctx.ir_path)
    try:
        _ensure_hits(con)
        eligible = con.execute(ELIGIBLE_SQL).fetchall()
        # measured on the first cells of the whole batch, a pilot's left-out cells included: a cell's
        # request is then the same in a pilot and in the full run, which reuses the pilot's answers
        budget = part_budget(ctx.options.models, summaries, _sample(con, eligible_before_pilot(con)))
        stamp = cache_stamp(thash, client.model, budget.stamp())
        # the IR's stored per-cell digests (an IR not made by export has none: nothing is cached then)
        cell_digests = content_digests(con) or {}
        reused = _cached_runs(con, stamp, {r[0]: summaries.get(r[1], "") for r in eligible}, store)
    finally:
        con.close()
    out = LunaOutputs(ctx.ir_path, ctx.run_dir, PATTERNS_FILE)
    _add_cached(ctx.ir_path, reused, out)
    # cells are loaded a chunk at a time as their calls start, never the whole batch at once
    feed = CellFeed(ctx.ir_path, [r[0] for r in eligible if r[0] not in reused], budget.tokens,
                    chars_per_token=budget.chars_per_token, count=budget.count)  # fmt: skip

    def kept_part(cell: CellIR, part: Part, context: dict[str, Any]) -> tuple[str, str, Any]:
        # A split cell keeps each answered part as it arrives, so a resume after one part failed asks
        # only the failed parts again instead of paying for the whole cell twice.
        name, key = _part_name(cell, part), _cell_key(cell_key, [context], thash, client.model)
        return name, key, part_store.get(name, key)

    def to_ask(cell: CellIR, parts: list[Part]) -> tuple[str, list[dict[str, Any]], Any]:
        """The cell's key, its parts' contexts and its stored answers (None: its parts are asked)."""
        contexts = [part_context(cell, p, summaries.get(cell.task_id, "")) for p in parts]
        key = _cell_key(cell_key, contexts, thash, client.model)
        return key, contexts, store.get(cell.cell_id, key)

    def first_requests() -> Iterator[tuple[str | None, dict[str, Any], type[LunaAnswer]]]:
        # --batch: what cell_job below will ask, a chunk of cells at a time (never all in memory)
        con = duck.connect(ctx.ir_path)
        try:
            for cell, parts, _size in prepare_in_chunks(
                con, budget.tokens, feed.cell_ids, budget.chars_per_token, budget.count
            ):
                if not cell.seq_of:
                    continue  # no events: no call
                _key, contexts, stored = to_ask(cell, parts)
                if stored is not None:
                    continue  # answered by an earlier run
                for part, context in zip(parts, contexts, strict=True):
                    if part.total == 1 or kept_part(cell, part, context)[2] is None:
                        yield _part_label(cell, part), context, LunaAnswer
        finally:
            con.close()

    async def _ask_part(cell: CellIR, part: Part, context: dict[str, Any]) -> CallOutcome[LunaAnswer]:
        if part.total == 1:
            return await _call_part(client, cell, part, context)
        name, key, kept = kept_part(cell, part, context)
        if kept is not None:
            answer = LunaAnswer.model_validate(kept)
            return CallOutcome(True, answer, [], 0, [], 0, 0, 0.0, role=ROLE, cell_id=name, template_hash=thash)
        out = await _call_part(client, cell, part, context)
        if out.ok and out.value is not None:
            part_store.put(name, key, out.value.model_dump(mode="json"), inputs={"template": thash})
        return out

    async def cell_job(cell_id: str) -> None:
        run = await made(cell_id)
        if run.status != "failed" and run.cell_id in cell_digests:
            run.cache_row = _cache_row(run, cell_digests[run.cell_id], stamp)
        _hand_over(run, out)  # written now: the cell's result is not held until the stage ends

    async def made(cell_id: str) -> CellRun:
        cell, parts, size = await feed.take(cell_id)
        run = CellRun(cell.cell_id, "split" if len(parts) > 1 else "ok", len(parts), size)
        run.summary = summaries.get(cell.task_id, "")
        if len(parts) > 1:
            run.reason = (
                f"rendered IR ~{size} tokens > budget {budget.tokens} (of {budget.input_tokens} per request); "
                f"split by segment into {len(parts)} parts"
            )
        if not cell.seq_of:
            run.reason = "no events in the IR: nothing to analyse, no call made"
            return run
        key, contexts, stored = to_ask(cell, parts)
        run.key = key
        if stored is not None:
            run.reused = True
            answers = [LunaAnswer.model_validate(a) for a in stored["answers"]]
        else:
            outs = await asyncio.gather(*[_ask_part(cell, p, c) for p, c in zip(parts, contexts, strict=True)])
            run.attempts = sum(o.attempts for o in outs)
            failed = [(p, o) for p, o in zip(parts, outs, strict=True) if not o.ok or o.value is None]
            if failed:
                run.status = "failed"
                # one phrase (the full errors are in calls.jsonl, per part, and in the report)
                run.reason = parts_phrase([o.errors for _, o in failed], len(parts))
                if len(parts) > 1 and len(failed) == 1:
                    run.reason += f" (part {failed[0][0].label})"
                return run
            answers = [o.value for o in outs if o.value is not None]
            store.put(
                cell.cell_id,
                key,
                {"answers": [a.model_dump(mode="json") for a in answers]},
                inputs={"cell": cell_digests.get(cell.cell_id), "template": thash, "model": client.model},
            )
        run.merged = merge_cell(cell.cell_id, answers, cell.hits, cell.seq_of)
        return run

    if client.batching(ROLE):
        await client.prefetch(ROLE, first_requests)
    # each cell's call made when a slot frees (not 10,000 coroutines up front), its result not kept
    await client.gather(
        (cell_job(c) for c in feed.cell_ids), label="luna", total=len(feed.cell_ids), keep=False
    )  # fmt: skip
    return out


def _part_label(cell: CellIR, part: Part) -> str:
    """The call's cell id: the cell's, or 'C001#<part label>' for one part of a split cell."""
    return cell.cell_id if part.total == 1 else f"{cell.cell_id}#{part.label}"


def _part_name(cell: CellIR, part: Part) -> str:
    """File name of one answered part of a split cell ('C001.part2of5'; a label's '/' cannot name a file)."""
    return f"{cell.cell_id}.part{part.index}of{part.total}"


def _cell_key(cell_key: Any, contexts: list[dict[str, Any]], thash: str, model: str | None) -> str:
    key: str = cell_key(prompt=digest(contexts), template=thash, model=model)
    return key


def write_outputs(out: LunaOutputs) -> str:
    """Write ``patterns.jsonl`` and the Luna tables from the staged cells; return the file's digest."""
    return out.finish()


def stage(ctx: RunContext) -> str:
    """Runner stage: Luna over every eligible cell; one-line summary (failed cells named)."""
    if not ctx.ir_path.is_file():
        raise BadInput(f"no IR at {ctx.ir_path}: export must run before luna")
    if ctx.options.dry_run:
        return f"dry run: {sum(1 for _ in plan(ctx))} luna calls planned"
    try:
        out = asyncio.run(run_luna(ctx))
        write_outputs(out)
    except BaseException:
        discard_staged(ctx.ir_path)  # a stage stopped mid-way (budget, Ctrl-C) leaves no staged rows behind
        raise
    finally:
        give_back()  # the calls' and rows' freed heap back to the OS: the Coordinator and Sol run next
    con = duck.connect(ctx.ir_path)
    try:
        failed = con.execute(FAILED_SQL).fetchall()
        split = [r[0] for r in con.execute(SPLIT_SQL).fetchall()]
    finally:
        con.close()
    for cell_id, attempts, reason in failed[:SHOWN]:
        ctx.log(f"[luna] cell {cell_id} FAILED after {attempts} attempts: {reason}")
    if len(failed) > SHOWN:
        ctx.log(f"[luna] and {len(failed) - SHOWN} more failed cell(s), each with its reason in table luna_cells")
    failed_ids = some([r[0] for r in failed])
    if failed:
        ctx.incomplete.append(f"{len(failed)} cell(s) failed ({failed_ids})")
    bits = [f"{out.patterns} patterns from {out.cells - len(failed)}/{out.cells} cells"]
    if out.cached:
        bits.append(f"{out.cells - out.cached} cell(s) rendered, {out.cached} unchanged")
    if split:
        bits.append(f"{len(split)} split ({some(split)})")
    if out.conflicts:
        bits.append(f"{out.conflicts} model claims overruled by probes")
    if failed:
        bits.append(f"{len(failed)} FAILED ({failed_ids}; see table luna_cells)")
    return "; ".join(bits)
