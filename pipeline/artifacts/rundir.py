"""One run directory: where each artifact lives, and reading it typed, migrated and checked.

:class:`RunDir` is the one place that spells an artifact's file name. Every verb reads a run through
it: one artifact into its pydantic model (:meth:`RunDir.load`), the rows of a JSONL artifact
(:meth:`RunDir.rows`), or a snapshot of the whole run (:meth:`RunDir.read`, what ``diff``, ``report``,
the API and ``lunasol runs`` take). A file that is present but unreadable (truncated or empty JSON,
a newer schema, the wrong shape) is one :class:`~pipeline.core.errors.BadInput` line naming it;
an absent one is ``None``, because a run that stopped at gate 1 has no proposals and one that
blocked in Luna has no shortlist.

Models of artifacts written by stages above this layer (the shortlist, the pattern groups...) are
passed by the caller, which imports them from the stage that owns them; this module knows only the
names, files, versions and migrations, all of which sit in this layer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from pipeline.artifacts.migrations import Doc
from pipeline.artifacts.schemas import Kind, parse_document, upgrade
from pipeline.core.errors import BadInput

M = TypeVar("M", bound=BaseModel)
Row = dict[str, Any]


@dataclass(frozen=True)
class ArtifactFile:
    """One artifact of a run directory: its versioned name (``VERSIONS``), its file, how it is stored."""

    name: str
    filename: str
    kind: Kind = "json"


RUN = ArtifactFile("run", "run.json")
PATTERNS = ArtifactFile("patterns", "patterns.jsonl", "jsonl-row")
GROUPS = ArtifactFile("pattern-groups", "pattern-groups.json")
SHORTLIST = ArtifactFile("weakness-shortlist", "weakness-shortlist.json")
PROPOSALS = ArtifactFile("proposals", "proposals.yaml", "yaml")
VALIDATION = ArtifactFile("validation", "validation.json")
HANDOFF = ArtifactFile("handoff", "handoff.json")
LEDGER = ArtifactFile("ledger", "ledger.json")
CALLS = ArtifactFile("calls", "calls.jsonl", "jsonl-row")
BLOCK = ArtifactFile("block-receipt", "block-receipt.json")
FOLLOWUP = ArtifactFile("followup", "followup.json")

FILES: dict[str, ArtifactFile] = {
    a.name: a
    for a in (RUN, PATTERNS, GROUPS, SHORTLIST, PROPOSALS, VALIDATION, HANDOFF, LEDGER, CALLS, BLOCK, FOLLOWUP)
}
"""Every versioned artifact a run directory holds as one file, by name."""

# Files and folders of a run that are not versioned documents of their own.
IR_FILE = "ir.duckdb"
REPORT_FILE = "report.html"  # the single-page report of earlier versions (replaced by REPORT_DIR when rewritten)
REPORT_DIR = "report"  # the report: index.html and its data/ shards
REPORT_INDEX = "index.html"
GATES_DIR = "gates"  # gate receipts: gates/<gate>-<operation>.json
EXCHANGES_DIR = "exchanges"  # a live run's raw answers, laid out like a recording store
VERIFIED_FILE = "verified-files.json"  # the bundle files the export hashed, with their stat
SOL_MAP_DIR = "sol_map"  # Sol's map answers (<call id>.json), their request counts and plan inputs
TIMELINES_FILE = "timelines.json"  # Sol's rendered timelines, reused while their inputs hold
BATCHES_FILE = "batches.json"  # provider batches submitted for the run
BATCH_QUEUE_FILE = "batch-queue.json"  # a queue limit the provider stated
RUN_LOCK = ".run.lock"  # held by `lunasol run` while it works on the directory
HANDOFF_LOCK = ".lunasol.lock"  # serialises handoff (state machine) updates
LEDGER_LOCK = ".ledger.lock"  # serialises ledger writes


class RunDir:
    """A run directory (``runs/<id>``): the path of every artifact and typed, migrated reads of them."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # -- paths ---------------------------------------------------------------------------------
    def file(self, art: ArtifactFile) -> Path:
        """Where artifact ``art`` lives in this run."""
        return self.path / art.filename

    @property
    def run_json(self) -> Path:
        """``run.json``: what the run was made from."""
        return self.file(RUN)

    @property
    def ir(self) -> Path:
        """The run's DuckDB Trajectory IR."""
        return self.path / IR_FILE

    @property
    def patterns(self) -> Path:
        """Luna's patterns, one per line."""
        return self.file(PATTERNS)

    @property
    def groups(self) -> Path:
        """The Coordinator's pattern groups."""
        return self.file(GROUPS)

    @property
    def shortlist(self) -> Path:
        """Sol's sealed weakness shortlist."""
        return self.file(SHORTLIST)

    @property
    def proposals(self) -> Path:
        """The accepted proposal cards."""
        return self.file(PROPOSALS)

    @property
    def validation(self) -> Path:
        """What the proposer produced per weakness, with the validator's findings."""
        return self.file(VALIDATION)

    @property
    def handoff(self) -> Path:
        """The run's state machine."""
        return self.file(HANDOFF)

    @property
    def ledger(self) -> Path:
        """Each artifact's state and the digests it was made from."""
        return self.file(LEDGER)

    @property
    def calls(self) -> Path:
        """One logical model call per line."""
        return self.file(CALLS)

    @property
    def block_receipt(self) -> Path:
        """Why the run cannot go on (absent when it can)."""
        return self.file(BLOCK)

    @property
    def followup(self) -> Path:
        """A follow-up judged on this (child) run."""
        return self.file(FOLLOWUP)

    @property
    def report(self) -> Path:
        """The report's page a reader opens, in its default directory (:attr:`report_dir`)."""
        return self.path / REPORT_DIR / REPORT_INDEX

    @property
    def report_dir(self) -> Path:
        """The report directory's default place: ``index.html`` and the ``data/`` it loads on demand."""
        return self.path / REPORT_DIR

    @property
    def gates(self) -> Path:
        """The folder of gate receipts."""
        return self.path / GATES_DIR

    @property
    def exchanges(self) -> Path:
        """A live run's raw model answers (a recording store)."""
        return self.path / EXCHANGES_DIR

    @property
    def verified_files(self) -> Path:
        """The bundle files the export hashed (reused while their stat holds)."""
        return self.path / VERIFIED_FILE

    @property
    def timelines(self) -> Path:
        """Sol's cached timelines."""
        return self.path / TIMELINES_FILE

    @property
    def batches(self) -> Path:
        """Provider batches submitted for the run."""
        return self.path / BATCHES_FILE

    @property
    def batch_queue(self) -> Path:
        """The provider's stated queue limit, kept for a resumed process."""
        return self.path / BATCH_QUEUE_FILE

    @property
    def run_lock(self) -> Path:
        """Held by ``lunasol run`` while it works here."""
        return self.path / RUN_LOCK

    @property
    def handoff_lock(self) -> Path:
        """Serialises state-machine updates."""
        return self.path / HANDOFF_LOCK

    @property
    def ledger_lock(self) -> Path:
        """Serialises ledger writes."""
        return self.path / LEDGER_LOCK

    def gate_receipt(self, stem: str) -> Path:
        """The receipt ``gates/<stem>.json``."""
        return self.gates / f"{stem}.json"

    def cell_results(self, role: str) -> Path:
        """The folder of one model role's per-cell results (``<role>/<cell>.json``)."""
        return self.path / role

    def is_run(self) -> bool:
        """Whether this looks like a run directory (run.json or an IR inside)."""
        return self.run_json.is_file() or self.ir.is_file()

    def require(self) -> RunDir:
        """The run directory itself, or one BadInput line when it is missing or not a run."""
        if not self.path.is_dir():
            raise BadInput(f"run directory not found: {self.path}")
        if not self.is_run():
            raise BadInput(f"not a lunasol run directory: {self.path} (expected run.json inside)")
        return self

    # -- typed reads ---------------------------------------------------------------------------
    def document(self, art: ArtifactFile) -> Doc | None:
        """Artifact ``art`` as a dict at the current version (older files upgraded in memory); None when absent."""
        path = self.file(art)
        if not path.is_file():
            return None
        return upgrade(_parse(path, art.kind), art.name, str(path))[0]

    def load(self, art: ArtifactFile, model: type[M]) -> M | None:
        """Artifact ``art`` read, migrated and validated into ``model``; None when absent."""
        doc = self.document(art)
        return None if doc is None else _validate(doc, self.file(art), art, model)

    def need(self, art: ArtifactFile, model: type[M]) -> M:
        """:meth:`load`, with one BadInput line when the file is absent."""
        got = self.load(art, model)
        if got is None:
            raise BadInput(f"{self.file(art)} not found")
        return got

    def rows(self, art: ArtifactFile, model: type[M]) -> list[M] | None:
        """Every row of a JSONL artifact, migrated and validated (errors name file and line); None when absent."""
        raw = self.raw_rows(art)
        if raw is None:
            return None
        path = self.file(art)
        return [_validate(upgrade(r, art.name, f"{path}:{n}")[0], path, art, model) for n, r in enumerate(raw, 1)]

    def raw_rows(self, art: ArtifactFile) -> list[Row] | None:
        """The JSON objects of a JSONL artifact as written (blank lines skipped); None when absent."""
        path = self.file(art)
        return read_jsonl(path) if path.is_file() else None

    def count_rows(self, art: ArtifactFile) -> int | None:
        """Non-blank lines of a JSONL artifact (its rows) without parsing them; None when absent."""
        path = self.file(art)
        if not path.is_file():
            return None
        n = 0
        with path.open("rb") as fh:
            for line in fh:
                n += bool(line.strip())
        return n

    def receipts(self) -> dict[str, Row]:
        """Every gate receipt, by file stem, as written (the folder may be absent)."""
        out: dict[str, Row] = {}
        if self.gates.is_dir():
            for receipt in sorted(self.gates.glob("*.json")):
                obj = _parse(receipt, "json")
                if not isinstance(obj, dict):
                    raise BadInput(f"{receipt}: expected a JSON object (a gate receipt)")
                out[receipt.stem] = obj
        return out

    def read(self, only: frozenset[str] | None = None) -> RunArtifacts:
        """A snapshot of the artifacts ``only`` names (default :data:`ARTIFACTS`), those that exist.

        Documents are migrated to the current version and kept as dicts, field for field as
        written, so that ``diff`` compares what each run holds and the report shows it. One not
        named stays None / empty, as an absent one: a caller that asks for less knows what it left
        out (``lunasol runs`` and ``lunasol show`` read :data:`SMALL`; diff and report all).
        """
        only = ARTIFACTS if only is None else only
        self.require()
        run = self.document(RUN) if self.run_json.is_file() else None
        arts = RunArtifacts(path=self.path, run=run or {})
        if "patterns" in only and self.patterns.is_file():
            arts.patterns = self.raw_rows(PATTERNS)
        if "groups" in only and (groups := self.document(GROUPS)) is not None:
            arts.groups_doc = groups
            arts.groups = _list_of(groups, "groups", self.groups)
        if "shortlist" in only:
            arts.shortlist = self.document(SHORTLIST)
            if arts.shortlist is not None:
                _list_of(arts.shortlist, "weaknesses", self.shortlist)
                _list_of(arts.shortlist, "dropped", self.shortlist)
        if "proposals" in only and self.proposals.is_file():
            # lazy: PyYAML loads only when a proposals file is read (`lunasol --help` stays light)
            from pipeline.artifacts.proposals_file import read_entries

            arts.proposals = [r for r in read_entries(self.proposals) if isinstance(r, dict)]
        if "validation" in only:
            arts.validation = self.document(VALIDATION)
        if "gates" in only:
            arts.gates = self.receipts()
        if "calls" in only:
            arts.calls = self.raw_rows(CALLS)
        if "handoff" in only:
            arts.handoff = self.document(HANDOFF)
        if "ledger" in only:
            arts.ledger = self.document(LEDGER)
        if "block" in only:
            arts.block = self.document(BLOCK)
        return arts


