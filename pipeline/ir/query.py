"""``lunasol query``: read-only SQL over a run's IR.

The connection is opened ``read_only`` with external access disabled (no files, no ATTACH, no
extension downloads); the statement allow-list only makes the error message friendlier.
"""

from __future__ import annotations

import datetime
import decimal
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.artifacts.run_info import run_command
from pipeline.core import duck
from pipeline.core.errors import BadInput
from pipeline.ir.store import IR_FILE, check_ir_version

_ALLOWED = ("select", "with", "describe", "show", "pragma", "from", "explain", "summarize", "values", "table")
_FIRST_WORD = re.compile(r"^\s*(?:--[^\n]*\n\s*|/\*.*?\*/\s*)*\(?\s*([A-Za-z]+)", re.DOTALL)


@dataclass
class QueryResult:
    """Column names and rows of one query."""

    columns: list[str]
    rows: list[tuple[Any, ...]]
    more: bool = False  # rows past ``max_rows`` exist and were not fetched

    def records(self) -> list[dict[str, Any]]:
        """Rows as JSON-ready dicts (non-JSON values become strings)."""
        return [{c: _jsonable(v) for c, v in zip(self.columns, row, strict=True)} for row in self.rows]


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, decimal.Decimal | datetime.date | datetime.time | datetime.timedelta):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def query(run_dir: Path, sql: str, *, max_rows: int | None = None, timeout_s: float | None = None) -> QueryResult:
    """Run one read-only statement against ``run_dir/ir.duckdb``; any SQL error is one BadInput line.

    ``max_rows``: fetch at most that many rows (``more`` says whether others exist), so a caller that
    shows a page never holds the whole result. ``timeout_s``: interrupt a statement still running then.
    """
    import threading

    import duckdb

    if not sql.strip():
        raise BadInput("empty query: give one read-only SQL statement, e.g. 'SELECT count(*) FROM events'")
    m = _FIRST_WORD.match(sql)
    if m is None or m.group(1).lower() not in _ALLOWED:
        word = m.group(1).upper() if m else "(empty)"
        raise BadInput(f"query is read-only: {word} statements are not allowed (use SELECT / WITH / DESCRIBE)")
    path = run_dir / IR_FILE
    if not path.is_file():
        raise BadInput(f"no IR in {run_dir} (run: lunasol export BUNDLE)")
    try:
        con = duck.connect(path, read_only=True, config={"enable_external_access": False})
    except duckdb.Error as exc:
        raise BadInput(f"cannot open {path}: {' '.join(str(exc).split())}") from None
    try:
        row = con.execute("SELECT value FROM meta WHERE key = 'ir_schema_version'").fetchone()
        check_ir_version(None if row is None else str(row[0]), path, rerun=lambda: run_command(run_dir))
        try:
            # Only the last statement's rows would be shown, and the first word check covers only the first.
            if len(con.extract_statements(sql)) > 1:
                raise BadInput("one statement per query: drop the ';' between statements or run them one by one")
            timer = threading.Timer(timeout_s, con.interrupt) if timeout_s else None
            if timer is not None:
                timer.start()
            try:
                cur = con.execute(sql)
                columns = [d[0] for d in cur.description or []]
                if not columns:
                    rows: list[tuple[Any, ...]] = []
                elif max_rows is None:
                    rows = cur.fetchall()
                else:
                    rows = cur.fetchmany(max_rows + 1)
            finally:
                if timer is not None:
                    timer.cancel()
        except duckdb.Error as exc:
            if timeout_s and "interrupt" in str(exc).lower():
                raise BadInput(f"query stopped after {timeout_s:g} s: narrow it (WHERE, LIMIT)") from None
            raise BadInput(f"SQL error: {' '.join(str(exc).split())}") from None
    finally:
        con.close()
    more = max_rows is not None and len(rows) > max_rows
    return QueryResult(columns, rows[:max_rows] if more else rows, more)
