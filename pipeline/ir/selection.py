"""Which cells a pilot (``--where SQL``, ``--sample N --seed S``) takes: shared by ``lunasol run`` and ``ask``.

The filter is the user's SQL over one row per eligible cell: ``cell_id``, ``task_id``, ``run_id``,
``harness`` and ``outcome`` (the sidecar's label). Outcomes are allowed here because the user
chooses the cells; no model reads them. A seeded sample is drawn from the filtered cells, in cell
order, so the same seed gives the same pilot.

A pilot ``run`` keeps the IR whole: :func:`apply_pilot` marks the cells it leaves out as
excluded (``cells`` and ``coverage``, reason :data:`PILOT_REASON`) and lists them in table
:data:`LEFT_OUT`, so every later stage, and every count over eligible cells (Luna, the
Coordinator's coverage, Sol's denominator and support, the report), is over the subset without
knowing of pilots. :func:`clear_pilot` puts them back before a new selection (or a full run).
"""

from __future__ import annotations

import random
from pathlib import Path

import duckdb

from pipeline.core import duck
from pipeline.core.errors import BadInput

COLUMNS = ("cell_id", "task_id", "run_id", "harness", "outcome")
LEFT_OUT = "pilot_left_out"
"""Eligible cells a pilot run left out (restored by :func:`clear_pilot`)."""
PILOT_REASON = "not in this pilot"
_ROWS = (
    "SELECT c.cell_id, c.task_id, c.run_id, c.harness, o.label AS outcome "
    "FROM cells c LEFT JOIN outcomes o USING (cell_id) WHERE c.eligibility = 'valid_behavior'{left_out}"
)
SELECT_SQL = "SELECT cell_id FROM (" + _ROWS.format(left_out="") + ") WHERE ({where}) ORDER BY cell_id"
WHAT = "not a valid filter over " + ", ".join(COLUMNS)


def _bad_where(where: str | None, exc: duckdb.Error) -> BadInput:
    msg = " ".join(str(exc).split("\nLINE ")[0].split())[:200]
    return BadInput(f"--where {where!r}: {WHAT} ({msg})")


def _one_statement(sql: str, where: str | None) -> str:
    # A filter is one condition inside one SELECT: DuckDB would run every statement a ";" adds.
    try:
        n = len(duckdb.extract_statements(sql))
    except duckdb.Error as exc:
        raise _bad_where(where, exc) from None
    if n != 1:
        raise BadInput(f"--where {where!r}: {WHAT} (it holds {n} SQL statements; give one condition)")
    return sql


def check_where(where: str | None) -> None:
    """Refuse a filter that is not SQL over :data:`COLUMNS` (syntax, unknown column, several statements).

    Checked against empty tables of the same shape, so it needs no IR: a bad ``--where`` is one line
    before anything is written.
    """
    if where is None:
        return
    if not where.strip():
        raise BadInput("--where is empty: give an SQL condition, e.g. --where \"outcome = 'failed'\"")
    con = duckdb.connect(":memory:")
    try:
        con.execute(
            "CREATE TABLE cells (cell_id VARCHAR, task_id VARCHAR, run_id VARCHAR, eligibility VARCHAR, "
            "harness VARCHAR); CREATE TABLE outcomes (cell_id VARCHAR, label VARCHAR)"
        )
        con.execute(_one_statement(SELECT_SQL.format(where=where), where)).fetchall()
    except duckdb.Error as exc:
        raise _bad_where(where, exc) from None
    finally:
        con.close()


def bundle_matching(bundle: Path, where: str) -> list[str]:
    """Eligible cells of a frozen bundle matching ``where``, read from the bundle (no IR, nothing written)."""
    import pyarrow as pa  # here: only a pilot's first run loads it for this

    from pipeline.ir.export import cell_facts  # here: the export module is large and only this needs it

    rows, outcomes = cell_facts(bundle)
    if not rows:
        return []
    cols = list(zip(*rows, strict=True))
    cells = pa.table({n: pa.array(list(c), pa.string()) for n, c in zip(
        ("cell_id", "task_id", "run_id", "eligibility", "harness"), cols, strict=True
    )})  # fmt: skip
    labels = pa.table({"cell_id": pa.array(list(outcomes), pa.string()),
                       "label": pa.array(list(outcomes.values()), pa.string())})  # fmt: skip
    con = duckdb.connect(":memory:")
    try:
        con.register("cells", cells)
        con.register("outcomes", labels)
        return matching(con, where)
    finally:
        con.close()


