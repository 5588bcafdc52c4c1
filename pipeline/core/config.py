"""Settings from a config file: ``lunasol.toml`` or ``[tool.lunasol]`` in ``pyproject.toml`` (working directory).

Precedence, highest first: command-line flags > ``LUNASOL_*`` env vars > ``lunasol.toml`` >
``pyproject.toml`` ``[tool.lunasol]`` > defaults. Every model setting of
:class:`pipeline.core.settings.ModelSettings` except the per-command ``mode`` and ``store`` can be
set in a file (``model``, ``api_base``, ``concurrency``, ``budget_usd``, ``budget_tokens``,
``timeout_s``, ...); the env var of a setting is ``LUNASOL_`` + its name in capitals. An unknown
key or a bad value in a file is bad input naming the file and the key.

tomllib (stdlib) reads the files; pydantic validates the merged values once, in
:class:`~pipeline.core.settings.ModelSettings`. pydantic-settings was considered: its sources do
not say where a value came from, which ``lunasol config`` must show, so the few lines here are simpler.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from pipeline.core.errors import BadInput

CONFIG_FILE = "lunasol.toml"
PYPROJECT = "pyproject.toml"
NOT_IN_FILES = frozenset({"mode", "store"})  # chosen per command (--replay / --record), never by a file


def env_var(field: str) -> str:
    """The env var of a setting."""
    return "LUNASOL_" + field.upper()


def _read(path: Path, table: tuple[str, ...]) -> dict[str, Any]:
    try:
        doc: Any = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: not valid TOML ({' '.join(str(exc).split())})") from None
    for key in table:
        doc = doc.get(key, {}) if isinstance(doc, dict) else {}
    if not isinstance(doc, dict):
        raise BadInput(f"{path}: [{'.'.join(table)}] must be a table")
    return doc


def file_values(fields: set[str], cwd: Path | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """Values set in the config files of ``cwd`` and, per field, the file (and table) that set it."""
    root = cwd or Path.cwd()
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    allowed = fields - NOT_IN_FILES
    for path, table, where in (
        (root / PYPROJECT, ("tool", "lunasol"), f"{PYPROJECT} [tool.lunasol]"),
        (root / CONFIG_FILE, (), CONFIG_FILE),  # read last: it overrides pyproject.toml
    ):
        if not path.is_file():
            continue
        found = _read(path, table)
        unknown = sorted(set(found) - allowed)
        if unknown:
            raise BadInput(f"{where}: unknown setting {', '.join(unknown)} (known: {', '.join(sorted(allowed))})")
        values.update(found)
        origin.update(dict.fromkeys(found, where))
    return values, origin


def env_values(fields: set[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """Values set by ``LUNASOL_*`` env vars (empty ones ignored) and their var names."""
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for field in sorted(fields - NOT_IN_FILES):
        var = env_var(field)
        if os.environ.get(var):
            values[field] = os.environ[var]
            origin[field] = var
    return values, origin
