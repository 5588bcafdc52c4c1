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
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pipeline.core import duck
from pipeline.luna.render import render_event, trim
from pipeline.sol.checks import EVENT_ID_RE

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


def load_evidence(con: Any, groups: list[dict[str, Any]]) -> GroupEvidence:
    """Read, on an open IR connection, what :class:`GroupEvidence` holds for ``groups``."""
    import pyarrow as pa  # third-party, loaded by the IR export already; kept off Sol's import path

    pids, eids = cited_by_groups(groups)
    out = GroupEvidence()
    if pids and duck.has_table(con, "patterns"):
        con.register("_sol_pids", pa.table({"pattern_id": pa.array(pids, pa.string())}))
        try:
            for pid, observed, fit in con.execute(
                "SELECT pattern_id, observed, definition_fit FROM patterns "
                "WHERE pattern_id IN (SELECT pattern_id FROM _sol_pids)"
            ).fetchall():
                out.patterns[str(pid)] = (" ".join(str(observed).split()), " ".join(str(fit).split()))
        finally:
            con.unregister("_sol_pids")
    if eids:
        con.register("_sol_eids", pa.table({"event_id": pa.array(eids, pa.string())}))
        try:
            # Streamed, unordered (lines are looked up by id): an event's whole text is read to render
            # its line, and sorting or fetching every cited event's text at once held them all
            # (+103 MiB at 1,000 cells for 17,132 events, ten times that at 10,000).
            cur = con.execute(
                "SELECT event_id, ts, kind, detail, actor, text, text_truncated, text_chars, tool_name, call_id, "
                "args_digest, result_digest, state_digest FROM events "
                "WHERE event_id IN (SELECT event_id FROM _sol_eids)"
            )
            names = [d[0] for d in cur.description]
            while tuples := cur.fetchmany(FETCH_ROWS):
                for tup in tuples:
                    row = dict(zip(names, tup, strict=True))
                    line = render_event(row)
                    # an event whose text is empty (a grep that found nothing) says so, not a dangling colon
                    line = line + "(empty)" if line.endswith(": ") else line
                    out.events[str(row["event_id"])] = trim(line, EVENT_CHARS)
        finally:
            con.unregister("_sol_eids")
    return out


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
