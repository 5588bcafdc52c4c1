"""Per-cell content digests of the IR, computed once at export (in DuckDB) and stored in ``cell_digests``.

A DuckDB file's bytes are not stable across writes, so the ledger fingerprints content instead.
A cell's digest is ``digest({"cell": [cell_id, task_id, run_id, eligibility, exclusion_reason,
harness], "events": [[<every events column but cell_id>, ...] in seq order]})`` of
:func:`pipeline.core.canonical.digest`: the SQL below writes exactly that canonical JSON (sorted
keys, compact, UTF-8 kept, Python's escapes) and hashes it, so no event is loaded into Python.

``source_digest`` says what a cell's events were read from (its raw files' digests, the format,
lunasol's version); a rerun reuses the rows of a cell whose source digest is unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.core import duck
from pipeline.core.canonical import StatKey, digest, stat_key
from pipeline.core.errors import BadInput
from pipeline.ir.schema import TEXT_LIMIT

CELL_COLUMNS = ("cell_id", "task_id", "run_id", "eligibility", "exclusion_reason", "harness")
# (column, JSON kind) of the events columns a cell digest covers, in order.
EVENT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("event_id", "str"),
    ("segment_id", "str"),
    ("seq", "int"),
    ("ts", "str"),
    ("kind", "str"),
    ("detail", "str"),
    ("actor", "str"),
    ("stage", "str"),
    ("session_id", "str"),
    ("step_index", "int"),
    ("text", "str"),
    ("text_truncated", "bool"),
    ("text_chars", "int"),
    ("tool_name", "str"),
    ("call_id", "str"),
    ("args_digest", "str"),
    ("result_digest", "str"),
    ("state_digest", "str"),
    ("target", "str"),
    ("source_path", "str"),
    ("line_start", "int"),
    ("line_end", "int"),
    ("source_sha256", "str"),
    ("json_pointer", "str"),
)


def _python_escapes(col: str) -> str:
    """SQL: ``col`` as a JSON string body with exactly the escapes of Python's json.dumps."""
    expr = f"replace(replace({col}, '\\', '\\\\'), '\"', '\\\"')"
    short = {8: "\\b", 9: "\\t", 10: "\\n", 12: "\\f", 13: "\\r"}
    for code in range(32):
        escape = short.get(code) or f"\\u{code:04x}"
        expr = f"replace({expr}, chr({code}), '{escape}')"
    return expr


# DuckDB's to_json writes the same JSON string as Python except for the hex case of the rarer
# control characters (\u001B, Python \u001b): only values whose JSON holds a \u escape take the
# slow, exact path.
_MACROS = f"""
CREATE OR REPLACE TEMP MACRO lunasol_js(s) AS CASE
    WHEN s IS NULL THEN 'null'
    WHEN contains(to_json(s), '\\u') THEN '"' || {_python_escapes("s")} || '"'
    ELSE to_json(s) END;
CREATE OR REPLACE TEMP MACRO lunasol_jn(n) AS coalesce(CAST(n AS VARCHAR), 'null');
CREATE OR REPLACE TEMP MACRO lunasol_jb(b) AS CASE WHEN b IS NULL THEN 'null' WHEN b THEN 'true' ELSE 'false' END;
"""

_JSON = {"str": "lunasol_js", "int": "lunasol_jn", "bool": "lunasol_jb"}


def _array(cols: list[tuple[str, str]], alias: str) -> str:
    return "'[' || " + " || ',' || ".join(f"{_JSON[kind]}({alias}.{name})" for name, kind in cols) + " || ']'"


_EVENT_JSON = _array(list(EVENT_COLUMNS), "r")
_CELL_JSON = _array([(c, "str") for c in CELL_COLUMNS], "c")

_EVENT_ARRAY = "json_array(" + ", ".join(f"e.{name}" for name, _ in EVENT_COLUMNS) + ")"

