"""Root of the ``lunasol`` command and its single error boundary.

Known errors become one line on stderr and the contract's exit code; set
``LUNASOL_DEBUG=1`` to see the traceback instead.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import typer
from typer.core import TyperGroup

import pipeline
from pipeline.errors import EXIT_BAD_INPUT, LunasolError


class LunasolGroup(TyperGroup):
    """A click group whose invoke turns LunasolError into one line and an exit code."""

    def invoke(self, ctx: Any) -> Any:
        """Invoke the verb; map LunasolError to one line and its exit code."""
        try:
            return super().invoke(ctx)
        except LunasolError as exc:
            if os.environ.get("LUNASOL_DEBUG"):
                raise
            typer.echo(f"lunasol: {exc.one_line()}", err=True)
            raise typer.Exit(exc.exit_code) from None
        except (OSError, UnicodeDecodeError) as exc:  # unreadable input that slipped past a check
            if os.environ.get("LUNASOL_DEBUG"):
                raise
            typer.echo(f"lunasol: {type(exc).__name__}: {exc}", err=True)
            raise typer.Exit(EXIT_BAD_INPUT) from None


app = typer.Typer(
    cls=LunasolGroup,
    name="lunasol",
    help="Root causes and single-lever proposals from frozen bundles of agent-harness runs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"lunasol {pipeline.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """Root causes and single-lever proposals from frozen bundles of agent-harness runs."""


def _register() -> None:
    # Each module adds its verbs; imports stay cheap (heavy libraries load inside commands).
    from pipeline.cli import bundle, calls, datasets, gates, ir, proposals, review, run

    for module in (bundle, ir, run, calls, gates, proposals, review, datasets):
        module.register(app)


_register()


def main() -> None:
    """Console-script entry point."""
    try:
        app(prog_name="lunasol")
    except KeyboardInterrupt:
        typer.echo("lunasol: interrupted", err=True)
        sys.exit(130)
