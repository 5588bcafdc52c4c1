"""What an answer that found nothing must say: a reason with content, not a placeholder.

Luna's ``none_reason``, Sol's ``none_reason`` and the proposer's ``note`` all go through
:func:`says_nothing`: a small model's "none", "No reason" or "n/a" must not pass as "looked, found
nothing" (the run would read as an analysis with no finding).
"""

from __future__ import annotations

import re

MIN_REASON_WORDS = 3


def says_nothing(reason: str | None) -> bool:
    """True for a reason absent or too short to state an observation ("none", "No reason", "n/a")."""
    return len(re.findall(r"\w+", reason or "")) < MIN_REASON_WORDS


def empty_reason_error(items: str, reason_field: str, reason: str | None, what: str) -> str | None:
    """The error for an empty ``items`` list whose ``reason_field`` is missing or says nothing (else None).

    ``what``: what the reason must state, e.g. "what in the log shows none of the three patterns".
    """
    text = (reason or "").strip()
    if not text:
        return f"{items} is empty but {reason_field} is missing: say {what}, or report what you found"
    if says_nothing(text):
        return (
            f"{reason_field} {text!r} says nothing: say {what} (at least {MIN_REASON_WORDS} words about this "
            f"evidence), or report what you found"
        )
    return None
