"""Semantic diff between two analysis runs (``lunasol diff``).

Public API: :func:`diff_run_dirs`, :func:`load_run`, :func:`diff_runs`, :class:`RunDiff`,
:func:`render_text`, :func:`render_markdown`, :func:`render_html`, :func:`diff_json`.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.diff.artifacts import RunArtifacts, load_run
from pipeline.diff.compare import RunDiff, diff_runs
from pipeline.diff.html import render_html
from pipeline.diff.render import diff_json, render_markdown, render_text

__all__ = [
    "RunArtifacts",
    "RunDiff",
    "diff_json",
    "diff_run_dirs",
    "diff_runs",
    "load_run",
    "render_html",
    "render_markdown",
    "render_text",
]


def diff_run_dirs(a: Path, b: Path) -> RunDiff:
    """Load two run directories and compare them."""
    return diff_runs(load_run(a), load_run(b))
