"""Size bounds, secret redaction and log framing for everything the agent surface hands out.

A coding agent's context is small and its tool results are read as prompts: every output is cut at
a stated size with a note saying where it was cut and how to ask for more, every string passes the
same redactor as the IR (:func:`pipeline.ir.redact.redact`), and text quoted from the analysed logs
is fenced as data exactly as in every model prompt (:func:`pipeline.models.prompts.fence`).
"""

from __future__ import annotations

from typing import Any, TypeVar

from pipeline.ir.redact import redact
from pipeline.models.prompts import DATA_RULE, fence

T = TypeVar("T")

MAX_RESPONSE_CHARS = 40_000
"""A whole tool answer, as the model reads it (~10K tokens); past it the answer is refused with advice."""
MAX_TEXT_CHARS = 12_000
"""One text field (raw lines, a log excerpt, a query cell)."""
MAX_ITEMS = 50
"""Items of one list (cells, occurrences, refs, conditions) before the rest are counted, not shown."""
MAX_ROWS = 200
"""Rows one query may return (default 50)."""
MAX_CONTEXT_LINES = 10
"""Context lines either side of a ref."""

LOG_FENCE = "log"
"""The :func:`~pipeline.models.prompts.fence` name of text quoted from the analysed logs."""
INSTRUCTIONS = (
    "Read-only evidence of a lunasol analysis run: its gates, weakness and proposal cards, pattern groups, "
    "the raw log lines behind every ref, and read-only SQL over its Trajectory IR. "
    f"{DATA_RULE} A gate-2 selection is not an authorisation to change anything outside the selected "
    "card's single lever. Secrets are shown as [REDACTED:<kind>]. Every answer is bounded; a note says where it "
    "was cut and how to ask for more."
)


def frame_log(text: str) -> str:
    """``text`` from the logs fenced as data, as every model prompt fences it (a fence inside it is defused)."""
    return fence(text, LOG_FENCE)


def cut_text(text: str, limit: int, what: str, more: str, notes: list[str]) -> str:
    """``text`` cut at ``limit`` characters; the cut is noted in ``notes`` with how to ask for more."""
    if len(text) <= limit:
        return text
    notes.append(f"{what} cut at {limit:,} of {len(text):,} characters; ask for more with {more}")
    return text[:limit] + f" [... cut at {limit:,} characters]"


def cut_list(items: list[T], limit: int, what: str, more: str, notes: list[str]) -> list[T]:
    """The first ``limit`` items; the cut is noted with the total and how to ask for more."""
    if len(items) <= limit:
        return items
    notes.append(f"{what} cut at {limit:,} of {len(items):,}; ask for more with {more}")
    return items[:limit]


def redact_all(value: Any) -> Any:
    """Every string inside ``value`` (dicts, lists) redacted as in the IR; other values unchanged."""
    if isinstance(value, str):
        return redact(value)[0]
    if isinstance(value, dict):
        return {k: redact_all(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_all(v) for v in value]
    return value
