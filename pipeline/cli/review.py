"""Reviewer verbs: ``diff`` two runs, ``report`` one run as HTML, list ``runs``."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from pipeline.cli.common import DEFAULT_RUNS_DIR, JSON_OPTION, emit_json
from pipeline.core.errors import EXIT_FINDINGS, BadInput
from pipeline.diff import diff_json, diff_run_dirs, render_markdown, render_text
from pipeline.report import write_report
from pipeline.run.index import list_runs


def _run_dir(run: str) -> Path:
    # A RUN argument: a run directory, or a run id under ./runs (the contract's default home).
    path = Path(run)
    if not path.is_dir() and (DEFAULT_RUNS_DIR / run).is_dir():
        return DEFAULT_RUNS_DIR / run
    return path


def register(app: typer.Typer) -> None:
    """Add ``diff``, ``report`` and ``runs`` to the root app."""

    @app.command("diff")
    def diff_cmd(
        run_a: str = typer.Argument(..., metavar="RUN_A", help="First run directory (or run id under ./runs)."),
        run_b: str = typer.Argument(..., metavar="RUN_B", help="Second run directory (or run id under ./runs)."),
        as_json: bool = JSON_OPTION,
        markdown: bool = typer.Option(False, "--markdown", help="Print Markdown (for a PR or a review note)."),
    ) -> None:
        """What differs between two runs: inputs, patterns per cell, weaknesses, proposals, gates, calls.

        Exit 0 when the outputs are identical, 1 when they differ.
        """
        if as_json and markdown:
            raise BadInput("choose one of --json and --markdown")
        d = diff_run_dirs(_run_dir(run_a), _run_dir(run_b))
        if as_json:
            emit_json(diff_json(d))
        else:
            sys.stdout.write(render_markdown(d) if markdown else render_text(d))
        if not d.identical:
            raise typer.Exit(EXIT_FINDINGS)

    @app.command("report")
    def report_cmd(
        run: str = typer.Argument(..., metavar="RUN", help="Run directory (or run id under ./runs)."),
        out: Path | None = typer.Option(None, "-o", "--output", help="HTML file (default RUN/report.html)."),
    ) -> None:
        """One self-contained HTML file: summary, coverage, groups, weaknesses, proposals, gates, calls."""
        path, stats = write_report(_run_dir(run), out=out)
        typer.echo(
            f"wrote {path} ({stats['bytes']} bytes, {stats['refs']} refs embedded, "
            f"{stats['hash_mismatches']} hash mismatches, {stats['unresolved']} unresolved)"
        )

    @app.command("runs")
    def runs_cmd(
        runs_dir: Path = typer.Option(DEFAULT_RUNS_DIR, "--runs-dir", help="Where run directories live."),
        as_json: bool = JSON_OPTION,
    ) -> None:
        """The runs under a runs directory: state, bundle, model, and key figures."""
        rows = list_runs(runs_dir)
        if as_json:
            emit_json([r.model_dump(mode="json") for r in rows])
            return
        if not rows:
            typer.echo(f"no runs under {runs_dir}")
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(box=None, pad_edge=False)
        for col in ("run", "state", "bundle", "model", "cells", "patterns", "weak.", "props", "calls", "cost $"):
            table.add_column(col, overflow="fold")

        def n(v: object) -> str:
            return "-" if v is None else str(v)

        for r in rows:
            cost = "-" if r.cost_usd is None else f"{r.cost_usd:.4f}"
            state = r.state if not r.error else f"{r.state} ({r.error})"
            table.add_row(
                r.run_id,
                state,
                n(r.bundle),
                n(r.model),
                n(r.cells),
                n(r.patterns),
                n(r.weaknesses),
                n(r.proposals),
                n(r.calls),
                cost,
            )
        Console(width=200).print(table)
