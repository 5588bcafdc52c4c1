"""``lunasol runs``: the runs under a runs directory, with state, bundle, model and key figures."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from pydantic import BaseModel

from pipeline.artifacts.run_info import Pilot, RunInfo
from pipeline.artifacts.rundir import BLOCK, HANDOFF, PATTERNS, RUN, SMALL, RunArtifacts, RunDir
from pipeline.core import duck
from pipeline.core.errors import BadInput, LunasolError
from pipeline.diff.compare import call_totals
from pipeline.run.status import missing_outputs
from pipeline.state.blocking import BlockReceipt
from pipeline.state.handoff import Handoff
from pipeline.state.ledger import Ledger


class RunSummary(BaseModel):
    """One line of ``lunasol runs``."""

    run_id: str
    path: str
    state: str
    bundle: str | None = None
    bundle_digest: str | None = None
    model: str | None = None
    cells: int | None = None
    pilot: Pilot | None = None  # a pilot run: ``cells`` is its subset of the eligible cells
    patterns: int | None = None
    weaknesses: int | None = None
    proposals: int | None = None
    calls: int | None = None
    cost_usd: float | None = None  # None with calls: no price known for the model (shown as "unknown")
    error: str | None = None  # an artifact that could not be read (the run is still listed)


# handoff.json keys in flow order: the first one not done says where the run is.
FLOW_KEYS = ("userRootCauseConfirmation", "proposalGeneration", "proposalSelection")
DONE = {"done", "confirmed", "selected", "none", "complete", "completed", "verified", "partially_confirmed"}


def run_state(arts: RunArtifacts) -> str:
    """A short state: blocked, awaiting a gate, or the last stage reached (a broken receipt or handoff: BadInput)."""
    block = arts.typed(BLOCK, BlockReceipt)
    if block is not None:
        return f"blocked: {block.constraint_class or 'blocked'}" + (f" at {block.stage}" if block.stage else "")
    h = arts.typed(HANDOFF, Handoff)
    if h is not None:
        flow = {key: str(getattr(h, key)) for key in FLOW_KEYS}
        for key, val in flow.items():
            if val not in DONE and val != "not_started":
                return f"{key}: {val}"
        for key, val in reversed(flow.items()):
            if val in DONE:
                return f"{key}: {val}"
        return h.phase
    # No handoff: infer from the artifacts present.
    for name, present in (
        ("proposals written", arts.proposals is not None),
        ("shortlist written", arts.shortlist is not None),
        ("patterns written", arts.patterns is not None or RunDir(arts.path).patterns.is_file()),
        ("exported", arts.ir_path.is_file()),
    ):
        if present:
            return name
    return "empty"


def _model(run: RunInfo) -> str | None:
    settings = run.inputs.models if run.inputs else None
    if settings is None or not (settings.model or settings.mode):
        return None
    return " ".join(str(x) for x in (settings.model, f"({settings.mode})" if settings.mode else None) if x)


def _bundle(run: RunInfo) -> tuple[str | None, str | None]:
    return (Path(run.bundle).name if run.bundle else None), run.bundle_digest or None


def _ir_cells(arts: RunArtifacts) -> int | None:
    if not arts.ir_path.is_file():
        return None
    try:
        con = duck.connect(arts.ir_path, read_only=True)
        try:
            row = con.execute("SELECT count(*) FROM cells WHERE eligibility = 'valid_behavior'").fetchone()
        finally:
            con.close()
    except Exception:  # a locked or half-written IR must not hide the run from the list
        return None
    return int(row[0]) if row else None


def _lock_held(path: Path) -> bool:
    if not path.is_file():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing releases the shared lock we may have taken
    return False


def activity(path: Path, ledger: Ledger | None = None) -> str | None:
    """What a run is doing: "running: STAGE" while one works on it, "interrupted during STAGE" after a Ctrl-C."""
    try:
        entries = list((ledger or Ledger(path)).entries(per_cell=False))
    except LunasolError:
        return None
    pending = [name for name, e in entries if e.state == "pending"]
    if not pending:
        return None
    return f"running: {pending[0]}" if _lock_held(RunDir(path).run_lock) else f"interrupted during {pending[0]}"


def summarise_run(path: Path) -> RunSummary:
    """Key figures of one run directory (never raises for a broken artifact: it is named in ``error``).

    Patterns are counted, not parsed, and the pattern groups are not read: at 10,000 cells they are
    tens of MB a run, and a listing of many runs read them all (2 s and 450 MiB a run).
    """
    try:
        rd = RunDir(path)
        arts = rd.read(SMALL | {"calls"})
        patterns = rd.count_rows(PATTERNS)
        run = arts.typed(RUN, RunInfo) or RunInfo()
        state = run_state(arts)
    except LunasolError as exc:
        return RunSummary(run_id=path.name, path=str(path), state="unreadable", error=exc.one_line())
    bundle, bundle_digest = _bundle(run)
    totals = call_totals(arts.calls) if arts.calls is not None else None
    try:
        ledger: Ledger | None = Ledger(path)  # read once: for the activity and the missing outputs
    except LunasolError:
        ledger = None
    if arts.block is None:
        state = activity(path, ledger) or state  # a run stopped by Ctrl-C is not "exported"
    return RunSummary(
        run_id=arts.run_id,
        path=str(path),
        state=state,
        bundle=bundle,
        bundle_digest=bundle_digest,
        model=_model(run),
        cells=_ir_cells(arts),
        pilot=run.pilot,
        patterns=patterns,
        weaknesses=len(arts.weaknesses) if arts.weaknesses is not None else None,
        proposals=len(arts.proposals) if arts.proposals is not None else None,
        calls=totals.calls if totals else None,
        cost_usd=totals.cost_usd if totals and totals.cost_known else None,  # None: unknown, as `calls` says
        error=_missing(path, ledger),
    )


def _missing(path: Path, ledger: Ledger | None) -> str | None:
    # A run whose verified outputs are gone must not list as a finished one.
    try:
        gone = missing_outputs(path, ledger)
    except LunasolError as exc:
        return exc.one_line()
    return f"missing {', '.join(gone)}" if gone else None


def list_runs(runs_dir: Path) -> list[RunSummary]:
    """Every run directory directly under ``runs_dir`` (sorted by name)."""
    if not runs_dir.is_dir():
        raise BadInput(f"runs directory not found: {runs_dir}")
    out = []
    for child in sorted(runs_dir.iterdir()):
        if child.is_dir() and RunDir(child).is_run():
            out.append(summarise_run(child))
    return out
