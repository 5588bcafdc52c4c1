"""``analysis-request.json``: what a bundle asks lunasol to analyse (docs/trajectory-format.md)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.dataclasses import dataclass

from pipeline.artifacts.versions import VERSIONS
from pipeline.core.errors import BundleError
from pipeline.core.limits import check_size, parse_json

REQUEST_FILE = "analysis-request.json"
REQUEST_SCHEMA_VERSION = VERSIONS["analysis-request"]

# Ids become directory names and SQL values: keep them to a safe alphabet.
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class _Strict(BaseModel):
    # strict: "1" is not the schema version 1, nor "0" the generation 0 (ill-typed, so refused)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class TaskSpec(_Strict):
    """One task family of the batch."""

    task_id: str = Field(min_length=1)
    summary: str


_Id = Annotated[str, Field(min_length=1, strict=True)]


# A pydantic dataclass with slots, not a model: a request lists every cell (100,000 in a sweep) and a
# model instance carries a dict and a set of the fields given (1.2 KB a cell with its strings: 162 MiB
# at 100,000 cells, held through the export); this holds the five strings. Same JSON schema, same
# checks (every field strict; extra keys refused).
@dataclass(frozen=True, slots=True, config=ConfigDict(extra="forbid"))
class CellSpec:
    """One cell: one run of one task by the parent harness, and where its logs are."""

    cell_id: _Id
    task_id: _Id
    run_id: _Id
    eligibility: Literal["valid_behavior", "excluded"]
    path: Annotated[
        str, Field(min_length=1, strict=True, description="Cell directory, POSIX, relative to the bundle root.")
    ]

    def as_json(self) -> dict[str, str]:
        """The cell as ``analysis-request.json`` lists it."""
        return dataclasses.asdict(self)


class Exclusion(_Strict):
    """Why a listed cell stays out of the denominator."""

    cell_id: str = Field(min_length=1)
    reason: str


class Implements(_Strict):
    """For a next-generation bundle: the harness it derives from and the selected proposal it implements.

    ``lunasol followup`` refuses a child run whose request does not name the parent's harness and
    the proposal being judged, so a card is never judged on a generation that did not implement it.
    """

    parent_harness: str = Field(min_length=1)
    proposal_id: str = Field(min_length=1)
    parent_run_id: str | None = Field(None, description="the parent analysis run whose gate 2 selected the card")


class AnalysisRequest(_Strict):
    """The bundle's request. Cross-field problems raise :class:`BundleError` with one clear line."""

    schema_version: int = REQUEST_SCHEMA_VERSION
    parent_harness: str = Field(min_length=1)
    generation: int
    analysis_run_id: str
    tasks: list[TaskSpec]
    cells: list[CellSpec]
    exclusions: list[Exclusion] = Field(default_factory=list)
    allowed_history: list[Any] = Field(default_factory=list)
    format: str = Field("native", description='Log format of the cells: "native" or an adapter name.')
    source: dict[str, Any] | None = Field(None, description="Free metadata about where the bundle came from.")
    implements: Implements | None = Field(
        None, description="Next generation only: the parent harness and the selected proposal this batch implements."
    )

    @model_validator(mode="after")
    def _consistent(self) -> AnalysisRequest:
        # BundleError is not a ValueError, so pydantic lets it through unchanged: one line, exit 2.
        if self.schema_version > REQUEST_SCHEMA_VERSION:
            raise BundleError(
                f"{REQUEST_FILE}: schema_version {self.schema_version} is newer than this lunasol "
                f"understands ({REQUEST_SCHEMA_VERSION})"
            )
        if not _SAFE_ID.match(self.analysis_run_id):
            raise BundleError(f"{REQUEST_FILE}: analysis_run_id {self.analysis_run_id!r} is not a safe id")
        task_ids = [t.task_id for t in self.tasks]
        dup_tasks = _duplicates(task_ids)
        if dup_tasks:
            raise BundleError(f"{REQUEST_FILE}: duplicate task ids: {', '.join(dup_tasks)}")
        dup_cells = _duplicates([c.cell_id for c in self.cells])
        if dup_cells:
            raise BundleError(f"{REQUEST_FILE}: duplicate cell ids: {', '.join(dup_cells)}")
        known_tasks = set(task_ids)
        for cell in self.cells:
            if not _SAFE_ID.match(cell.cell_id):
                raise BundleError(f"{REQUEST_FILE}: cell id {cell.cell_id!r} is not a safe id")
            if cell.task_id not in known_tasks:
                raise BundleError(f"{REQUEST_FILE}: cell {cell.cell_id} names unknown task id {cell.task_id!r}")
            check_relative(cell.path, f"{REQUEST_FILE}: cell {cell.cell_id} path")
        dup_excl = _duplicates([e.cell_id for e in self.exclusions])
        if dup_excl:
            raise BundleError(f"{REQUEST_FILE}: duplicate exclusions for cells: {', '.join(dup_excl)}")
        by_id = {c.cell_id: c for c in self.cells}
        reasons = {e.cell_id: e.reason for e in self.exclusions}
        for cell_id, reason in reasons.items():
            if cell_id not in by_id:
                raise BundleError(f"{REQUEST_FILE}: exclusion names cell {cell_id} that is not listed in cells")
            if by_id[cell_id].eligibility != "excluded":
                raise BundleError(f"{REQUEST_FILE}: cell {cell_id} is valid_behavior but has an exclusion")
            if not reason.strip():
                raise BundleError(f"{REQUEST_FILE}: excluded cell {cell_id} has an empty reason")
        for cell in self.cells:
            if cell.eligibility == "excluded" and cell.cell_id not in reasons:
                raise BundleError(f"{REQUEST_FILE}: excluded cell {cell.cell_id} has no reason in exclusions")
        return self

    @property
    def eligible_cells(self) -> list[CellSpec]:
        """Cells in the denominator (``valid_behavior``), in request order."""
        return [c for c in self.cells if c.eligibility == "valid_behavior"]

    def exclusion_reason(self, cell_id: str) -> str | None:
        """The stated reason a cell is excluded, if it is."""
        for e in self.exclusions:
            if e.cell_id == cell_id:
                return e.reason
        return None


