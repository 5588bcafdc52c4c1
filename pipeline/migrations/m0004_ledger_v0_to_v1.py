"""ledger.json: written before schema_version existed (v0) -> v1; the fields are the same."""

from __future__ import annotations

from pipeline.migrations import Doc, add_schema_version

NUMBER = 4
ARTIFACT = "ledger"
FROM_VERSION = 0
TO_VERSION = 1


def upgrade(doc: Doc) -> Doc:
    """Add ``schema_version: 1``; nothing else changed between v0 and v1."""
    return add_schema_version(doc, TO_VERSION)
