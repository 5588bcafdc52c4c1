"""What Sol is shown behind each pattern group: Luna's words per pattern and the text of every cited event.

A pattern group alone is a type, a ``concerns`` key and event ids; a model asked to explain it
would have to take it on trust. So every event an occurrence cites is rendered with its text
(Luna's line for it, :func:`pipeline.luna.render.render_event`, cut to :data:`EVENT_CHARS` with a
visible marker; the IR's text is already redacted), and every occurrence carries Luna's ``observed`` and
``definition_fit`` (identical texts said once). Both are read in one query each, for the whole
batch, from the run's DuckDB IR (tables ``events`` and ``patterns``).

:func:`shown_events` lists the event ids a request shows, so Sol's checks can refuse a citation of
an event that was not in the request that cited it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pipeline.core import duck
from pipeline.luna.render import render_event, trim
from pipeline.sol.checks import EVENT_ID_RE
from pipeline.sol.timeline_cache import capped

FETCH_ROWS = 1_024  # cited events rendered at a time (each row carries its event's whole text)
EVENT_CHARS = 320  # one cited event's line at most (head and tail kept around a marker, as Luna's lines)
# What splits an event id from the text around it in a rendered request (ids never hold these).
_TOKEN_SPLIT = re.compile(r"[\s,;()\[\]{}\"'`|<>]+")


@dataclass
class GroupEvidence:
    """Per pattern: Luna's two texts; per cited event: its one rendered line."""

    patterns: dict[str, tuple[str, str]] = field(default_factory=dict)  # pattern id -> (observed, definition_fit)
    events: dict[str, str] = field(default_factory=dict)  # event id -> rendered line (id, time, kind, text)


