"""Plugins through Python entry points: formats (``lunasol.formats``) and probe packs (``lunasol.probes``).

An installed package adds a format or a probe pack by naming an object in its metadata; nothing of
lunasol changes. lunasol's own formats are registered the same way (its ``pyproject.toml``). This
module reads the metadata only (cheap: no plugin module is imported until :func:`load` is called),
so the CLI can list the names in its help without loading any adapter.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from pipeline.core.errors import BadInput

FORMATS_GROUP = "lunasol.formats"
PROBES_GROUP = "lunasol.probes"
OWN_PACKAGE = "lunasol"


@dataclass(frozen=True)
class Plugin:
    """One entry point: its name, where it points, and the package that declares it."""

    group: str
    name: str
    value: str  # "module:attribute"
    package: str
    version: str
    entry: EntryPoint

    @property
    def builtin(self) -> bool:
        """Declared by lunasol itself."""
        return self.package == OWN_PACKAGE


def plugins(group: str) -> list[Plugin]:
    """Every installed entry point of ``group``: lunasol's own first, then by package and name.

    Two packages declaring one name: the first (lunasol's own, else the alphabetically first
    package) is kept, so the choice does not depend on install order.
    """
    found: dict[str, Plugin] = {}
    eps = sorted(
        entry_points(group=group),
        key=lambda ep: (_package(ep) != OWN_PACKAGE, _package(ep), ep.name),
    )
    for ep in eps:
        dist = ep.dist
        p = Plugin(group, ep.name, ep.value, _package(ep), dist.version if dist else "?", ep)
        found.setdefault(p.name, p)
    return list(found.values())


def _package(ep: EntryPoint) -> str:
    return ep.dist.metadata["Name"] if ep.dist is not None else "?"


def names(group: str) -> list[str]:
    """The names registered under ``group`` (metadata only)."""
    return [p.name for p in plugins(group)]


def load(p: Plugin) -> Any:
    """The object a plugin names; a plugin that fails to load is one BadInput line naming its package."""
    try:
        return p.entry.load()
    except Exception as exc:  # a third-party module may raise anything at import
        raise BadInput(
            f"{p.group} plugin {p.name!r} of package {p.package} {p.version} cannot be loaded ({p.value}): "
            f"{type(exc).__name__}: {exc}; fix or uninstall that package"
        ) from None
