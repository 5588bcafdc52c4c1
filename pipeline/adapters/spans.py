"""Where a JSON value sits in its file: line spans for JSON pointers, and resolving refs back to bytes.

Adapters never rewrite a source file, so an IR event points into the original bytes: a 1-based
inclusive line range plus, for JSON sources, a JSON pointer (RFC 6901) to the element. The pointer
is resolved against the whole file when the file is one JSON document, else (JSON Lines) against
the document on ``line_start``. When the element is a string holding a multi-line log (MAST
traces), the pointer may end with ``#L<a>-L<b>``: lines a..b (1-based) of the decoded string, and ``#/inner/pointer``
descends into a string that itself holds JSON (segments apply left to right).

The span finder is a small tokenizer (strings and structural characters only), so it is exact for
any valid JSON, pretty-printed or compact, without a second full parse per element.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from pipeline.core.limits import check_lines, check_size, limit, parse_json, read_member
from pipeline.core.zips import open_zip

_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\],:]', re.DOTALL)
_NONSPACE = re.compile(r"\S")


def escape_token(token: str | int) -> str:
    """Escape one JSON pointer reference token (RFC 6901)."""
    return str(token).replace("~", "~0").replace("/", "~1")


def pointer(*tokens: str | int) -> str:
    """Build a JSON pointer from reference tokens."""
    return "".join("/" + escape_token(t) for t in tokens)


def split_pointer(ptr: str) -> list[str]:
    """Split a JSON pointer into unescaped reference tokens."""
    if not ptr:
        return []
    if not ptr.startswith("/"):
        raise ValueError(f"not a JSON pointer: {ptr!r}")
    return [t.replace("~1", "/").replace("~0", "~") for t in ptr[1:].split("/")]


def get_pointer(doc: Any, ptr: str) -> Any:
    """The element of ``doc`` at ``ptr``; KeyError/IndexError/ValueError when it does not exist."""
    node = doc
    for tok in split_pointer(ptr):
        if isinstance(node, list):
            if not tok.isdigit():
                raise ValueError(f"array index expected, got {tok!r}")
            node = node[int(tok)]
        elif isinstance(node, dict):
            node = node[tok]
        else:
            raise KeyError(tok)
    return node


def value_spans(text: str, max_depth: int = 4, base: str = "") -> dict[str, tuple[int, int]]:
    """Character spans ``[start, end)`` of every JSON value down to ``max_depth`` pointer tokens.

    ``base`` is prefixed to every pointer (used for JSON Lines, where each line is its own document).
    """
    spans: dict[str, tuple[int, int]] = {}
    m = _NONSPACE.search(text)
    if m is None:
        return spans
    root_start = m.start()
    # Frame: [kind ('{' or '['), pointer, next index, current key, element start, expecting key]
    stack: list[list[Any]] = []

    def close_element(frame: list[Any], end_pos: int) -> None:
        start = frame[4]
        if start is None:
            return
        end = end_pos
        while end > start and text[end - 1].isspace():
            end -= 1
        if frame[0] == "[":
            token: str | int = frame[2]
            frame[2] += 1
        else:
            token = frame[3]
        if len(stack) <= max_depth:
            spans[frame[1] + "/" + escape_token(token)] = (start, end)
        frame[4] = None

    for tok in _TOKEN.finditer(text):
        s = tok.group()
        pos = tok.start()
        if s == "{" or s == "[":
            ptr = base
            if stack:
                top = stack[-1]
                key = top[2] if top[0] == "[" else top[3]
                ptr = top[1] + "/" + escape_token(key)
            stack.append([s, ptr, 0, None, None, s == "{"])
            if s == "[":
                nxt = _NONSPACE.search(text, tok.end())
                if nxt is not None and nxt.group() != "]":
                    stack[-1][4] = nxt.start()
        elif s == "}" or s == "]":
            frame = stack.pop()
            if frame[4] is not None:
                close_element(frame, pos)
            if not stack:
                spans[base] = (root_start, tok.end())
        elif s == ",":
            frame = stack[-1]
            close_element(frame, pos)
            if frame[0] == "[":
                nxt = _NONSPACE.search(text, tok.end())
                frame[4] = nxt.start() if nxt is not None else None
            else:
                frame[5] = True
        elif s == ":":
            frame = stack[-1]
            nxt = _NONSPACE.search(text, tok.end())
            frame[4] = nxt.start() if nxt is not None else None
            frame[5] = False
        else:  # a string: an object key, or a value (spans closed by the next , } ])
            if stack and stack[-1][0] == "{" and stack[-1][5]:
                stack[-1][3] = json.loads(s)
    if base not in spans:  # a scalar document
        end = len(text.rstrip())
        spans[base] = (root_start, end)
    return spans


class LineIndex:
    """Maps character offsets of a text to 1-based line numbers."""

    def __init__(self, text: str) -> None:
        self._starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self.count = len(self._starts) if not text.endswith("\n") else len(self._starts) - 1

    def line_of(self, offset: int) -> int:
        """1-based line holding character ``offset``."""
        return bisect.bisect_right(self._starts, offset)

    def span(self, start: int, end: int) -> tuple[int, int]:
        """1-based inclusive line range of characters ``[start, end)``."""
        return self.line_of(start), self.line_of(max(start, end - 1))

    def line_start_offset(self, line: int) -> int:
        """Character offset where 1-based ``line`` begins."""
        return self._starts[line - 1]


@dataclass(frozen=True)
class Located:
    """A JSON element's place in its file."""

    line_start: int
    line_end: int
    json_pointer: str


