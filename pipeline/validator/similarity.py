"""No two cards in one file that are the same strategy in other words.

Deterministic measure: the ``proposed_strategy`` and ``rationale`` of each card are
normalised (NFKC, lower case, punctuation dropped) and cut into units - one unit per CJK
character, one per Latin word (stop words dropped, a plural / past ``s`` / ``ed`` / ``ing``
stripped). The score is the mean of the Jaccard similarity of unit unigrams and of unit
bigrams, so it works for Chinese, English and the mixed text example cards use. Two
cards at or above ``THRESHOLD`` are flagged on the later card.

Calibration (tests/test_validator_similarity.py): the reference example cards P-01 vs P-02 (two genuinely
different levers on one weakness) and every pair of valid corpus cards stay well below
the threshold; paraphrased duplicates in the invalid corpus stay above it. Limitation: a
duplicate written in another language is not caught.
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from typing import Any

from pipeline.artifacts.proposal_card import ProposalCard

RULES: dict[str, str] = {"V-DUPLICATE-STRATEGY": "two cards in one file are the same strategy in other words"}

THRESHOLD = 0.32

_TOKEN = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]|[a-z0-9]+")
_STOP_WORDS = (
    "a an the of to in on for and or but is are be been being it its this that these those with by as at from into "
    "than then so such which who whom whose when where while not no nor do does did will would can could should "
    "may might must shall card strategy proposal"
)
_STOP = frozenset(_STOP_WORDS.split(" "))
_CJK_STOP = frozenset("的了是在和与及或而也就都将把被对其之")


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


def units(text: str) -> list[str]:
    """The comparison units of a text: CJK characters and stemmed Latin words, stop words dropped."""
    norm = unicodedata.normalize("NFKC", text).lower()
    out = []
    for tok in _TOKEN.findall(norm):
        if tok.isascii():
            if tok in _STOP or len(tok) < 2:
                continue
            out.append(_stem(tok))
        elif tok not in _CJK_STOP:
            out.append(tok)
    return out


def _jaccard(a: set[Any], b: set[Any]) -> float:
    return len(a & b) / len(a | b) if a or b else 0.0


def similarity(a: ProposalCard, b: ProposalCard) -> float:
    """Similarity in [0, 1] of two cards' strategy (proposed_strategy + rationale)."""
    ua = units(a.strategy_change.proposed_strategy + " " + a.strategy_change.rationale)
    ub = units(b.strategy_change.proposed_strategy + " " + b.strategy_change.rationale)
    uni = _jaccard(set(ua), set(ub))
    bi = _jaccard(set(itertools.pairwise(ua)), set(itertools.pairwise(ub)))
    return (uni + bi) / 2


def check_duplicates(cards: list[tuple[int, ProposalCard]]) -> list[tuple[int, str, str, str]]:
    """Return (card index, rule, path, message) for each later card that duplicates an earlier one."""
    out = []
    for j, (jdx, later) in enumerate(cards):
        for idx, earlier in cards[:j]:
            score = similarity(earlier, later)
            if score >= THRESHOLD:
                out.append(
                    (
                        jdx,
                        "V-DUPLICATE-STRATEGY",
                        f"proposals[{jdx}].strategy_change.proposed_strategy",
                        f"same strategy as proposals[{idx}] ({earlier.proposal_id}) in other words "
                        f"(similarity {score:.2f} >= {THRESHOLD}); one lever, one card",
                    )
                )
                break
    return out
