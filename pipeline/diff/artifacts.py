"""Read a run directory defensively: every artifact is optional, every malformed one is named.

A run that stopped at gate 1 has no proposals; a run that blocked in Luna has no
shortlist. Readers here return ``None`` / empty for what is absent and raise
:class:`~pipeline.core.errors.BadInput` (one line, naming the file) for what is present
but unreadable. Rows stay plain JSON-like dicts so that the diff compares exactly
what was written, field by field, whatever version of a producer wrote it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core.canonical import read_json
from pipeline.core.errors import BadInput

Row = dict[str, Any]

# Artifact file names of DESIGN.md "Outputs of a run".
RUN_JSON = "run.json"
IR_DB = "ir.duckdb"
PATTERNS = "patterns.jsonl"
GROUPS = "pattern-groups.json"
SHORTLIST = "weakness-shortlist.json"
PROPOSALS = "proposals.yaml"
VALIDATION = "validation.json"
GATES_DIR = "gates"
CALLS = "calls.jsonl"
HANDOFF = "handoff.json"
LEDGER = "ledger.json"
BLOCK = "block-receipt.json"


def read_json_file(path: Path) -> Any:
    """Parse a JSON file, or raise BadInput naming it."""
    try:
        return read_json(path)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: not valid JSON ({exc})") from None


def read_jsonl_file(path: Path) -> list[Row]:
    """Parse a JSONL file (blank lines skipped), or raise BadInput naming file and line."""
    rows: list[Row] = []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"{path}: not valid UTF-8 ({exc})") from None
    for n, line in enumerate(text.splitlines(), start=1):
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


def _optional_json(path: Path) -> Any:
    return read_json_file(path) if path.is_file() else None


def _rows_of(obj: Any, *keys: str) -> list[Row]:
    """A list of dicts from a bare list or from the first of ``keys`` holding one."""
    if isinstance(obj, list):
        return [r for r in obj if isinstance(r, dict)]
    if isinstance(obj, dict):
        for key in keys:
            val = obj.get(key)
            if isinstance(val, list):
                return [r for r in val if isinstance(r, dict)]
    return []


def _load_proposals(path: Path) -> list[Row] | None:
    # DESIGN.md: one card (a mapping), a list of cards, or a mapping with key `proposals`.
    if not path.is_file():
        return None
    import yaml

    try:
        obj = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
    if obj is None:
        return []
    if isinstance(obj, dict) and "proposals" in obj:
        return _rows_of(obj, "proposals")
    if isinstance(obj, dict):
        return [obj]
    if isinstance(obj, list):
        return [r for r in obj if isinstance(r, dict)]
    raise BadInput(f"{path}: expected a card, a list of cards or a mapping with key 'proposals'")


@dataclass
class RunArtifacts:
    """Everything a reviewer needs from one run directory; absent artifacts are None / empty."""

    path: Path
    run: Row = field(default_factory=dict)
    patterns: list[Row] | None = None
    groups: list[Row] | None = None
    groups_doc: Any = None
    shortlist: Row | None = None
    proposals: list[Row] | None = None
    validation: Any = None
    gates: dict[str, Row] = field(default_factory=dict)
    calls: list[Row] | None = None
    handoff: Row | None = None
    ledger: Any = None
    block: Row | None = None

    @property
    def run_id(self) -> str:
        """The run's id: run.json's, else the directory name."""
        for key in ("run_id", "analysis_run_id", "id"):
            val = self.run.get(key)
            if isinstance(val, str) and val:
                return val
        return self.path.name

    @property
    def weaknesses(self) -> list[Row] | None:
        """The shortlist's weakness cards (None when there is no shortlist)."""
        if self.shortlist is None:
            return None
        return _rows_of(self.shortlist, "weaknesses", "shortlist", "cards", "items")

    @property
    def dropped_weaknesses(self) -> list[Row]:
        """Weaknesses Sol proposed that the deterministic checks dropped (with reasons), if recorded."""
        if not isinstance(self.shortlist, dict):
            return []
        return _rows_of(self.shortlist, "dropped", "rejected")

    @property
    def ir_path(self) -> Path:
        """The run's DuckDB IR."""
        return self.path / IR_DB


ARTIFACTS = frozenset(
    {"patterns", "groups", "shortlist", "proposals", "validation", "gates", "calls", "handoff", "ledger", "block"}
)
"""What :func:`load_run` can read (``run.json`` is always read)."""
SMALL = frozenset({"shortlist", "proposals", "validation", "gates", "handoff", "block"})
"""The artifacts whose size does not grow with the batch's cells (patterns, groups, calls and the
ledger do: tens of MB at 10,000 cells)."""


def load_run(path: Path, only: frozenset[str] = ARTIFACTS) -> RunArtifacts:
    """Read the artifacts ``only`` names of a run directory, those that exist; BadInput for a non-run or a broken file.

    One not named stays None / empty, as an absent one: a caller that asks for less knows what it
    left out (``lunasol runs`` and ``lunasol show`` read :data:`SMALL` first; diff and report all).
    """
    if not path.is_dir():
        raise BadInput(f"run directory not found: {path}")
    if not (path / RUN_JSON).is_file() and not (path / IR_DB).is_file():
        raise BadInput(f"not a lunasol run directory: {path} (expected run.json inside)")
    run = _optional_json(path / RUN_JSON)
    if run is not None and not isinstance(run, dict):
        raise BadInput(f"{path / RUN_JSON}: expected a JSON object")
    arts = RunArtifacts(path=path, run=run or {})
    if "patterns" in only and (path / PATTERNS).is_file():
        arts.patterns = read_jsonl_file(path / PATTERNS)
    groups_doc = _optional_json(path / GROUPS) if "groups" in only else None
    if groups_doc is not None:
        arts.groups_doc = groups_doc
        arts.groups = _rows_of(groups_doc, "groups", "pattern_groups", "items")
    shortlist = _optional_json(path / SHORTLIST) if "shortlist" in only else None
    if shortlist is not None:
        arts.shortlist = shortlist if isinstance(shortlist, dict) else {"weaknesses": shortlist}
    if "proposals" in only:
        arts.proposals = _load_proposals(path / PROPOSALS)
    if "validation" in only:
        arts.validation = _optional_json(path / VALIDATION)
    gates_dir = path / GATES_DIR
    if "gates" in only and gates_dir.is_dir():
        for receipt in sorted(gates_dir.glob("*.json")):
            obj = read_json_file(receipt)
            if isinstance(obj, dict):
                arts.gates[receipt.stem] = obj
    if "calls" in only and (path / CALLS).is_file():
        arts.calls = read_jsonl_file(path / CALLS)
    handoff = _optional_json(path / HANDOFF) if "handoff" in only else None
    arts.handoff = handoff if isinstance(handoff, dict) else None
    if "ledger" in only:
        arts.ledger = _optional_json(path / LEDGER)
    block = _optional_json(path / BLOCK) if "block" in only else None
    arts.block = block if isinstance(block, dict) else None
    return arts


def count_lines(path: Path) -> int | None:
    """Non-blank lines of a JSONL artifact (its rows, e.g. patterns), without parsing them; None when absent."""
    if not path.is_file():
        return None
    n = 0
    with path.open("rb") as fh:
        for line in fh:
            n += bool(line.strip())
    return n