class JsonFile:
    """A JSON document or a JSON Lines file, with line spans of its elements.

    ``docs`` holds ``(line_number or None, document)``: one entry with None for a JSON document,
    one per non-blank line for JSON Lines.
    """

    def __init__(self, text: str, max_depth: int = 4, source: str = "<json>") -> None:
        self.text = text
        self.lines = LineIndex(text)
        self.max_depth = max_depth
        self.jsonl = False
        # JSON Lines lines that do not parse (a truncated last line, log noise): left out of
        # ``docs`` and listed here so adapters can report them instead of failing the whole file.
        self.bad_lines: list[int] = []
        self.docs: list[tuple[int | None, Any]] = []
        # Bounded (pipeline.core.limits): a whole document up to LUNASOL_MAX_DOC_BYTES, else JSON Lines
        # of at most LUNASOL_MAX_LINE_BYTES each; too deep is one BundleError naming source and line.
        try:
            if len(text) > limit("LUNASOL_MAX_DOC_BYTES"):
                raise json.JSONDecodeError("over LUNASOL_MAX_DOC_BYTES as one document", text[:0], 0)
            self.docs = [(None, parse_json(text, source))]
        except json.JSONDecodeError as exc:
            self.jsonl = True
            self.docs = []
            lines = text.split("\n")
            if sum(1 for line in lines if line.strip()) <= 1:
                check_size(len(text), "LUNASOL_MAX_DOC_BYTES", source, "the JSON document")
            check_lines(lines, source)
            for i, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    self.docs.append((i, parse_json(line, f"{source} line {i}")))
                except json.JSONDecodeError:
                    self.bad_lines.append(i)
            # Mostly unparseable lines: a broken (e.g. truncated pretty-printed) document, not JSON Lines.
            if not any(isinstance(d, dict | list) for _, d in self.docs) or len(self.bad_lines) > len(self.docs):
                raise ValueError(f"neither JSON nor JSON Lines ({exc.msg} at line {exc.lineno})") from None
        self._spans: dict[int | None, dict[str, tuple[int, int]]] = {}

    def _spans_for(self, line: int | None) -> dict[str, tuple[int, int]]:
        if line not in self._spans:
            if line is None:
                self._spans[line] = value_spans(self.text, self.max_depth)
            else:
                off = self.lines.line_start_offset(line)
                raw = self.text.split("\n", line)[line - 1] if line > 0 else ""
                local = value_spans(raw, self.max_depth)
                self._spans[line] = {k: (a + off, b + off) for k, v in local.items() for a, b in [v]}
        return self._spans[line]

    def char_span(self, ptr: str, line: int | None = None) -> tuple[int, int]:
        """Character span ``[start, end)`` in the text of the element at ``ptr`` (or its deepest recorded ancestor)."""
        spans = self._spans_for(line)
        probe = ptr
        while probe not in spans:
            if not probe:
                raise KeyError(ptr)
            probe = probe.rsplit("/", 1)[0]
        return spans[probe]

    def locate(self, ptr: str, line: int | None = None) -> Located:
        """Line span of the element at ``ptr`` (in the document on ``line`` for JSON Lines).

        Elements deeper than ``max_depth`` get the span of their deepest recorded ancestor and keep
        their full pointer, so the ref still names the exact element.
        """
        a, b = self.char_span(ptr, line)
        ls, le = self.lines.span(a, b)
        return Located(ls, le, ptr)


def string_line_ranges(value: str) -> LineIndex:
    """Line index of a decoded string value (for ``#L`` suffixes inside a string)."""
    return LineIndex(value)


_FILES: dict[tuple[str, int], JsonFile] = {}


