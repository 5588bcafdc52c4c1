"""Word-level diffs of changed text fields (difflib), for the text, Markdown and HTML renderings.

Cutting both sides of a long changed string to the same prefix hides the change; a word diff shows
exactly the words removed and added, with a little unchanged context around each change (long
unchanged stretches collapse to "…").
"""

from __future__ import annotations

import difflib
import re
from typing import Literal

from markupsafe import escape

Op = Literal["equal", "delete", "insert"]
CONTEXT_WORDS = 8  # unchanged words kept on each side of a change in the inline form

_TOKENS = re.compile(r"\s+|[^\s]+")


def word_ops(a: str, b: str) -> list[tuple[Op, str]]:
    """The edit from ``a`` to ``b`` as runs of equal / deleted / inserted text (whitespace kept)."""
    ta, tb = _TOKENS.findall(a), _TOKENS.findall(b)
    out: list[tuple[Op, str]] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=ta, b=tb, autojunk=False).get_opcodes():
        if tag == "equal":
            out.append(("equal", "".join(ta[i1:i2])))
            continue
        if tag in ("delete", "replace"):
            out.append(("delete", "".join(ta[i1:i2])))
        if tag in ("insert", "replace"):
            out.append(("insert", "".join(tb[j1:j2])))
    return out


def _collapse(text: str, first: bool, last: bool) -> str:
    """Unchanged text with only CONTEXT_WORDS words kept next to the changes around it."""
    words = text.split()
    if len(words) <= 2 * CONTEXT_WORDS:
        return " ".join(words)
    head = [] if first else words[:CONTEXT_WORDS]
    tail = [] if last else words[-CONTEXT_WORDS:]
    return " ".join([*head, "…", *tail]).strip()


Style = Literal["text", "markdown"]


def inline(a: str, b: str, style: Style = "text") -> str:
    """One line: unchanged context, removed words as ``[-…-]`` and added ones as ``{+…+}`` (``~~…~~`` / ``**…**``)."""
    ops = word_ops(" ".join(a.split()), " ".join(b.split()))
    parts: list[str] = []
    for i, (op, text) in enumerate(ops):
        text = text.strip()
        if not text:
            continue
        if op == "equal":
            parts.append(_collapse(text, first=i == 0, last=i == len(ops) - 1))
        elif style == "markdown":
            parts.append(f"~~{text}~~" if op == "delete" else f"**{text}**")
        else:
            parts.append(f"[-{text}-]" if op == "delete" else f"{{+{text}+}}")
    return " ".join(p for p in parts if p)


def sides_html(a: str, b: str) -> tuple[str, str]:
    """Both sides in full as escaped HTML, removed words marked in A (``<del>``) and added ones in B (``<ins>``)."""
    left: list[str] = []
    right: list[str] = []
    for op, text in word_ops(a, b):
        t = str(escape(text))
        if op == "equal":
            left.append(t)
            right.append(t)
        elif op == "delete":
            left.append(f"<del>{t}</del>")
        else:
            right.append(f"<ins>{t}</ins>")
    return "".join(left), "".join(right)
