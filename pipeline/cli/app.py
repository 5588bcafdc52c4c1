"""Root of the ``lunasol`` command and its single error boundary.

Known errors become one line on stderr and the contract's exit code; set
``LUNASOL_DEBUG=1`` to see the traceback instead.
"""

from __future__ import annotations

import errno
import gc
import os
import sys
import warnings
from typing import Any

import typer
from typer.core import TyperGroup, TyperOption
from typer.exceptions import TyperException

import pipeline
from pipeline.cli import (
    agent,
    ask,
    bundle,
    calls,
    config,
    datasets,
    followup,
    gates,
    ir,
    proposals,
    review,
    run,
    schema,
)
from pipeline.core import offline
from pipeline.core.errors import EXIT_BAD_INPUT, EXIT_INTERNAL, LunasolError

# Verbs in the order of the workflow, under panels that say what each group is for (``lunasol --help``).
WORKFLOW: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Analyse", ("bundle", "run", "status", "calls", "config")),
    ("Read before you decide", ("show", "report", "show-ref", "diff", "ask")),
    ("Decide", ("confirm", "propose", "validate", "select", "followup")),
    ("Hand over", ("handoff", "mcp")),
    ("Data", ("export", "export-tables", "query", "runs", "eval", "schema")),
)
_ORDER = [name for _, names in WORKFLOW for name in names]
_PANEL = {name: panel for panel, names in WORKFLOW for name in names}


def _flag_display(self: TyperOption, ctx: Any) -> str | None:
    # typer 0.29 shows "<bool>" after every flag, as if it took a value; a flag takes none.
    return None if self.is_flag else _TYPED_DISPLAY(self, ctx)


_TYPED_DISPLAY = TyperOption.display_type_rich
TyperOption.display_type_rich = _flag_display  # type: ignore[method-assign]


class LunasolGroup(TyperGroup):
    """A click group whose invoke turns LunasolError into one line and an exit code."""

    def list_commands(self, ctx: Any) -> list[str]:
        """Verbs in workflow order (then any verb the table does not know, by name)."""
        names = super().list_commands(ctx)
        return sorted(names, key=lambda n: (_ORDER.index(n) if n in _ORDER else len(_ORDER), n))

    def invoke(self, ctx: Any) -> Any:
        """Invoke the verb; map LunasolError to one line and its exit code."""
        try:
            return super().invoke(ctx)
        except LunasolError as exc:
            if os.environ.get("LUNASOL_DEBUG"):
                raise
            typer.echo(f"lunasol: {exc.one_line()}", err=True)
            raise typer.Exit(exc.exit_code) from None
        except (typer.Exit, typer.Abort, TyperException):
            raise  # click's own flow: --help, usage errors (exit 2 with a usage box), prompts aborted
        except KeyboardInterrupt:
            # typer would turn it into a silent exit 130; say what happened (the ledger keeps what finished)
            typer.echo(
                "lunasol: interrupted (work already finished is kept; `lunasol status RUN` shows how to go on)",
                err=True,
            )
            raise typer.Exit(130) from None
        except (OSError, UnicodeDecodeError) as exc:  # unreadable input that slipped past a check
            if os.environ.get("LUNASOL_DEBUG") or getattr(exc, "errno", None) == errno.EPIPE:
                raise  # `lunasol ... | head`: typer exits quietly on a closed pipe
            typer.echo(f"lunasol: {type(exc).__name__}: {_fold(str(exc))}", err=True)
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except Exception as exc:  # the last line of defence: never a traceback
            if os.environ.get("LUNASOL_DEBUG"):
                raise
            line, code = _unexpected(exc)
            typer.echo(f"lunasol: {line}", err=True)
            raise typer.Exit(code) from None


def _fold(text: str, limit: int = 400) -> str:
    """One line, at most ``limit`` characters (an error message is not a dump)."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _unexpected(exc: Exception) -> tuple[str, int]:
    """The one line and exit code for an exception no check turned into a LunasolError.

    A pydantic ValidationError means some input (a flag, an env var, a file) did not fit its model:
    bad input, exit 2. Anything else is a bug in lunasol: say so, point at ``LUNASOL_DEBUG=1``, and
    exit 70 (EX_SOFTWARE), distinct from the contract's codes so a script never takes it for findings.
    """
    from pydantic import ValidationError

    if "duckdb" in type(exc).__module__ and type(exc).__name__ == "OutOfMemoryException":
        # the input outgrew DuckDB's limit even with spilling (pipeline.core.duck): say which knob raises it.
        # DuckDB's own first line gives the limit in force (steps take their own when the variable is unset).
        from pipeline.core.duck import MEMORY_ENV

        first = str(exc).split("\n")[0]
        return (
            _fold(
                f"DuckDB ran out of memory ({first}); raise its limit, e.g. "
                f"{MEMORY_ENV}=2GiB, and run the same command again (finished work is kept)"
            ),
            EXIT_BAD_INPUT,
        )
    if isinstance(exc, ValidationError):
        errs = exc.errors()
        parts = []
        for e in errs[:3]:
            loc = ".".join(str(x) for x in e.get("loc", ())) or exc.title
            parts.append(f"{loc}: {e.get('msg', '')} (got {e.get('input')!r})")
        more = f" (+{len(errs) - 3} more)" if len(errs) > 3 else ""
        return _fold(f"invalid {exc.title}: " + "; ".join(parts) + more), EXIT_BAD_INPUT
    return (
        _fold(f"internal error: {type(exc).__name__}: {exc}")
        + " (a bug in lunasol; LUNASOL_DEBUG=1 shows the traceback)",
        EXIT_INTERNAL,
    )


app = typer.Typer(
    cls=LunasolGroup,
    name="lunasol",
    help="Root causes and single-lever proposals from frozen bundles of agent-harness runs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
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

    for module in (bundle, ir, run, calls, gates, proposals, followup, review, datasets, schema, config, agent, ask):
        module.register(app)
    for command in app.registered_commands:
        name = command.name or (command.callback.__name__ if command.callback else "")
        command.rich_help_panel = _PANEL.get(name, "More")
    for group in app.registered_groups:
        group.rich_help_panel = _PANEL.get(group.name or "", "More")


_register()


# CPython's default collector thresholds (700, 10, 10) suit programs with few live objects. A run holds
# hundreds of thousands (the openai SDK alone defines ~2,000 pydantic classes) and allocates millions more
# that reference counting frees anyway: a rerun of one changed cell in 1,000 ran the collector ~1,200
# times, 8 of them over every object, for 0.83 of its 5.9 CPU s. Young collections every 100,000
# allocations still reclaim young cycles (0.14 CPU s, 5 collections, on that rerun); full ones wait.
GC_THRESHOLDS = (100_000, 50, 100)


def main() -> None:
    """Console-script entry point."""
    gc.set_threshold(*GC_THRESHOLDS)
    offline.apply()  # the CLI never reaches the network unless a live model call is asked for
    # litellm leaves an un-awaited coroutine behind when a connection fails; Python's warning about it
    # (two lines on stderr, at exit) would break the one-line error contract and says nothing to a user.
    warnings.filterwarnings("ignore", message=r"coroutine .* was never awaited", category=RuntimeWarning)
    try:
        try:
            app(prog_name="lunasol")
        finally:
            # Exiting, the interpreter's last collections would traverse every object still alive (0.75
            # CPU s after that rerun); frozen ones are skipped. Artifacts are written and closed by now,
            # and what reference counting frees at exit is freed as before.
            gc.freeze()
    except KeyboardInterrupt:
        typer.echo("lunasol: interrupted", err=True)
        sys.exit(130)
