"""A cell's IR rendered compactly for Luna, split into parts when it exceeds the context budget.

Every event is shown with its id; long texts are trimmed with a visible marker (never silently).
What is left out is only what repeats: no hex digests of arguments and results (a text an earlier
event of the cell already had is named by that event's id instead: "same text as C004-e0011", so
a re-read or a re-run check is said in words), and a result's call id when its call is the line
before. On the demo this is 0.58x the tokens of one full line per event; labelled mistake steps
stay visible with their text (``bench/bench_evidence.py``). Outcomes are never read here: this
module only touches ``cells``, ``segments``, ``events`` and ``probe_hits``.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
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
# An event text at least this long that repeats an earlier event's is named by that event's id when
# both are in one request ("same text as C004-e0011"): re-read files and re-run checks were a third of
# the demo's rendered log.
SAME_TEXT_CHARS = 48
OWN_KINDS = ("message", "tool_call")  # the agent's words and actions: their text is in every request holding them


def context_budget() -> int:
    """Tokens of rendered IR allowed per Luna call (``$LUNASOL_LUNA_CONTEXT_TOKENS`` or the default)."""
    raw = os.environ.get(CONTEXT_ENV)
    return int(raw) if raw and raw.isdigit() and int(raw) > 0 else DEFAULT_CONTEXT_TOKENS


def estimate_tokens(text: str, chars_per_token: float = JSON_CHARS_PER_TOKEN) -> int:
    """Token estimate used for the budget: ceil(chars / chars_per_token)."""
    return math.ceil(len(text) / chars_per_token)


_HEX_ASIDE = re.compile(r" \((?:args|result) sha256:[0-9a-f]{12}\)|(?<=\()args sha256:[0-9a-f]{12} (?=in )")


def explanation(hit: ProbeHit) -> str:
    """A candidate's explanation as Luna reads it: without the argument and result digests.

    Its log lines no longer carry them (the sameness they stood for is said in words, and the lines
    name repeated texts by id).
    """
    return _HEX_ASIDE.sub("", hit.explanation)


def candidate_chars(hit: ProbeHit) -> int:
    """Characters of one probe candidate as the Luna prompt lists it (id, type, key, evidence, explanation)."""
    evidence = sum(len(e) + 2 for e in hit.evidence)
    return len(hit.hit_id) + len(hit.type) + len(hit.key) + len(explanation(hit)) + evidence + 40


def candidates_tokens(hits: list[ProbeHit], chars_per_token: float = JSON_CHARS_PER_TOKEN) -> int:
    """Token estimate of probe candidates as the Luna prompt lists them."""
    return math.ceil(sum(map(candidate_chars, hits)) / chars_per_token)


@dataclass
class Segment:
    """One segment of a cell and its rendered event lines.

    ``lines`` are the events' whole lines; ``heads`` their id-to-call part; ``same[i]`` the first event of
    the cell with the very same text (None: the first, or a text too short to be worth a reference).
    """

    segment_id: str
    header: str
    lines: list[str]
    event_ids: list[str]
    heads: list[str] = field(default_factory=list)
    same: list[str | None] = field(default_factory=list)
    own: list[bool] = field(default_factory=list)  # the agent's words or action (always shown in its part)

    def line(self, i: int, shown: dict[str, str], part_of: dict[str, int]) -> tuple[str, bool]:
        """Event ``i``'s line (and whether it holds the text): a text an earlier event had is named by id.

        ``shown``: a text's first event -> the event holding that text in this part (cited there);
        ``part_of``: the part each earlier event is in. A text held in this part is named; one first
        shown in an earlier part is named too (with that part), except the agent's own words and
        actions (messages, tool calls: what a labelled mistake step is), which every request shows.
        """
        first = self.same[i] if self.same else None
        if first is None:
            return self.lines[i], True
        held = shown.get(first)
        if held is not None:
            return f"{self.heads[i]}: same text as {held}", False
        where = f"same text as {first} (in part {part_of.get(first, 1)})"
        if self.own and self.own[i]:
            head = self.heads[i]
            return f"{head} ({where}){self.lines[i][len(head) :]}", True
        return f"{self.heads[i]}: {where}", False


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
    """One Luna call's share of a cell: segments in order, one cut between events where a part is full."""

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


BREAK = "¶"
"""A line break inside an event's text in Luna's log (one cl100k token where " ⏎ " takes three)."""


def _squash(text: str, mark: str = " ⏎ ") -> str:
    # One line per event: newlines become a visible mark, runs of blanks fold.
    return _WS.sub(" ", text.strip()).replace("\n", mark)


