"""``lunasol config``: the effective settings and where each one came from."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from pipeline.cli.common import JSON_OPTION, emit_json
from pipeline.core import config as cfg
from pipeline.core.settings import ModelSettings
from pipeline.core.urls import shown_url


def register(app: typer.Typer) -> None:
    """Add ``config`` to the root app."""

    @app.command("config")
    def config_cmd(as_json: bool = JSON_OPTION) -> None:
        """The effective model settings and where each came from (flag > env > lunasol.toml > pyproject > default).

        Files are read from the working directory: lunasol.toml (top-level keys) or [tool.lunasol] in
        pyproject.toml, e.g. model = "openai/gpt-4o-mini", concurrency = 4, budget_usd = 2.0.
        """
        settings, source = ModelSettings.resolve()
        values = settings.model_dump(mode="json")
        if values.get("api_base"):
            values["api_base"] = shown_url(values["api_base"])  # a pasted `lunasol config` keeps no credential
        rows = [(k, values[k], source[k]) for k in sorted(values) if k not in cfg.NOT_IN_FILES]
        files = {
            cfg.CONFIG_FILE: (Path.cwd() / cfg.CONFIG_FILE).is_file(),
            f"{cfg.PYPROJECT} [tool.lunasol]": (Path.cwd() / cfg.PYPROJECT).is_file(),
        }
        known = {cfg.env_var(k) for k in values}
        other_env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("LUNASOL_") and k not in known}
        if as_json:
            emit_json(
                {
                    "settings": {k: {"value": v, "source": s} for k, v, s in rows},
                    "files": files,
                    "other_env": other_env,
                }
            )
            return
        width = max(len(k) for k, _, _ in rows)
        typer.echo(f"{'setting':<{width}}  {'value':<28}  from")
        for k, v, s in rows:
            shown = "-" if v is None else str(v)
            typer.echo(f"{k:<{width}}  {shown:<28}  {s}")
        typer.echo(
            "files in "
            + str(Path.cwd())
            + ": "
            + ", ".join(f"{f} ({'found' if ok else 'none'})" for f, ok in files.items())
        )
        for k, v in other_env.items():
            typer.echo(f"env {k}={v}")
        typer.echo("precedence: flag > LUNASOL_* env var > lunasol.toml > pyproject.toml [tool.lunasol] > default")
