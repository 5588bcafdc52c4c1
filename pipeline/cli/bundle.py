"""``lunasol bundle``: freeze and verify frozen bundles (other verbs may be added to ``bundle_app``)."""

from __future__ import annotations

from pathlib import Path

import typer

from pipeline.cli.common import JSON_OPTION, emit_json
from pipeline.core.errors import EXIT_FINDINGS

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
    total = sum(f.size for f in manifest.files)
    if as_json:
        emit_json({"manifest": str(bundle / MANIFEST_FILE), "files": len(manifest.files), "bytes": total})
        return
    typer.echo(f"froze {len(manifest.files)} files ({total:,} bytes) into {bundle / MANIFEST_FILE}")


@bundle_app.command("verify")
def verify_cmd(bundle: Path = typer.Argument(..., help="Bundle directory."), as_json: bool = JSON_OPTION) -> None:
    """Re-hash every file; list changed / missing / extra files (exit 1 when any)."""
    # startup: `lunasol --help` and every other verb load none of this
    from pipeline.bundle.manifest import verify

    report = verify(bundle)
    if as_json:
        emit_json(report.to_json())
    elif report.ok:
        typer.echo(f"ok: {report.files} files match the manifest")
    else:
        for line in report.lines():
            typer.echo(line)
    if not report.ok:
        raise typer.Exit(EXIT_FINDINGS)


def register(app: typer.Typer) -> None:
    """Add ``bundle`` and its verbs to the root app."""
    app.add_typer(bundle_app, name="bundle")
