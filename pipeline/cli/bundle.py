"""``lunasol bundle``: freeze and verify frozen bundles (other verbs may be added to ``bundle_app``)."""

from __future__ import annotations

from pathlib import Path

import typer

from pipeline.cli.common import JSON_OPTION, emit_json
from pipeline.core.errors import EXIT_FINDINGS, BadInput

bundle_app = typer.Typer(
    name="bundle",
    help="Frozen bundles: write and check the manifest.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@bundle_app.command("freeze")
def freeze_cmd(bundle: Path = typer.Argument(..., help="Bundle directory."), as_json: bool = JSON_OPTION) -> None:
    """Write the manifest of a bundle: every file with its sha256 and size."""
    from pipeline.bundle.manifest import (
        MANIFEST_FILE,  # startup: `lunasol --help` and every other verb load none of this
        freeze,
    )

    manifest = freeze(bundle)  # refuses an empty directory: a manifest of nothing would verify forever
    total = sum(manifest.files.sizes)  # no FileEntry made per file (1.2 million at 100,000 cells)
    if as_json:
        emit_json({"manifest": str(bundle / MANIFEST_FILE), "files": len(manifest.files), "bytes": total})
        return
    typer.echo(f"froze {len(manifest.files)} files ({total:,} bytes) into {bundle / MANIFEST_FILE}")


@bundle_app.command("verify")
def verify_cmd(
    bundle: Path = typer.Argument(..., help="Bundle directory."),
    source: bool = typer.Option(
        False,
        "--source",
        help="Also list the bucket a bundle was imported from (network) and name every object changed, "
        "gone or added since the freeze.",
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Re-hash every file; list changed / missing / extra files (exit 1 when any)."""
    # startup: `lunasol --help` and every other verb load none of this
    from pipeline.bundle.manifest import verify
    from pipeline.bundle.sources import SOURCES_FILE, compare, read_sources

    report = verify(bundle)
    record = read_sources(bundle)
    if source and record is None:
        raise BadInput(f"{bundle} was not imported from object storage (no {SOURCES_FILE}); nothing to compare")
    checked = None
    if source and record is not None:
        from pipeline.core.objstore import list_objects  # startup: only --source loads fsspec's helpers

        checked = compare(record, list_objects(record.url)[1])
    ok = report.ok and (checked is None or checked.ok)
    if as_json:
        emit_json({**report.to_json(), **({"source": checked.to_json()} if checked else {}), "ok": ok})
    else:
        if report.ok:
            typer.echo(f"ok: {report.files} files match the manifest")
        for line in report.lines():
            typer.echo(line)
        if checked is not None and checked.ok:
            typer.echo(f"ok: {checked.objects} objects under {checked.url} unchanged since the import")
        elif checked is not None:
            for line in checked.lines():
                typer.echo(line)
        elif record is not None:
            typer.echo(f"source: {record.url} ({len(record.objects)} objects; --source compares them now)")
    if not ok:
        raise typer.Exit(EXIT_FINDINGS)


def register(app: typer.Typer) -> None:
    """Add ``bundle`` and its verbs to the root app."""
    app.add_typer(bundle_app, name="bundle")
