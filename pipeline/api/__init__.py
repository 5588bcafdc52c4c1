"""The data API: a run's tables as Arrow, for pandas, polars or DuckDB (``import pipeline.api``).

::

    from pipeline import api

    run = api.load_run("runs/h0-demo-20260809-a")
    run.table("weaknesses")              # pyarrow.Table
    run.table("cells").to_pandas()       # a pandas DataFrame, when pandas is installed
    polars.from_arrow(run.table("events"))
    runs = api.load_runs(["runs/a", "runs/b"])   # every table of several runs, with a run_id column
    runs.table("patterns")

Tables (:data:`TABLES`): ``cells`` (with outcome label and class), ``events``, ``segments``,
``probe_hits``, ``patterns``, ``groups`` (one row per pattern group), ``occurrences`` (one row per
group occurrence), ``weaknesses``, ``proposals``, ``validation`` (one row per card) and ``calls``.
IR tables come straight from the run's DuckDB; artifact tables are flattened one level: scalar
fields stay typed, nested fields are canonical JSON strings (``json.loads`` them, or DuckDB's
``->>``). ``lunasol export-tables RUN --parquet DIR`` writes every table as Parquet.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.artifacts.rundir import RunArtifacts, RunDir
from pipeline.core import duck
from pipeline.core.errors import BadInput
from pipeline.diff.compare import validation_by_id

__all__ = ["TABLES", "Run", "Runs", "export_tables", "load_run", "load_runs"]

_SUCCESS = "lower(o.label) IN ('completed', 'success', 'succeeded', 'resolved', 'passed')"  # = lunasol_successful
IR_TABLES: dict[str, str] = {
    "cells": "SELECT c.*, o.label AS outcome_label, o.quality, o.completion, o.cost, o.stability, "
    "CASE WHEN c.eligibility <> 'valid_behavior' THEN 'excluded' WHEN o.label IS NULL THEN 'unknown' "
    f"WHEN {_SUCCESS} THEN 'successful' ELSE 'failed' END AS outcome "
    "FROM cells c LEFT JOIN outcomes o USING (cell_id) ORDER BY c.cell_id",
    "events": "SELECT * FROM events ORDER BY cell_id, seq",
    "segments": "SELECT * FROM segments ORDER BY cell_id, seq",
    "probe_hits": "SELECT * FROM probe_hits ORDER BY ALL",
    "asks": "SELECT * FROM asks ORDER BY ask_id",  # lunasol ask: one row per question asked
    "ask_answers": "SELECT * FROM ask_answers ORDER BY ask_id, cell_id",
}
ARTIFACT_TABLES = ("patterns", "groups", "occurrences", "weaknesses", "proposals", "validation", "calls")
TABLES: tuple[str, ...] = (*IR_TABLES, *ARTIFACT_TABLES)
PARQUET_ROWS = 100_000
"""Rows per Parquet row group of an IR table (DuckDB's own files use 122,880): ~70 MB of events at a time."""


def _flat(row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in row.items():
        if isinstance(v, dict | list):
            out[k] = json.dumps(v, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
        else:
            out[k] = v
    return out


def _rows_table(rows: list[dict[str, Any]]) -> pa.Table:
    flat = [_flat(r) for r in rows]
    names = sorted({k for r in flat for k in r})
    columns = {}
    for name in names:
        values = [r.get(name) for r in flat]
        kinds = {type(v) for v in values if v is not None}
        if len(kinds) > 1 and not kinds <= {int, float}:  # mixed kinds across producers: keep them as text
            values = [None if v is None else str(v) for v in values]
        columns[name] = values
    return pa.table(columns) if names else pa.table({})


@dataclass
class Run:
    """One run's tables, read on demand (nothing is loaded until a table is asked for)."""

    path: Path
    _arts: RunArtifacts | None = field(default=None, repr=False)

    @property
    def arts(self) -> RunArtifacts:
        """The run's artifacts, read once."""
        if self._arts is None:
            self._arts = RunDir(self.path).read()
        return self._arts

    @property
    def run_id(self) -> str:
        """The run's id."""
        return self.arts.run_id

    def _ir(self, sql: str) -> pa.Table:
        batches = self._ir_batches(sql)
        return pa.table({}) if batches is None else pa.Table.from_batches(list(batches), batches.schema)

    def _ir_batches(self, sql: str, rows: int = 1_000_000) -> pa.RecordBatchReader | None:
        # None: no IR, or a table a partial run never wrote. The reader holds its own connection.
        ir = RunDir(self.path).ir
        if not ir.is_file():
            return None
        con = duck.connect(ir, read_only=True)
        try:
            reader = con.sql(sql).to_arrow_reader(rows)
        except duckdb.CatalogException:
            con.close()
            return None

        def batches() -> Iterator[pa.RecordBatch]:
            try:
                yield from reader
            finally:
                con.close()

        return pa.RecordBatchReader.from_batches(reader.schema, batches())

    def write_parquet(self, name: str, path: Path) -> None:
        """Write one table to ``path`` as Parquet; an IR table batch by batch (never whole in memory)."""
        batches = self._ir_batches(IR_TABLES[name], PARQUET_ROWS) if name in IR_TABLES else None
        if batches is None:
            pq.write_table(self.table(name), path)
            return
        with pq.ParquetWriter(path, batches.schema) as writer:
            for batch in batches:
                writer.write_batch(batch)

    def _artifact_rows(self, name: str) -> list[dict[str, Any]]:
        a = self.arts
        if name == "patterns":
            return list(a.patterns or [])
        if name == "groups":
            return [{k: v for k, v in g.items() if k != "occurrences"} for g in a.groups or []]
        if name == "occurrences":
            return [{"group_id": g.get("group_id"), **o} for g in a.groups or [] for o in g.get("occurrences") or []]
        if name == "weaknesses":
            return list(a.weaknesses or [])
        if name == "proposals":
            return list(a.proposals or [])
        if name == "validation":
            return list(validation_by_id(a.validation).values())
        return list(a.calls or [])

    def table(self, name: str) -> pa.Table:
        """One table as a ``pyarrow.Table`` (empty when the run has not produced it)."""
        if name in IR_TABLES:
            return self._ir(IR_TABLES[name])
        if name in ARTIFACT_TABLES:
            return _rows_table(self._artifact_rows(name))
        raise BadInput(f"no table {name!r}; tables: {', '.join(TABLES)}")

    def tables(self) -> dict[str, pa.Table]:
        """Every table by name."""
        return {name: self.table(name) for name in TABLES}


@dataclass
class Runs:
    """Several runs: each table concatenated across them, with a ``run_id`` column first."""

    runs: list[Run]

    def table(self, name: str) -> pa.Table:
        """The table of every run, stacked (columns a run lacks are null)."""
        parts = []
        for run in self.runs:
            t = run.table(name)
            if t.num_columns:
                if "run_id" in t.column_names:
                    t = t.rename_columns(["source_run_id" if c == "run_id" else c for c in t.column_names])
                parts.append(t.add_column(0, "run_id", pa.array([run.run_id] * t.num_rows, pa.string())))
        if not parts:
            return pa.table({})
        return pa.concat_tables(parts, promote_options="permissive")


def load_run(path: str | Path) -> Run:
    """A run directory (``runs/<id>``); BadInput when it is not one."""
    p = Path(path)
    run = Run(p)
    run.arts  # noqa: B018 - read now, so a wrong path fails here with one clear line
    return run


def load_runs(paths: Iterable[str | Path]) -> Runs:
    """Several run directories at once (for SQL or dataframes across generations)."""
    return Runs([load_run(p) for p in paths])


def export_tables(run_dir: Path, out_dir: Path) -> list[Path]:
    """Write every table of a run as ``OUT/<table>.parquet`` (atomically, one file per table)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise BadInput(f"--parquet {out_dir} is a file; it must be a directory (new or existing)")
    run = load_run(run_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name in TABLES:  # one table at a time: the events alone are 1.8 GB of Arrow at 10,000 cells
        path = out_dir / f"{name}.parquet"
        tmp = path.with_suffix(".parquet.tmp")
        run.write_parquet(name, tmp)
        tmp.replace(path)
        written.append(path)
    return written


def export_tables_url(run_dir: Path, url: str) -> list[str]:
    """Write every table of a run as ``URL/<table>.parquet`` on object storage (``s3://``, ``gs://``, ``az://``).

    Each table is written locally first, then put whole (an object store shows an object only once all
    of it is there), so a reader never finds part of a table at its key. Returns the URLs written, as
    :func:`pipeline.core.objstore.shown` keeps them (no credential).
    """
    import tempfile

    # only a URL target loads the object storage helpers (fsspec and its backend load later still)
    from pipeline.core.objstore import join, open_url, put_files, shown

    open_url(url)  # an unknown scheme or a missing backend: one line before any table is written
    with tempfile.TemporaryDirectory(prefix="lunasol-tables-") as tmp:
        written = export_tables(run_dir, Path(tmp))
        put_files(url, [(path, path.name) for path in written])
    return [shown(join(url, p.name)) for p in written]
