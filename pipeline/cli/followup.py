"""``lunasol followup``: the parent's selected proposal judged on the next generation's run."""

from __future__ import annotations

import sys
from pathlib import Path

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
from pipeline.core.errors import BadInput


def register(app: typer.Typer) -> None:
    """Add ``followup`` to the root app."""

    @app.command("followup")
    def followup_cmd(
        parent: str = typer.Argument(..., metavar="PARENT_RUN", help="The run whose gate 2 selected the proposal."),
        proposal: str = typer.Option(..., "--proposal", help="The selected proposal id, e.g. P-02."),
        child: str = typer.Option(..., "--child", metavar="CHILD_RUN", help="The next generation's analysis run."),
        out: Path | None = typer.Option(None, "-o", "--output", help="Output file (default CHILD_RUN/followup.json)."),
        no_judge: bool = typer.Option(False, "--no-judge", help="Counts only: leave uncounted conditions to a human."),
        model: str | None = typer.Option(None, "--model", help="The judge's model (default: the child run's)."),
        api_base: str | None = typer.Option(None, "--api-base", help="Override the child run's base URL."),
        replay: Path | None = typer.Option(None, "--replay", help="Serve the judge's answer from this store only."),
        record: Path | None = typer.Option(None, "--record", help="Call live and store the judge's exchange here."),
        timeout: float | None = TIMEOUT_OPTION,
        max_tokens: int | None = MAX_TOKENS_OPTION,
        instructor_mode: str | None = MODE_OPTION,
        context_tokens: int | None = CONTEXT_TOKENS_OPTION,
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Supported, rejected or inconclusive: prevalence of the targeted pattern, tests, power, conditions.

        Counts settle what they can; the judge role reads the child's evidence for the rest (the
        child run's model settings unless overridden; a replayed child replays its judge).
        Writes CHILD_RUN/followup.json, bound by digest to the gate-2 receipt, both shortlists and both bundles.
        """
        # startup cost: the runner, its model client, duckdb
        from pipeline.followup import followup, render_text
        from pipeline.models.store import check_store
        from pipeline.proposals.proposer import run_model_settings

        if replay and record:
            raise BadInput("--replay and --record exclude each other")
        child_dir = resolve_run(child)
        settings = None
        if not no_judge:
            settings = run_model_settings(
                child_dir, model=model, api_base=api_base, mode="replay" if replay else "record" if record else None,
                store=replay or record, timeout_s=timeout, max_tokens=max_tokens, instructor_mode=instructor_mode,
                context_tokens=context_tokens,
            )  # fmt: skip
            check_store(settings)
        log = (lambda _m: None) if as_json else typer.echo
        result = followup(resolve_run(parent), proposal, child_dir, out=out, settings=settings,
                          ask_judge=not no_judge, log=log)  # fmt: skip
        if as_json:
            emit_json(result.doc.model_dump(mode="json"))
            return
        sys.stdout.write(render_text(result.doc))
        typer.echo(f"wrote {result.path}")
