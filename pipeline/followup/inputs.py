"""Load the parent and child runs of a follow-up and refuse, in one line, what cannot be judged.

Refusals (:class:`~pipeline.errors.BadInput`, exit 2): the parent has no gate-2 selection, the
selection is another proposal or was made on another ``proposals.yaml``, the child's request does
not name the parent's harness and the proposal, the child is the same bundle or not a later
generation, either run is not analysed up to gate 1, or a bundle changed since its run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.artifacts.proposal_card import ProposalCard
from pipeline.artifacts.proposals_file import read_entries
from pipeline.artifacts.run_info import RunInfo
from pipeline.artifacts.rundir import GROUPS, RUN, SHORTLIST, RunDir
from pipeline.bundle.request import AnalysisRequest, load_request
from pipeline.core import duck
from pipeline.core.canonical import digest, read_json, sha256_file
from pipeline.core.errors import BadInput, LunasolError
from pipeline.gates.gate1 import Receipt
from pipeline.run.runner import bundle_digest
from pipeline.sol.shortlist import Shortlist, read_shortlist
from pipeline.state import handoff as hf

Row = dict[str, Any]


@dataclass
class RunSide:
    """What the follow-up reads from one run."""

    run_dir: Path
    run_id: str
    request: AnalysisRequest
    bundle_digest: str
    shortlist: Shortlist
    groups: list[Row]
    cells: dict[str, str] = field(default_factory=dict)  # eligible, analysed cell -> task family
    not_analysed: list[str] = field(default_factory=list)
    harnesses: list[str] = field(default_factory=list)  # cells.harness values of the eligible cells
    outcomes: dict[str, Row] = field(default_factory=dict)  # cell -> sidecar row


@dataclass
class Selection:
    """The parent's gate-2 selection: the card and the receipt that chose it."""

    card: ProposalCard
    card_digest: str
    proposals_digest: str
    receipt_path: str
    receipt_digest: str


def _run_json(run_dir: Path) -> RunInfo:
    rd = RunDir(run_dir)
    if not rd.run_json.is_file():
        raise BadInput(f"not a lunasol run directory: {run_dir} (expected {RUN.filename} inside)")
    return rd.need(RUN, RunInfo)


def _bundle_of(run_dir: Path, run: RunInfo, what: str) -> tuple[AnalysisRequest, str]:
    """The run's frozen bundle (request, digest), checked unchanged since the run read it."""
    rel, recorded = run.bundle, run.bundle_digest
    if rel is None or recorded is None:
        raise BadInput(f"{what} run {run_dir} does not record its bundle (run.json bundle / bundle_digest)")
    bundle = (run_dir / rel).resolve()
    if not bundle.is_dir():
        raise BadInput(f"{what} run {run_dir}: its bundle {bundle} is gone; the follow-up cites its raw lines")
    now = bundle_digest(bundle)
    if now != recorded:
        raise BadInput(f"{what} bundle {bundle} changed since run {run_dir} read it ({now} != {recorded})")
    return load_request(bundle), recorded


