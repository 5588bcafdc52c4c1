"""How much of a card the rules read: a bound per field and per card.

A card states one behaviour change in a few sentences (the reference example cards: fields under 400
characters, cards under 3,000). Every pattern is linear, but a model can still answer with
megabytes; so a field longer than ``MAX_FIELD_CHARS`` or a card longer than
``MAX_CARD_CHARS`` is a finding of its own (``V-TOO-LONG``), and the content rules read
only the first ``MAX_FIELD_CHARS`` of each field, up to ``MAX_CARD_CHARS`` per card. The
validator's time is then bounded per card whatever the input.
"""

from __future__ import annotations

from dataclasses import replace

from pipeline.validator.findings import TextField

MAX_FIELD_CHARS = 4_000
"""Longest text field the rules read whole (10x the longest field of the reference example cards)."""
MAX_CARD_CHARS = 32_000
"""Most text the rules read in one card (10x the longest seed card)."""

RULES: dict[str, str] = {
    "V-TOO-LONG": f"a text field over {MAX_FIELD_CHARS:,} characters or a card over {MAX_CARD_CHARS:,}",
}


def bound_fields(fields: list[TextField]) -> tuple[list[TextField], list[tuple[str, str, str]]]:
    """The fields cut to the bounds, and a ``V-TOO-LONG`` finding per field that was cut."""
    out: list[TextField] = []
    found: list[tuple[str, str, str]] = []
    budget = MAX_CARD_CHARS
    for f in fields:
        if budget <= 0:
            found.append(("V-TOO-LONG", f.path, f"not read: the card is over {MAX_CARD_CHARS:,} characters"))
            continue
        size = len(f.text)
        keep = min(size, MAX_FIELD_CHARS, budget)
        if size > MAX_FIELD_CHARS:
            found.append(
                ("V-TOO-LONG", f.path, f"over {MAX_FIELD_CHARS:,} characters; a field states one point, briefly")
            )
        elif keep < size:
            found.append(("V-TOO-LONG", f.path, f"read in part: the card is over {MAX_CARD_CHARS:,} characters"))
        out.append(f if keep == size else replace(f, text=f.text[:keep]))
        budget -= keep
    return out, found