def matching(con: duckdb.DuckDBPyConnection, where: str | None, *, with_left_out: bool = False) -> list[str]:
    """Eligible cells of an open IR matching ``where`` (all of them when None), in cell order.

    ``with_left_out``: count the cells an earlier pilot left out as eligible (what a new selection starts from).
    """
    sql = SELECT_SQL
    if with_left_out and duck.has_table(con, LEFT_OUT):
        rows_sql = _ROWS.format(left_out=f" OR c.cell_id IN (SELECT cell_id FROM {LEFT_OUT})")
        sql = "SELECT cell_id FROM (" + rows_sql + ") WHERE ({where}) ORDER BY cell_id"
    try:
        rows = con.execute(_one_statement(sql.format(where=where or "TRUE"), where)).fetchall()
    except duckdb.Error as exc:
        raise _bad_where(where, exc) from None
    return [str(r[0]) for r in rows]


def select_cells(ir: Path, where: str | None) -> list[str]:
    """Eligible cells matching ``where`` (SQL over :data:`COLUMNS`); BadInput when none or bad SQL."""
    con = duck.connect(ir, read_only=True)
    try:
        cells = matching(con, where)
    finally:
        con.close()
    if not cells:
        raise BadInput(none_match(where))
    return cells


def none_match(where: str | None) -> str:
    """The one line for a selection of no cell."""
    return "no eligible cell matches" + (f" --where {where!r}" if where else " (the run has none)")


def sample_cells(cells: list[str], n: int | None, seed: int) -> list[str]:
    """A seeded draw of ``n`` of ``cells``, in cell order (all of them when ``n`` is None or larger)."""
    if n is None:
        return list(cells)
    if n < 1:
        raise BadInput("--sample must be at least 1")
    return sorted(random.Random(seed).sample(cells, min(n, len(cells))))


def clear_pilot(con: duckdb.DuckDBPyConnection) -> int:
    """Put the cells an earlier pilot left out back among the eligible; return how many."""
    if not duck.has_table(con, LEFT_OUT):
        return 0
    n = int((con.execute(f"SELECT count(*) FROM {LEFT_OUT}").fetchone() or (0,))[0])
    con.execute(
        f"UPDATE cells SET eligibility = 'valid_behavior', exclusion_reason = NULL "
        f"WHERE cell_id IN (SELECT cell_id FROM {LEFT_OUT})"
    )
    con.execute(
        f"UPDATE coverage SET status = 'included', reason = NULL WHERE cell_id IN (SELECT cell_id FROM {LEFT_OUT})"
    )
    con.execute(f"DROP TABLE {LEFT_OUT}")
    return n


def apply_pilot(con: duckdb.DuckDBPyConnection, keep: list[str], reason: str) -> int:
    """Mark every eligible cell not in ``keep`` excluded with ``reason`` (listed in :data:`LEFT_OUT`); how many."""
    import pyarrow as pa  # here: a run without a pilot never loads it for this

    con.register("_lunasol_pilot_keep", pa.table({"cell_id": pa.array(keep, pa.string())}))
    try:
        con.execute(
            f"CREATE TABLE {LEFT_OUT} AS SELECT cell_id FROM cells WHERE eligibility = 'valid_behavior' "
            "AND cell_id NOT IN (SELECT cell_id FROM _lunasol_pilot_keep) ORDER BY cell_id"
        )
    finally:
        con.unregister("_lunasol_pilot_keep")
    con.execute(
        f"UPDATE cells SET eligibility = 'excluded', exclusion_reason = ? "
        f"WHERE cell_id IN (SELECT cell_id FROM {LEFT_OUT})",
        [reason],
    )
    con.execute(
        f"UPDATE coverage SET status = 'excluded', reason = ? WHERE cell_id IN (SELECT cell_id FROM {LEFT_OUT})",
        [reason],
    )
    return int((con.execute(f"SELECT count(*) FROM {LEFT_OUT}").fetchone() or (0,))[0])


def eligible_before_pilot(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Every eligible cell, those a pilot left out included, in cell order.

    What a per-cell request may depend on (e.g. Luna measuring characters per token on the first
    cells) is taken from here, so a cell's request is the same in a pilot and in the full run and
    the full run can reuse the pilot's answers.
    """
    left = f" OR cell_id IN (SELECT cell_id FROM {LEFT_OUT})" if duck.has_table(con, LEFT_OUT) else ""
    rows = con.execute(f"SELECT cell_id FROM cells WHERE eligibility = 'valid_behavior'{left} ORDER BY cell_id")
    return [str(r[0]) for r in rows.fetchall()]