def cited_by_groups(groups: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """The pattern ids and the event ids the groups' occurrences cite (sorted, each once)."""
    pids: set[str] = set()
    eids: set[str] = set()
    for g in groups:
        for o in g.get("occurrences") or []:
            if isinstance(o, dict):
                pids.update(str(p) for p in o.get("pattern_ids") or [])
                eids.update(str(e) for e in o.get("events") or [])
    return sorted(pids), sorted(eids)


CITED_TABLE = "sol_cited_lines"
TEXTS_TABLE = "sol_pattern_texts"
WRITE_ROWS = 4_096  # rendered lines written to DuckDB at a time
_CITED_DDL = f"""
CREATE OR REPLACE {{temp}}TABLE {CITED_TABLE} (
    rank INTEGER NOT NULL,      -- its cell's place in the order partitions walk the cells (a request reads a range)
    event_id VARCHAR NOT NULL,
    groups VARCHAR[] NOT NULL,  -- the pattern groups whose occurrences cite it
    line VARCHAR NOT NULL       -- the event's line in Sol's requests
)
"""
_TEXTS_DDL = f"""
CREATE OR REPLACE {{temp}}TABLE {TEXTS_TABLE} (
    rank INTEGER NOT NULL,
    pattern_id VARCHAR NOT NULL,
    groups VARCHAR[] NOT NULL,
    observed VARCHAR NOT NULL,        -- Luna's words, whitespace made single spaces
    definition_fit VARCHAR NOT NULL
)
"""


def _fill(con: Any, table: str, rows: Iterator[Any]) -> None:
    for t in rows:
        con.register("_sol_rows", t)
        try:
            con.execute(f"INSERT INTO {table} SELECT * FROM _sol_rows")
        finally:
            con.unregister("_sol_rows")


def write_evidence(con: Any, *, temp: bool = False) -> None:
    """Tables ``sol_cited_lines`` and ``sol_pattern_texts`` for the occurrences of ``sol_occurrences``.

    On a connection that may write, after :func:`pipeline.sol.corpus.write_occurrences`. Every cited
    event's line is rendered once (Luna's renderer), a batch of rows at a time from one streamed
    query, and stored by its occurrence's ``rank`` (its cell's place in the partitions' walk) so that
    a request's cells are one range of the table. ``temp``: temporary tables of ``con``.
    """
    import pyarrow as pa  # loaded by the IR export already; kept off Sol's import path

    kind = "TEMP " if temp else ""
    for name, key in (("_sol_cited_events", "events"), ("_sol_cited_patterns", "pattern_ids")):
        # (rank, group, id) of every id the occurrences cite under ``key``
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT rank, group_id, id FROM ("
            f"SELECT rank, group_id, unnest({key}) AS id FROM sol_occurrences) WHERE id IS NOT NULL"
        )
    cited = "SELECT id, min(rank) AS rank, list(DISTINCT group_id ORDER BY group_id) AS groups FROM {} GROUP BY id"
    con.execute(_TEXTS_DDL.format(temp=kind))
    if duck.has_table(con, "patterns"):
        con.execute(
            f"INSERT INTO {TEXTS_TABLE} SELECT c.rank, p.pattern_id, c.groups, "
            # Python's split() and DuckDB's whitespace differ: the texts are made single-spaced below
            "coalesce(p.observed::VARCHAR, 'None'), coalesce(p.definition_fit::VARCHAR, 'None') "
            f"FROM patterns p JOIN ({cited.format('_sol_cited_patterns')}) c ON c.id = p.pattern_id"
        )
    con.execute(_CITED_DDL.format(temp=kind))
    staging = "_sol_cited_staging"
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE {staging} (rank INTEGER, event_id VARCHAR, groups VARCHAR[], line VARCHAR)"
    )
    reader = con.cursor() if not temp else None  # a write on ``con`` ends a result still streaming on it
    src = reader if reader is not None else con
    rows: tuple[list[int], list[str], list[list[str]], list[str]] = ([], [], [], [])

    def flush() -> None:
        s = pa.string()
        t = pa.table({"rank": pa.array(rows[0], pa.int32()), "event_id": pa.array(rows[1], s),
                      "groups": pa.array(rows[2], pa.list_(s)), "line": pa.array(rows[3], s)})  # fmt: skip
        _fill(con, staging, iter([t]))
        for r in rows:
            r.clear()

    try:
        # the cited events' ids, ranks and groups in a table the reader's connection reads (a temporary table is
        # its connection's own: a table of the file, dropped below; held in Python, ~100 MB at 100,000 cells);
        # the lines are rendered a batch at a time
        con.execute(f"CREATE OR REPLACE {kind}TABLE _sol_cited_ids AS {cited.format('_sol_cited_events')}")
        cur = src.execute(
            "SELECT c.rank, c.groups, e.event_id, e.ts, e.kind, e.detail, e.actor, e.text, e.text_truncated, "
            "e.text_chars, e.tool_name, e.call_id, e.args_digest, e.result_digest, e.state_digest "
            "FROM events e JOIN _sol_cited_ids c ON c.id = e.event_id"
        )
        names = [d[0] for d in cur.description]
        pending: list[tuple[Any, ...]] = []
        while True:
            tuples = cur.fetchmany(WRITE_ROWS)
            if temp and tuples:  # one connection: read the whole batch's rows before writing (small batches only)
                pending.extend(tuples)
                continue
            for tup in pending or tuples:
                row = dict(zip(names, tup, strict=True))
                line = render_event(row)
                # an event whose text is empty (a grep that found nothing) says so, not a dangling colon
                line = line + "(empty)" if line.endswith(": ") else line
                rows[0].append(row["rank"])
                rows[1].append(str(row["event_id"]))
                rows[2].append(list(row["groups"]))
                rows[3].append(trim(line, EVENT_CHARS))
                if len(rows[0]) >= WRITE_ROWS:
                    flush()
            pending = []
            if not tuples:
                break
        if rows[0]:
            flush()
    finally:
        if reader is not None:
            reader.close()
    con.execute(f"INSERT INTO {CITED_TABLE} SELECT * FROM {staging} ORDER BY rank, event_id")
    for name in (staging, "_sol_cited_events", "_sol_cited_patterns", "_sol_cited_ids"):
        con.execute(f"DROP TABLE {name}")


