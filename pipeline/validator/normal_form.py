"""The form of a card's text that the rules read: what a reader sees, not how it is encoded.

A card could hide a forbidden thing from a pattern without hiding it from a human reader:
a Cyrillic ``ѕrс/х.ру`` reads as ``src/x.py``, a no-break space or a zero-width space
between ``filter`` and ``.py`` is invisible, a right-to-left override shows ``x.py`` for
the stored ``x.yp``. So before any rule runs, every text field is put in one form:

1. NFKC (full-width ``３０％`` is ``30%``, math letters ``𝐬𝐫𝐜`` are ``src``, every odd space
   such as U+00A0 or U+3000 is a plain space);
2. format characters (Unicode category Cf: zero-width spaces and joiners, soft hyphens,
   bidi embeddings, overrides and isolates, BOM) removed; where a right-to-left override
   reverses a run of text, the text as displayed is appended on a new line, so a rule sees
   both the stored and the displayed text; a no-break space between a word and ``.ext`` is
   dropped (it glues the two into what a reader sees as one file name);
3. letters of other scripts that are confusable with a Latin letter or digit (Unicode's
   confusables table, via the ``confusable-homoglyphs`` package) replaced by it. CJK
   scripts are left alone: Chinese cards are read as written.

Rules quote the normalised text in their messages. Letter case is kept (rules decide).
"""

from __future__ import annotations

import re
import unicodedata
from functools import cache
from itertools import chain

# Scripts whose letters are read as written even where one looks like a Latin letter
# (口 is not "o", ー is not "-"): the cards are Chinese or English, and CJK text is meant.
_KEEP_SCRIPTS = frozenset({"LATIN", "COMMON", "HAN", "HIRAGANA", "KATAKANA", "HANGUL", "BOPOMOFO", "INHERITED"})

# Every format character (Cf) lies in the BMP, planes 1-2 or the tags block of plane 14 (a test
# checks it against the whole code space); scanning only these keeps the table build ~30 ms.
_FORMAT_PLANES = (range(0x30000), range(0xE0000, 0xE1000))

_RLO = "\u202e"
# A no-break space glues, it does not separate: ``filter\u00a0.py`` shows as one name, so it is read as one.
_GLUE_BEFORE_DOT = re.compile(r"(?<=\w)[\u00a0\u2007\u202f]+(?=\.\w)")
_RLO_RUN = re.compile(r"\u202e([^\u202c\u2069\n]*)")  # up to PDF / PDI / end of line


@cache
def _fold_table() -> dict[int, str | None]:
    """Format character -> nothing, confusable letter -> its Latin letter or digit (built once)."""
    # Imported here: the confusables table is 0.9 MB of JSON, read only when a card is validated.
    from confusable_homoglyphs import categories
    from confusable_homoglyphs.confusables import confusables_data

    table: dict[int, str | None] = {
        c: None for c in chain.from_iterable(_FORMAT_PLANES) if unicodedata.category(chr(c)) == "Cf"
    }
    for char, entries in confusables_data.items():
        if len(char) != 1 or char.isascii() or not unicodedata.category(char).startswith(("L", "N")):
            continue
        if categories.alias(char) in _KEEP_SCRIPTS:
            continue
        for entry in entries:
            target = entry["c"]
            if len(target) == 1 and target.isascii() and target.isalnum():
                table[ord(char)] = target
                break
    return table


def rule_text(text: str) -> str:
    """The text every validator rule reads (see the module docstring)."""
    if text.isascii():
        return text  # the common case: nothing to fold
    text = unicodedata.normalize("NFKC", _GLUE_BEFORE_DOT.sub("", text))
    if _RLO in text:
        text += "\n" + _RLO_RUN.sub(lambda m: m.group(1)[::-1], text)
    return text.translate(_fold_table())
