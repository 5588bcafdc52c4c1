"""A cell's IR rendered compactly for Luna, split by segment when it exceeds the context budget.

Every event is shown with its id; long texts are trimmed with a visible marker (never silently).
Outcomes are never read here: this module only touches ``cells``, ``segments``, ``events`` and
``probe_hits``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

import duckdb

from pipeline.core import duck
from pipeline.probes.core import ProbeHit, read_probe_hits

# Rough token estimate: characters / 4 (no tokenizer needed offline, good enough for a budget).
CHARS_PER_TOKEN = 4
# Budget for one cell's rendered IR in one call; the prompt's fixed text comes on top.
DEFAULT_CONTEXT_TOKENS = 30_000
CONTEXT_ENV = "LUNASOL_LUNA_CONTEXT_TOKENS"

_LIMITS = {"message": 600, "tool_result": 400, "error": 400}
_DEFAULT_LIMIT = 300


def context_budget() -> int:
    """Tokens of rendered IR allowed per Luna call (``$LUNASOL_LUNA_CONTEXT_TOKENS`` or the default)."""
    raw = os.environ.get(CONTEXT_ENV)
    return int(raw) if raw and raw.isdigit() and int(raw) > 0 else DEFAULT_CONTEXT_TOKENS


def estimate_tokens(text: str) -> int:
    """Token estimate used for the budget: ceil(chars / 4)."""
    return -(-len(text) // CHARS_PER_TOKEN)


@dataclass
class Segment:
    """One segment of a cell and its rendered event lines."""

    segment_id: str
    header: str
    lines: list[str]
    event_ids: list[str]


@dataclass
class CellIR:
    """What Luna may see of one cell."""

    cell_id: str
    task_id: str
    run_id: str
    harness: str | None
    segments: list[Segment]
    seq_of: dict[str, int]
    hits: list[ProbeHit]

    @property
    def event_ids(self) -> set[str]:
        """Every event id of the cell."""
        return set(self.seq_of)


@dataclass
class Part:
    """One Luna call's share of a cell: whole segments in order (a huge segment may be cut in pieces)."""

    index: int
    total: int
    text: str
    shown_ids: set[str]
    events: int
    candidates: list[ProbeHit] = field(default_factory=list)

    @property
    def label(self) -> str:
        """'1/1' or 'k/n'."""
        return f"{self.index}/{self.total}"


_WS = re.compile(r"[ \t\r\f\v]+")
_FULL_DIGEST = re.compile(r"sha256:([0-9a-f]{12})[0-9a-f]{52}")


def _squash(text: str) -> str:
    # One line per event: newlines become a visible mark, runs of blanks fold.
    return _WS.sub(" ", text.strip()).replace("\n", " ⏎ ")


