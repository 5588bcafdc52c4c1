"""The raw lines behind every event id and ref a run's artifacts cite, read from the frozen bundle.

One batched pass (:class:`pipeline.ir.refs.RefReader`): the manifest is read once and each raw
file is read and hashed once, however many refs point into it. The digest is also compared with
the one the IR recorded. A mismatch is shown as such and its lines are not embedded: a report
never shows bytes that are not the frozen ones. Besides the cited lines, ``CONTEXT_LINES`` lines
either side are kept, so a reader sees what came just before and after.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from pipeline.artifacts.rundir import RunDir
from pipeline.core import duck
from pipeline.core.canonical import sha256_text
from pipeline.core.errors import LunasolError
from pipeline.core.refs import REF
from pipeline.ir.redact import redact
from pipeline.ir.refs import RefReader

SNIPPET_LIMIT = 64_000  # characters of raw text embedded per line; the rest is cut with a marker
CONTEXT_LINES = 3  # lines shown before and after a ref's own lines

_EVENT_COLUMNS = (
    "event_id",
    "cell_id",
    "kind",
    "actor",
    "stage",
    "source_path",
    "line_start",
    "line_end",
    "source_sha256",
    "json_pointer",
)


@dataclass
class Snippet:
    """One cited event id or ref and where its raw lines are (the lines live in :class:`Evidence`)."""

    key: str
    anchor: str
    path: str | None = None
    line_start: int | None = None
    line_end: int | None = None
    sha256: str | None = None  # the file's digest in the manifest, checked against the bytes
    expected_sha256: str | None = None  # the digest the IR recorded for an event's source file
    status: str = "unresolved"  # verified | hash_mismatch | unreadable | not_in_ir | bad_ref
    event: dict[str, Any] = field(default_factory=dict)  # cell, kind, actor, stage of an IR event
    pointer: str | None = None
    element: str | None = None  # the JSON-pointer element, pretty-printed, when the ref has one
    position: str | None = None  # where that element sits in its line(s)
    note: str | None = None

    @property
    def ref(self) -> str | None:
        """``PATH#Lstart-Lend`` for ``lunasol show-ref``."""
        if self.path is None or self.line_start is None or self.line_end is None:
            return None
        return f"{self.path}#L{self.line_start}-L{self.line_end}" + (self.pointer or "")

    @property
    def lines_key(self) -> str | None:
        """Where its lines are kept: per file, or per ref when a pointer names one document's (or member's) lines."""
        return self.ref if self.pointer else self.path

    def to_json(self) -> dict[str, Any]:
        """What the page's viewer needs to show this key."""
        return {
            "key": self.key,
            "status": self.status,
            "path": self.path,
            "start": self.line_start,
            "end": self.line_end,
            "ref": self.ref,
            "lines": self.lines_key,
            "sha256": self.sha256 or self.expected_sha256,
            "event": self.event or None,
            "element": self.element,
            "position": self.position,
            "note": self.note,
        }


@dataclass
class Evidence:
    """Every cited key's snippet, and the frozen lines (cited ones and their context) per file."""

    snippets: dict[str, Snippet]
    lines: dict[str, dict[int, str]]  # Snippet.lines_key -> line number -> text

    def cited_lines(self, snip: Snippet) -> list[tuple[int, str]]:
        """The snippet's own lines (empty when they were not embedded)."""
        if snip.status != "verified" or snip.lines_key is None or snip.line_start is None or snip.line_end is None:
            return []
        have = self.lines.get(snip.lines_key, {})
        return [(n, have[n]) for n in range(snip.line_start, snip.line_end + 1) if n in have]


def anchor_for(key: str) -> str:
    """A DOM-safe, stable anchor id for a cited key."""
    return "raw-" + sha256_text(key).removeprefix("sha256:")[:16]


def _cut(text: str) -> str:
    if len(text) <= SNIPPET_LIMIT:
        return text
    return text[:SNIPPET_LIMIT] + f" [... report cut {len(text) - SNIPPET_LIMIT} chars; see lunasol show-ref]"


