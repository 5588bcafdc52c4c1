"""Semantic diff between two analysis runs (``lunasol diff``).

Public API: :func:`diff_run_dirs`, :func:`diff_runs`, :class:`RunDiff`,
:func:`render_text`, :func:`render_markdown`, :func:`render_html`, :func:`diff_json`.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.artifacts.rundir import RunDir
from pipeline.diff.compare import RunDiff, diff_runs
from pipeline.diff.html import render_html
from pipeline.diff.render import diff_json, render_markdown, render_text

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
    """Read two run directories and compare them."""
    return diff_runs(RunDir(a).read(), RunDir(b).read())