# Per event one JSON array (json_array, one call), exact (slow) path only where it holds a \u escape.
# One statement per range of cell ids ($lo and $hi: first and last id, inclusive): string_agg holds
# every event's JSON of the cells it aggregates, so a statement over the whole batch holds the whole
# IR's text at once (1 GiB at 1,000 demo cells); a range of cells holds only theirs.
_FILL_TEMPLATE = """
INSERT INTO cell_digests BY NAME
SELECT c.cell_id,
       s.source_digest,
       'sha256:' || sha256('{{"cell":' || {cell_json} || ',"events":[' || coalesce(ev.body, '') || ']}}')
           AS content_digest
FROM (SELECT * FROM cells WHERE cell_id BETWEEN $lo AND $hi) c
LEFT JOIN (
    SELECT r.cell_id,
           string_agg({event_json}, ',' ORDER BY r.seq) AS body
    FROM (
        SELECT e.*, {event_array} AS j FROM events e ANTI JOIN cell_digests k ON e.cell_id = k.cell_id
        WHERE e.cell_id BETWEEN $lo AND $hi
    ) r
    GROUP BY r.cell_id
) ev USING (cell_id)
LEFT JOIN _lunasol_sources s USING (cell_id)
ANTI JOIN cell_digests k ON c.cell_id = k.cell_id
"""
_EXACT = f"CASE WHEN contains(r.j, '\\u') THEN {_EVENT_JSON} ELSE r.j END"
FILL_SQL = _FILL_TEMPLATE.format(cell_json=_CELL_JSON, event_json=_EXACT, event_array=_EVENT_ARRAY)
# When no event's JSON holds a \u escape (nearly always) the exact path is never taken, and planning
# its expression (24 columns x 34 nested replaces) costs more than the digests: 0.23 s per export.
FILL_FAST_SQL = _FILL_TEMPLATE.format(cell_json=_CELL_JSON, event_json="r.j", event_array=_EVENT_ARRAY)
# The cells without digests are found first, from the cells table: filtering the anti join built
# every event's JSON (0.28 CPU s at 1,000 cells) when a rerun re-exports one cell, and finding them
# from the events' cell ids scanned every event with its JSON (4.5 CPU s at 10,000 cells; now 0.01).
NEEDS_EXACT_SQL = (
    "SELECT count(*) FROM events e "
    "WHERE e.cell_id IN (SELECT cell_id FROM cells ANTI JOIN cell_digests USING (cell_id)) "
    f"AND contains({_EVENT_ARRAY}, '\\u')"
)

# Bytes of event JSON per fill statement, about (see TODO_SQL): bounds the aggregate's memory (the
# JSON and its sort) under the export's 256 MiB whatever the batch; ~50,000 events of a typical log.
FILL_BYTES = 32 << 20

# The cells without digests yet: (cell_id, events, bytes of their events' JSON, about). An event's
# JSON is ~460 bytes of columns and its text (648 bytes on average over 22 million events of a
# 100,000-cell batch, estimated 700 here); an excluded cell has no events (least() skips a NULL).
TODO_SQL = f"""
SELECT c.cell_id, count(e.seq), sum(CASE WHEN e.seq IS NULL THEN 0 ELSE 512 + least(e.text_chars, {TEXT_LIMIT}) END)
FROM cells c LEFT JOIN events e USING (cell_id) ANTI JOIN cell_digests k ON c.cell_id = k.cell_id
GROUP BY c.cell_id
"""


def fill_sql(exact: bool = True) -> tuple[str, str]:
    """(macros, INSERT) that fill ``cell_digests`` for the cells with ids in ``[$lo, $hi]`` not in it yet.

    From ``cells``, ``events`` and the view ``_lunasol_sources`` (cell_id, source_digest); the
    digests of cells copied from a previous IR are already there. ``exact`` False: the INSERT
    without the exact escape path, equal to it when ``NEEDS_EXACT_SQL`` counts no event. One
    INSERT per range of :func:`fill_ranges`.
    """
    return _MACROS, FILL_SQL if exact else FILL_FAST_SQL


# At most this many events to fill: their digests are made in Python from the rows (the definition
# the SQL spells out), not by the SQL, whose exact path costs ~0.15 CPU s to plan whatever it fills.
# A rerun after an edit of a few cells stays far below; a first export of a batch far above.
PYTHON_FILL_EVENTS = 5_000


def python_digests(fetch: Any, cell_ids: list[str]) -> dict[str, str]:
    """Content digests of ``cell_ids`` computed in Python: ``digest({"cell": row, "events": rows})``.

    ``fetch(sql, params)`` returns a query's rows (an IRWriter's or a connection's). Equal to the
    SQL fill by definition: the SQL writes this canonical JSON in DuckDB (tests compare the two).
    """
    if not cell_ids:
        return {}
    wanted = f"IN ({duck.literals(cell_ids)})"
    cells = fetch(f"SELECT {', '.join(CELL_COLUMNS)} FROM cells WHERE cell_id {wanted} ORDER BY cell_id", [])
    names = ", ".join(c for c, _ in EVENT_COLUMNS)
    events: dict[str, list[list[Any]]] = {c[0]: [] for c in cells}
    for row in fetch(f"SELECT cell_id, {names} FROM events WHERE cell_id {wanted} ORDER BY cell_id, seq", []):
        events[row[0]].append(list(row[1:]))
    return {c[0]: digest({"cell": list(c), "events": events[c[0]]}) for c in cells}


