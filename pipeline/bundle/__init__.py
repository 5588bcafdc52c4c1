"""Frozen bundles: the analysis request, the manifest (freeze / verify) and the native reader."""

from pipeline.bundle.manifest import (
    MANIFEST_FILE,
    FileEntry,
    Manifest,
    VerifyReport,
    freeze,
    read_frozen,
    read_manifest,
    resolve_in_bundle,
    verify,
)
from pipeline.bundle.request import (
    REQUEST_FILE,
    AnalysisRequest,
    CellSpec,
    Exclusion,
    TaskSpec,
    load_request,
    request_json_schema,
)

__all__ = [
    "MANIFEST_FILE",
    "REQUEST_FILE",
    "AnalysisRequest",
    "CellSpec",
    "Exclusion",
    "FileEntry",
    "Manifest",
    "TaskSpec",
    "VerifyReport",
    "freeze",
    "load_request",
    "read_frozen",
    "read_manifest",
    "request_json_schema",
    "resolve_in_bundle",
    "verify",
]
