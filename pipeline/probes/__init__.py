"""Deterministic probes: pattern candidates found in the IR without a model (they outrank a model's observation)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core import duck
from pipeline.core.errors import BadInput
from pipeline.core.memory import give_back
from pipeline.probes.cells import ProbeCounts, update_probe_hits
from pipeline.probes.engine import (
    PROBES,
    ProbeHit,
    normalise_key,
    read_probe_hits,
    run_probes,
    write_probe_hits,
)
from pipeline.probes.files import HIT_COLUMNS, Probe, load_probe_dir
from pipeline.probes.packs import pack_probes

if TYPE_CHECKING:
    from pipeline.core.context import RunContext

__all__ = [
    "HIT_COLUMNS",
    "PROBES",
    "Probe",
    "ProbeCounts",
    "ProbeHit",
    "normalise_key",
    "probe_list",
    "read_probe_hits",
    "run_probes",
    "stage",
    "user_probes",
    "write_probe_hits",
]


def user_probes(folder: Path | None) -> tuple[Probe, ...]:
    """The user's probes of ``--probes DIR`` (none without it), checked against the contract."""
    return () if folder is None else load_probe_dir(folder, PROBES + pack_probes())


def probe_list(folder: Path | None) -> list[dict[str, str]]:
    """The user's probes as run.json lists them: id, file and sha256."""
    return [{"probe_id": p.probe_id, "path": p.path, "sha256": p.sha256} for p in user_probes(folder)]


def stage(ctx: RunContext) -> str:
    """Run every probe over the run's IR and store the hits in table ``probe_hits``."""
    if not ctx.ir_path.is_file():
        raise BadInput(f"no IR at {ctx.ir_path}: export must run before probes")
    probes = PROBES + pack_probes() + user_probes(ctx.options.probes_dir)  # packs: lunasol.probes plugins
    con = duck.connect(ctx.ir_path)
    try:
        found = update_probe_hits(con, probes)  # only cells whose IR changed are probed again
    finally:
        con.close()
    give_back()  # the chunks' hits and DuckDB's query memory, freed: not carried into Luna
    detail = ", ".join(f"{k} {v}" for k, v in sorted(found.by_probe.items())) or "none"
    line = f"{found.hits} probe hits in {found.cells_with_hits} cells ({detail})"
    if found.probed < found.eligible:
        line += f"; {found.probed} changed cell(s) probed, {found.eligible - found.probed} reused"
    return line
