"""``lunasol calls RUN``: the run's model calls per role (calls, tokens, cost, retries, failures)."""

from __future__ import annotations

import typer

from pipeline.cli.common import JSON_OPTION, emit_json, resolve_run


def register(app: typer.Typer) -> None:
    """Add ``calls`` to the root app."""

    @app.command("calls")
    def calls_cmd(
        run: str = typer.Argument(..., help="Run directory (or run id under ./runs)."),
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Model calls of a run, per role: calls, attempts, re-asks, retries, tokens, cost, failures."""
        from pipeline.models.calllog import (
            format_summary,  # startup: `lunasol --help` and every other verb load none of this
            summarise,
        )

        summary = summarise(resolve_run(run))
        if as_json:
            emit_json(summary)
        elif not summary["roles"]:
            typer.echo("no model calls recorded (calls.jsonl is absent or empty)")
        else:
            typer.echo(format_summary(summary))