def ir_rows(run_dir: Path, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    """Rows of a read-only query on the run's IR."""
    path = RunDir(run_dir).ir
    if not path.is_file():
        raise BadInput(f"{run_dir} has no {path.name}: export the run first")
    con = duck.connect(path, read_only=True)
    try:
        return con.execute(sql, params or []).fetchall()
    finally:
        con.close()


def load_side(run_dir: Path, what: str) -> RunSide:
    """One run analysed up to gate 1: bundle, shortlist, pattern groups, eligible cells, outcomes."""
    run = _run_json(run_dir)
    request, bundle_digest = _bundle_of(run_dir, run, what)
    rd = RunDir(run_dir)
    doc = rd.document(GROUPS)
    if doc is None or not rd.shortlist.is_file():
        raise BadInput(
            f"{what} run {run_dir} is not analysed up to gate 1 (no {GROUPS.filename} or {SHORTLIST.filename}): "
            f"lunasol run BUNDLE first"
        )
    shortlist = read_shortlist(rd.shortlist)
    groups = [g for g in doc.get("groups", []) if isinstance(g, dict)]
    not_analysed = sorted(str(c) for c in (doc.get("totals", {}).get("cells_not_analysed") or []))
    side = RunSide(
        run_dir=run_dir,
        run_id=run.run_id or run.analysis_run_id or run_dir.name,
        request=request,
        bundle_digest=bundle_digest,
        shortlist=shortlist,
        groups=groups,
        not_analysed=not_analysed,
    )
    skip = set(not_analysed)
    harnesses: set[str] = set()
    for cell_id, task_id, harness in ir_rows(
        run_dir, "SELECT cell_id, task_id, harness FROM cells WHERE eligibility = 'valid_behavior' ORDER BY cell_id"
    ):
        if harness:
            harnesses.add(str(harness))
        if cell_id not in skip:
            side.cells[str(cell_id)] = str(task_id)
    side.harnesses = sorted(harnesses)
    cols = ("label", "quality", "completion", "cost", "stability")
    for row in ir_rows(run_dir, f"SELECT cell_id, {', '.join(cols)} FROM outcomes ORDER BY cell_id"):
        if row[0] in side.cells:
            side.outcomes[str(row[0])] = dict(zip(cols, row[1:], strict=True))
    return side


def load_selection(parent_dir: Path, proposal_id: str) -> Selection:
    """The parent's gate-2 selection of ``proposal_id``, checked against the current proposals.yaml."""
    h = hf.load(parent_dir)
    rel = h.receipts.get("gate2")
    if h.proposalSelection != "selected" or not rel:
        raise BadInput(
            f"parent run {parent_dir} has no gate-2 selection (proposalSelection: {h.proposalSelection}); "
            f"select the card first: {hf.select_command(parent_dir, h, f'--proposal {proposal_id}')}"
        )
    receipt_file = parent_dir / rel
    if not receipt_file.is_file():
        raise BadInput(f"parent run {parent_dir}: its gate-2 receipt {rel} is missing")
    try:
        receipt = Receipt.model_validate(read_json(receipt_file))
    except (ValueError, LunasolError) as exc:
        raise BadInput(f"{receipt_file}: not a valid gate receipt ({str(exc).splitlines()[0]})") from None
    chosen = receipt.request.get("proposal_id")
    if chosen != proposal_id:
        raise BadInput(f"{proposal_id} was not selected in parent run {parent_dir}: gate 2 selected {chosen}")
    proposals = RunDir(parent_dir).proposals
    if not proposals.is_file():
        raise BadInput(f"parent run {parent_dir} has no {proposals.name}")
    proposals_digest = sha256_file(proposals)
    if receipt.subject.digest != proposals_digest:
        raise BadInput(
            f"parent run {parent_dir}: gate 2 selected {proposal_id} in another proposals.yaml "
            f"({receipt.subject.digest}, now {proposals_digest}); select again"
        )
    entries = [e for e in read_entries(proposals) if isinstance(e, dict) and e.get("proposal_id") == proposal_id]
    if len(entries) != 1:
        raise BadInput(f"parent run {parent_dir}: proposals.yaml holds {len(entries)} card(s) {proposal_id}")
    try:
        card = ProposalCard.model_validate(entries[0])
    except ValueError as exc:
        raise BadInput(f"{proposals}: card {proposal_id} is not a valid card ({str(exc).splitlines()[0]})") from None
    return Selection(
        card=card,
        card_digest=digest(card.model_dump(mode="json")),
        proposals_digest=proposals_digest,
        receipt_path=rel,
        receipt_digest=receipt.receipt_digest or sha256_file(receipt_file),
    )


def check_lineage(parent: RunSide, child: RunSide, card: ProposalCard) -> None:
    """The child's request must name the parent's harness and this proposal, as a later generation."""
    impl = child.request.implements
    harness = parent.request.parent_harness
    if child.bundle_digest == parent.bundle_digest:
        raise BadInput("the child run analysed the same bundle as the parent: a follow-up needs the next generation")
    if impl is None:
        raise BadInput(
            f"child run {child.run_dir}: its analysis-request.json does not say what it implements "
            f'(add "implements": {{"parent_harness": "{harness}", "proposal_id": "{card.proposal_id}"}})'
        )
    if impl.parent_harness != harness:
        raise BadInput(
            f"child run {child.run_dir} implements a change of harness {impl.parent_harness}, "
            f"not of the parent's harness {harness}"
        )
    if impl.proposal_id != card.proposal_id:
        raise BadInput(f"child run {child.run_dir} implements {impl.proposal_id}, not {card.proposal_id}")
    if impl.parent_run_id is not None and impl.parent_run_id not in (parent.run_id, parent.request.analysis_run_id):
        raise BadInput(f"child run {child.run_dir} names parent run {impl.parent_run_id}, not {parent.run_id}")
    if child.request.generation <= parent.request.generation:
        raise BadInput(
            f"child run {child.run_dir} is generation {child.request.generation}, "
            f"not later than the parent's {parent.request.generation}"
        )