ARTIFACTS = frozenset(
    {"patterns", "groups", "shortlist", "proposals", "validation", "gates", "calls", "handoff", "ledger", "block"}
)
"""What :meth:`RunDir.read` can read (``run.json`` is always read)."""
SMALL = frozenset({"shortlist", "proposals", "validation", "gates", "handoff", "block"})
"""The artifacts whose size does not grow with the run's cells (patterns, groups, calls and the
ledger do: tens of MB at 10,000 cells)."""


@dataclass
class RunArtifacts:
    """A snapshot of one run directory: documents at the current version; absent ones None / empty."""

    path: Path
    run: Row = field(default_factory=dict)
    patterns: list[Row] | None = None
    groups: list[Row] | None = None
    groups_doc: Row | None = None
    shortlist: Row | None = None
    proposals: list[Row] | None = None
    validation: Row | None = None
    gates: dict[str, Row] = field(default_factory=dict)
    calls: list[Row] | None = None
    handoff: Row | None = None
    ledger: Row | None = None
    block: Row | None = None

    @property
    def run_id(self) -> str:
        """The run's id: run.json's, else the directory name."""
        for key in ("run_id", "analysis_run_id"):
            val = self.run.get(key)
            if isinstance(val, str) and val:
                return val
        return self.path.name

    @property
    def weaknesses(self) -> list[Row] | None:
        """The shortlist's weakness cards (None when there is no shortlist)."""
        if self.shortlist is None:
            return None
        return list(self.shortlist.get("weaknesses") or [])

    @property
    def dropped_weaknesses(self) -> list[Row]:
        """Weaknesses Sol proposed that the deterministic checks dropped (with reasons)."""
        return list((self.shortlist or {}).get("dropped") or [])

    @property
    def ir_path(self) -> Path:
        """The run's DuckDB IR."""
        return RunDir(self.path).ir

    def typed(self, art: ArtifactFile, model: type[M]) -> M | None:
        """A document of the snapshot validated into ``model`` (None when absent); the wrong shape is one line."""
        docs: dict[str, Row | None] = {
            RUN.name: self.run if self.run else None,
            GROUPS.name: self.groups_doc,
            SHORTLIST.name: self.shortlist,
            VALIDATION.name: self.validation,
            HANDOFF.name: self.handoff,
            LEDGER.name: self.ledger,
            BLOCK.name: self.block,
        }
        doc = docs[art.name]
        return None if doc is None else _validate(doc, RunDir(self.path).file(art), art, model)


