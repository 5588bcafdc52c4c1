"""``lunasol bundle import`` (public trajectory formats -> frozen bundle) and ``lunasol eval``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from pipeline.cli.bundle import bundle_app
from pipeline.cli.common import JSON_OPTION, emit_json, resolve_run
from pipeline.core import plugins
from pipeline.core.errors import BadInput

# From the installed metadata (no adapter is imported to print help): every registered format.
_FORMAT_HELP = (
    "Format of the logs, or 'auto' to detect each file's format: "
    + ", ".join(plugins.names(plugins.FORMATS_GROUP))
    + " (`lunasol formats` says what each detects)."
)


def import_cmd(
    fmt: str = typer.Argument(..., metavar="FORMAT", help=_FORMAT_HELP),
    src: str = typer.Argument(
        ...,
        metavar="SRC",
        help="A log file or a folder of logs (read only), or an object storage URL: s3://bucket/prefix, "
        "gs://…, az://container/prefix, file://… (credentials from the backend's standard chain).",
    ),
    dest: Path = typer.Argument(..., help="New bundle directory (must not exist, or be empty)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Copy foreign logs byte-for-byte into a new frozen bundle (request, outcome sidecar, manifest)."""
    # startup: `lunasol --help` and every other verb load none of this
    from pipeline.adapters import import_bundle, import_from_url
    from pipeline.core.objstore import is_url

    fetched: dict[str, int] | None = None
    if is_url(src):
        result, stats = import_from_url(fmt, src, dest)
        fetched = {
            "objects": stats.objects,
            "fetched": stats.fetched,
            "reused": stats.reused,
            "bytes_fetched": stats.bytes_fetched,
        }
    else:
        result = import_bundle(fmt, Path(src), dest)
    if as_json:
        emit_json(
            {
                "format": result.format,
                "detected": result.detected,
                "dest": str(result.dest),
                "cells": result.cells,
                "files": result.files,
                "harness": result.harness,
                "formats": result.formats,
                "skipped": [{"path": p, "reason": r} for p, r in result.skipped],
                "warnings": [{"path": p, "warning": w} for p, w in result.warnings],
                **({"source": fetched} if fetched is not None else {}),
            }
        )
        return
    if fetched is not None:
        again = f", {fetched['reused']} already fetched by an interrupted import" if fetched["reused"] else ""
        typer.echo(f"fetched {fetched['fetched']} objects ({fetched['bytes_fetched']:,} bytes){again}")
    if result.detected:
        shown = f"{result.format} ({', '.join(result.formats)})" if len(result.formats) > 1 else result.format
        typer.echo(f"detected format: {shown}")
    typer.echo(
        f"imported {result.cells} cells ({result.files} files frozen) as {result.format} "
        f"[{result.harness}] into {result.dest}"
    )
    if result.skipped:
        path, why = result.skipped[0]
        typer.echo(f"{len(result.skipped)} files not read as runs; e.g. {path}: {why}")
    for path, warning in result.warnings:
        typer.echo(f"warning: {path}: {warning}", err=True)


def _fmt(v: Any) -> str:
    return "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))


def _pm(s: dict[str, Any], name: str) -> str:
    """``0.125±0.052``: a rate and its binomial standard error."""
    acc, se = s.get(f"{name}_acc"), s.get(f"{name}_se")
    return _fmt(acc) + ("" if se is None else f"±{se:.3f}")


_STEP_METRICS = {
    "who-and-when": (("exact", "exact"), ("±1", "within_1"), ("±3", "within_3"), ("agent", "agent")),
    "agentrx": (
        ("root exact", "root_exact"),
        ("root ±1", "root_within_1"),
        ("any-failure exact", "any_exact"),
        ("any ±1", "any_within_1"),
        ("agent", "agent"),
    ),
}


def _print_steps(report: dict[str, Any], labels: str) -> None:
    metrics = _STEP_METRICS[labels]
    positional = report.get("positional") or {}
    for name, s in report["sources"].items():
        typer.echo(f"\n{name}: {s['status']}")
        shown = "  ".join(f"{label} {_pm(s, key)}" for label, key in metrics)
        typer.echo(f"  predicted {s['predicted']}/{s['labelled']} (no prediction: {s['no_prediction']})  {shown}")
        if name in positional:
            continue
        # Beside every other source: what position alone scores on the same labelled cells.
        for base, p in positional.items():
            alone = "  ".join(f"{label} {_pm(p, key)}" for label, key in metrics[:1] + metrics[-1:])
            typer.echo(f"    positional {base.removeprefix('baseline_')} (n={p.get('labelled')}): {alone}")


