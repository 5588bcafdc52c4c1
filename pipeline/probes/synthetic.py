"""Hand-made IR for tests and examples: a compact way to write event sequences into a DuckDB.

Each event is a dict of IR columns; missing columns get neutral defaults (one segment per
(stage, session, actor) run, a fake source ref on line ``seq + 1``). This is never used on
real data: the exporter writes real IRs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb

from pipeline.core import duck
from pipeline.ir.schema import DDL, event_id

_EVENT_COLUMNS = (
    "event_id",
    "cell_id",
    "segment_id",
    "seq",
    "ts",
    "kind",
    "detail",
    "actor",
    "stage",
    "session_id",
    "step_index",
    "text",
    "text_truncated",
    "text_chars",
    "tool_name",
    "call_id",
    "args_digest",
    "result_digest",
    "state_digest",
    "target",
    "source_path",
    "line_start",
    "line_end",
    "source_sha256",
    "json_pointer",
)


def _complete(cell_id: str, seq: int, ev: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(_EVENT_COLUMNS)
    row.update(
        event_id=event_id(cell_id, seq),
        cell_id=cell_id,
        seq=seq,
        ts=f"2026-08-09T10:{seq // 60:02d}:{seq % 60:02d}Z",
        kind="message",
        actor="candidate",
        stage="implementation",
        session_id="s1",
        text="",
        text_truncated=False,
        source_path=f"cells/{cell_id}/sessions/01.jsonl",
        source_sha256="sha256:" + "0" * 64,
    )
    row.update(ev)
    row["event_id"] = event_id(cell_id, seq)
    row["text_chars"] = len(row["text"] or "")
    row.setdefault("line_start", None)
    if row["line_start"] is None:
        row["line_start"] = seq + 1
    if row["line_end"] is None:
        row["line_end"] = row["line_start"]
    return row


def write_cells(
    con: duckdb.DuckDBPyConnection,
    cells: dict[str, list[dict[str, Any]]],
    *,
    outcomes: dict[str, str] | None = None,
    task_of: dict[str, str] | None = None,
) -> None:
    """Create the IR tables on ``con`` and insert the given cells' events (seq = list order)."""
    con.execute(DDL)
    for cell_id, events in cells.items():
        task = (task_of or {}).get(cell_id, f"task-{cell_id}")
        con.execute(
            "INSERT INTO cells VALUES (?, ?, ?, 'valid_behavior', NULL, 'H0', NULL)",
            [cell_id, task, f"h0-{task}-{cell_id}"],
        )
        rows = [_complete(cell_id, seq, ev) for seq, ev in enumerate(events)]
        seg_no = -1
        prev: tuple[Any, ...] | None = None
        segs: list[list[Any]] = []
        for row in rows:
            key = (row["stage"], row["session_id"], row["actor"])
            if key != prev:
                seg_no += 1
                prev = key
                segs.append([f"{cell_id}-s{seg_no:03d}", cell_id, seg_no, *key, row["seq"], row["seq"], 0])
            row["segment_id"] = segs[-1][0]
            segs[-1][7] = row["seq"]
            segs[-1][8] += 1
        for seg in segs:
            con.execute("INSERT INTO segments VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", seg)
        placeholders = ", ".join("?" for _ in _EVENT_COLUMNS)
        for row in rows:
            con.execute(
                f"INSERT INTO events ({', '.join(_EVENT_COLUMNS)}) VALUES ({placeholders})",
                [row[c] for c in _EVENT_COLUMNS],
            )
        con.execute(
            "INSERT INTO coverage (cell_id, status, reason, events) VALUES (?, 'included', NULL, ?)",
            [cell_id, len(rows)],
        )
        label = (outcomes or {}).get(cell_id)
        if label is not None:
            con.execute(
                "INSERT INTO outcomes VALUES (?, ?, NULL, NULL, NULL, NULL, NULL)",
                [cell_id, label],
            )


def write_ir(path: Path, cells: dict[str, list[dict[str, Any]]], **kw: Any) -> Path:
    """Write a fresh DuckDB file at ``path`` holding the given cells."""
    path.parent.mkdir(parents=True, exist_ok=True)
    con = duck.connect(path)
    try:
        write_cells(con, cells, **kw)
    finally:
        con.close()
    return path