def fill_ranges(counts: list[tuple[str, int]], limit: int | None = None) -> list[tuple[str, str]]:
    """Consecutive ``(lo, hi)`` cell-id ranges, in id order, of at most ``limit`` in size each (one cell at least).

    ``counts``: every cell to fill with its size (the bytes of its events' JSON, about); a cell is
    never split. ``limit`` defaults to :data:`FILL_BYTES`.
    """
    limit = FILL_BYTES if limit is None else limit
    ranges: list[tuple[str, str]] = []
    lo: str | None = None
    hi, size = "", 0
    for cell, n in sorted(counts):
        if lo is not None and size + n > limit:
            ranges.append((lo, hi))
            lo = None
        if lo is None:
            lo, size = cell, 0
        hi, size = cell, size + n
    if lo is not None:
        ranges.append((lo, hi))
    return ranges


_NO_DIGESTS = "the IR has no cell_digests table (written by an older lunasol): re-export it"


def _connect(ir_path: Path) -> Any:

    return duck.connect(ir_path, read_only=True)


def read_cell_digests(con: Any) -> dict[str, tuple[str | None, str]]:
    """Cell id -> (source digest, content digest), as stored at export."""
    sql = "SELECT cell_id, source_digest, content_digest FROM cell_digests ORDER BY cell_id"
    try:
        rows = con.execute(sql).fetchall()
    except Exception as exc:  # duckdb.CatalogException: an IR written before the digests were stored
        if "cell_digests" in str(exc):
            raise BadInput(_NO_DIGESTS) from None
        raise
    return {r[0]: (r[1], r[2]) for r in rows}


def content_digests(con: Any) -> dict[str, str] | None:
    """Cell id -> content digest as stored at export; None when the IR stores none (not made by export)."""
    if not duck.has_table(con, "cell_digests"):
        return None
    return dict(con.execute("SELECT cell_id, content_digest FROM cell_digests").fetchall())


# The last IR read (its path and stat key -> its digests): a run asks for them three times in a row
# after export (the ledger's output, its per-cell entries, Sol's made_from), and each connection
# costs ~25 ms. An IR written again is a new inode (export renames it in) or a new mtime; writes not
# yet checkpointed are in its WAL, whose stat is part of the key too.
_LAST: dict[tuple[str, StatKey, StatKey | None], tuple[str | None, dict[str, str] | None]] = {}


def _file_key(path: Path) -> StatKey | None:
    try:
        return stat_key(path.stat())
    except FileNotFoundError:
        return None


def _stored(ir_path: Path) -> tuple[str | None, dict[str, str] | None]:
    """(ir digest, cell -> content digest) of an IR that stores its per-cell digests, else (None, None)."""
    wal = ir_path.with_name(ir_path.name + ".wal")
    key = (str(ir_path.resolve()), stat_key(ir_path.stat()), _file_key(wal))
    hit = _LAST.get(key)
    if hit is not None:
        return hit
    con = _connect(ir_path)
    try:
        if duck.has_table(con, "cell_digests"):
            cells = {cell: content for cell, (_source, content) in read_cell_digests(con).items()}
            got: tuple[str | None, dict[str, str] | None] = (_ir_digest(con, cells), cells)
        else:
            got = (None, None)
    finally:
        con.close()
    _LAST.clear()
    _LAST[key] = got
    return got


def stored_ir_digest(ir_path: Path) -> str | None:
    """:func:`ir_digest` of an IR that stores its per-cell digests, else None."""
    return _stored(ir_path)[0]


def ir_cell_digests(ir_path: Path) -> dict[str, str]:
    """Digest of each cell's IR content (its cell row and its events in order), by cell id."""
    cells = _stored(ir_path)[1]
    if cells is None:
        raise BadInput(_NO_DIGESTS)
    return dict(cells)


def ir_digest(ir_path: Path) -> str:
    """Digest of the IR's content: every cell's digest plus the outcome sidecar."""
    got = _stored(ir_path)[0]
    if got is None:
        raise BadInput(_NO_DIGESTS)
    return got


def _ir_digest(con: Any, cells: dict[str, str]) -> str:
    outcomes = con.execute(
        "SELECT cell_id, label, quality, completion, cost, stability, extra FROM outcomes ORDER BY cell_id"
    ).fetchall()
    return digest({"cells": cells, "outcomes": [list(r) for r in outcomes]})
