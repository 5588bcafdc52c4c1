"""The raw lines behind every event id and ref a run's artifacts cite, read from the frozen bundle.

Lines are read through :func:`pipeline.ir.refs.resolve_ref`, which re-hashes the file against
the manifest; the digest is also compared with the one the IR recorded. A mismatch is shown as
such and its lines are not embedded: a report never shows bytes that are not the frozen ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core.canonical import sha256_text
from pipeline.core.errors import LunasolError
from pipeline.ir.redact import redact
from pipeline.ir.refs import resolve_ref

SNIPPET_LIMIT = 64_000  # characters of raw text embedded per ref; the rest is cut with a marker

_REF_PARTS = re.compile(r"^(?P<path>[^#]+)#L(?P<start>\d+)(?:-L(?P<end>\d+))?(?P<pointer>/.*)?$")


@dataclass
class Snippet:
    """One cited event id or ref and the raw lines it points to."""

    key: str
    anchor: str
    path: str | None = None
    line_start: int | None = None
    line_end: int | None = None
    sha256: str | None = None  # the file's digest in the manifest, checked against the bytes
    expected_sha256: str | None = None  # the digest the IR recorded for an event's source file
    status: str = "unresolved"  # verified | hash_mismatch | unreadable | not_in_ir | bad_ref
    event: dict[str, Any] = field(default_factory=dict)  # cell, kind, actor, stage of an IR event
    lines: list[tuple[int, str]] = field(default_factory=list)
    pointer: str | None = None
    element: str | None = None  # the JSON-pointer element, pretty-printed, when the ref has one
    note: str | None = None

    @property
    def ref(self) -> str | None:
        """``PATH#Lstart-Lend`` for ``lunasol show-ref``."""
        if self.path is None or self.line_start is None or self.line_end is None:
            return None
        return f"{self.path}#L{self.line_start}-L{self.line_end}" + (self.pointer or "")


def anchor_for(key: str) -> str:
    """A DOM-safe, stable anchor id for a cited key."""
    return "raw-" + sha256_text(key).removeprefix("sha256:")[:16]


class EvidenceReader:
    """Resolve cited keys against a run's IR and its frozen bundle (each distinct ref resolved once)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.ir_path = run_dir / "ir.duckdb"
        self._cache: dict[str, Any] = {}

    def _events(self, ids: list[str]) -> dict[str, dict[str, Any]]:
        if not ids or not self.ir_path.is_file():
            return {}
        import duckdb

        con = duckdb.connect(str(self.ir_path), read_only=True)
        try:
            cols = [r[0] for r in con.execute("DESCRIBE events").fetchall()]
            want = [
                c
                for c in (
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
                if c in cols
            ]
            rows = con.execute(
                f"SELECT {', '.join(want)} FROM events WHERE event_id IN (SELECT unnest(?))", [ids]
            ).fetchall()
        finally:
            con.close()
        return {r[0]: dict(zip(want, r, strict=True)) for r in rows}

    def _fill(self, snip: Snippet) -> None:
        """Embed the frozen lines through :func:`pipeline.ir.refs.resolve_ref` (hash checked there)."""
        ref = snip.ref
        assert ref is not None
        if ref in self._cache:
            view_or_error = self._cache[ref]
        else:
            try:
                view_or_error = resolve_ref(self.run_dir, ref)
            except LunasolError as exc:
                view_or_error = exc.one_line()
            self._cache[ref] = view_or_error
        if isinstance(view_or_error, str):
            snip.status = "hash_mismatch" if "changed" in view_or_error or "digest" in view_or_error else "unreadable"
            snip.note = view_or_error + " — lines not embedded"
            return
        view = view_or_error
        snip.sha256 = view.sha256
        if snip.expected_sha256 and view.sha256 != snip.expected_sha256:
            snip.status = "hash_mismatch"
            snip.note = f"the IR recorded {snip.expected_sha256} but the bundle's file is {view.sha256}"
            return
        used = 0
        assert snip.line_start is not None
        # A report is shared: the raw lines it embeds are redacted like the IR (newlines kept, so
        # line numbers still match the raw file; show-ref --unredacted shows the bytes themselves).
        lines, _ = redact(view.lines)
        for n, text in enumerate(lines.split("\n"), start=snip.line_start):
            if used + len(text) > SNIPPET_LIMIT:
                keep = max(SNIPPET_LIMIT - used, 0)
                text = text[:keep] + f" [... report cut {len(text) - keep} chars; see lunasol show-ref]"
            used += len(text)
            snip.lines.append((n, text))
        snip.element = redact(view.element)[0][:SNIPPET_LIMIT] if view.element else None
        snip.status = "verified"

    def resolve(self, keys: set[str]) -> dict[str, Snippet]:
        """Snippets for every key (event ids through the IR, refs directly), in key order."""
        event_keys = sorted(k for k in keys if "#L" not in k)
        events = self._events(event_keys)
        out: dict[str, Snippet] = {}
        for key in sorted(keys):
            snip = Snippet(key=key, anchor=anchor_for(key))
            if "#L" in key:
                m = _REF_PARTS.match(key)
                if not m:
                    snip.status, snip.note = "bad_ref", "not a PATH#Lstart-Lend ref"
                    out[key] = snip
                    continue
                snip.path, snip.pointer = m.group("path"), m.group("pointer")
                snip.line_start = int(m.group("start"))
                snip.line_end = int(m.group("end") or m.group("start"))
                self._fill(snip)
            elif key in events:
                ev = events[key]
                snip.event = {k: ev.get(k) for k in ("cell_id", "kind", "actor", "stage")}
                snip.path, snip.pointer = ev.get("source_path"), ev.get("json_pointer")
                snip.line_start, snip.line_end = ev.get("line_start"), ev.get("line_end")
                snip.expected_sha256 = ev.get("source_sha256")
                self._fill(snip)
            else:
                snip.status, snip.note = "not_in_ir", "no such event in this run's IR"
            out[key] = snip
        return out