def trim(text: str, limit: int) -> str:
    """Trim to ``limit`` chars, keeping head and tail, with a marker naming what was cut."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    return f"{text[:head]} […{len(text) - head - tail} chars trimmed…] {text[-tail:]}"


def _short(d: str | None) -> str:
    return d.split(":", 1)[-1][:12] if d else ""


def render_event(row: dict[str, Any], *, compact: bool = False) -> str:
    """One event as one line: id, time, kind and what it acts on, then the (trimmed) text.

    ``compact`` (Luna's and ask's log): no hex digests of arguments and results (identical texts are
    named by event id instead, see :func:`split_parts`) and "¶" for a line break; without it (Sol's
    cited-event lines) the digests stay and a break is " ⏎ ".
    """
    head, text = _head_and_text(row, compact)
    return f"{head}: {trim(text, _LIMITS.get(row['kind'], _DEFAULT_LIMIT))}"


def _head_and_text(row: dict[str, Any], compact: bool, call: bool = True) -> tuple[str, str]:
    # call=False: a result right after its own call, whose call id that line already shows
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
    if row.get("call_id") and call:
        bits.append(f"call={row['call_id']}")
    if not compact:
        if kind == "tool_call" and row.get("args_digest"):
            bits.append(f"args={_short(row['args_digest'])}")
        if kind in ("tool_result", "artifact") and row.get("result_digest"):
            bits.append(f"result={_short(row['result_digest'])}")
    if kind == "state_change" and row.get("state_digest") and row["state_digest"] not in (row.get("text") or ""):
        bits.append(f"state={_short(row['state_digest'])}")
    # Full digests in log text (state lines, artifacts) shown as their first 12 hex digits plus "…".
    text = _FULL_DIGEST.sub(r"sha256:\1…", _squash(row.get("text") or "", BREAK if compact else " ⏎ "))
    if row.get("text_truncated"):
        text += f" [IR kept {len(row.get('text') or '')} of {row.get('text_chars')} chars]"
    return " ".join(b for b in bits if b), text


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
        first_of: dict[str, str] = {}  # an event text -> the first event of the cell with it
        prev: dict[str, Any] | None = None
        for ev in by_cell.get(cell_id, []):
            seq_of[ev["event_id"]] = ev["seq"]
            sid = ev["segment_id"]
            seg = by_seg.get(sid)
            if seg is None or segments[-1] is not seg:
                meta = segs.get(cell_id, {}).get(sid)
                stage, session, actor = (
                    (meta[3], meta[4], meta[5]) if meta else (ev["stage"], ev["session_id"], ev["actor"])
                )
                bits = (f"stage={stage or '-'}", f"session={session}" if session else "", f"actor={actor or '-'}")
                header = f"## segment {sid} " + " ".join(b for b in bits if b)
                seg = Segment(sid, header, [], [])
                by_seg[sid] = seg
                segments.append(seg)
            after_call = prev is not None and prev["kind"] == "tool_call" and prev.get("call_id") == ev.get("call_id")
            head, text = _head_and_text(ev, compact=True, call=not (ev["kind"] == "tool_result" and after_call))
            prev = ev
            limit = _LIMITS.get(ev["kind"], _DEFAULT_LIMIT)
            seg.lines.append(f"{head}: {trim(text, limit)}")
            seg.heads.append(head)
            seg.event_ids.append(ev["event_id"])
            first = None
            if len(text) >= SAME_TEXT_CHARS:  # shorter texts cost less than the reference to them
                # a text the IR cut is the same only when its digest says so (the cut tails may differ)
                cut = ev.get("text_truncated")
                key = f"{text}\0{ev.get('result_digest') or ev.get('args_digest') or ev['event_id']}" if cut else text
                first = first_of.setdefault(key, ev["event_id"])
            seg.same.append(first if first != ev["event_id"] else None)
            seg.own.append(ev["kind"] in OWN_KINDS)
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


Packed = list[tuple[Segment, list[int], list[str]]]
"""One part's blocks: a segment, the indexes of its events in this part, and their lines as shown there."""

_PIECE_NOTE = 44  # a piece's header note (" · piece k/n of this segment"): at most two pieces a part


def _pack(cell: CellIR, budget_chars: float, extra: dict[str, int]) -> list[Packed]:
    """Fill parts in event order, each up to ``budget_chars`` (an event's candidates counted with it).

    Greedy and therefore as few parts as an in-order split can make: a segment that does not fit the
    room left continues in the next part, its header repeated. A text an earlier event of the cell
    already had is named by that event's id (:meth:`Segment.line`), the one in the same part if any.
    """
    parts: list[Packed] = [[]]
    budget_chars -= 2 * _PIECE_NOTE  # only a part's first and last segment can be a piece
    size = 0
    shown: dict[str, str] = {}  # a text's first event in the cell -> the event holding it in this part
    part_of: dict[str, int] = {}
    for seg in cell.segments:
        idx: list[int] = []
        lines: list[str] = []
        opening = len(seg.header) + 2  # the header line and the blank line before the block
        for i, eid in enumerate(seg.event_ids):
            line, has_text = seg.line(i, shown, part_of)
            need = len(line) + 1 + extra.get(eid, 0) + (0 if idx else opening)
            if (parts[-1] or idx) and size + need > budget_chars:
                if idx:
                    parts[-1].append((seg, idx, lines))
                parts.append([])
                size, idx, lines, shown = 0, [], [], {}
                line, has_text = seg.line(i, shown, part_of)
                need = len(line) + 1 + extra.get(eid, 0) + opening
            idx.append(i)
            lines.append(line)
            size += need
            if has_text:  # its text is in this part: later repeats here name it
                first = seg.same[i] if seg.same else None
                shown.setdefault(first or eid, eid)
            part_of[eid] = len(parts)
        if idx:
            parts[-1].append((seg, idx, lines))
    return [p for p in parts if p]


