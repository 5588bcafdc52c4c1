"""Sol's controller-level timeline per cell: chosen by event kind and by role, from the bundle itself.

Which events count as controller-level does not depend on one harness's vocabulary:

* every event of a controller-level kind (stage boundaries, state changes, handoffs, obligations,
  artifacts, errors), whoever wrote it;
* every event of the harness itself (actors the adapters name ``controller``, ``harness`` or
  ``system``) except raw tool output;
* permission and approval requests (a tool or event detail naming permission, approval or consent);
* messages of every role other than the cell's main worker. The main worker is the actor with the
  most tool calls in the cell (the agent doing the task); the others are the roles around it that
  the bundle declares through its logs: operators, checkers, users, other agents. Tool and
  environment output is never a role's message.

Each event is one compact line with its id (citable), and digests shortened to 8 hex digits.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Iterator
from typing import Any

from pipeline.core import duck

TIMELINE_KINDS = ("stage", "state_change", "handoff", "obligation", "artifact", "error")
CONTROLLER_ACTORS = ("controller", "harness", "system")
NOT_ROLES = ("tool", "environment")  # actors whose "messages" are output, not a role speaking
PERMISSION_RE = "permission|approv|consent"
TIMELINE_TEXT = 200
FETCH_ROWS = 8_192  # timeline rows read at a time
LOW_VALUE = frozenset({"stage_started", "handoff", "artifact_written"})
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")


def timeline_sql(where_cells: str = "TRUE") -> str:
    """The SQL selecting every eligible cell's controller-level events (``where_cells`` narrows cells)."""
    return f"""
WITH tool_actors AS (
    SELECT cell_id, actor, count(*) AS n FROM events
    WHERE kind = 'tool_call' AND actor IS NOT NULL GROUP BY cell_id, actor
), main_worker AS (
    SELECT cell_id, actor FROM (
        SELECT cell_id, actor, row_number() OVER (PARTITION BY cell_id ORDER BY n DESC, actor) AS r FROM tool_actors
    ) WHERE r = 1
)
SELECT e.event_id, e.cell_id, e.seq, e.stage, e.actor, e.kind, e.detail,
       substr(coalesce(e.text, ''), 1, {TIMELINE_TEXT}) AS text
FROM events e JOIN cells c USING (cell_id) LEFT JOIN main_worker w USING (cell_id)
WHERE c.eligibility = 'valid_behavior' AND ({where_cells}) AND (
    e.kind IN ({duck.literals(TIMELINE_KINDS)})
    OR (lower(coalesce(e.actor, '')) IN ({duck.literals(CONTROLLER_ACTORS)}) AND e.kind <> 'tool_result')
    OR regexp_matches(lower(coalesce(e.tool_name, '') || ' ' || coalesce(e.detail, '')), '{PERMISSION_RE}')
    OR (e.kind = 'message' AND e.actor IS NOT NULL AND e.actor IS DISTINCT FROM w.actor
        AND lower(e.actor) NOT IN ({duck.literals(NOT_ROLES)}))
)
ORDER BY e.cell_id, e.seq
"""


def timeline_rows_sql(where_cells: str = "TRUE") -> str:
    """Per selected event, in order: cell, detail (or kind), and its line's prefix ``id stage/actor detail: ``.

    The prefix is made in DuckDB (one string per event instead of a Python dict per row);
    the text is compacted in Python (:func:`read_timelines`), whose ``str.split`` is faster than a regex.
    """
    key = "coalesce(nullif(detail, ''), kind, 'None')"
    prefix = (
        "event_id || ' ' || coalesce(nullif(stage, ''), '-') || '/' || coalesce(nullif(actor, ''), '-') || ' ' "
        f"|| {key} || ': '"
    )
    return f"SELECT cell_id, {key} AS k, {prefix} AS p, text FROM ({timeline_sql(where_cells)})"


def read_timelines(con: Any, where_cells: str = "TRUE") -> dict[str, list[tuple[str, str]]]:
    """Per cell, (detail or kind, one compact line) for each selected event, in order (:func:`iter_timelines`)."""
    return dict(iter_timelines(con, where_cells))


def iter_timelines(con: Any, where_cells: str = "TRUE") -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """Each selected cell's (detail or kind, one compact line) per selected event, a cell at a time, in cell order.

    One compact line per event: whitespace runs made one space, digests shortened (8 hex digits
    are enough to see "unchanged"). Rows are fetched a batch at a time, each detail kept once:
    only the cell being read is held.
    """
    details: dict[str, str] = {}
    cur = con.execute(timeline_rows_sql(where_cells))
    cell: str | None = None
    lines: list[tuple[str, str]] = []
    while rows := cur.fetchmany(FETCH_ROWS):
        for row_cell, key, prefix, raw in rows:
            if row_cell != cell:
                if cell is not None:
                    yield cell, lines
                cell, lines = row_cell, []
            text = " ".join(raw.split())
            if "sha256:" in text:  # the regex only where it can match (~55,000 events at 1,000 cells)
                text = _DIGEST.sub(_short_digest, text)
            lines.append((details.setdefault(key, key), prefix + text))
    if cell is not None:
        yield cell, lines


def _short_digest(m: re.Match[str]) -> str:
    return m.group(1)[:8]


_line = operator.itemgetter(1)


def _chars(lines: list[str]) -> int:
    """Characters these lines take in a prompt (each line and its newline)."""
    return sum(map(len, lines)) + len(lines)


def timeline_chars(lines: list[tuple[str, str]]) -> int:
    """Characters a cell's whole timeline takes in a prompt (:func:`_chars` of its lines)."""
    return _chars(list(map(_line, lines)))


def fit_timelines(lines: dict[str, list[tuple[str, str]]], budget: int) -> tuple[dict[str, list[str]], int]:
    """Fit per-cell timelines into ``budget`` characters, never silently.

    First the low-value lines (stage started, handoffs, artifacts written) go; then each cell keeps
    its first and last lines with a marker saying how many were left out in between. Returns the
    timelines and the number of events omitted. Markers count against the budget too.
    """
    # Sizes with C-level loops (map): the single call's batch has ~55,000 lines at 1,000 cells.
    full = {c: list(map(_line, v)) for c, v in lines.items()}
    if sum(map(_chars, full.values())) <= budget:
        return full, 0
    kept = {c: [ln for d, ln in v if d not in LOW_VALUE] for c, v in lines.items()}
    low = {c: len(lines[c]) - len(v) for c, v in kept.items()}  # low-value lines left out, per cell
    omitted = sum(low.values())
    if sum(map(_chars, kept.values())) > budget and kept:
        per_cell = max(budget // len(kept) - 120, 200)  # room for the two marker lines of a cell
        for c, v in kept.items():
            if _chars(v) <= per_cell:
                continue
            head: list[str] = []
            tail: list[str] = []
            used = 0
            i, j = 0, len(v) - 1
            while i <= j:  # alternate from both ends: the start and the end of a cell matter most
                nxt = v[i] if len(head) <= len(tail) else v[j]
                if used + len(nxt) + 1 > per_cell:
                    break
                used += len(nxt) + 1
                if len(head) <= len(tail):
                    head.append(nxt)
                    i += 1
                else:
                    tail.insert(0, nxt)
                    j -= 1
            cut = len(v) - len(head) - len(tail)
            omitted += cut
            kept[c] = [*head, f"[... {cut} events omitted here to fit the prompt ...]", *tail]
    if omitted:
        for c in kept:
            if low[c]:
                kept[c].insert(0, f"[{low[c]} stage-start / handoff / artifact lines omitted in this cell]")
    return kept, omitted
