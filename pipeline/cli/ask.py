"""``lunasol ask RUN QUESTION``: one question asked of every selected cell, answers counted per outcome and task."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from pipeline.cli.common import (
    CONTEXT_TOKENS_OPTION,
    JSON_OPTION,
    MAX_TOKENS_OPTION,
    MODE_OPTION,
    TIMEOUT_OPTION,
    emit_json,
    resolve_run,
)
from pipeline.core.errors import BadInput, Blocked


def _unblock(exc: Blocked) -> str:
    """What to do about a blocked ask (the stage's own unblock names ``lunasol run``, which an ask is not)."""
    from pipeline.models.errors import BudgetExceeded  # startup: the model layer loads only when an ask blocks

    if isinstance(exc, BudgetExceeded):
        return ("no ask rows were written; raise --budget-usd and ask again: answered requests are served "
                "from the run's exchanges, never paid twice")  # fmt: skip
    if "batch" in type(exc).__name__.lower():
        return "run the same lunasol ask command again: it collects the batch (nothing is submitted twice)"
    return "no ask rows were written; the same lunasol ask command asks again"


def _pm(rate: float | None, se: float | None) -> str:
    return "-" if rate is None else f"{rate:.3f}" + ("" if se is None else f"±{se:.3f}")


def _line(g: dict[str, Any], kind: str) -> str:
    head = f"{g['answered']}/{g['cells']} answered" + (f", {g['failed']} FAILED" if g["failed"] else "")
    if kind == "number":
        return f"{head}; mean {_pm(g['mean'], g['mean_se'])}"
    counts = g["counts"]
    if kind == "yes-no":  # "no" is the rest of the answered cells
        counts = {"yes": counts["yes"]}
    shown = ", ".join(f"{v} {k} ({_pm(g['rates'][v]['rate'], g['rates'][v]['se'])})" for v, k in counts.items())
    return f"{head}; {shown}"


def print_summary(s: dict[str, Any], run: str) -> None:
    """The counts, then each cell answered 'yes' (or any answer) with the events that show it."""
    ask, kind = s["ask"], str(s["ask"]["answer_kind"])
    typer.echo(f"{ask['ask_id']}: {ask['question']}")
    where = f" where {ask['where_sql']}" if ask["where_sql"] else ""
    pilot = f" (a PILOT: {ask['sample']} sampled with seed {ask['seed']})" if ask.get("sample") is not None else ""
    typer.echo(f"  {ask['cells']} cells{where}{pilot}; model {ask['model']}")
    typer.echo(f"  all: {_line(s['overall'], kind)}")
    for outcome, g in s["by_outcome"].items():
        typer.echo(f"  {outcome} cells: {_line(g, kind)}")
    typer.echo("per task (successful | failed):")
    for task, by in s["by_task"].items():
        typer.echo(f"  {task}: " + " | ".join(_line(g, kind) if g["cells"] else "-" for g in by.values()))
    quiet = {"no"} if kind == "yes-no" else {"neither"} if ask.get("weakness_id") else set()  # the uneventful answer
    shown = [a for a in s["answers"] if a["status"] == "ok" and a["answer"] not in quiet]
    if shown:
        typer.echo("answers and their events (lunasol show RUN EVENT --evidence prints the raw lines):")
    for a in shown:
        typer.echo(f"  {a['cell_id']} [{a['outcome']}] {a['answer']}: {', '.join(a['evidence']) or '(no event)'}")
    failed = [a["cell_id"] for a in s["answers"] if a["status"] == "failed"]
    if failed:
        typer.echo(f"FAILED cells (reason in table ask_answers): {', '.join(failed)}")
    typer.echo(f"table: lunasol query {run} \"SELECT * FROM ask_answers WHERE ask_id = '{ask['ask_id']}'\"")


def _rates(h: dict[str, Any]) -> str:
    if h["answer_kind"] == "number":
        return "mean -" if h["mean"] is None else f"mean {h['mean']:g}"
    rates = h["rates"] or {}
    shown = ("supports", "contradicts") if h["weakness_id"] else ("yes",) if h["answer_kind"] == "yes-no" else rates
    return ", ".join(f"{v} {h['counts'][v]} ({'-' if rates.get(v) is None else f'{rates[v]:.3f}'})" for v in shown)


def show_asks(run_dir: Path, run: str, *, as_json: bool) -> None:
    """``lunasol show RUN`` (or ``show RUN asks``): the run's asks, one line each, and how to open one."""
    # startup: `lunasol --help` and every other verb load none of this
    from pipeline.ask.summary import ask_ids, headline, summarise

    heads = [headline(summarise(run_dir, a)) for a in ask_ids(run_dir)]
    if as_json:
        emit_json({"asks": heads})
        return
    if not heads:
        typer.echo(f"no ask in {run} yet (lunasol ask {run} QUESTION | --weakness W-01); "
                   f"lunasol show {run} ID prints a weakness, proposal, cell, pattern, group or event")  # fmt: skip
        return
    typer.echo(f"{len(heads)} ask(s) in {run}:")
    for h in heads:
        about = f" [{h['weakness_id']}]" if h["weakness_id"] else ""
        pilot = f" PILOT {h['pilot']['sample']} (seed {h['pilot']['seed']})" if h["pilot"] else ""
        failed = f", {h['failed']} FAILED" if h["failed"] else ""
        typer.echo(f"  {h['ask_id']}{about}{pilot}: {h['answered']}/{h['cells']} answered{failed}; {_rates(h)}")
        first = h["question"].strip().splitlines()[0] if h["question"].strip() else ""
        typer.echo(f"      {first[:110]}{'…' if len(first) > 110 else ''}")
    typer.echo(f"one ask, every cell's answer and its events: lunasol show {run} ASK_ID [--evidence]")


def show_ask(run_dir: Path, run: str, ask_id: str, *, evidence: bool, context: int, as_json: bool) -> None:
    """``lunasol show RUN ASK_ID``: the counts, then every cell's answer, explanation and cited events.

    With ``--evidence`` each cited event's raw lines follow it, hash-checked (as ``show RUN EVENT``).
    """
    # startup: `lunasol --help` and every other verb load none of this
    from pipeline.ask.summary import ask_ids, summarise
    from pipeline.report.items import find_item, render_item

    if ask_id not in ask_ids(run_dir):
        known = ", ".join(ask_ids(run_dir)) or "none"
        raise BadInput(f"no ask {ask_id!r} in {run} (asks: {known})")
    s = summarise(run_dir, ask_id)
    raw: dict[str, Any] = {}
    if evidence:
        cited = sorted({e for a in s["answers"] for e in a["evidence"]})
        raw = {e: find_item(run_dir, e, context=context) for e in cited}
    if as_json:
        emit_json({**s, "evidence": {e: i.to_json() for e, i in raw.items()}})
        return
    print_summary(s, run)
    typer.echo(f"digest {s['digest']} (lunasol confirm {run} ... --ask {ask_id} cites it)")
    typer.echo("every cell:")
    for a in s["answers"]:
        head = f"  {a['cell_id']} ({a['task_id']}, {a['outcome']})"
        if a["status"] != "ok":
            typer.echo(f"{head}: FAILED: {a['reason']}")
            continue
        typer.echo(f"{head}: {a['answer']}: {a['explanation']}")
        typer.echo(f"      events: {', '.join(a['evidence']) or '(none)'}")
        for e in a["evidence"]:
            if e in raw:
                typer.echo("".join("        " + line for line in render_item(raw[e]).splitlines(keepends=True)))


def register(app: typer.Typer) -> None:
    """Add ``ask`` to the root app."""

    @app.command("ask")
    def ask_cmd(
        run: str = typer.Argument(..., metavar="RUN", help="Run directory (or run id under ./runs)."),
        question: str | None = typer.Argument(
            None, metavar="[QUESTION]", help="The question to ask of every selected cell (or use --weakness)."
        ),
        answer: str | None = typer.Option(
            None,
            "--answer",
            help="yes-no (default), number, or CHOICES as 'a|b|c' (--weakness: supports|contradicts|neither).",
        ),
        weakness: str | None = typer.Option(
            None,
            "--weakness",
            help="Ask whether each cell supports or contradicts this card (W-01): its statement and prediction.",
        ),
        where: str | None = typer.Option(
            None, "--where", help="SQL filter over the cells: task_id, run_id, harness, outcome (the sidecar label)."
        ),
        sample: int | None = typer.Option(None, "--sample", min=1, help="A pilot: ask only N of the selected cells."),
        seed: int = typer.Option(0, "--seed", help="Seed of the --sample draw (same seed, same cells)."),
        model: str | None = typer.Option(None, "--model", help="litellm model string (env LUNASOL_MODEL)."),
        api_base: str | None = typer.Option(None, "--api-base", help="OpenAI-compatible base URL."),
        replay: Path | None = typer.Option(None, "--replay", help="Serve model answers only from this store."),
        record: Path | None = typer.Option(None, "--record", help="Call live and store every exchange here."),
        concurrency: int | None = typer.Option(None, "--concurrency", help="Concurrent model calls (default 8)."),
        budget_usd: float | None = typer.Option(None, "--budget-usd", help="Stop cleanly past this spend."),
        dry_run: bool = typer.Option(
            False, "--dry-run", help="Plan every call (parts per cell, tokens, cost); call nothing, write nothing."
        ),
        batch: bool = typer.Option(
            False, "--batch", help="First requests as one provider batch (about half price, hours); env LUNASOL_BATCH."
        ),
        batch_queue_tokens: int | None = typer.Option(
            None, "--batch-queue-tokens", help="With --batch: the most prompt tokens enqueued at once (as run's)."
        ),
        timeout: float | None = TIMEOUT_OPTION,
        max_tokens: int | None = MAX_TOKENS_OPTION,
        instructor_mode: str | None = MODE_OPTION,
        context_tokens: int | None = CONTEXT_TOKENS_OPTION,
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Ask every selected cell one question; each answer cites events that must resolve; counts per outcome.

        One structured call per cell (per part of a long cell), through the same model client as
        Luna (live, --record, --replay, --budget-usd, --batch, --dry-run). An answer citing events
        not in the cell's log is re-asked, then the cell is FAILED with the reason, never kept. Results: tables asks and
        ask_answers in the run's DuckDB (also in export-tables).
        """
        # startup: `lunasol --help` and every other verb load none of this
        from pipeline.ask import AskSpec, parse_answer_kind, run_ask, summarise
        from pipeline.ask.answer import WEAKNESS_CHOICES, find_card, weakness_question
        from pipeline.ask.stage import plan_ask
        from pipeline.core.settings import ModelSettings
        from pipeline.models import format_estimate
        from pipeline.models.store import check_store

        if replay and record:
            raise BadInput("--replay and --record exclude each other")
        if (question is None) == (weakness is None):
            raise BadInput("give a QUESTION or --weakness W-.., not both")
        run_dir = resolve_run(run)
        if weakness is not None:
            question = weakness_question(find_card(run_dir, weakness))
            # Shown before anything is sent: the reviewer reads what the cells will be asked.
            typer.echo(f"asking every selected cell about {weakness}:\n{question}\n", err=True)
        assert question is not None
        default = "|".join(WEAKNESS_CHOICES) if weakness else "yes-no"
        kind, choices = parse_answer_kind(answer or default)
        mode = "replay" if replay else "record" if record else None
        settings = ModelSettings.from_env(
            model=model, api_base=api_base, mode=mode, store=replay or record, concurrency=concurrency,
            budget_usd=budget_usd, batch=batch or None,  # None: LUNASOL_BATCH decides
            batch_queue_tokens=batch_queue_tokens, timeout_s=timeout, max_tokens=max_tokens,
            instructor_mode=instructor_mode, context_tokens=context_tokens,
        )  # fmt: skip
        check_store(settings)
        spec = AskSpec(question, kind, choices, where=where, sample=sample, seed=seed, weakness=weakness)
        if dry_run:
            plan = plan_ask(run_dir, spec, settings, progress=lambda m: typer.echo(f"dry run: {m}", err=True))
            if as_json:
                emit_json({"ask_id": spec.ask_id, "cells": plan.cells, "parts": plan.parts,
                           "estimate": plan.estimate.as_dict()})  # fmt: skip
                return
            typer.echo(f"{spec.ask_id}: {plan.describe()}")
            typer.echo(format_estimate(plan.estimate))
            return
        try:
            ask_id, _ = run_ask(run_dir, spec, settings, log=lambda m: typer.echo(m, err=True))
        except Blocked as exc:
            raise Blocked(f"{exc.one_line()}; {_unblock(exc)}", reason=exc.reason, tried=exc.tried) from None
        s = summarise(run_dir, ask_id)
        if as_json:
            emit_json(s)
            return
        print_summary(s, run)