def _cached_file(raw: bytes, text: str, depth: int) -> JsonFile:
    # Resolving every ref of a run re-reads the same few files: parse each once per process.
    key = (hashlib.sha256(raw).hexdigest(), depth)
    jf = _FILES.get(key)
    if jf is None:
        if len(_FILES) > 32:
            _FILES.clear()
        jf = _FILES[key] = JsonFile(text, max_depth=depth)
    return jf


def _member(raw: bytes, json_pointer: str | None) -> tuple[bytes, str | None]:
    """(bytes the lines count in, pointer within them): a zip member's when the pointer names one."""
    if json_pointer and "!" in json_pointer.split("#", 1)[0]:
        # A member of a zip container (Inspect .eval): "/<member>!<pointer>", lines are the member's.
        member, _, rest = json_pointer.partition("!")
        with open_zip(raw) as zf:
            return read_member(zf, member.removeprefix("/"), "the zip"), rest
    return raw, json_pointer


def ref_lines(raw: bytes, line_start: int, line_end: int, json_pointer: str | None = None) -> str:
    """The raw lines a ref names: of the file, or of the zip member its pointer names."""
    data, _ = _member(raw, json_pointer)
    lines = data.decode("utf-8").split("\n")
    if data.endswith(b"\n"):
        lines = lines[:-1]
    if line_end > len(lines):
        raise ValueError(f"lines {line_start}-{line_end} are past the end of the file ({len(lines)} lines)")
    if not (1 <= line_start <= line_end):
        raise ValueError(f"lines {line_start}-{line_end} are not a line range")
    return "\n".join(lines[line_start - 1 : line_end])


def resolve_element(raw: bytes, line_start: int, line_end: int, json_pointer: str | None) -> str:
    """The exact source text behind a ref; raises ValueError when the ref does not hold.

    Without a pointer: the raw lines. With one: the element's canonical JSON (or the string's
    selected lines for a ``#L`` suffix), after checking that the element's own span lies within
    ``line_start..line_end``.
    """
    return resolve_element_at(raw, line_start, line_end, json_pointer)[0]


def resolve_element_at(raw: bytes, line_start: int, line_end: int, json_pointer: str | None) -> tuple[str, str | None]:
    """:func:`resolve_element` and where the element sits (None without a pointer).

    ``line 3, characters 120-980`` or ``lines 3-9``, then ``of member M`` for a zip member and
    any string suffix.
    """
    zipped = json_pointer is not None and "!" in json_pointer.split("#", 1)[0]
    member = json_pointer.partition("!")[0].removeprefix("/") if json_pointer and zipped else None
    raw, json_pointer = _member(raw, json_pointer)
    text = raw.decode("utf-8")
    lines = text.split("\n")
    if text.endswith("\n"):
        lines = lines[:-1]
    if not (1 <= line_start <= line_end <= len(lines)):
        raise ValueError(f"lines {line_start}-{line_end} outside the file ({len(lines)} lines)")
    if not json_pointer:
        return "\n".join(lines[line_start - 1 : line_end]), None
    ptr, *subs = json_pointer.split("#")
    jf = _cached_file(raw, text, len(split_pointer(ptr)))
    doc_line = None if not jf.jsonl else line_start
    doc = jf.docs[0][1] if doc_line is None else json.loads(lines[doc_line - 1])
    element = get_pointer(doc, ptr)
    loc = jf.locate(ptr, doc_line)
    if not (line_start <= loc.line_start and loc.line_end <= line_end):
        raise ValueError(f"{ptr} spans lines {loc.line_start}-{loc.line_end}, not within {line_start}-{line_end}")
    a, b = jf.char_span(ptr, doc_line)
    if loc.line_start == loc.line_end:
        col = jf.lines.line_start_offset(loc.line_start)
        place = f"line {loc.line_start}, characters {a - col + 1}-{b - col}"
    else:
        place = f"lines {loc.line_start}-{loc.line_end}"
    place += f" of member {member}" if member else ""
    place += "".join(f", string {sub}" for sub in subs)
    for sub in subs:  # inside a string value: "/ptr" parses it as JSON, "La-Lb" takes lines of it
        if not isinstance(element, str):
            raise ValueError(f"suffix #{sub} needs a string value")
        m = re.fullmatch(r"L(\d+)-L(\d+)", sub)
        if m is not None:
            inner = element.split("\n")
            a, b = int(m.group(1)), int(m.group(2))
            if not (1 <= a <= b <= len(inner)):
                raise ValueError(f"string lines {a}-{b} outside the value ({len(inner)} lines)")
            element = "\n".join(inner[a - 1 : b])
        elif sub.startswith("/"):
            element = get_pointer(json.loads(element), sub)
        else:
            raise ValueError(f"bad suffix #{sub}")
    if isinstance(element, str):
        return element, place
    return json.dumps(element, ensure_ascii=False, indent=2, sort_keys=True), place
