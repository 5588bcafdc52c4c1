"""Why something failed, in one short phrase (the full error is kept where it was written).

A failed cell's reason was one 10,979-character line of pydantic errors, repeated per part. A
reader needs the cause in a few words ("empty list without none_reason", "patterns: Field
required"), and the count of parts it hit; the whole text stays in ``calls.jsonl`` and the report.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

PHRASE_CHARS = 120

_URL = re.compile(r"For further information visit \S+")
# "[type=..., input_value=..., input_type=...]": the input value may hold brackets and quotes of its own
_PYDANTIC_DETAIL = re.compile(r"\[type=[\w.]+(?:, input_value=.*?, input_type=\w+)?\]")
_HEAD = re.compile(r"^(?:[\w.]+Error|[\w.]+Exception): (?:\d+ validation errors? for \w+\s*)?")
# Our own checks' messages, worded for the model: the few that recur get their short name.
_KNOWN = (
    (re.compile(r"patterns is empty but none_reason is missing"), "empty list without none_reason"),
    (re.compile(r"none_reason .* says nothing"), "none_reason says nothing"),
    (re.compile(r"finish_reason length|was cut at max_tokens"), "answer cut at max_tokens"),
    (re.compile(r"rejected the request format"), "request format rejected (--mode)"),
)


def one_phrase(error: str, limit: int = PHRASE_CHARS) -> str:
    """The gist of one error message: a known cause's short name, else its first fields and messages, cut."""
    text = " ".join(str(error).split())
    for pattern, name in _KNOWN:
        if pattern.search(text):
            return name
    text = _URL.sub("", text)
    if _PYDANTIC_DETAIL.search(text):
        # "loc msg [type=...] loc msg [type=...]": each field with its message, the details dropped
        items = [" ".join(p.split()) for p in _PYDANTIC_DETAIL.split(_HEAD.sub("", text))]
        text = "; ".join(i for i in items if i)
    else:
        text = _HEAD.sub("", text)
    text = text.replace("Value error, ", "").strip(" ;")
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def parts_phrase(errors_per_part: Sequence[Sequence[str]], total: int) -> str:
    """``"29 of 33 parts: empty list without none_reason"``: how many parts failed and the commonest cause."""
    phrases = Counter(one_phrase(errs[0]) if errs else "no answer" for errs in errors_per_part)
    if not phrases:
        return "no answer"
    common, n = phrases.most_common(1)[0]
    others = len(phrases) - 1
    more = f" (+{others} other cause{'s' if others > 1 else ''})" if others else ""
    head = f"{len(errors_per_part)} of {total} parts: " if total > 1 else ""
    return f"{head}{common}{more}" if n == len(errors_per_part) or total > 1 else common
