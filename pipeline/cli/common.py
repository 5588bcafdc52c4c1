"""Small helpers shared by the verbs: output, run-directory resolution."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from pipeline.canonical import pretty_json
from pipeline.errors import BadInput

DEFAULT_RUNS_DIR = Path("runs")

JSON_OPTION = typer.Option(False, "--json", help="Print machine-readable JSON instead of text.")


def emit_json(obj: Any) -> None:
    """Print canonical, indented JSON to stdout."""
    sys.stdout.write(pretty_json(obj))


def resolve_run(run: str) -> Path:
    """A RUN argument: a run directory, or a run id under ./runs."""
    path = Path(run)
    if not path.is_dir() and (DEFAULT_RUNS_DIR / run).is_dir():
        path = DEFAULT_RUNS_DIR / run
    if not (path / "run.json").is_file() and not (path / "ir.duckdb").is_file():
        raise BadInput(f"not a lunasol run directory: {run} (expected run.json inside)")
    return path