def trim(text: str, limit: int) -> str:
    """Trim to ``limit`` chars, keeping head and tail, with a marker naming what was cut."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    return f"{text[:head]} […{len(text) - head - tail} chars trimmed…] {text[-tail:]}"


def _short(d: str | None) -> str:
    return d.split(":", 1)[-1][:12] if d else ""


def render_event(row: dict[str, Any]) -> str:
    """One event as one line: id, time, kind and what it acts on, then the (trimmed) text."""
    kind = row["kind"]
    ts = (row.get("ts") or "")[11:19]
    tag = row.get("detail") or kind
    if kind == "message":
        tag = f"message {row.get('actor') or ''}".strip()
    elif kind in ("tool_call", "tool_result"):
        tag = f"{kind} {row.get('tool_name') or ''}".strip()
        if row.get("detail") and row["detail"] != kind:
            tag += f" {row['detail'].removeprefix('tool_result ')}"
    bits = [row["event_id"], ts, f"[{tag}]"]
    if row.get("call_id"):
        bits.append(f"call={row['call_id']}")
    if kind == "tool_call" and row.get("args_digest"):
        bits.append(f"args={_short(row['args_digest'])}")
    if kind in ("tool_result", "artifact") and row.get("result_digest"):
        bits.append(f"result={_short(row['result_digest'])}")
    if kind == "state_change" and row.get("state_digest") and row["state_digest"] not in (row.get("text") or ""):
        bits.append(f"state={_short(row['state_digest'])}")
    # Full digests in log text (state lines, artifacts) shown as their first 12 hex digits plus "…".
    text = _FULL_DIGEST.sub(r"sha256:\1…", _squash(row.get("text") or ""))
    if row.get("text_truncated"):
        text += f" [IR kept {len(row.get('text') or '')} of {row.get('text_chars')} chars]"
    limit = _LIMITS.get(kind, _DEFAULT_LIMIT)
    return " ".join(b for b in bits if b) + ": " + trim(text, limit)


_EVENT_SQL = (
    "SELECT event_id, cell_id, segment_id, seq, ts, kind, detail, actor, stage, session_id, text, text_truncated, "
    "text_chars, tool_name, call_id, args_digest, result_digest, state_digest, target FROM events "
    "WHERE cell_id IN (SELECT cell_id FROM {cells}) ORDER BY cell_id, seq"
)


def load_cells(con: duckdb.DuckDBPyConnection, only: list[str] | None = None) -> list[CellIR]:
    """Every eligible cell's IR as Luna sees it (segments in order, probe hits), ordered by cell id.

    ``only``: just these cells (a rerun renders the changed cells alone).
    """
    import pyarrow as pa

    wanted = "SELECT cell_id FROM cells WHERE eligibility = 'valid_behavior'"
    if only is not None:
        con.register("_lunasol_luna_only", pa.table({"cell_id": pa.array(only, pa.string())}))
        wanted += " AND cell_id IN (SELECT cell_id FROM _lunasol_luna_only)"
    con.execute(f"CREATE OR REPLACE TEMP VIEW _lunasol_luna_cells AS {wanted}")
    try:
        return _load(con)
    finally:
        con.execute("DROP VIEW IF EXISTS _lunasol_luna_cells")
        if only is not None:
            con.unregister("_lunasol_luna_only")


def _load(con: duckdb.DuckDBPyConnection) -> list[CellIR]:
    cells = con.execute(
        "SELECT cell_id, task_id, run_id, harness FROM cells "
        "WHERE cell_id IN (SELECT cell_id FROM _lunasol_luna_cells) ORDER BY cell_id"
    ).fetchall()
    segs: dict[str, dict[str, tuple[Any, ...]]] = {}
    for row in con.execute(
        "SELECT segment_id, cell_id, seq, stage, session_id, actor, first_event_seq, last_event_seq, event_count "
        "FROM segments WHERE cell_id IN (SELECT cell_id FROM _lunasol_luna_cells) ORDER BY cell_id, seq"
    ).fetchall():
        segs.setdefault(row[1], {})[row[0]] = row
    cur = con.execute(_EVENT_SQL.format(cells="_lunasol_luna_cells"))
    names = [d[0] for d in cur.description]
    by_cell: dict[str, list[dict[str, Any]]] = {}
    for tup in cur.fetchall():
        ev = dict(zip(names, tup, strict=True))
        by_cell.setdefault(ev["cell_id"], []).append(ev)
    hits_of: dict[str, list[ProbeHit]] = {}
    if duck.has_table(con, "probe_hits"):
        for h in read_probe_hits(con, within="_lunasol_luna_cells"):  # only these cells' hits: a chunk reads its own
            hits_of.setdefault(h.cell_id, []).append(h)
    out: list[CellIR] = []
    for cell_id, task_id, run_id, harness in cells:
        segments: list[Segment] = []
        by_seg: dict[str, Segment] = {}
        seq_of: dict[str, int] = {}
        for ev in by_cell.get(cell_id, []):
            seq_of[ev["event_id"]] = ev["seq"]
            sid = ev["segment_id"]
            seg = by_seg.get(sid)
            if seg is None or segments[-1] is not seg:
                meta = segs.get(cell_id, {}).get(sid)
                stage, session, actor = (
                    (meta[3], meta[4], meta[5]) if meta else (ev["stage"], ev["session_id"], ev["actor"])
                )
                header = f"## segment {sid} · stage={stage or '-'} · session={session or '-'} · actor={actor or '-'}"
                seg = Segment(sid, header, [], [])
                by_seg[sid] = seg
                segments.append(seg)
            seg.lines.append(render_event(ev))
            seg.event_ids.append(ev["event_id"])
        out.append(
            CellIR(
                cell_id=cell_id,
                task_id=task_id,
                run_id=run_id,
                harness=harness,
                segments=segments,
                seq_of=seq_of,
                hits=hits_of.get(cell_id, []),
            )
        )
    return out


def _segment_text(seg: Segment, lines: list[str], note: str = "") -> str:
    return "\n".join([seg.header + note, *lines])


def split_parts(cell: CellIR, budget_tokens: int) -> list[Part]:
    """Pack whole segments, in order, into as few parts as fit ``budget_tokens`` each.

    A single segment larger than the budget is cut between events, and the cut is stated in the
    segment header. Nothing is dropped: every event of the cell is in exactly one part.
    """
    budget_chars = max(budget_tokens, 1) * CHARS_PER_TOKEN
    whole = render_cell(cell)
    if estimate_tokens(whole) <= budget_tokens:
        return _place_candidates(cell, [Part(1, 1, whole, set(cell.seq_of), len(cell.seq_of))])
    blocks: list[tuple[str, list[str]]] = []  # (text, event ids)
    for seg in cell.segments:
        full = _segment_text(seg, seg.lines)
        if len(full) <= budget_chars:
            blocks.append((full, seg.event_ids))
            continue
        chunk: list[int] = []
        size = len(seg.header) + 40
        pieces: list[list[int]] = []
        for i, line in enumerate(seg.lines):
            if chunk and size + len(line) + 1 > budget_chars:
                pieces.append(chunk)
                chunk, size = [], len(seg.header) + 40
            chunk.append(i)
            size += len(line) + 1
        pieces.append(chunk)
        for k, idx in enumerate(pieces, 1):
            note = f" · piece {k}/{len(pieces)} of this segment"
            blocks.append((_segment_text(seg, [seg.lines[i] for i in idx], note), [seg.event_ids[i] for i in idx]))
    groups: list[list[tuple[str, list[str]]]] = [[]]
    size = 0
    for text, ids in blocks:
        if groups[-1] and size + len(text) + 2 > budget_chars:
            groups.append([])
            size = 0
        groups[-1].append((text, ids))
        size += len(text) + 2
    parts: list[Part] = []
    for n, group in enumerate(groups, 1):
        shown = {i for _, ids in group for i in ids}
        text = "\n\n".join(t for t, _ in group)
        parts.append(Part(index=n, total=len(groups), text=text, shown_ids=shown, events=len(shown)))
    return _place_candidates(cell, parts)


def render_cell(cell: CellIR) -> str:
    """The whole cell rendered (segments in order, blank line between segments)."""
    return "\n\n".join(_segment_text(s, s.lines) for s in cell.segments)


def _place_candidates(cell: CellIR, parts: list[Part]) -> list[Part]:
    # Each candidate goes to the part holding its first evidence event; its ids are citable there.
    for hit in cell.hits:
        home = next((p for p in parts if hit.evidence[0] in p.shown_ids), parts[0])
        home.candidates.append(hit)
    for p in parts:
        for hit in p.candidates:
            p.shown_ids.update(hit.evidence)
    return parts
