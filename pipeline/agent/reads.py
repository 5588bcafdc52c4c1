"""Every read of a run directory the agent surface makes, in one place, through the typed loaders.

The MCP server and the handoff brief read a run only through these functions, so that one owner
of the run directory can replace them wholesale. Nothing here writes: the handoff state, the
shortlist, the cards, the gate receipts and followup.json are read with the loaders their stages
write them with (schema version and digest checked), and the IR is opened read-only.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.artifacts.proposal_card import ProposalCard
from pipeline.artifacts.proposals_file import read_entries
from pipeline.artifacts.rundir import FOLLOWUP, RUN, VALIDATION, RunDir
from pipeline.core import duck
from pipeline.core.canonical import read_json
from pipeline.core.errors import BadInput
from pipeline.gates.gate2 import selection_status
from pipeline.run.status import status
from pipeline.sol.corpus import read_groups
from pipeline.sol.shortlist import Shortlist, read_shortlist
from pipeline.state import handoff
from pipeline.state.handoff import Handoff

if TYPE_CHECKING:
    import duckdb

    from pipeline.followup.schema import Followup

FOLLOWUP_FILE = FOLLOWUP.filename


def check_run(run_dir: Path) -> None:
    """Refuse, in one line, what is not a lunasol run directory."""
    RunDir(run_dir).require()


def run_json(run_dir: Path) -> dict[str, Any]:
    """run.json as written by export (an empty dict when it is not an object)."""
    return RunDir(run_dir).document(RUN) or {}


def run_id_of(run_dir: Path) -> str:
    """The run's id: run.json's, else the directory name."""
    raw = run_json(run_dir)
    for key in ("run_id", "analysis_run_id"):
        if isinstance(raw.get(key), str) and raw[key]:
            return str(raw[key])
    return run_dir.name


def state(run_dir: Path) -> Handoff:
    """The run's state machine (handoff.json)."""
    return handoff.load(run_dir)


def run_status(run_dir: Path) -> dict[str, Any]:
    """What ``lunasol status`` shows, as data (no provider is asked)."""
    return status(run_dir, poll=False)


def shortlist(run_dir: Path) -> Shortlist | None:
    """The sealed weakness shortlist (digest checked), or None before Sol."""
    path = RunDir(run_dir).shortlist
    return read_shortlist(path) if path.is_file() else None


def proposal_cards(run_dir: Path) -> tuple[list[ProposalCard], list[str]]:
    """The cards of proposals.yaml as validated models, and one line per entry that is not a valid card."""
    path = RunDir(run_dir).proposals
    if not path.is_file():
        return [], []
    cards: list[ProposalCard] = []
    problems: list[str] = []
    for n, entry in enumerate(read_entries(path), start=1):
        try:
            cards.append(ProposalCard.model_validate(entry))
        except ValueError as exc:
            problems.append(f"{path} entry {n}: not a valid card ({str(exc).splitlines()[0]})")
    return cards, problems


def validation(run_dir: Path) -> dict[str, Any] | None:
    """validation.json (the validator's findings per card), or None."""
    return RunDir(run_dir).document(VALIDATION)


def selection(run_dir: Path) -> dict[str, Any] | None:
    """Gate 2 as ``lunasol status`` shows it (None before any proposal)."""
    return selection_status(run_dir) if RunDir(run_dir).proposals.is_file() else None


def gate_receipts(run_dir: Path) -> dict[str, dict[str, Any]]:
    """The current receipt of each gate the handoff names (gate -> receipt JSON)."""
    out: dict[str, dict[str, Any]] = {}
    for gate, rel in sorted(state(run_dir).receipts.items()):
        path = run_dir / rel
        raw = read_json(path) if path.is_file() else None
        if isinstance(raw, dict):
            out[gate] = {"path": rel, **raw}
    return out


def groups(run_dir: Path) -> list[dict[str, Any]]:
    """The Coordinator's pattern groups (empty when absent)."""
    return read_groups(run_dir)


def followup_of(run_dir: Path) -> Followup | None:
    """The run's own followup.json (it is the child of a follow-up), validated, or None."""
    if not RunDir(run_dir).followup.is_file():
        return None
    from pipeline.followup.verdict import read_followup  # startup: followup imports the runner and its stages

    return read_followup(run_dir)


def followup_candidates(run_dir: Path, served: list[Path]) -> Iterator[Path]:
    """Run directories that may hold the follow-up of ``run_dir``'s selection: itself, the served runs, its siblings."""
    seen: set[Path] = set()
    siblings = sorted(run_dir.parent.glob(f"*/{FOLLOWUP_FILE}")) if run_dir.parent.is_dir() else []
    for path in [run_dir, *served, *(p.parent for p in siblings)]:
        key = path.resolve()
        if key not in seen and (path / FOLLOWUP_FILE).is_file():
            seen.add(key)
            yield path


@contextmanager
def ir(run_dir: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    """The run's IR, read-only, with no external access (no files, no ATTACH, no extension downloads)."""
    path = RunDir(run_dir).ir
    if not path.is_file():
        raise BadInput(f"no IR in {run_dir} (run: lunasol export BUNDLE)")
    con = duck.connect(path, read_only=True, config={"enable_external_access": False})
    try:
        yield con
    finally:
        con.close()
