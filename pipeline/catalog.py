"""Every artifact lunasol writes, with its pydantic model: what ``lunasol schema`` exports.

It sits above every layer because it imports each artifact's model from the module that owns it
(an explicit import, not a lookup by name). Versions come from
:data:`pipeline.artifacts.versions.VERSIONS`; a test checks each model's default against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pipeline.artifacts.proposals_file import ProposalsFile
from pipeline.artifacts.run_info import RunInfo
from pipeline.artifacts.rundir import FILES, GATES_DIR
from pipeline.artifacts.schemas import Kind, current_version
from pipeline.bundle.manifest import MANIFEST_FILE, ManifestDoc
from pipeline.bundle.request import REQUEST_FILE, AnalysisRequest
from pipeline.bundle.sources import SOURCES_FILE, SourcesDoc
from pipeline.coordinator.groups import PatternGroups
from pipeline.core.canonical import atomic_write_text, pretty_json
from pipeline.core.errors import BadInput
from pipeline.followup.schema import Followup
from pipeline.gates.gate1 import Receipt
from pipeline.luna.patterns import PatternRow
from pipeline.models.calllog import CallRow
from pipeline.models.store import Recording
from pipeline.proposals.proposer import Validation
from pipeline.sol.shortlist import Shortlist
from pipeline.state.blocking import BlockReceipt
from pipeline.state.handoff import Handoff
from pipeline.state.ledger import CellResult, LedgerData


@dataclass(frozen=True)
class ArtifactSchema:
    """One artifact: where it lives, how it is stored, and the model that defines it."""

    name: str
    filename: str
    model: type[BaseModel]
    kind: Kind
    writer: str
    description: str

    @property
    def model_path(self) -> str:
        """``module:Class`` of the model (shown in the exported schema)."""
        return f"{self.model.__module__}:{self.model.__qualname__}"

    @property
    def version(self) -> int:
        """The current schema version (:data:`pipeline.artifacts.versions.VERSIONS`)."""
        return current_version(self.name)

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


def _a(
    name: str, filename: str, model: type[BaseModel], writer: str, description: str, kind: Kind = "json"
) -> ArtifactSchema:
    return ArtifactSchema(name, filename, model, kind, writer, description)


# name -> artifact. Order: how a run produces them (bundle inputs first).
REGISTRY: dict[str, ArtifactSchema] = {
    a.name: a
    for a in (
        _a("manifest", MANIFEST_FILE, ManifestDoc, "pipeline.bundle.manifest",
           "every file of a frozen bundle with its sha256 and size"),
        _a("manifest-sources", SOURCES_FILE, SourcesDoc, "pipeline.adapters.remote",
           "where an imported bundle's bytes came from: each object's URL, ETag, version, size, sha256"),
        _a("analysis-request", REQUEST_FILE, AnalysisRequest,
           "bundle author / pipeline.adapters", "what a bundle asks lunasol to analyse"),
        _a("run", FILES["run"].filename, RunInfo, "pipeline.ir.export, pipeline.run.runner",
           "what a run was made from: bundle, models, templates, versions"),
        _a("patterns", FILES["patterns"].filename, PatternRow, "pipeline.luna.stage",
           "one behaviour pattern per line", kind="jsonl-row"),
        _a("cell-result", "<role>/<cell>.json", CellResult, "pipeline.state.ledger.CellResults",
           "one cell's model result and the key it was made with (reused by reruns)"),
        _a("pattern-groups", FILES["pattern-groups"].filename, PatternGroups,
           "pipeline.coordinator", "patterns grouped across cells, with coverage"),
        _a("weakness-shortlist", FILES["weakness-shortlist"].filename, Shortlist,
           "pipeline.sol", "Sol's weakness cards, dropped ones with reasons, sealed by a digest"),
        _a("proposals", FILES["proposals"].filename, ProposalsFile, "pipeline.proposals",
           "accepted proposal cards", kind="yaml"),
        _a("validation", FILES["validation"].filename, Validation, "pipeline.proposals",
           "what the proposer produced per weakness, every card with its findings"),
        _a("gate-receipt", f"{GATES_DIR}/<gate>-<operation>.json", Receipt, "pipeline.gates",
           "proof of one gate decision"),
        _a("handoff", FILES["handoff"].filename, Handoff, "pipeline.state.handoff",
           "the run's state machine with a revision"),
        _a("ledger", FILES["ledger"].filename, LedgerData, "pipeline.state.ledger",
           "each artifact's state and the digests it was made from"),
        _a("calls", FILES["calls"].filename, CallRow, "pipeline.models",
           "one logical model call per line", kind="jsonl-row"),
        _a("block-receipt", FILES["block-receipt"].filename, BlockReceipt, "pipeline.state.blocking",
           "why a run cannot go on, what was tried, the command that unblocks"),
        _a("followup", FILES["followup"].filename, Followup, "pipeline.followup",
           "the parent's selected proposal judged on the next generation's run, bound by digest to both"),
        _a("recording", "<store>/<hex[:2]>/<hex>.json", Recording, "pipeline.models",
           "one recorded model exchange (raw request and response)"),
    )
}  # fmt: skip


def get(name: str) -> ArtifactSchema:
    """The registry entry ``name``; an unknown name is one line naming the known ones."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise BadInput(f"unknown artifact {name!r}; known: {', '.join(REGISTRY)}") from None


def export_all(out_dir: Path) -> list[Path]:
    """Write every artifact's JSON Schema to ``out_dir/<name>.json``; return the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for art in REGISTRY.values():
        path = out_dir / f"{art.name}.json"
        atomic_write_text(path, pretty_json(art.json_schema()))
        paths.append(path)
    return paths


__all__ = ["REGISTRY", "ArtifactSchema", "export_all", "get"]
