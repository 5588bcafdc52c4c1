"""``lunasol ask``: one question asked of every selected cell, answered with cited events, then counted.

Public API: :class:`AskSpec`, :func:`parse_answer_kind`, :func:`run_ask`, :func:`summarise`.
"""

from __future__ import annotations

from pipeline.ask.answer import AskSpec, parse_answer_kind
from pipeline.ask.stage import run_ask
from pipeline.ask.summary import summarise

__all__ = ["AskSpec", "parse_answer_kind", "run_ask", "summarise"]
