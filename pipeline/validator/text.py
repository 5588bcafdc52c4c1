"""Language-independent text helpers shared by the rule families (Chinese and English)."""

from __future__ import annotations

import re
import unicodedata

from pipeline.artifacts.proposal_card import ProposalCard
from pipeline.validator.findings import TextField
from pipeline.validator.limits import MAX_FIELD_CHARS
from pipeline.validator.normal_form import rule_text

# Sentence ends: CJK and ASCII punctuation, newlines; a period only when followed by space/end
# so that "0.7x" and "e.g.x" stay whole.
_SENTENCE_SPLIT = re.compile(r"[。！？；;!?\n]+|\.(?=\s|$)")
_CLAUSE_SPLIT = re.compile(r"[。！？；;!?\n，,：:()（）]+|\.(?=\s|$)")

NEGATION = re.compile(
    r"(?i)\b(?:not|no|never|without|nor|neither|none)\b|n't\b|"
    r"不|没有|没|无需|无须|并非|而非|未|勿"
)


def sentences(text: str) -> list[str]:
    """Split into sentences (CJK and ASCII punctuation, newlines)."""
    return [s.strip() for s in _SENTENCE_SPLIT.split(text) if s.strip()]


def clauses(text: str) -> list[str]:
    """Split into clauses (sentences, then commas and colons)."""
    return [s.strip() for s in _CLAUSE_SPLIT.split(text) if s.strip()]


NEGATION_WINDOW = 24
"""How far (characters) before a word a negation still governs it: "names no target file or patch"."""


def negated_before(clause: str, start: int) -> bool:
    """True when a negation word occurs in ``clause`` shortly before offset ``start``."""
    return NEGATION.search(clause[max(0, start - NEGATION_WINDOW) : start]) is not None


def normalise(text: str) -> str:
    """NFKC, lower case, single spaces: full-width digits and letters become ASCII."""
    return " ".join(unicodedata.normalize("NFKC", text).lower().split())


def card_fields(card: ProposalCard, prefix: str) -> list[TextField]:
    """Every text leaf of a card with its path (``prefix.evidence.summary``) and area.

    The text is in the form the rules read (:func:`pipeline.validator.normal_form.rule_text`):
    homoglyphs, invisible characters and bidi overrides cannot hide a forbidden thing.
    """
    out: list[TextField] = []

    def walk(value: object, path: str, area: str) -> None:
        if isinstance(value, str):
            # One character past the bound is enough to know the field is too long (limits.py).
            out.append(TextField(path=path, area=area, text=rule_text(value[: MAX_FIELD_CHARS + 1])))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                walk(item, f"{path}[{i}]", area)
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{path}.{key}", area)

    for key, value in card.model_dump(mode="json").items():
        walk(value, f"{prefix}.{key}", key if isinstance(value, dict | list) else "identity")
    return out
