"""Probe packs as plugins: folders of ``<probe_id>.sql`` files registered under ``lunasol.probes``.

A package adds probes with no change to lunasol by naming, in its metadata, a :class:`ProbePack`
(or the folder itself, a ``Path``). Every pack's probes meet the same contract as ``--probes DIR``
(:func:`pipeline.probes.files.load_probe_dir`) and run in the probes stage after the shipped ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from pipeline.core import plugins
from pipeline.core.errors import BadInput
from pipeline.probes.engine import PROBES
from pipeline.probes.files import Probe, load_probe_dir


@dataclass(frozen=True)
class ProbePack:
    """What a package registers: a name and the folder holding its ``.sql`` probes."""

    name: str
    folder: Path


@dataclass(frozen=True)
class InstalledPack:
    """One installed pack, its package and its checked probes."""

    name: str
    package: str
    version: str
    entry: str
    probes: tuple[Probe, ...]


@lru_cache(maxsize=1)
def installed_packs() -> tuple[InstalledPack, ...]:
    """Every installed probe pack, its probes checked (ids unique across shipped probes and packs)."""
    out: list[InstalledPack] = []
    taken = PROBES
    for p in plugins.plugins(plugins.PROBES_GROUP):
        obj = plugins.load(p)
        folder = obj.folder if isinstance(obj, ProbePack) else obj
        if not isinstance(folder, Path):
            raise BadInput(
                f"lunasol.probes plugin {p.name!r} of package {p.package} points at {p.value}, "
                "which is neither a ProbePack nor a folder Path"
            )
        probes = load_probe_dir(folder, taken)
        taken += probes
        out.append(InstalledPack(p.name, p.package, p.version, p.value, probes))
    return tuple(out)


def pack_probes() -> tuple[Probe, ...]:
    """The probes of every installed pack, in pack order."""
    return tuple(pr for pack in installed_packs() for pr in pack.probes)
