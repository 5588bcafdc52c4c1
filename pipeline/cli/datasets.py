"""``lunasol bundle import`` (public trajectory formats -> frozen bundle) and ``lunasol eval``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from pipeline.adapters import import_bundle
from pipeline.cli.bundle import bundle_app
from pipeline.cli.common import JSON_OPTION, emit_json, resolve_run
from pipeline.core.errors import BadInput
from pipeline.eval import evaluate

_FORMAT_HELP = (
    "Format of the logs, or 'auto' to detect it: who-and-when, mast, swe-agent, openhands, inspect, "
    "claude-code, atif, tau."
)


def import_cmd(
    fmt: str = typer.Argument(..., metavar="FORMAT", help=_FORMAT_HELP),
    src: Path = typer.Argument(..., help="A log file or a folder of logs (read only)."),
    dest: Path = typer.Argument(..., help="New bundle directory (must not exist, or be empty)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Copy foreign logs byte-for-byte into a new frozen bundle (request, outcome sidecar, manifest)."""
    result = import_bundle(fmt, src, dest)
    if as_json:
        emit_json(
            {
                "format": result.format,
                "detected": result.detected,
                "dest": str(result.dest),
                "cells": result.cells,
                "files": result.files,
                "harness": result.harness,
                "skipped": [{"path": p, "reason": r} for p, r in result.skipped],
            }
        )
        return
    if result.detected:
        typer.echo(f"detected format: {result.format}")
    typer.echo(
        f"imported {result.cells} cells ({result.files} files frozen) as {result.format} "
        f"[{result.harness}] into {result.dest}"
    )
    if result.skipped:
        path, why = result.skipped[0]
        typer.echo(f"{len(result.skipped)} files hold no run (copied, not read); e.g. {path}: {why}")


def _fmt(v: Any) -> str:
    return "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))


def eval_cmd(
    run: str = typer.Argument(..., help="Run directory (or run id under ./runs)."),
    labels: str = typer.Option(..., "--labels", help="Label format of the sidecar: who-and-when or mast."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Score the run's findings (weakness cards, probe hits) and deterministic baselines against human labels."""
    report = evaluate(resolve_run(run), labels)
    if not report.get("labelled_cells"):
        # Scores over zero labels are a table of dashes: say why instead (the library still returns
        # the deterministic checks for callers that want them).
        raise BadInput(
            f"no usable {labels} labels in the outcome sidecar of {run}'s bundle: nothing to score "
            f"(eval needs a bundle imported from a labelled dataset: lunasol bundle import {labels} SRC DEST)"
        )
    if as_json:
        emit_json(report)
        return
    typer.echo(f"{report['run']}: {report['labelled_cells']} labelled cells of {report['cells']} ({labels})")
    checks = ", ".join(f"{k} {v['cells']}" for k, v in report["checks"].items())
    typer.echo(f"deterministic checks (cells): {checks}")
    for name, s in report["sources"].items():
        typer.echo(f"\n{name}: {s['status']}")
        if labels == "who-and-when":
            typer.echo(
                f"  predicted {s['predicted']}/{s['labelled']} (no prediction: {s['no_prediction']})  "
                f"exact {_fmt(s['exact_acc'])}  ±1 {_fmt(s['within_1_acc'])}  ±3 {_fmt(s['within_3_acc'])}  "
                f"agent {_fmt(s['agent_acc'])}"
            )
        elif not s.get("available"):
            typer.echo("  no failure-mode predictions from this source")
        else:
            for mode, m in s["modes"].items():
                typer.echo(
                    f"  {mode}: precision {_fmt(m['precision'])} recall {_fmt(m['recall'])} "
                    f"(tp {m['tp']} fp {m['fp']} fn {m['fn']})"
                )


def register(app: typer.Typer) -> None:
    """Add ``bundle import`` to the bundle sub-app and ``eval`` to the root app."""
    bundle_app.command("import")(import_cmd)
    app.command("eval")(eval_cmd)