class EvidenceStore:
    """What :func:`write_evidence` stored, read per request on the batch's connection (never held for the batch).

    :meth:`for_cells` reads a request's cells (one range of ranks), :meth:`for_group` a group's
    (whole-batch texts walk the groups one at a time).
    """

    def __init__(self, con: Any, rank: dict[str, int]) -> None:
        self._con = con
        self.rank = rank

    def _view(
        self, where: str, params: list[Any], pids: set[str] | None, eids: set[str] | None, by_id: bool = False
    ) -> GroupEvidence:
        # ``by_id``: ``where`` is ``IN (...)`` of ids, after the id column of each table
        out = GroupEvidence()
        key = "pattern_id " if by_id else ""
        sql = f"SELECT pattern_id, observed, definition_fit FROM {TEXTS_TABLE} WHERE {key}{where}"
        cur = capped(self._con).execute(sql, params)
        while rows := cur.fetchmany(WRITE_ROWS):
            for pid, observed, fit in rows:
                if pids is None or pid in pids:
                    out.patterns[str(pid)] = (" ".join(str(observed).split()), " ".join(str(fit).split()))
        sql = f"SELECT event_id, line FROM {CITED_TABLE} WHERE {'event_id ' if by_id else ''}{where}"
        cur = capped(self._con).execute(sql, params)
        while rows := cur.fetchmany(WRITE_ROWS):
            for eid, line in rows:
                if eids is None or eid in eids:
                    out.events[str(eid)] = str(line)
        return out

    def for_cells(self, cells: Iterable[str], occurrences: Iterable[dict[str, Any]]) -> GroupEvidence:
        """Luna's words and the event lines ``occurrences`` (of ``cells``) cite."""
        ranks = [self.rank.get(c, len(self.rank)) for c in cells]
        pids: set[str] = set()
        eids: set[str] = set()
        for o in occurrences:
            pids.update(str(p) for p in o.get("pattern_ids") or [])
            eids.update(str(e) for e in o.get("events") or [])
        if not ranks or not (pids or eids):
            return GroupEvidence()
        out = self._view("rank BETWEEN ? AND ?", [min(ranks), max(ranks)], pids, eids)
        # an id stored under another cell's rank (an occurrence citing outside its cell): read by id
        missing_p = sorted(pids - out.patterns.keys())
        missing_e = sorted(eids - out.events.keys())
        if missing_p or missing_e:
            ids = duck.literals([*missing_p, *missing_e])
            more = self._view(f"IN ({ids})", [], set(missing_p), set(missing_e), by_id=True)
            out.patterns.update(more.patterns)
            out.events.update(more.events)
        return out

    def for_ids(self, occurrences: Iterable[dict[str, Any]]) -> GroupEvidence:
        """Luna's words and the event lines ``occurrences`` cite, read by id (occurrences of cells far apart)."""
        pids: set[str] = set()
        eids: set[str] = set()
        for o in occurrences:
            pids.update(str(p) for p in o.get("pattern_ids") or [])
            eids.update(str(e) for e in o.get("events") or [])
        if not (pids or eids):
            return GroupEvidence()
        return self._view("IN (SELECT unnest(?::VARCHAR[]))", [sorted(pids | eids)], pids, eids, by_id=True)

    def for_group(self, gid: str) -> GroupEvidence:
        """Luna's words and the event lines the occurrences of group ``gid`` cite."""
        return self._view("list_contains(groups, ?)", [gid], None, None)


def occurrence_lines(
    o: dict[str, Any], where: str, evidence: GroupEvidence, indent: str = "  "
) -> tuple[str, list[tuple[str, str]], list[tuple[str, str]]]:
    """One occurrence: its head line, Luna's texts as (text key, line), and its events as (event id, line).

    Texts and events come apart so that a request says each once (``Renderer.groups_text``).
    """
    events = [str(e) for e in o.get("events") or []]
    pids = [str(p) for p in o.get("pattern_ids") or []]
    head = f"{indent}{o['occurrence_id']} {where} · patterns {' '.join(pids) or '-'} · events {' '.join(events)}"
    texts: list[tuple[str, str]] = []
    for pid in pids:
        observed, fit = evidence.patterns.get(pid, ("", ""))
        if observed:
            texts.append((f"o:{observed}", f"{indent}  observed ({pid}): {observed}"))
        if fit:
            texts.append((f"f:{fit}", f"{indent}  definition_fit ({pid}): {fit}"))
    lines = [(e, f"{indent}  {evidence.events[e]}") for e in events if e in evidence.events]
    return head, texts, lines


def shown_events(context: dict[str, Any]) -> set[str]:
    """Every event id a request's context shows (the strings of the context, read as the model reads them).

    The template's own text is not searched: its one example id (C004-e0012) is not an event.
    """
    found: set[str] = set()
    for text in _strings(context):
        if "-e" not in text:
            continue
        for tok in _TOKEN_SPLIT.split(text):
            tok = tok.rstrip(":.")
            if EVENT_ID_RE.match(tok):
                found.add(tok)
    return found


_SPLIT_CHAR = re.compile(r"[\s,;()\[\]{}\"'`|<>]")
_ID_END = re.compile(r"[:.]*(?:[\s,;()\[\]{}\"'`|<>]|\Z)")  # what may follow a shown id: rstrip(":.") then a split


def shown_among(context: dict[str, Any], candidates: Iterable[str]) -> set[str]:
    """``shown_events(context) & candidates``, reading the context for these ids only.

    A check reads only the events an answer cites: listing every id of a ~180,000-character map request
    (twice per map call, rerun or not) was a tenth of a one-changed-cell rerun's CPU. An id counts where
    :func:`shown_events` would take it: a whole token, after any trailing ``:`` or ``.`` is dropped.
    """
    todo = {e for e in candidates if EVENT_ID_RE.match(e) and not _SPLIT_CHAR.search(e) and not e.endswith((":", "."))}
    found: set[str] = set()
    for text in _strings(context):
        if not todo:
            break
        for e in [e for e in todo if e in text]:
            start = text.find(e)
            while start >= 0:
                if (start == 0 or _SPLIT_CHAR.match(text, start - 1)) and _ID_END.match(text, start + len(e)):
                    found.add(e)
                    todo.discard(e)
                    break
                start = text.find(e, start + 1)
    return found


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _strings(v)
