"""``lunasol report``: one self-contained HTML page per run, every cited id linked to its raw lines.

Public API: :func:`write_report`, :func:`render_report`.
"""

from __future__ import annotations

from pipeline.report.build import render_report, write_report

__all__ = ["render_report", "write_report"]
