"""``lunasol confirm`` (gate 1) and ``lunasol status``."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from pipeline.gates import gate1 as gates

from pipeline.cli.common import JSON_OPTION, check_digest, emit_json, moves_run, resolve_run
from pipeline.core.errors import BadInput, NeedsRebase


def on_terminal() -> bool:
    """Whether a person can be asked (stdin is a terminal)."""
    return sys.stdin.isatty()


def receipt_line(gate: str, receipt: gates.Receipt, replayed: bool, run_dir: Path, what: object) -> str:
    """What a gate verb prints: the outcome, the receipt, and the real revisions (the run may have moved on)."""
    # startup: `lunasol --help` and every other verb load none of this
    from pipeline.gates import gate1 as gates
    from pipeline.state import handoff

    path = gates.receipt_path(run_dir, receipt.gate, receipt.operation_id)
    if not replayed:
        line = f"{gate} recorded: {what}; receipt {path} (revision {receipt.base_revision}→{receipt.new_revision})"
        if receipt.supersedes is not None:
            old = receipt.supersedes
            was = gates.outcome(receipt.gate, old.result)
            line += f"; supersedes {old.by}'s {was} ({old.operation_id}, {old.decided_at})"
        return line
    h = handoff.load(run_dir)
    line = (
        f"{gate} replayed (nothing changed): {what}; receipt {path} was recorded at revision "
        f"{receipt.base_revision}→{receipt.new_revision}; the run is now at revision {h.revision}"
    )
    head = gates.standing(run_dir, receipt.gate, h)
    if head is None or head.operation_id != receipt.operation_id:
        line += "; it no longer stands: " + (f"{gates.summary(head)} since" if head else "voided since")
    return line


def cited_ask(run_dir: Path, ask_id: str) -> gates.CitedAsk:
    """The ask ``ask_id`` of the run as a gate-1 receipt records it; BadInput naming the run's asks otherwise."""
    # startup: `lunasol --help` and every other verb load none of this
    from pipeline.ask.summary import ask_ids, headline, summarise
    from pipeline.gates.gate1 import CitedAsk

    known = ask_ids(run_dir)
    if ask_id not in known:
        raise BadInput(f"--ask {ask_id}: no such ask in {run_dir.name} (asks: {', '.join(known) or 'none'})")
    h = headline(summarise(run_dir, ask_id))
    return CitedAsk.model_validate({k: h[k] for k in CitedAsk.model_fields})


