"""Every artifact lunasol writes, its pydantic model, its schema version, and how older files are read.

The pydantic models are the single source of truth: an artifact's current version is the default
of its model's ``schema_version`` field, and ``lunasol schema`` exports the JSON Schema from the
model (``docs/schemas/*.json`` are that export, checked by a test). Reading an artifact
(:func:`load_document` / :func:`load_artifact`):

- a ``schema_version`` newer than the model's is refused with one line (:class:`BadInput`, exit 2)
  telling the user to upgrade lunasol;
- an older one (0 = written before the field existed) is upgraded in memory by the numbered
  migrations of :mod:`pipeline.migrations`, one version at a time, in number order; the file on
  disk is left as it is (the next write of that artifact writes the current version);
- a gap in the migration chain is a bug in lunasol, reported as such.

The DuckDB IR (``ir.duckdb``, ``meta.ir_schema_version``) is derived wholly from the frozen
bundle, so it is not migrated in place: a newer IR is refused, an older one is refused with the
command that re-exports it (:func:`check_ir_version`). See docs/schemas.md.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from pipeline.errors import BadInput
from pipeline.migrations import Doc, Migration, all_migrations

Kind = Literal["json", "jsonl-row", "yaml"]


@dataclass(frozen=True)
class ArtifactSchema:
    """One artifact: where it lives, how it is stored, and the model that defines it."""

    name: str
    filename: str
    model_path: str  # "module:Class", imported on first use (readers import this module cheaply)
    kind: Kind
    writer: str
    description: str

    @property
    def model(self) -> type[BaseModel]:
        """The pydantic model of the artifact (of one row for JSONL files)."""
        module, _, cls = self.model_path.partition(":")
        model = getattr(importlib.import_module(module), cls)
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise TypeError(f"{self.model_path} is not a pydantic model")
        return model

    @property
    def version(self) -> int:
        """The current schema version: the default of the model's ``schema_version`` field."""
        field = self.model.model_fields["schema_version"]
        return int(field.default)

    def json_schema(self) -> dict[str, Any]:
        """The JSON Schema exported from the model, with the artifact's file and version attached."""
        schema = self.model.model_json_schema(mode="serialization")
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema["x-lunasol"] = {
            "artifact": self.name,
            "file": self.filename,
            "kind": self.kind,
            "model": self.model_path,
            "schema_version": self.version,
            "writer": self.writer,
        }
        return schema


def _a(name: str, filename: str, model_path: str, writer: str, description: str, kind: Kind = "json") -> ArtifactSchema:
    return ArtifactSchema(name, filename, model_path, kind, writer, description)


# name -> artifact. Order: how a run produces them (bundle inputs first).
REGISTRY: dict[str, ArtifactSchema] = {
    a.name: a
    for a in (
        _a("manifest", "manifest.json", "pipeline.bundle.manifest:ManifestDoc", "pipeline.bundle.manifest",
           "every file of a frozen bundle with its sha256 and size"),
        _a("analysis-request", "analysis-request.json", "pipeline.bundle.request:AnalysisRequest",
           "bundle author / pipeline.adapters", "what a bundle asks lunasol to analyse"),
        _a("run", "run.json", "pipeline.run_info:RunInfo", "pipeline.ir.export, pipeline.runner",
           "what a run was made from: bundle, models, templates, versions"),
        _a("patterns", "patterns.jsonl", "pipeline.luna.patterns:PatternRow", "pipeline.luna.stage",
           "one behaviour pattern per line", kind="jsonl-row"),
        _a("cell-result", "<role>/<cell>.json", "pipeline.ledger:CellResult", "pipeline.ledger.CellResults",
           "one cell's model result and the key it was made with (reused by reruns)"),
        _a("pattern-groups", "pattern-groups.json", "pipeline.coordinator.core:PatternGroups",
           "pipeline.coordinator", "patterns grouped across cells, with coverage"),
        _a("weakness-shortlist", "weakness-shortlist.json", "pipeline.sol.shortlist:Shortlist",
           "pipeline.sol", "Sol's weakness cards, dropped ones with reasons, sealed by a digest"),
        _a("proposals", "proposals.yaml", "pipeline.proposals.io:ProposalsFile", "pipeline.proposals",
           "accepted proposal cards", kind="yaml"),
        _a("validation", "validation.json", "pipeline.proposals.proposer:Validation", "pipeline.proposals",
           "what the proposer produced per weakness, every card with its findings"),
        _a("gate-receipt", "gates/<gate>-<operation>.json", "pipeline.gates:Receipt", "pipeline.gates",
           "proof of one gate decision"),
        _a("handoff", "handoff.json", "pipeline.handoff:Handoff", "pipeline.handoff",
           "the run's state machine with a revision"),
        _a("ledger", "ledger.json", "pipeline.ledger:LedgerData", "pipeline.ledger",
           "each artifact's state and the digests it was made from"),
        _a("calls", "calls.jsonl", "pipeline.models.calllog:CallRow", "pipeline.models",
           "one logical model call per line", kind="jsonl-row"),
        _a("block-receipt", "block-receipt.json", "pipeline.blocking:BlockReceipt", "pipeline.blocking",
           "why a run cannot go on, what was tried, the command that unblocks"),
        _a("followup", "followup.json", "pipeline.followup.model:Followup", "pipeline.followup",
           "the parent's selected proposal judged on the next generation's run, bound by digest to both"),
        _a("recording", "<store>/<hex[:2]>/<hex>.json", "pipeline.models.store:Recording", "pipeline.models",
           "one recorded model exchange (raw request and response)"),
    )
}  # fmt: skip


