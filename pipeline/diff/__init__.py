"""Semantic diff between two analysis runs (``lunasol diff``).

Public API: :func:`diff_run_dirs`, :func:`diff_runs`, :class:`RunDiff`,
:func:`render_text`, :func:`render_markdown`, :func:`render_html`, :func:`diff_json`.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from pipeline.artifacts.run_info import RunInfo
from pipeline.artifacts.rundir import (
    BLOCK,
    HANDOFF,
    LEDGER,
    RUN,
    ArtifactFile,
    RunArtifacts,
    RunDir,
)
from pipeline.diff.compare import RunDiff, diff_runs
from pipeline.diff.html import render_html
from pipeline.diff.render import diff_json, render_markdown, render_text
from pipeline.state.blocking import BlockReceipt
from pipeline.state.handoff import Handoff
from pipeline.state.ledger import LedgerData

__all__ = [
    "RunDiff",
    "diff_json",
    "diff_run_dirs",
    "diff_runs",
    "render_html",
    "render_markdown",
    "render_text",
]


def diff_run_dirs(a: Path, b: Path) -> RunDiff:
    """Read two run directories and compare them (run.json and the state documents checked by their models first)."""
    return diff_runs(_checked(RunDir(a).read()), _checked(RunDir(b).read()))


def _checked(arts: RunArtifacts) -> RunArtifacts:
    """The snapshot, its run file and state documents validated by their models (one line names a bad file).

    The shortlist, groups and validation are compared as migrated documents and not validated here
    yet: the synthetic runs of tests/diff write them shaped like the models, not whole. The
    comparison stays field by field over the documents as written (at the current version), so a
    field a model fills by default is never reported as a difference the files do not have.
    """
    for art, model in _MODELS:
        arts.typed(art, model)
    return arts


_MODELS: tuple[tuple[ArtifactFile, type[BaseModel]], ...] = (
    (RUN, RunInfo),
    (HANDOFF, Handoff),
    (LEDGER, LedgerData),
    (BLOCK, BlockReceipt),
)