class EvidenceReader:
    """Resolve cited keys against a run's IR and its frozen bundle, in one pass over the files."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.ir_path = RunDir(run_dir).ir
        # Kept across resolve() calls (the report resolves a shard of cells at a time): the manifest is
        # read once, the IR opened once.
        self._reader: RefReader | None = None
        self._opened: str | None = None
        self._con: duckdb.DuckDBPyConnection | None = None
        self._cols: list[str] = []

    def close(self) -> None:
        """Release the IR connection (the frozen files are read one at a time and not kept open)."""
        if self._con is not None:
            self._con.close()
            self._con = None

    def __enter__(self) -> EvidenceReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _events(self, ids: list[str], cells: tuple[str, str] | None = None) -> dict[str, dict[str, Any]]:
        """The IR rows of event ``ids``; ``cells`` (first, last cell id) where they are expected to be.

        The range lets DuckDB skip the rest of the events table (read a shard of cells at a time);
        ids outside it are looked up in the whole table.
        """
        if not ids or not self.ir_path.is_file():
            return {}
        if self._con is None:
            self._con = duck.connect(self.ir_path, read_only=True)
            have = {r[0] for r in self._con.execute("DESCRIBE events").fetchall()}
            self._cols = [c for c in _EVENT_COLUMNS if c in have]
        sql = f"SELECT {', '.join(self._cols)} FROM events WHERE event_id IN (SELECT unnest(?))"
        found: dict[str, dict[str, Any]] = {}
        if cells is not None:
            rows = self._con.execute(sql + " AND cell_id BETWEEN ? AND ?", [ids, *cells]).fetchall()
            found = {r[0]: dict(zip(self._cols, r, strict=True)) for r in rows}
            ids = [i for i in ids if i not in found]
        if ids:
            rows = self._con.execute(sql, [ids]).fetchall()
            found.update({r[0]: dict(zip(self._cols, r, strict=True)) for r in rows})
        return found

    def _place(self, keys: set[str], cells: tuple[str, str] | None = None) -> dict[str, Snippet]:
        """Every key's snippet with its path and lines known (or why not), nothing read yet."""
        events = self._events(sorted(k for k in keys if "#L" not in k), cells)
        out: dict[str, Snippet] = {}
        for key in sorted(keys):
            snip = Snippet(key=key, anchor=anchor_for(key))
            out[key] = snip
            if "#L" in key:
                m = REF.match(key)
                if not m:
                    snip.status, snip.note = "bad_ref", "not a PATH#Lstart-Lend ref"
                    continue
                snip.path, snip.pointer = m.group("path"), m.group("pointer")
                snip.line_start = int(m.group("start"))
                snip.line_end = int(m.group("end") or m.group("start"))
            elif key in events:
                ev = events[key]
                snip.event = {k: ev.get(k) for k in ("cell_id", "kind", "actor", "stage")}
                snip.path, snip.pointer = ev.get("source_path"), ev.get("json_pointer")
                snip.line_start, snip.line_end = ev.get("line_start"), ev.get("line_end")
                snip.expected_sha256 = ev.get("source_sha256")
            else:
                snip.status, snip.note = "not_in_ir", "no such event in this run's IR"
        return out

    def resolve(self, keys: set[str], cells: tuple[str, str] | None = None) -> Evidence:
        """Snippets for every key (event ids through the IR, refs directly) and the lines they show.

        ``cells``: the (first, last) cell ids the keys' events are expected in (a narrower IR lookup).
        """
        snippets = self._place(keys, cells)
        todo = sorted(
            (s for s in snippets.values() if s.path is not None and s.status == "unresolved"),
            key=lambda s: (s.path or "", s.line_start or 0, s.key),
        )
        lines: dict[str, dict[int, str]] = {}
        if self._reader is None and self._opened is None and todo:
            try:
                self._reader, self._opened = RefReader(self.run_dir), ""
            except LunasolError as exc:
                self._opened = exc.one_line()
        reader, opened = self._reader, self._opened or ""
        for snip in todo:  # sorted by path: the reader keeps one file at a time
            if reader is None:
                snip.status, snip.note = "unreadable", opened + " — lines not embedded"
                continue
            ref = snip.ref
            assert ref is not None and snip.path is not None
            try:
                view = reader.view(ref)
                file_lines = reader.file_lines(snip.path) if not snip.pointer else None
            except LunasolError as exc:
                msg = exc.one_line()
                snip.status = "hash_mismatch" if "changed" in msg or "digest" in msg else "unreadable"
                snip.note = msg + " — lines not embedded"
                continue
            snip.sha256 = view.sha256
            if snip.expected_sha256 and view.sha256 != snip.expected_sha256:
                snip.status = "hash_mismatch"
                snip.note = f"the IR recorded {snip.expected_sha256} but the bundle's file is {view.sha256}"
                continue
            assert snip.line_start is not None and snip.line_end is not None
            have = lines.setdefault(snip.lines_key or snip.path, {})
            # A report is shared: the raw lines it embeds are redacted like the IR, the window as one
            # text (a multi-line key block is found whole; its line breaks are kept, so numbers match).
            if file_lines is not None:
                lo = max(1, snip.line_start - CONTEXT_LINES)
                hi = min(len(file_lines), snip.line_end + CONTEXT_LINES)
                window = redact("\n".join(file_lines[lo - 1 : hi]))[0].split("\n")
                for n in range(lo, hi + 1):
                    if n not in have:
                        have[n] = _cut(window[n - lo])
            elif view.element is None:  # a pointer into one document (or a zip member): its own lines only
                for n, text in enumerate(redact(view.lines)[0].split("\n"), start=snip.line_start):
                    have.setdefault(n, _cut(text))
            # A pointer's element alone, never the line around it: one line may hold a whole run with
            # its labels (an Inspect sample's target and scores, a MAST record) the report must not show.
            snip.element = redact(view.element)[0][:SNIPPET_LIMIT] if view.element else None
            snip.position = view.position
            snip.status = "verified"
        return Evidence(snippets, lines)
