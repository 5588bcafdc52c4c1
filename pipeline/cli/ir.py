"""``lunasol export``, ``show-ref`` and ``query``: the Trajectory IR of a run."""

from __future__ import annotations

from pathlib import Path

import typer

from pipeline.cli.common import (
    DEFAULT_RUNS_DIR,
    JSON_OPTION,
    NO_REDACT_OPTION,
    check_dir_option,
    emit_json,
    resolve_run,
    warn_no_redact,
)


def register(app: typer.Typer) -> None:
    """Add the IR verbs to the root app."""

    @app.command("export")
    def export_cmd(
        bundle: Path = typer.Argument(..., help="Frozen bundle directory."),
        run_id: str | None = typer.Option(None, "--run-id", help="Run id (default: the request's analysis_run_id)."),
        runs_dir: Path = typer.Option(DEFAULT_RUNS_DIR, "--runs-dir", help="Where run directories live."),
        parquet: Path | None = typer.Option(None, "--parquet", help="Also write every table as Parquet here."),
        no_redact: bool = NO_REDACT_OPTION,
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Verify a bundle and write its Trajectory IR to RUNS_DIR/RUN_ID/ir.duckdb.

        Secrets in the logs become [REDACTED:<kind>] unless --no-redact.
        """
        # startup: `lunasol --help` and every other verb load none of this
        from pipeline.ir.export import export_bundle

        check_dir_option(runs_dir, "--runs-dir")
        check_dir_option(parquet, "--parquet")
        if no_redact:
            warn_no_redact()
        report = export_bundle(bundle, run_id=run_id, runs_dir=runs_dir, parquet_dir=parquet, redact=not no_redact)
        if as_json:
            emit_json(report.to_json())
            return
        typer.echo(f"exported {report.summary()} -> {report.ir_path} ({report.seconds:.2f}s)")
        for cell_id, reason in report.excluded.items():
            typer.echo(f"  excluded {cell_id}: {reason}")
        if report.parquet:
            typer.echo(f"  parquet: {len(report.parquet)} tables in {report.parquet[0].parent}")

    @app.command("show-ref")
    def show_ref_cmd(
        ref: str = typer.Argument(
            ...,
            help="PATH#Lstart-Lend, PATH relative to the bundle; may end with a JSON pointer like /args/path.",
        ),
        run: str = typer.Option(..., "--run", help="Run directory (or run id under ./runs)."),
        context: int = typer.Option(
            0, "--context", "-C", min=0, help="Also N lines before and after, numbered; cited lines marked >."
        ),
        pretty: bool = typer.Option(False, "--pretty", help="Also pretty-print each cited JSON line."),
        line: bool = typer.Option(
            False, "--line", help="With a JSON pointer: print the whole raw line(s), not the element."
        ),
        unredacted: bool = typer.Option(
            False, "--unredacted", help="Show secrets as written (default: [REDACTED:<kind>], as in the IR)."
        ),
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Print what a ref names, hash-checked: its raw lines (--context N for more), or its pointer's element.

        Secrets are shown as [REDACTED:<kind>] unless --unredacted.
        """
        from pipeline.ir.refs import (
            redacted,  # startup: `lunasol --help` and every other verb load none of this
            resolve_ref,
            show_ref,
            show_ref_context,
        )

        run_dir = resolve_run(run)
        if as_json:
            view = resolve_ref(run_dir, ref)
            emit_json((view if unredacted else redacted(view)).to_json(lines=line))
        elif context or pretty:
            typer.echo(show_ref_context(run_dir, ref, context, pretty, unredacted=unredacted))
        else:
            typer.echo(show_ref(run_dir, ref, line=line, unredacted=unredacted))

    @app.command("query")
    def query_cmd(
        run: str = typer.Argument(..., help="Run directory (or run id under ./runs)."),
        sql: str = typer.Argument(..., help="One read-only SQL statement."),
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Run read-only SQL over the run's DuckDB and print a table (or JSON rows)."""
        # startup: `lunasol --help` and every other verb load none of this
        from pipeline.ir.query import query

        result = query(resolve_run(run), sql)
        if as_json:
            emit_json(result.records())
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(*result.columns, show_lines=False)
        for row in result.rows:
            table.add_row(*("NULL" if v is None else str(v) for v in row))
        Console(soft_wrap=True).print(table)
        typer.echo(f"{len(result.rows)} rows")
