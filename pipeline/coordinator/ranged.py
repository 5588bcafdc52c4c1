"""A Coordinator statement run on ranges of cells, its temp table the union of the ranges'.

Its hash tables and aggregates hold every row of the cells it is run on: run on the whole of
100,000 cells they spilled past DuckDB's limit (the incident rule 50.4 CPU s, the occurrences
17.7, against 1.6 and 0.6 at 10,000 cells). On ranges of a bounded number of rows they stay that size.
"""

from __future__ import annotations

import bisect

import duckdb

from pipeline.ir.digests import fill_ranges


def run_by_ranges(
    con: duckdb.DuckDBPyConnection, sql: str, cells: str, into: str, sizes: list[tuple[str, int]], limit: int
) -> None:
    """Run ``sql`` (it writes temp table ``into`` from the cells listed in table ``cells``) per range of ``sizes``.

    ``sizes``: (cell id, rows it brings), in id order; a range holds ``limit`` rows at most (a cell
    whole). ``into`` ends as the union of every range's rows; with no cell ``sql`` still runs once
    (on none), so ``into`` exists.
    """
    import pyarrow as pa  # here, not at module top: `lunasol --help` never loads Arrow

    ranges = fill_ranges(sizes, limit) or [("", "")]
    ids = [c for c, _ in sizes]
    union = f"_{into}_ranges"
    for i, (lo, hi) in enumerate(ranges):
        part = ids[bisect.bisect_left(ids, lo) : bisect.bisect_right(ids, hi)]
        con.register(cells, pa.table({"cell_id": pa.array(part, pa.string())}))
        try:
            con.execute(sql)
        finally:
            con.unregister(cells)
        if i:
            con.execute(f"INSERT INTO {union} SELECT * FROM {into}")
        elif len(ranges) > 1:
            con.execute(f"CREATE OR REPLACE TEMP TABLE {union} AS SELECT * FROM {into}")
    if len(ranges) > 1:
        con.execute(f"CREATE OR REPLACE TEMP TABLE {into} AS SELECT * FROM {union}")
        con.execute(f"DROP TABLE {union}")
