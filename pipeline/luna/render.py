"""A cell's IR rendered compactly for Luna, split by segment when it exceeds the context budget.

Every event is shown with its id; long texts are trimmed with a visible marker (never silently).
Outcomes are never read here: this module only touches ``cells``, ``segments``, ``events`` and
``probe_hits``.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

import duckdb

from pipeline.core import duck
from pipeline.probes.engine import ProbeHit, read_probe_hits

# Characters per token of rendered IR when the model's tokenizer is not known: JSON-heavy log lines
# count 2.84 with cl100k_base and 2.16 with SmolLM2's tokenizer on the demo (a local server counted
# 2.03 on whole requests), so 2.0 is a conservative default (4, the old guess, under-counted by half).
JSON_CHARS_PER_TOKEN = 2.0
# Budget for one cell's rendered IR in one call (the same 120,000 characters as 30,000 at 4 characters
# a token); the prompt's fixed text comes on top, and the model's context lowers it (luna.stage).
DEFAULT_CONTEXT_TOKENS = 60_000
CONTEXT_ENV = "LUNASOL_LUNA_CONTEXT_TOKENS"

_LIMITS = {"message": 600, "tool_result": 400, "error": 400}
_DEFAULT_LIMIT = 300


def context_budget() -> int:
    """Tokens of rendered IR allowed per Luna call (``$LUNASOL_LUNA_CONTEXT_TOKENS`` or the default)."""
    raw = os.environ.get(CONTEXT_ENV)
    return int(raw) if raw and raw.isdigit() and int(raw) > 0 else DEFAULT_CONTEXT_TOKENS


def estimate_tokens(text: str, chars_per_token: float = JSON_CHARS_PER_TOKEN) -> int:
    """Token estimate used for the budget: ceil(chars / chars_per_token)."""
    return math.ceil(len(text) / chars_per_token)


def candidate_chars(hit: ProbeHit) -> int:
    """Characters of one probe candidate as the Luna prompt lists it (id, type, key, evidence, explanation)."""
    evidence = sum(len(e) + 2 for e in hit.evidence)
    return len(hit.hit_id) + len(hit.type) + len(hit.key) + len(hit.explanation) + evidence + 40


def candidates_tokens(hits: list[ProbeHit], chars_per_token: float = JSON_CHARS_PER_TOKEN) -> int:
    """Token estimate of probe candidates as the Luna prompt lists them."""
    return math.ceil(sum(map(candidate_chars, hits)) / chars_per_token)


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


def split_parts(cell: CellIR, budget_tokens: int, chars_per_token: float = JSON_CHARS_PER_TOKEN) -> list[Part]:
    """Pack whole segments, in order, into as few parts as fit ``budget_tokens`` each.

    A single segment larger than the budget is cut between events, and the cut is stated in the
    segment header. Nothing is dropped: every event of the cell is in exactly one part.
    The budget covers the log AND the probe candidates: each candidate travels with the part holding
    its first evidence event (:func:`_place_candidates`), so its characters count where it lands.
    """
    budget_chars = int(max(budget_tokens, 1) * chars_per_token)
    whole = render_cell(cell)
    # candidates whose first event is not in the log go to part 1: their room is kept in every part
    stray = sum(candidate_chars(h) for h in cell.hits if h.evidence[0] not in cell.seq_of)
    extra: dict[str, int] = {}
    for h in cell.hits:
        if h.evidence[0] in cell.seq_of:
            extra[h.evidence[0]] = extra.get(h.evidence[0], 0) + candidate_chars(h)
    if len(whole) + sum(map(candidate_chars, cell.hits)) <= budget_chars:
        return _place_candidates(cell, [Part(1, 1, whole, set(cell.seq_of), len(cell.seq_of))])
    budget_chars = max(budget_chars - stray, 1)

    # Fill each part: a segment that does not fit the room left continues in the next part (its
    # header repeated with "piece k/n"), unless it fits a part of its own and little room is left
    # (then it starts the next part whole). Whole-segment packing wasted half a segment per part:
    # 10 parts instead of 8 for the demo's largest cell at an 8K context.
    overhead = 44  # a piece's header note and the blank line between blocks
    groups: list[list[tuple[Segment, list[int]]]] = [[]]
    size = 0
    for seg in cell.segments:
        whole_chars = (
            len(seg.header)
            + overhead
            + sum(len(line) + 1 + extra.get(e, 0) for line, e in zip(seg.lines, seg.event_ids, strict=True))
        )
        if groups[-1] and size + whole_chars > budget_chars >= whole_chars and budget_chars - size < budget_chars // 4:
            groups.append([])
            size = 0
        idx: list[int] = []
        used = len(seg.header) + overhead
        for i, line in enumerate(seg.lines):
            grow = len(line) + 1 + extra.get(seg.event_ids[i], 0)
            if (groups[-1] or idx) and size + used + grow > budget_chars:
                if idx:
                    groups[-1].append((seg, idx))
                groups.append([])
                size, idx, used = 0, [], len(seg.header) + overhead
            idx.append(i)
            used += grow
        if idx:
            groups[-1].append((seg, idx))
            size += used
    pieces: dict[str, int] = {}
    for group in groups:
        for seg, _ in group:
            pieces[seg.segment_id] = pieces.get(seg.segment_id, 0) + 1
    seen: dict[str, int] = {}
    texts: list[list[tuple[str, list[str]]]] = []
    for group in groups:
        texts.append([])
        for seg, idx in group:
            seen[seg.segment_id] = seen.get(seg.segment_id, 0) + 1
            total = pieces[seg.segment_id]
            note = "" if total == 1 else f" · piece {seen[seg.segment_id]}/{total} of this segment"
            texts[-1].append((_segment_text(seg, [seg.lines[i] for i in idx], note), [seg.event_ids[i] for i in idx]))
    groups_text = [g for g in texts if g]
    parts: list[Part] = []
    for n, group_text in enumerate(groups_text, 1):
        shown = {i for _, ids in group_text for i in ids}
        text = "\n\n".join(t for t, _ in group_text)
        parts.append(Part(index=n, total=len(groups_text), text=text, shown_ids=shown, events=len(shown)))
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
