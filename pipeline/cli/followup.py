"""``lunasol followup``: the parent's selected proposal judged on the next generation's run."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from pipeline.cli.common import JSON_OPTION, emit_json, resolve_run


def register(app: typer.Typer) -> None:
    """Add ``followup`` to the root app."""

    @app.command("followup")
    def followup_cmd(
        parent: str = typer.Argument(..., metavar="PARENT_RUN", help="The run whose gate 2 selected the proposal."),
        proposal: str = typer.Option(..., "--proposal", help="The selected proposal id, e.g. P-02."),
        child: str = typer.Option(..., "--child", metavar="CHILD_RUN", help="The next generation's analysis run."),
        out: Path | None = typer.Option(None, "-o", "--output", help="Output file (default CHILD_RUN/followup.json)."),
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Supported, rejected or inconclusive: prevalence of the targeted pattern, tests, power, conditions.

        Writes CHILD_RUN/followup.json, bound by digest to the gate-2 receipt, both shortlists and both bundles.
        """
        from pipeline.followup import followup, render_text  # startup cost: the runner, its model client, duckdb

        result = followup(resolve_run(parent), proposal, resolve_run(child), out=out)
        if as_json:
            emit_json(result.doc.model_dump(mode="json"))
            return
        sys.stdout.write(render_text(result.doc))
        typer.echo(f"wrote {result.path}")
