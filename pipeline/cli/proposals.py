"""CLI verbs of the proposal stage: validate, propose, select (thin: each calls one library function)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from pipeline.cli.common import (
    CONTEXT_TOKENS_OPTION,
    JSON_OPTION,
    MAX_TOKENS_OPTION,
    MODE_OPTION,
    TIMEOUT_OPTION,
    check_digest,
    emit_json,
    moves_run,
    resolve_run,
)
from pipeline.cli.gates import receipt_line
from pipeline.core.errors import BadInput, Findings

if TYPE_CHECKING:
    from pipeline.proposals.proposer import ProposeResult


def validate(
    file: Path = typer.Argument(
        ..., help="A proposals YAML file: one card, a list, or a mapping with key 'proposals'."
    ),
    run: str | None = typer.Option(None, "--run", help="Also check the cards against this run (RUN dir or id)."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Validate proposal cards deterministically; exit 0 all valid, 1 some invalid, 2 unreadable."""
    # startup: `lunasol --help` and every other verb load none of this
    from pipeline.validator import validate_file

    run_dir = resolve_run(run) if run else None
    result = validate_file(file, run_dir)
    counts = result.as_dict()["counts"]
    if json_out:
        emit_json(result.as_dict())
    else:
        for card in result.cards:
            name = card.proposal_id or f"proposals[{card.index}]"
            typer.echo(f"{name}: {'valid' if card.valid else 'INVALID'}")
            for finding in card.findings:
                typer.echo(f"  {finding.line()}")
        typer.echo(f"{counts['valid']} of {counts['cards']} cards valid, {counts['findings']} findings")
    if not counts["cards"]:
        # "0 of 0 cards valid", exit 0, read as a clean bill: an empty file proposes nothing to check
        raise Findings(f"no proposal card in {file}: nothing was validated (an empty file is not a valid proposal set)")
    if not result.valid:
        raise Findings(f"{counts['invalid']} of {counts['cards']} cards invalid in {file}")


def propose(
    run: str = typer.Argument(..., help="Run directory (or run id under ./runs)."),
    model: str | None = typer.Option(None, "--model", help="Override the run's model (litellm model string)."),
    api_base: str | None = typer.Option(None, "--api-base", help="Override the run's OpenAI-compatible base URL."),
    replay: Path | None = typer.Option(None, "--replay", help="Serve answers only from this recording store."),
    record: Path | None = typer.Option(None, "--record", help="Call live and store every exchange here."),
    concurrency: int | None = typer.Option(None, "--concurrency", help="Concurrent model calls."),
    budget_usd: float | None = typer.Option(None, "--budget-usd", help="Stop cleanly past this spend."),
    timeout: float | None = TIMEOUT_OPTION,
    max_tokens: int | None = MAX_TOKENS_OPTION,
    instructor_mode: str | None = MODE_OPTION,
    context_tokens: int | None = CONTEXT_TOKENS_OPTION,
    json_out: bool = JSON_OPTION,
) -> None:
    """Proposal cards for every confirmed weakness (0..N each), validated; writes proposals.yaml and validation.json.

    Uses the run's model settings (run.json) unless overridden. Refuses (exit 3) until gate 1 has a
    receipt for the current shortlist.
    """
    # startup: `lunasol --help` and every other verb load none of this
    from pipeline.models.store import check_store
    from pipeline.proposals.proposer import propose as do_propose
    from pipeline.proposals.proposer import run_model_settings

    if replay and record:
        raise BadInput("--replay and --record exclude each other")
    run_dir = resolve_run(run)
    mode = "replay" if replay else "record" if record else None
    settings = run_model_settings(
        run_dir,
        model=model,
        api_base=api_base,
        mode=mode,
        store=replay or record,
        concurrency=concurrency,
        budget_usd=budget_usd,
        timeout_s=timeout,
        max_tokens=max_tokens,
        instructor_mode=instructor_mode,
        context_tokens=context_tokens,
    )
    check_store(settings)
    with moves_run(run_dir, "propose"):
        result = do_propose(run_dir, settings, log=typer.echo if not json_out else (lambda _m: None))
        if json_out:
            emit_json({"proposals_digest": result.proposals_digest, "validation": result.validation})
        else:
            _print_proposals(run_dir, result)
        if result.failed:
            # Missing cards are not an honest zero: exit 3 with a receipt (moves_run writes it), as any block.
            raise result.incomplete()