def get(name: str) -> ArtifactSchema:
    """The registry entry ``name``; an unknown name is one line naming the known ones."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise BadInput(f"unknown artifact {name!r}; known: {', '.join(REGISTRY)}") from None


@cache
def migrations() -> tuple[Migration, ...]:
    """Every numbered migration, in number order."""
    return all_migrations()


def migrations_for(name: str) -> list[Migration]:
    """The migrations of one artifact, in number order."""
    return [m for m in migrations() if m.artifact == name]


def version_of(doc: Any, source: str) -> int:
    """The ``schema_version`` of a document (0 when it has none: written before the field existed)."""
    if not isinstance(doc, dict):
        raise BadInput(f"{source} is not a JSON object")
    version = doc.get("schema_version", 0)
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise BadInput(f"{source} has schema_version {version!r}; expected a whole number")
    return version


def upgrade(doc: Any, name: str, source: str) -> tuple[Doc, int]:
    """``doc`` at the current version of artifact ``name``, and the version it was found at.

    Newer than this lunasol: one line, exit 2. Older: the numbered migrations, in order.
    """
    art = get(name)
    current = art.version
    found = version_of(doc, source)
    if found > current:
        raise BadInput(
            f"{source} has schema_version {found}, newer than this lunasol reads (up to {current}): upgrade lunasol"
        )
    out: Doc = dict(doc)
    version = found
    for m in migrations_for(name):
        if m.from_version == version and version < current:
            out = m.upgrade(out)
            out["schema_version"] = m.to_version  # a migration cannot forget to say what it produced
            version = m.to_version
    if version != current:
        # a missing step is lunasol's bug, not the user's; say so plainly
        raise BadInput(
            f"{source} has schema_version {found} and lunasol has no migration from {version} to {current} "
            f"for {name} (a lunasol bug: please report it)"
        )
    return out, found


def read_document(path: Path, kind: Kind = "json") -> Any:
    """Parse an artifact file; unreadable content is one BadInput line."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise BadInput(f"{path} is not UTF-8 text") from None
    if kind == "yaml":
        import yaml

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise BadInput(f"{path}: not readable YAML: {' '.join(str(exc).split())}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise BadInput(f"{path} is not valid JSON ({exc})") from None


def load_document(path: Path, name: str) -> tuple[Doc, int]:
    """Read artifact ``name`` from ``path`` at the current version (a dict) and the version found on disk."""
    art = get(name)
    if art.kind == "jsonl-row":
        raise BadInput(f"{name} is a JSONL artifact: read it row by row with upgrade_rows()")
    if not path.is_file():
        raise BadInput(f"{path} not found")
    return upgrade(read_document(path, art.kind), name, str(path))


def load_artifact(path: Path, name: str) -> BaseModel:
    """Read, version-check, upgrade and validate artifact ``name``; return its model instance."""
    doc, _ = load_document(path, name)
    model = get(name).model
    try:
        return model.model_validate(doc)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        first = str(exc).splitlines()
        detail = " ".join(first[:3]) if first else type(exc).__name__
        raise BadInput(f"{path}: not a valid {name} (schema_version {get(name).version}): {detail}") from None


def upgrade_rows(rows: list[Any], name: str, source: str) -> list[Doc]:
    """Every row of a JSONL artifact at the current version (errors name the 1-based row)."""
    return [upgrade(row, name, f"{source} row {n}")[0] for n, row in enumerate(rows, 1)]


def check_ir_version(found: str | None, path: Path, rerun: Callable[[], str] | None = None) -> None:
    """Refuse an IR whose ``meta.ir_schema_version`` is not this lunasol's.

    Newer: upgrade lunasol. Older or absent: the IR is derived from the frozen bundle, so it is
    re-exported rather than migrated (``rerun()`` gives the command; per-cell model answers are reused).
    """
    from pipeline.ir.schema import IR_SCHEMA_VERSION

    try:
        version = 0 if found is None else int(found)
    except ValueError:
        raise BadInput(f"{path} has IR schema {found!r}; expected a whole number") from None
    if version > IR_SCHEMA_VERSION:
        raise BadInput(
            f"{path} has IR schema {version}, newer than this lunasol reads ({IR_SCHEMA_VERSION}): upgrade lunasol"
        )
    if version < IR_SCHEMA_VERSION:
        how = rerun() if rerun else "lunasol export BUNDLE --run-id ID"
        raise BadInput(
            f"{path} has IR schema {version}, older than this lunasol's ({IR_SCHEMA_VERSION}); "
            f"the IR is rebuilt from the bundle, not migrated: re-export with {how}"
        )


def export_all(out_dir: Path) -> list[Path]:
    """Write every artifact's JSON Schema to ``out_dir/<name>.json``; return the paths."""
    from pipeline.canonical import atomic_write_text, pretty_json

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for art in REGISTRY.values():
        path = out_dir / f"{art.name}.json"
        atomic_write_text(path, pretty_json(art.json_schema()))
        paths.append(path)
    return paths


__all__ = [
    "REGISTRY",
    "ArtifactSchema",
    "check_ir_version",
    "export_all",
    "get",
    "load_artifact",
    "load_document",
    "migrations",
    "migrations_for",
    "upgrade",
    "upgrade_rows",
    "version_of",
]
