"""``lunasol export``: a verified bundle -> the run's Trajectory IR (DuckDB, optionally Parquet).

Order of work: check the manifest and re-hash the bundle, read the request, read every eligible
cell into columns in memory, and only then create the run directory and write the DuckDB file
(temp file + rename). A bad bundle therefore leaves nothing behind, and nothing is ever written
inside the bundle.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pipeline
from pipeline.bundle.manifest import MANIFEST_FILE, Manifest, read_frozen, read_manifest, verify
from pipeline.bundle.native import iter_lines
from pipeline.bundle.request import AnalysisRequest, CellSpec, load_request
from pipeline.canonical import canonical_json, read_json, sha256_bytes, write_json
from pipeline.errors import BadInput, BundleError
from pipeline.ir.events import Reader, SourceEvent, reader_for
from pipeline.ir.schema import IR_SCHEMA_VERSION, event_id, trim_text
from pipeline.ir.store import IR_FILE, write_ir, write_parquet

if TYPE_CHECKING:
    import pyarrow as pa

    from pipeline.runner import RunContext

OUTCOMES_FILE = "sidecar/outcomes.jsonl"
RUN_FILE = "run.json"
RUN_SCHEMA_VERSION = 1
_OUTCOME_NUMBERS = ("quality", "completion", "cost", "stability")

# Events columns in schema order, with their Arrow types (built lazily: pyarrow loads on use).
_EVENT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("event_id", "string"),
    ("cell_id", "string"),
    ("segment_id", "string"),
    ("seq", "int32"),
    ("ts", "string"),
    ("kind", "string"),
    ("detail", "string"),
    ("actor", "string"),
    ("stage", "string"),
    ("session_id", "string"),
    ("step_index", "int32"),
    ("text", "string"),
    ("text_truncated", "bool_"),
    ("text_chars", "int32"),
    ("tool_name", "string"),
    ("call_id", "string"),
    ("args_digest", "string"),
    ("result_digest", "string"),
    ("state_digest", "string"),
    ("target", "string"),
    ("source_path", "string"),
    ("line_start", "int32"),
    ("line_end", "int32"),
    ("source_sha256", "string"),
    ("json_pointer", "string"),
)
_SEGMENT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("segment_id", "string"),
    ("cell_id", "string"),
    ("seq", "int32"),
    ("stage", "string"),
    ("session_id", "string"),
    ("actor", "string"),
    ("first_event_seq", "int32"),
    ("last_event_seq", "int32"),
    ("event_count", "int32"),
)


@dataclass
class ExportReport:
    """What one export did: coverage, where the IR is, how long it took."""

    run_dir: Path
    ir_path: Path
    bundle_digest: str
    cells_in: int
    events: int
    events_per_cell: dict[str, int]
    excluded: dict[str, str]
    seconds: float
    parquet: list[Path] = field(default_factory=list)

    def summary(self) -> str:
        """One line: cells in, cells excluded, events."""
        return f"{self.cells_in} cells in, {len(self.excluded)} excluded, {self.events:,} events"

    def to_json(self) -> dict[str, Any]:
        """Machine-readable coverage."""
        return {
            "run_dir": self.run_dir.as_posix(),
            "ir": self.ir_path.as_posix(),
            "bundle_digest": self.bundle_digest,
            "cells_in": self.cells_in,
            "events": self.events,
            "events_per_cell": self.events_per_cell,
            "excluded": self.excluded,
            "parquet": [p.as_posix() for p in self.parquet],
        }


class _Columns:
    """Column lists for events and segments, appended cell by cell."""

    def __init__(self) -> None:
        self.events: dict[str, list[Any]] = {name: [] for name, _ in _EVENT_COLUMNS}
        self.segments: dict[str, list[Any]] = {name: [] for name, _ in _SEGMENT_COLUMNS}

    def add_cell(self, cell_id: str, events: list[SourceEvent], manifest: Manifest) -> int:
        # Time order; ties by file then line. sort() is stable, so a reader's order breaks the rest.
        events.sort(key=lambda e: (e.ts or "", e.source_path, e.line_start))
        ev = self.events
        sg = self.segments
        shas: dict[str, str] = {}
        state: str | None = None
        seg_key: tuple[str | None, str | None, str | None] | None = None
        seg_no = -1
        seg_id = ""
        seg_first = 0
        for seq, e in enumerate(events):
            if e.kind == "state_change" and e.state_digest:
                state = e.state_digest
            elif e.state_digest is None:
                e.state_digest = state  # the controller state in force at this event
            key = (e.stage, e.session_id, e.actor)
            if key != seg_key:
                if seg_key is not None:
                    self._close_segment(cell_id, seg_id, seg_no, seg_key, seg_first, seq - 1)
                seg_key, seg_no, seg_first = key, seg_no + 1, seq
                seg_id = f"{cell_id}-s{seg_no:03d}"
            sha = shas.get(e.source_path)
            if sha is None:
                sha = shas[e.source_path] = manifest.get(e.source_path).sha256
            text, cut = trim_text(e.text)
            ev["event_id"].append(event_id(cell_id, seq))
            ev["cell_id"].append(cell_id)
            ev["segment_id"].append(seg_id)
            ev["seq"].append(seq)
            ev["ts"].append(e.ts)
            ev["kind"].append(e.kind)
            ev["detail"].append(e.detail)
            ev["actor"].append(e.actor)
            ev["stage"].append(e.stage)
            ev["session_id"].append(e.session_id)
            ev["step_index"].append(e.step_index)
            ev["text"].append(text)
            ev["text_truncated"].append(cut)
            ev["text_chars"].append(len(e.text))
            ev["tool_name"].append(e.tool_name)
            ev["call_id"].append(e.call_id)
            ev["args_digest"].append(e.args_digest)
            ev["result_digest"].append(e.result_digest)
            ev["state_digest"].append(e.state_digest)
            ev["target"].append(e.target)
            ev["source_path"].append(e.source_path)
            ev["line_start"].append(e.line_start)
            ev["line_end"].append(e.line_end)
            ev["source_sha256"].append(sha)
            ev["json_pointer"].append(e.json_pointer)
        if seg_key is not None:
            self._close_segment(cell_id, seg_id, seg_no, seg_key, seg_first, len(events) - 1)
        del sg
        return len(events)

    def _close_segment(
        self, cell_id: str, seg_id: str, no: int, key: tuple[str | None, str | None, str | None], first: int, last: int
    ) -> None:
        sg = self.segments
        sg["segment_id"].append(seg_id)
        sg["cell_id"].append(cell_id)
        sg["seq"].append(no)
        sg["stage"].append(key[0])
        sg["session_id"].append(key[1])
        sg["actor"].append(key[2])
        sg["first_event_seq"].append(first)
        sg["last_event_seq"].append(last)
        sg["event_count"].append(last - first + 1)


def _table(columns: dict[str, list[Any]], spec: tuple[tuple[str, str], ...]) -> pa.Table:
    import pyarrow as pa

    return pa.table({name: pa.array(columns[name], type=getattr(pa, typ)()) for name, typ in spec})


def _read_outcomes(bundle: Path, manifest: Manifest, request: AnalysisRequest) -> dict[str, list[Any]]:
    cols: dict[str, list[Any]] = {k: [] for k in ("cell_id", "label", *_OUTCOME_NUMBERS, "extra")}
    if OUTCOMES_FILE not in manifest.by_path:
        return cols
    known = {c.cell_id for c in request.cells}
    seen: set[str] = set()
    for n, rec in iter_lines(read_frozen(bundle, OUTCOMES_FILE, manifest), OUTCOMES_FILE):
        rest = dict(rec)
        cell_id = rest.pop("cell_id", None)
        if not isinstance(cell_id, str) or cell_id not in known:
            raise BundleError(f"{OUTCOMES_FILE} line {n}: unknown or missing cell_id {cell_id!r}")
        if cell_id in seen:
            raise BundleError(f"{OUTCOMES_FILE} line {n}: second outcome for cell {cell_id}")
        seen.add(cell_id)
        label = rest.pop("label", None)
        if label is not None and not isinstance(label, str):
            raise BundleError(f"{OUTCOMES_FILE} line {n}: label must be a string")
        cols["cell_id"].append(cell_id)
        cols["label"].append(label)
        for key in _OUTCOME_NUMBERS:
            value = rest.pop(key, None)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise BundleError(f"{OUTCOMES_FILE} line {n}: {key} must be a number or null")
            cols[key].append(None if value is None else float(value))
        cols["extra"].append(canonical_json(rest))
    return cols


def _inside(root: Path, path: Path) -> bool:
    root, path = root.resolve(), path.resolve()
    return path == root or root in path.parents


def run_bundle(run_dir: Path) -> Path:
    """The bundle a run was exported from (``run.json`` stores it relative to the run directory)."""
    run_json = run_dir / RUN_FILE
    if not run_json.is_file():
        raise BadInput(f"not a lunasol run directory: {run_dir} (no {RUN_FILE})")
    bundle = read_json(run_json).get("bundle")
    if not isinstance(bundle, str):
        raise BadInput(f"{run_json} names no bundle")
    return (run_dir / bundle).resolve()


def _write_run_json(run_dir: Path, bundle: Path, request: AnalysisRequest, digest: str, export: dict[str, Any]) -> None:
    path = run_dir / RUN_FILE
    data: dict[str, Any] = read_json(path) if path.is_file() else {}
    data.update(
        {
            "schema_version": RUN_SCHEMA_VERSION,
            "run_id": run_dir.name,
            # Relative to the run directory, so the run resolves its bundle from any working directory.
            "bundle": Path(os.path.relpath(bundle.resolve(), run_dir.resolve())).as_posix(),
            "bundle_digest": digest,
            "analysis_run_id": request.analysis_run_id,
            "parent_harness": request.parent_harness,
            "lunasol_version": pipeline.__version__,
            "export": export,
        }
    )
    write_json(path, data)


def _read_all(
    bundle: Path, cells: list[CellSpec], manifest: Manifest, reader: Reader
) -> tuple[_Columns, dict[str, int]]:
    cols = _Columns()
    counts: dict[str, int] = {}
    for cell in cells:
        events = list(reader(bundle, cell, manifest))
        counts[cell.cell_id] = cols.add_cell(cell.cell_id, events, manifest)
    return cols, counts


def export(bundle: Path, run_dir: Path, parquet_dir: Path | None = None) -> ExportReport:
    """Verify ``bundle`` and write its IR to ``run_dir/ir.duckdb`` (and ``run.json``); see module doc."""
    import pyarrow as pa

    t0 = time.perf_counter()
    if not bundle.is_dir():
        raise BundleError(f"bundle not found: {bundle}")
    for out, what in ((run_dir, "run directory"), (parquet_dir, "parquet directory")):
        if out is not None and _inside(bundle, out):
            raise BadInput(f"{what} {out} is inside the bundle; lunasol never writes inside a bundle")
    manifest = read_manifest(bundle)
    report = verify(bundle, manifest)
    if not report.ok:
        raise BundleError(f"bundle {bundle} differs from its {MANIFEST_FILE}: {report.summary()}")
    request = load_request(bundle)
    bundle_digest = sha256_bytes((bundle / MANIFEST_FILE).read_bytes())
    cells = request.eligible_cells
    if not cells:
        raise BundleError(f"empty bundle: {bundle} lists no valid_behavior cells")
    reader = reader_for(request.format)
    cols, counts = _read_all(bundle, cells, manifest, reader)
    total = sum(counts.values())
    if total == 0:
        raise BundleError(f"empty bundle: no events in any of the {len(cells)} eligible cells of {bundle}")
    outcomes = _read_outcomes(bundle, manifest, request)

    excluded = {
        c.cell_id: request.exclusion_reason(c.cell_id) or "" for c in request.cells if c.eligibility == "excluded"
    }
    harness = request.parent_harness
    tables = {
        "meta": pa.table(
            {
                "key": ["analysis_run_id", "bundle_digest", "format", "ir_schema_version", "lunasol_version"],
                "value": [
                    request.analysis_run_id,
                    bundle_digest,
                    request.format,
                    str(IR_SCHEMA_VERSION),
                    pipeline.__version__,
                ],
            }
        ),
        "cells": pa.table(
            {
                "cell_id": [c.cell_id for c in request.cells],
                "task_id": [c.task_id for c in request.cells],
                "run_id": [c.run_id for c in request.cells],
                "eligibility": [c.eligibility for c in request.cells],
                "exclusion_reason": [excluded.get(c.cell_id) for c in request.cells],
                "harness": [harness for _ in request.cells],
                "step_index_base": pa.array([None] * len(request.cells), type=pa.int32()),
            }
        ),
        "segments": _table(cols.segments, _SEGMENT_COLUMNS),
        "events": _table(cols.events, _EVENT_COLUMNS),
        "outcomes": pa.table(
            {k: pa.array(v, type=pa.float64() if k in _OUTCOME_NUMBERS else pa.string()) for k, v in outcomes.items()}
        ),
        "coverage": pa.table(
            {
                "cell_id": [c.cell_id for c in request.cells],
                "status": ["excluded" if c.cell_id in excluded else "included" for c in request.cells],
                "reason": [excluded.get(c.cell_id) for c in request.cells],
                "events": pa.array([counts.get(c.cell_id, 0) for c in request.cells], type=pa.int32()),
            }
        ),
    }
    del cols

    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    ir_path = run_dir / IR_FILE
    try:
        write_ir(ir_path, tables)
        written = write_parquet(ir_path, parquet_dir) if parquet_dir is not None else []
    except Exception:
        if created:
            with contextlib.suppress(OSError):
                run_dir.rmdir()  # only if still empty: never remove anything we did not create
        raise
    result = ExportReport(
        run_dir=run_dir,
        ir_path=ir_path,
        bundle_digest=bundle_digest,
        cells_in=len(cells),
        events=total,
        events_per_cell=counts,
        excluded=excluded,
        seconds=time.perf_counter() - t0,
        parquet=written,
    )
    _write_run_json(
        run_dir,
        bundle,
        request,
        bundle_digest,
        {
            "ir": IR_FILE,
            "ir_schema_version": IR_SCHEMA_VERSION,
            "cells_in": len(cells),
            "cells_excluded": len(excluded),
            "events": total,
        },
    )
    return result


def stage(ctx: RunContext) -> str:
    """Runner stage: export the run's bundle into ``ctx.run_dir``; one-line summary."""
    return export(ctx.bundle, ctx.run_dir).summary()