def register(app: typer.Typer) -> None:
    """Add ``confirm`` and ``status`` to the root app."""

    @app.command("confirm")
    def confirm_cmd(
        run: str = typer.Argument(..., help="Run directory (or run id under ./runs)."),
        decision: list[str] = typer.Option(
            [], "--decision", help="W-01=confirm|reject|unresolved|amend; one per weakness, every weakness."
        ),
        note: list[str] = typer.Option([], "--note", help='W-01="..." (required for amend: the amended statement).'),
        by: str | None = typer.Option(None, "--by", help="Who decides (required)."),
        digest: str | None = typer.Option(None, "--digest", help="The shortlist digest you decided on."),
        base: str | None = typer.Option(
            None,
            "--base",
            help="The gate-1 decision you saw standing (its operation id, as `lunasol status` prints it), or "
            "none. Omitted: none (you saw no decision); a decision standing then refuses with needs_rebase.",
        ),
        operation_id: str | None = typer.Option(
            None, "--operation-id", help="Idempotency key: the same id returns the same receipt."
        ),
        supersede: bool = typer.Option(
            False,
            "--supersede",
            help="Replace the decision standing (named by --base); the receipt records whom it replaces. "
            "Proposals and a gate-2 decision made under the old decision are voided.",
        ),
        ask: str | None = typer.Option(
            None,
            "--ask",
            help="The ask you decided with (its id, as `lunasol show RUN` lists it): its question, counts and "
            "digest are recorded in the receipt.",
        ),
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Gate 1: confirm, reject, keep unresolved or amend each weakness of the shortlist.

        Read the cards first (lunasol show RUN W-01, lunasol report RUN). --digest is required with
        --decision: a compare-and-set on the shortlist digest and the gate's standing decision (--base,
        default none); if either is not what you read, or a decision stands and you did not say
        --supersede, it refuses with needs_rebase (exit 4) naming who decided what. Without --decision
        on a terminal it shows every card and asks, binding the digest and base it showed. Silence is
        never approval.
        """
        # startup: `lunasol --help` and every other verb load none of this
        from pipeline.gates import gate1 as gates
        from pipeline.run.status import format_shortlist, status
        from pipeline.state import handoff

        run_dir = resolve_run(run)
        check_digest(digest)
        cited = cited_ask(run_dir, ask) if ask is not None else None  # an unknown id: one line before anything
        now = handoff.load(run_dir)
        decisions = gates.parse_pairs(decision, "--decision")
        notes = gates.parse_pairs(note, "--note")
        interactive = not decisions
        # Non-interactive: only the digest and base the decider names (no --base: none); interactive:
        # those of what was shown.
        seen_digest = digest if not interactive else digest or now.shortlist_digest
        seen_base = base if not interactive else base or handoff.chain_base(run_dir, "gate1", now)
        if not decisions:
            if not on_terminal():
                raise BadInput(
                    "no --decision given: silence is never approval; decide on every weakness: "
                    + handoff.confirm_command(run_dir, now)
                )
            head = gates.standing(run_dir, gates.GATE1, now)
            if head is not None and not supersede:
                # Said before the questions, not after them: answers that cannot be recorded waste a review.
                raise NeedsRebase(
                    f"needs_rebase: gate 1 already decided: {gates.summary(head)}; to replace it, decide "
                    f"again with --supersede: lunasol confirm {shlex.quote(str(run_dir))} --supersede"
                )
            s = status(run_dir)
            sl = s["shortlist"]
            typer.echo(format_shortlist(sl["weaknesses"], sl["dropped"], sl["pilot"]))
            if head is not None:
                typer.echo(f"replacing the decision standing: {gates.summary(head)}")
            choices = "/".join(gates.DECISIONS)
            for wid in handoff.weakness_ids(run_dir):
                answer = ""
                while answer not in gates.DECISIONS:  # ask again until it is one of the four
                    answer = typer.prompt(f"{wid} ({choices})").strip().lower()
                decisions[wid] = answer
                if decisions[wid] == "amend" or typer.confirm(f"{wid}: add a note?", default=False):
                    notes[wid] = typer.prompt(f"{wid}: note")
            if by is None:
                by = typer.prompt("your name")
        if by is None:
            raise BadInput("--by NAME is required: a decision needs a named person")
        with moves_run(run_dir, "confirm"):
            receipt, replayed = gates.confirm(
                run_dir,
                decisions,
                by=by,
                notes=notes,
                expected_digest=seen_digest,
                operation_id=operation_id,
                require_digest=not interactive,
                supersede=supersede,
                expected_base=seen_base,
                ask=cited,
            )
        superseded = not replayed and now.proposalSelection in gates.LATER_DECISIONS
        if superseded:
            typer.echo(
                f"warning: this supersedes gate 2's decision ({now.proposalSelection}); its receipt is "
                "invalidated and proposals must be generated again",
                err=True,
            )
        if as_json:
            emit_json({"replayed": replayed, "superseded": superseded, "receipt": receipt.model_dump(mode="json")})
            return
        typer.echo(receipt_line("gate 1", receipt, replayed, run_dir, receipt.result.get("userRootCauseConfirmation")))
        if receipt.ask is not None:
            a = receipt.ask
            found = ", ".join(f"{v} {k}" for v, k in (a.counts or {}).items()) or f"mean {a.mean}"
            typer.echo(f"cites {a.ask_id}: {a.answered}/{a.cells} answered ({found}); digest {a.digest}")
        if receipt.pilot is not None:
            typer.echo(f"decided on a {receipt.pilot.label()}; the receipt says so (field pilot)")
        typer.echo(f"next: {handoff.next_command(run_dir)}")

    @app.command("status")
    def status_cmd(
        run: str = typer.Argument(..., help="Run directory (or run id under ./runs)."),
        as_json: bool = JSON_OPTION,
        poll: bool = typer.Option(False, "--poll", help="Ask the provider about the run's unfinished batches."),
    ) -> None:
        """The run's state machine, its ledger, and the exact next command."""
        from pipeline.run.status import (
            format_status,  # startup: `lunasol --help` and every other verb load none of this
            status,
        )

        s = status(resolve_run(run), poll=True) if poll else status(resolve_run(run))
        if as_json:
            emit_json(s)
        else:
            typer.echo(format_status(s))
