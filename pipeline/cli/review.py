"""Reviewer verbs: ``diff`` two runs, ``report`` one run as HTML, list ``runs``."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import typer

from pipeline.cli.common import DEFAULT_RUNS_DIR, JSON_OPTION, check_dir_option, emit_json, resolve_run
from pipeline.core.canonical import atomic_write_text
from pipeline.core.errors import EXIT_FINDINGS, BadInput


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
        html: Path | None = typer.Option(None, "--html", help="Also write a side-by-side HTML page to this file."),
    ) -> None:
        """What differs between two runs: inputs, patterns per cell, weaknesses, proposals, gates, calls.

        Changed text is shown as a word diff: [-removed-] {+added+} (Markdown: ~~removed~~ **added**).
        Exit 0 when the outputs are identical, 1 when they differ.
        """
        from pipeline.diff import (
            diff_json,  # startup: `lunasol --help` and every other verb load none of this
            diff_run_dirs,
            render_html,
            render_markdown,
            render_text,
        )

        if as_json and markdown:
            raise BadInput("choose one of --json and --markdown")
        if html is not None and (html.is_dir() or not html.parent.is_dir()):
            raise BadInput(f"--html {html}: name a file in an existing directory")
        d = diff_run_dirs(_run_dir(run_a), _run_dir(run_b))
        if html is not None:
            atomic_write_text(html, render_html(d))
            typer.echo(f"wrote {html}", err=True)
        if as_json:
            # Reading order, not sorted keys: the decisions lead here as in the text (diff_json orders them).
            sys.stdout.write(json.dumps(diff_json(d), indent=2, ensure_ascii=False) + "\n")
        else:
            sys.stdout.write(render_markdown(d) if markdown else render_text(d))
        if not d.identical:
            raise typer.Exit(EXIT_FINDINGS)

    @app.command("report")
    def report_cmd(
        run: str = typer.Argument(..., metavar="RUN", help="Run directory (or run id under ./runs)."),
        out: str | None = typer.Option(
            None,
            "-o",
            "--output",
            help="Report directory (default RUN/report/: index.html and its data/), or an object URL prefix "
            "(s3://bucket/reports/run1, gs://…, az://…).",
        ),
        as_json: bool = JSON_OPTION,
    ) -> None:
        """A report to read before deciding: cards, timelines, raw lines beside the text (opens at any size)."""
        # startup: `lunasol --help` and every other verb load none of this
        from pipeline.artifacts.rundir import REPORT_DIR, REPORT_INDEX
        from pipeline.core.objstore import is_url, open_url, put_files, shown
        from pipeline.report import write_report

        if out is not None and is_url(out):
            import tempfile

            open_url(out)  # an unknown scheme or a missing backend: one line before the report is built
            base = out.rstrip("/")
            with tempfile.TemporaryDirectory(prefix="lunasol-report-") as tmp:
                local, stats = write_report(_run_dir(run), out=Path(tmp) / REPORT_DIR)
                # each object whole; the page last, so whoever opens it finds every shard it loads
                shards = sorted(p for p in local.parent.rglob("*") if p.is_file() and p != local)
                put_files(base, [(f, f.relative_to(local.parent).as_posix()) for f in shards])
                put_files(base, [(local, REPORT_INDEX)])
            where = shown(f"{base}/{REPORT_INDEX}")
        else:
            path, stats = write_report(_run_dir(run), out=Path(out) if out is not None else None)
            where = str(path)
        if as_json:
            emit_json({"path": where, **stats})
            return
        typer.echo(
            f"wrote {where} ({stats['bytes']} bytes; {stats['files']} files, {stats['total_bytes']} bytes in all; "
            f"{stats['refs']} refs embedded, "
            f"{stats['hash_mismatches']} hash mismatches, {stats['unresolved']} unresolved)"
        )

    @app.command("show")
    def show_cmd(
        run: str = typer.Argument(..., metavar="RUN", help="Run directory (or run id under ./runs)."),
        item_id: str | None = typer.Argument(
            None,
            metavar="[ID]",
            help="W-01, P-01, a cell (C004), a pattern, a pattern group (G010), an event, a ref, or an ask "
            "(ask-…); none (or 'asks'): the run's asks.",
        ),
        evidence: bool = typer.Option(
            False, "--evidence", help="Also print the raw lines (with context) of every event and ref it cites."
        ),
        context: int = typer.Option(2, "--context", min=0, max=3, help="Context lines around each ref (0-3)."),
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Print one whole weakness, proposal, cell, pattern, pattern group, event or ref: every field, nothing cut.

        Without an ID: the run's asks (lunasol ask), each with its counts; an ask's id prints every
        cell's answer and cited events. Read it before you decide at a gate. Events and refs come
        with their raw lines and context.
        """
        from pipeline.report.items import (
            find_item,  # startup: `lunasol --help` and every other verb load none of this
            render_item,
        )

        if item_id is None or item_id == "asks" or item_id.startswith("ask-"):
            from pipeline.cli.ask import show_ask, show_asks  # startup: only `show` of an ask loads it

            if item_id is None or item_id == "asks":
                show_asks(resolve_run(run), run, as_json=as_json)
            else:
                show_ask(resolve_run(run), run, item_id, evidence=evidence, context=context, as_json=as_json)
            return
        item = find_item(resolve_run(run), item_id, evidence=evidence, context=context)
        if as_json:
            emit_json(item.to_json())
        else:
            width = shutil.get_terminal_size((100, 24)).columns
            sys.stdout.write(render_item(item, width=max(60, min(width, 120))))

    @app.command("export-tables")
    def export_tables_cmd(
        run: str = typer.Argument(..., metavar="RUN", help="Run directory (or run id under ./runs)."),
        parquet: str = typer.Option(
            ...,
            "--parquet",
            help="Directory for one <table>.parquet per table, or an object storage prefix (s3://bucket/prefix, "
            "gs://…, az://…; credentials from the backend's standard chain).",
        ),
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Every table of a run as Parquet: cells, events, probe hits, patterns, groups, weaknesses, proposals, calls.

        The same tables as the Python data API (pipeline.api, docs/api.md), for pandas, polars or DuckDB.
        """
        # startup: `lunasol --help` and every other verb load none of this
        from pipeline.api import export_tables, export_tables_url
        from pipeline.core.objstore import is_url, shown

        if is_url(parquet):
            urls = export_tables_url(resolve_run(run), parquet)
            tables = {u.rsplit("/", 1)[-1].removesuffix(".parquet"): u for u in urls}
            where = shown(parquet)
        else:
            check_dir_option(Path(parquet), "--parquet")
            tables = {p.stem: str(p) for p in export_tables(resolve_run(run), Path(parquet))}
            where = parquet
        if as_json:
            emit_json({"tables": tables})
            return
        typer.echo(f"wrote {len(tables)} tables to {where}: {', '.join(tables)}")

    @app.command("runs")
    def runs_cmd(
        runs_dir: Path = typer.Option(DEFAULT_RUNS_DIR, "--runs-dir", help="Where run directories live."),
        as_json: bool = JSON_OPTION,
    ) -> None:
        """The runs under a runs directory: state, bundle, model, and key figures."""
        # startup: `lunasol --help` and every other verb load none of this
        from pipeline.run.index import list_runs

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
            cost = "-" if r.calls is None else "unknown" if r.cost_usd is None else f"{r.cost_usd:.4f}"
            state = r.state if not r.error else f"{r.state} ({r.error})"
            table.add_row(
                r.run_id,
                state,
                n(r.bundle),
                n(r.model),
                f"{r.cells} of {r.pilot.eligible} (pilot)" if r.pilot and r.cells is not None else n(r.cells),
                n(r.patterns),
                n(r.weaknesses),
                n(r.proposals),
                n(r.calls),
                cost,
            )
        Console(width=200).print(table)