def _print_proposals(run_dir: Path, result: ProposeResult) -> None:
    # startup: `lunasol --help` and every other verb load none of this
    from pipeline.core.phrases import one_phrase
    from pipeline.run.status import format_proposals
    from pipeline.state import handoff

    typer.echo(f"[propose] {result.summary()}")
    failed = [str(w["weakness_id"]) for w in result.failed]
    typer.echo(format_proposals([c.model_dump(mode="json") for c in result.cards], result.validation, failed))
    for w in result.validation["weaknesses"]:
        if w["zero_cards"]:
            why = f": {' '.join(str(w['note']).split())}" if w.get("note") else ""
            typer.echo(f"  {w['weakness_id']}: no card proposed (an honest zero){why}")
    for c in result.validation["cards"]:
        if c["status"] == "rejected":
            rules = ", ".join(sorted({f["rule"] for f in c["findings"]}))
            typer.echo(f"  {c['proposal_id']} ({c['source_weakness']}) kept out: {rules}")
    for w in result.failed:
        call = w["call"]
        why = one_phrase(call["errors"][0]) if call["errors"] else "no answer"
        typer.echo(
            f"  {w['weakness_id']}: FAILED after {call['attempts']} attempt(s), its cards are missing (not zero): {why}"
        )
    if result.cards:
        pid = result.cards[0].proposal_id
        typer.echo(f"read first: lunasol show {run_dir} {pid}   # the whole card; lunasol report {run_dir} for all")
    if not failed:
        typer.echo(f"next: {handoff.next_command(run_dir)}")


def select(
    run: str = typer.Argument(..., help="Run directory (or run id under ./runs)."),
    proposal: str | None = typer.Option(None, "--proposal", help="The proposal you select, e.g. P-01."),
    none: bool = typer.Option(False, "--none", help="Select no proposal."),
    redo: bool = typer.Option(False, "--redo", help="Ask for new proposals."),
    by: str | None = typer.Option(None, "--by", help="Who decides (required)."),
    note: str | None = typer.Option(None, "--note", help="Why (kept in the receipt)."),
    digest: str | None = typer.Option(None, "--digest", help="The proposals digest you decided on."),
    base: str | None = typer.Option(
        None,
        "--base",
        help="The gate-2 decision you saw standing (its operation id, as `lunasol status` prints it), or none. "
        "Omitted: none (you saw no decision); a decision standing then refuses with needs_rebase.",
    ),
    supersede: bool = typer.Option(
        False, "--supersede", help="Replace the decision standing (named by --base); the receipt records whom."
    ),
    operation_id: str | None = typer.Option(
        None, "--operation-id", help="Idempotency key: the same id returns the same receipt."
    ),
    json_out: bool = JSON_OPTION,
) -> None:
    """Gate 2: select one proposal, none, or ask for a redo. A selection does not authorise implementation.

    A compare-and-set on the proposals digest and the gate's standing decision (--base, default
    none): if either is not what you read, or a decision stands and you did not say --supersede, it
    refuses with needs_rebase (exit 4) naming who decided what.
    """
    # startup: `lunasol --help` and every other verb load none of this
    from pipeline.gates.gate2 import NOT_AUTHORISATION, Choice
    from pipeline.gates.gate2 import select as do_select
    from pipeline.state import handoff

    if sum([proposal is not None, none, redo]) != 1:
        raise BadInput("choose exactly one of --proposal P-.., --none or --redo")
    if not by:
        raise BadInput("--by NAME is required: a decision needs a named person")
    check_digest(digest)
    run_dir = resolve_run(run)
    choice: Choice = "proposal" if proposal is not None else "none" if none else "redo"
    with moves_run(run_dir, "select"):
        receipt, replayed = do_select(
            run_dir,
            choice=choice,
            by=by,
            proposal_id=proposal,
            note=note,
            expected_digest=digest,
            operation_id=operation_id,
            require_digest=True,
            expected_base=base,
            supersede=supersede,
        )
    if json_out:
        emit_json({"replayed": replayed, "receipt": receipt.model_dump(mode="json")})
        return
    what = f"selected {proposal}" if proposal else "no proposal selected" if none else "redo requested"
    typer.echo(receipt_line("gate 2", receipt, replayed, run_dir, what))
    typer.echo(f"note: {NOT_AUTHORISATION}")
    typer.echo(f"next: {handoff.next_command(run_dir)}")


def register(app: typer.Typer) -> None:
    """Add this module's verbs to the root app."""
    app.command("validate")(validate)
    app.command("propose")(propose)
    app.command("select")(select)
