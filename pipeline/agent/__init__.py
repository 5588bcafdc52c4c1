"""What the coding agent that implements a selected card reads: ``lunasol mcp`` and ``lunasol handoff``.

:mod:`~pipeline.agent.server` is a read-only Model Context Protocol server (stdio) over one or more
runs; :mod:`~pipeline.agent.tools` are its tools as plain functions returning the bounded views of
:mod:`~pipeline.agent.views`; :mod:`~pipeline.agent.brief` writes the handoff brief. Every run read
goes through :mod:`~pipeline.agent.reads`. The server module (and the ``mcp`` SDK) is imported only
by the ``mcp`` verb.

Public API: :class:`Runs`, :func:`handoff_brief`, :func:`write_handoff`, :func:`run_summary`.
"""

from __future__ import annotations

from pipeline.agent.brief import handoff_brief, run_summary, write_handoff
from pipeline.agent.tools import Runs

__all__ = ["Runs", "handoff_brief", "run_summary", "write_handoff"]