def _duplicates(values: list[str]) -> list[str]:
    seen: set[str] = set()
    dups: list[str] = []
    for v in values:
        if v in seen and v not in dups:
            dups.append(v)
        seen.add(v)
    return dups


_DRIVE = re.compile(r"[A-Za-z]:")


def check_relative(path: str, what: str) -> None:
    """A bundle-relative POSIX path: not absolute, no ``..``, no backslashes. Raise BundleError otherwise.

    String tests only (a manifest holds one path per file, checked on every read): a POSIX path
    is absolute exactly when it starts with ``/``, and its ``..`` parts are its ``/``-separated
    ``..`` pieces (``PurePosixPath`` keeps them).
    """
    if not path or path.startswith(("/", "\\")) or _DRIVE.match(path):
        raise BundleError(f"{what} {path!r} is absolute; bundle paths must be relative")
    if "\\" in path or "\x00" in path or (".." in path and ".." in path.split("/")):
        raise BundleError(f"{what} {path!r} escapes the bundle")


def request_json_schema() -> dict[str, Any]:
    """JSON Schema of ``analysis-request.json``, generated from the model."""
    return AnalysisRequest.model_json_schema()


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


class _DuplicateKey(Exception):
    """A JSON object names one key twice (parsers silently keep the last one)."""


def read_bundle_json(bundle: Path, name: str, missing_hint: str = "") -> Any:
    """The parsed JSON file ``bundle/name``; missing or invalid is one BundleError line naming it.

    Strict, because these files steer the whole run: UTF-8 only, not empty, no key given twice
    (which value would count?), no nesting past the parser's depth, at most
    ``LUNASOL_MAX_DOC_BYTES``.
    """
    return parse_bundle_json(name, read_bundle_bytes(bundle, name, missing_hint))


def read_bundle_bytes(bundle: Path, name: str, missing_hint: str = "") -> bytes:
    """The bytes of ``bundle/name`` (missing, or over ``LUNASOL_MAX_DOC_BYTES``: one BundleError line)."""
    path = bundle / name
    if not path.is_file():
        raise BundleError(f"missing {name} in bundle {bundle}{missing_hint}")
    check_size(path.stat().st_size, "LUNASOL_MAX_DOC_BYTES", name, "the file")
    return path.read_bytes()


def parse_bundle_json(name: str, raw: bytes) -> Any:
    """The bytes of bundle file ``name`` parsed as :func:`read_bundle_json` does (strict; one BundleError line)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise BundleError(f"{name}: not UTF-8 (line {line}, byte {exc.start}); save it as UTF-8") from None
    if not text.strip():
        raise BundleError(f"{name}: empty file (expected a JSON object)")
    try:
        return parse_json(text, name, lambda t: json.loads(t, object_pairs_hook=_unique_keys))
    except _DuplicateKey as exc:
        raise BundleError(f"{name}: key {exc.args[0]!r} appears twice in one object") from None
    except ValueError as exc:
        raise BundleError(f"{name}: invalid JSON ({exc})") from None


def load_request(bundle: Path) -> AnalysisRequest:
    """Read and validate ``BUNDLE/analysis-request.json``; every problem is one BundleError line."""
    data = read_bundle_json(bundle, REQUEST_FILE)
    try:
        return AnalysisRequest.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "(root)"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise BundleError(f"{REQUEST_FILE}: {loc}: {err['msg']}{more}") from None