def _texts(packed: list[Packed]) -> list[tuple[str, set[str]]]:
    """Each part's text (its segment blocks, "piece k/n" where a segment spans parts) and its event ids."""
    pieces: dict[str, int] = {}
    for blocks in packed:
        for seg, _, _ in blocks:
            pieces[seg.segment_id] = pieces.get(seg.segment_id, 0) + 1
    seen: dict[str, int] = {}
    out: list[tuple[str, set[str]]] = []
    for blocks in packed:
        texts: list[str] = []
        ids: set[str] = set()
        for seg, idx, lines in blocks:
            seen[seg.segment_id] = seen.get(seg.segment_id, 0) + 1
            total = pieces[seg.segment_id]
            note = "" if total == 1 else f" · piece {seen[seg.segment_id]}/{total} of this segment"
            texts.append(_segment_text(seg, lines, note))
            ids.update(seg.event_ids[i] for i in idx)
        out.append(("\n\n".join(texts), ids))
    return out


def candidates_text(hits: list[ProbeHit]) -> str:
    """The probe candidates about as the Luna prompt lists them (to count their tokens with a part's log)."""
    return "\n".join(f"- {h.hit_id} · {h.type} · {h.key} · evidence {', '.join(h.evidence)}\n  {explanation(h)}"
                     for h in hits)  # fmt: skip


def split_parts(
    cell: CellIR,
    budget_tokens: int,
    chars_per_token: float = JSON_CHARS_PER_TOKEN,
    count: Callable[[str], int] | None = None,
) -> list[Part]:
    """Pack the cell's segments, in order, into as few parts as fit ``budget_tokens`` each.

    A segment larger than the room left is cut between events, and the cut is stated in the segment
    header. Nothing is dropped: every event of the cell is in exactly one part, each with its line.
    The budget covers the log AND the probe candidates: each candidate travels with the part holding
    its first evidence event (:func:`_place_candidates`), so its characters count where it lands.
    Sizes are planned in characters at ``chars_per_token``; with ``count`` (the request's own token
    count) every part that might be over the budget is counted, and the cell is packed again at a
    lower ratio when one is: planned parts never exceed the budget the request is checked against.
    """
    from pipeline.models.budget import ESTIMATE_FACTOR  # an upper bound of tokens per UTF-8 byte

    for _ in range(6):
        parts = _split(cell, budget_tokens, chars_per_token)
        if count is None:
            return parts
        worst = 0.0
        for part in parts:
            text = part.text + "\n" + candidates_text(part.candidates)
            if len(text.encode("utf-8")) * ESTIMATE_FACTOR + 1 > budget_tokens:
                worst = max(worst, count(text) / budget_tokens)
        if worst <= 1.0:
            return parts
        chars_per_token = chars_per_token / worst * 0.98
    return parts


def _split(cell: CellIR, budget_tokens: int, chars_per_token: float) -> list[Part]:
    budget_chars = max(budget_tokens, 1) * chars_per_token
    # candidates whose first event is not in the log go to part 1: their room is kept in every part
    stray = sum(candidate_chars(h) for h in cell.hits if h.evidence[0] not in cell.seq_of)
    extra: dict[str, int] = {}
    for h in cell.hits:
        if h.evidence[0] in cell.seq_of:
            extra[h.evidence[0]] = extra.get(h.evidence[0], 0) + candidate_chars(h)
    whole = render_cell(cell)
    if len(whole) + sum(map(candidate_chars, cell.hits)) <= budget_chars:
        return _place_candidates(cell, [Part(1, 1, whole, set(cell.seq_of), len(cell.seq_of))])
    texts = _texts(_pack(cell, max(budget_chars - stray, 1), extra))
    parts = [Part(n, len(texts), text, ids, len(ids)) for n, (text, ids) in enumerate(texts, 1)]
    return _place_candidates(cell, parts)


def render_cell(cell: CellIR) -> str:
    """The whole cell rendered (segments in order, blank line between segments, repeated texts named once)."""
    return _texts(_pack(cell, math.inf, {}))[0][0] if cell.segments else ""


def _place_candidates(cell: CellIR, parts: list[Part]) -> list[Part]:
    # Each candidate goes to the part holding its first evidence event; its ids are citable there.
    for hit in cell.hits:
        home = next((p for p in parts if hit.evidence[0] in p.shown_ids), parts[0])
        home.candidates.append(hit)
    for p in parts:
        for hit in p.candidates:
            p.shown_ids.update(hit.evidence)
    return parts
