"""``lunasol schema [NAME] [-o DIR]``: the JSON Schema of lunasol's artifacts, exported from the pydantic models."""

from __future__ import annotations

from pathlib import Path

import typer

from pipeline.core.canonical import atomic_write_text, pretty_json
from pipeline.core.errors import BadInput


def register(app: typer.Typer) -> None:
    """Add ``schema`` to the root app."""

    @app.command("schema")
    def schema_cmd(
        name: str | None = typer.Argument(None, help="Artifact name (e.g. handoff); omit to list them all."),
        out: Path | None = typer.Option(
            None, "-o", "--output", help="Write every artifact's schema to DIR/<name>.json (or NAME's only)."
        ),
    ) -> None:
        """JSON Schema of an artifact (handoff, run, weakness-shortlist, ...), exported from its pydantic model."""
        # startup: `lunasol --help` and every other verb load none of this
        from pipeline import catalog as schemas

        if out is not None and out.exists() and not out.is_dir():
            raise BadInput(f"-o {out} is a file; give a directory")
        if name is not None:
            art = schemas.get(name)  # unknown: one line listing the known names, exit 2
            text = pretty_json(art.json_schema())
            if out is None:
                typer.echo(text, nl=False)
                return
            out.mkdir(parents=True, exist_ok=True)
            atomic_write_text(out / f"{art.name}.json", text)
            typer.echo(f"wrote {out / f'{art.name}.json'}")
            return
        if out is not None:
            paths = schemas.export_all(out)
            typer.echo(f"wrote {len(paths)} schemas to {out}")
            return
        width = max(len(n) for n in schemas.REGISTRY)
        for art in schemas.REGISTRY.values():
            typer.echo(f"{art.name:<{width}}  v{art.version}  {art.filename:<30}  {art.model_path}")
        typer.echo("lunasol schema NAME prints one; lunasol schema -o DIR writes them all")
