"""The current schema version of every on-disk artifact: the one source each model's default reads.

Bump a number here together with a step in :mod:`pipeline.artifacts.migrations` (a test checks
that every version has a path from 0). The DuckDB IR is versioned too (``ir``), but it is rebuilt
from the bundle rather than migrated (:func:`pipeline.ir.store.check_ir_version`).
"""

from __future__ import annotations

VERSIONS: dict[str, int] = {
    "manifest": 1,
    "manifest-sources": 1,
    "analysis-request": 1,
    "run": 2,
    "patterns": 1,
    "cell-result": 1,
    "pattern-groups": 1,
    "weakness-shortlist": 5,
    "proposals": 1,
    "validation": 1,
    "gate-receipt": 3,
    "handoff": 1,
    "ledger": 1,
    "calls": 1,
    "block-receipt": 1,
    "followup": 2,
    "recording": 1,
    "ir": 1,
}
