"""CLI verbs of the proposal stage: validate, propose, select (thin: each calls one library function)."""

from __future__ import annotations

from pathlib import Path

import typer

from pipeline.cli.common import JSON_OPTION, emit_json, resolve_run
from pipeline.errors import Findings


def validate(
    file: Path = typer.Argument(
        ..., help="A proposals YAML file: one card, a list, or a mapping with key 'proposals'."
    ),
    run: str | None = typer.Option(None, "--run", help="Also check the cards against this run (RUN dir or id)."),
    json_out: bool = JSON_OPTION,
) -> None:
    """Validate proposal cards deterministically; exit 0 all valid, 1 some invalid, 2 unreadable."""
    from pipeline.validator import validate_file

    run_dir = resolve_run(run) if run else None
    result = validate_file(file, run_dir)
    if json_out:
        emit_json(result.as_dict())
    else:
        for card in result.cards:
            name = card.proposal_id or f"proposals[{card.index}]"
            typer.echo(f"{name}: {'valid' if card.valid else 'INVALID'}")
            for finding in card.findings:
                typer.echo(f"  {finding.line()}")
        counts = result.as_dict()["counts"]
        typer.echo(f"{counts['valid']} of {counts['cards']} cards valid, {counts['findings']} findings")
    if not result.valid:
        counts = result.as_dict()["counts"]
        raise Findings(f"{counts['invalid']} of {counts['cards']} cards invalid in {file}")


def register(app: typer.Typer) -> None:
    """Add this module's verbs to the root app."""
    app.command("validate")(validate)