def eval_cmd(
    run: str = typer.Argument(..., help="Run directory (or run id under ./runs)."),
    labels: str = typer.Option(
        ...,
        "--labels",
        help="Label format of the sidecar (who-and-when, mast or agentrx), or your own FILE.csv|.parquet "
        "(columns: cell or source id, label = a pattern type or card id or 'none', optional step).",
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Score the run's findings (weakness cards, probe hits, patterns) and deterministic baselines against labels."""
    # startup: `lunasol --help` and every other verb load none of this
    from pipeline.eval import evaluate
    from pipeline.eval.user_labels import evaluate_label_file, is_label_file

    if is_label_file(labels):
        own = evaluate_label_file(resolve_run(run), Path(labels))
        if as_json:
            emit_json(own)
        else:
            _print_own(own)
        return
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
    if labels in _STEP_METRICS:
        _print_steps(report, labels)
        for name, c in (report.get("categories") or {}).items():
            typer.echo(f"\ncategories, {name}: {c['status']}")
            for cat, m in (c.get("categories") or {}).items():
                typer.echo(
                    f"  {cat}: precision {_fmt(m['precision'])} recall {_fmt(m['recall'])} "
                    f"(tp {m['tp']} fp {m['fp']} fn {m['fn']})"
                )
        return
    for name, s in report["sources"].items():
        typer.echo(f"\n{name}: {s['status']}")
        if not s.get("available"):
            typer.echo("  no failure-mode predictions from this source")
            continue
        for mode, m in s["modes"].items():
            typer.echo(
                f"  {mode}: precision {_fmt(m['precision'])} recall {_fmt(m['recall'])} "
                f"(tp {m['tp']} fp {m['fp']} fn {m['fn']}, n={report['labelled_cells']})"
            )


def _print_own(report: dict[str, Any]) -> None:
    """The table of ``eval --labels FILE``: confusion matrix and scores per pattern type and per card."""
    typer.echo(
        f"{report['run']}: {report['labelled_cells']} labelled cells of {report['cells']} "
        f"({report['labels']}, {report['rows']} rows)"
    )
    if report["labelled_not_eligible"]:
        typer.echo(f"not scored (excluded cells): {', '.join(report['labelled_not_eligible'])}")
    cols = f"{'tp':>4} {'fp':>4} {'fn':>4} {'tn':>4}  {'precision':<13} {'recall':<13} {'F1':>6} {'bal.acc':>7}"
    head = f"  {'':<24} {cols}"
    for source, key in (("patterns", "types"), ("weakness_cards", "cards"), ("asks", "asks")):
        s = report["sources"][source]
        rows = s[key]
        if source == "asks" and not rows:
            continue  # asks are scored only when the file labels one
        empty = "" if rows else ": nothing labelled or predicted"
        typer.echo(f"\n{source.replace('_', ' ')} ({s['status']}){empty}")
        if rows:
            typer.echo(head)
        for name, m in rows.items():
            p = _fmt(m["precision"]) + ("" if m["precision_se"] is None else f"±{m['precision_se']:.3f}")
            r = _fmt(m["recall"]) + ("" if m["recall_se"] is None else f"±{m['recall_se']:.3f}")
            typer.echo(
                f"  {name:<24} {m['tp']:>4} {m['fp']:>4} {m['fn']:>4} {m['tn']:>4}  {p:<13} {r:<13} "
                f"{_fmt(m['f1']):>6} {_fmt(m['balanced_accuracy']):>7}"
            )
            if m.get("failed_cells"):
                typer.echo(f"    failed cells (counted as no): {', '.join(m['failed_cells'])}")
            if "steps" in m:
                st = m["steps"]
                typer.echo(
                    f"    labelled steps: {st['exact']} exact, {st['within_1']} within ±1 of {st['checked']} checkable"
                )


def formats_cmd(as_json: bool = JSON_OPTION) -> None:
    """List the installed log formats and probe packs: name, package, version, what each detects."""
    # startup: loading the formats imports every adapter module
    from pipeline.adapters import installed
    from pipeline.probes.packs import installed_packs

    rows = [
        {"name": n, "package": i.package, "version": i.version, "entry_point": i.entry,
         "detects": i.adapter.detects or i.adapter.description, "description": i.adapter.description}
        for n, i in installed().items()
    ]  # fmt: skip
    packs = [
        {"name": p.name, "package": p.package, "version": p.version, "entry_point": p.entry,
         "probes": [pr.probe_id for pr in p.probes]}
        for p in installed_packs()
    ]  # fmt: skip
    if as_json:
        emit_json({"formats": rows, "probe_packs": packs})
        return
    width = max(len(r["name"]) for r in rows)
    pkg = max(len(f"{r['package']} {r['version']}") for r in rows)
    typer.echo(f"{len(rows)} formats (lunasol bundle import FORMAT|auto SRC DEST):")
    for r in rows:
        typer.echo(f"  {r['name']:<{width}}  {r['package'] + ' ' + r['version']:<{pkg}}  {r['detects']}")
    typer.echo(f"{len(packs)} probe packs:" if packs else "probe packs: none installed beyond the built-in probes")
    for p in packs:
        typer.echo(f"  {p['name']}  {p['package']} {p['version']}  {len(p['probes'])} probes: {', '.join(p['probes'])}")


def register(app: typer.Typer) -> None:
    """Add ``bundle import`` to the bundle sub-app, ``eval`` and ``formats`` to the root app."""
    bundle_app.command("import")(import_cmd)
    app.command("eval")(eval_cmd)
    app.command("formats")(formats_cmd)
