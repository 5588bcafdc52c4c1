"""Deterministic probes: pattern candidates found in the IR without a model (seed 002's cascade)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.core.errors import BadInput
from pipeline.probes.core import (
    PROBES,
    Probe,
    ProbeHit,
    normalise_key,
    read_probe_hits,
    run_probes,
    write_probe_hits,
)

if TYPE_CHECKING:
    from pipeline.core.context import RunContext

__all__ = [
    "PROBES",
    "Probe",
    "ProbeHit",
    "normalise_key",
    "read_probe_hits",
    "run_probes",
    "stage",
    "write_probe_hits",
]


def stage(ctx: RunContext) -> str:
    """Run every probe over the run's IR and store the hits in table ``probe_hits``."""
    import duckdb

    if not ctx.ir_path.is_file():
        raise BadInput(f"no IR at {ctx.ir_path}: export must run before probes")
    con = duckdb.connect(str(ctx.ir_path))
    try:
        hits = run_probes(con)
        write_probe_hits(con, hits)
    finally:
        con.close()
    by_probe: dict[str, int] = {}
    for h in hits:
        by_probe[h.probe_id] = by_probe.get(h.probe_id, 0) + 1
    detail = ", ".join(f"{k} {v}" for k, v in sorted(by_probe.items())) or "none"
    cells = len({h.cell_id for h in hits})
    return f"{len(hits)} probe hits in {cells} cells ({detail})"
