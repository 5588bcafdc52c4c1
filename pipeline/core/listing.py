"""Ids in one-line messages: the first few, then how many more (a line stays a line at 10,000 cells)."""

from __future__ import annotations

from collections.abc import Sequence

SHOWN = 10


def some(items: Sequence[str], limit: int = SHOWN) -> str:
    """``"C001, C002 and 7 more"``: the first ``limit`` items, comma-separated, then the count left."""
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")
