"""The two spellings of a raw-bytes ref, ``PATH#Lstart-Lend[/json/pointer]``, shared by every layer.

A ref is parsed whole (``REF``: a field that holds one ref) or found inside text (``REF_IN_TEXT``:
an answer, a card, a page). Both accept the end line with or without its ``L`` (``#L3-5`` is how
models often write ``#L3-L5``), so whatever one layer cites, every other layer reads the same way.
The pointer is what ``pipeline.ir.refs`` appends for an element of a JSON file, zip member or embedded log.
"""

from __future__ import annotations

import re

REF = re.compile(r"^(?P<path>[^#]+)#L(?P<start>\d+)(?:-L?(?P<end>\d+))?(?P<pointer>/.*)?$")
"""One whole ref (strip it first); groups ``path``, ``start``, ``end`` (may be None), ``pointer``."""

REF_IN_TEXT = re.compile(r"[^\s#'\"\[\](),]+#L\d+(?:-L?\d+)?(?:/[^\s'\"\]),]*)?")
"""A ref inside text: its path stops at whitespace, quotes, brackets, parentheses and commas."""
