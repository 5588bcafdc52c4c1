"""Numbered migrations of lunasol's JSON artifacts, applied in order by :mod:`pipeline.artifacts.schemas`.

Each module ``mNNNN_<artifact>_v<a>_to_v<b>.py`` upgrades one artifact by one version and
defines ``NUMBER``, ``ARTIFACT`` (a :data:`pipeline.artifacts.schemas.REGISTRY` name), ``FROM_VERSION``,
``TO_VERSION`` and ``upgrade(doc) -> doc``. Numbers are unique and never reused; a module is
never edited after it shipped (a fix is a new migration). Version 0 means "written before the
artifact carried ``schema_version``": the same fields, no version. See docs/schemas.md.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Doc = dict[str, Any]

_MODULE_NAME = re.compile(r"^m(\d{4})_([a-z0-9_]+)_v(\d+)_to_v(\d+)$")


@dataclass(frozen=True)
class Migration:
    """One numbered step: ``artifact`` from ``from_version`` to ``to_version``."""

    number: int
    name: str
    artifact: str
    from_version: int
    to_version: int
    upgrade: Callable[[Doc], Doc]
    summary: str


def add_schema_version(doc: Doc, version: int) -> Doc:
    """A copy of ``doc`` with ``schema_version`` set (the whole v0 -> v1 step of most artifacts)."""
    return {**doc, "schema_version": version}


def _load(module_name: str) -> Migration:
    m = _MODULE_NAME.match(module_name)
    if m is None:
        raise RuntimeError(f"pipeline.migrations.{module_name}: name must read mNNNN_<artifact>_v<a>_to_v<b>")
    mod = importlib.import_module(f"{__name__}.{module_name}")
    migration = Migration(
        number=int(mod.NUMBER),
        name=module_name,
        artifact=str(mod.ARTIFACT),
        from_version=int(mod.FROM_VERSION),
        to_version=int(mod.TO_VERSION),
        upgrade=mod.upgrade,
        summary=(mod.__doc__ or "").strip().splitlines()[0] if mod.__doc__ else "",
    )
    # The file name repeats the module's constants so a listing reads like the registry; they must agree.
    if (int(m.group(1)), int(m.group(3)), int(m.group(4))) != (
        migration.number,
        migration.from_version,
        migration.to_version,
    ):
        raise RuntimeError(f"pipeline.migrations.{module_name}: name and constants disagree")
    return migration


def all_migrations() -> tuple[Migration, ...]:
    """Every migration module of this package, ordered by number (numbers unique)."""
    names = sorted(info.name for info in pkgutil.iter_modules(__path__) if info.name.startswith("m"))
    found = tuple(sorted((_load(n) for n in names), key=lambda mig: mig.number))
    numbers = [mig.number for mig in found]
    if len(set(numbers)) != len(numbers):
        raise RuntimeError(f"pipeline.migrations: duplicate migration numbers in {numbers}")
    return found


__all__ = ["Doc", "Migration", "add_schema_version", "all_migrations"]