def _list_of(doc: Row, key: str, path: Path) -> list[Row]:
    """``doc[key]`` as a list of objects (absent: empty); anything else is the wrong shape, one line."""
    val = doc.get(key)
    if val is None:
        return []
    if not isinstance(val, list) or not all(isinstance(r, dict) for r in val):
        raise BadInput(f"{path}: {key!r} must be a list of objects")
    return val


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise BadInput(f"{path} is not UTF-8 text") from None


def _parse(path: Path, kind: Kind) -> Any:
    """One JSON (or YAML) document; an empty or unreadable file is one line naming it."""
    text = _read_text(path)
    if not text.strip():
        raise BadInput(f"{path} is empty (a lunasol write is atomic: the file was cut or made by hand)")
    if kind == "yaml":
        return parse_document(text, path, "yaml")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise BadInput(f"{path} is not valid JSON ({exc}): truncated or edited by hand?") from None


def read_jsonl(path: Path) -> list[Row]:
    """The JSON objects of a JSONL file (blank lines skipped); a bad line is one BadInput naming file and line."""
    rows: list[Row] = []
    # Lines end at "\n" only: lunasol writes UTF-8 as is, so a model's text may hold U+2028 or U+0085 inside a
    # JSON string, which str.splitlines() would take for the end of a line.
    for n, line in enumerate(_read_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BadInput(f"{path}:{n}: not valid JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise BadInput(f"{path}:{n}: expected a JSON object per line")
        rows.append(obj)
    return rows


def _validate(doc: Doc, path: Path, art: ArtifactFile, model: type[M]) -> M:
    try:
        return model.model_validate(doc)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        lines = str(exc).splitlines()
        detail = " ".join(" ".join(lines[:3]).split()) if lines else type(exc).__name__
        raise BadInput(f"{path}: not a valid {art.name}: {detail}") from None


__all__ = [
    "ARTIFACTS",
    "FILES",
    "SMALL",
    "ArtifactFile",
    "RunArtifacts",
    "RunDir",
    "read_jsonl",
]
