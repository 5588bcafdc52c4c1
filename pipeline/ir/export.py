"""``lunasol export``: a verified bundle -> the run's Trajectory IR (DuckDB, optionally Parquet).

Order of work: check the manifest and re-hash the bundle, read and check the request and the
outcome sidecar, then stream every eligible cell into a temp DuckDB file (one bulk INSERT fed by
Arrow batches) and rename it into place. Any error removes the temp file and a run directory
this export created, so a bad bundle leaves nothing behind; nothing is ever written inside the
bundle.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import pipeline
from pipeline.adapters import cell_harness, reader_for, step_index_base
from pipeline.adapters.native import iter_lines
from pipeline.artifacts.run_info import RUN_SCHEMA_VERSION
from pipeline.artifacts.schemas import load_document
from pipeline.bundle.manifest import MANIFEST_FILE, Manifest, read_frozen, read_manifest, verify
from pipeline.bundle.request import AnalysisRequest, CellSpec, load_request
from pipeline.core.canonical import canonical_json, sha256_bytes, write_json
from pipeline.core.errors import BadInput, BundleError
from pipeline.ir import events as events_module
from pipeline.ir import fast
from pipeline.ir.events import EVENT_ROW, SEGMENT_ROW, event_batches, gc_paused, to_arrow
from pipeline.ir.schema import IR_SCHEMA_VERSION
from pipeline.ir.store import IR_FILE, IRWriter, write_parquet

if TYPE_CHECKING:
    import pyarrow as pa

    from pipeline.core.context import RunContext

OUTCOMES_FILE = "sidecar/outcomes.jsonl"
RUN_FILE = "run.json"
_OUTCOME_NUMBERS = ("quality", "completion", "cost", "stability")
# Native bundles whose eligible cells hold at least this many raw bytes are read by worker
# processes (export_workers()); below it, starting processes costs more than it saves.
PARALLEL_MIN_BYTES = 48 * 2**20
TASK_BYTES = 8 * 2**20  # raw bytes of cells per worker task: ~40k events, a few tens of MiB in flight
MAX_WORKERS = 2

_INSERT_EVENTS = (
    "INSERT INTO events BY NAME SELECT "
    "format('{}-e{:04d}', cell_id, seq) AS event_id, "
    "format('{}-s{:03d}', cell_id, seg_no) AS segment_id, "
    "* EXCLUDE (seg_no) FROM _lunasol_events"
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
    redactions_per_cell: dict[str, int] = field(default_factory=dict)

    @property
    def redactions(self) -> int:
        """Secrets replaced by ``[REDACTED:<kind>]`` in the IR's event text (pipeline.ir.redact)."""
        return sum(self.redactions_per_cell.values())

    def summary(self) -> str:
        """One line: cells in, cells excluded, events (and secrets redacted, when there were any)."""
        line = f"{self.cells_in} cells in, {len(self.excluded)} excluded, {self.events:,} events"
        if self.redactions:
            cells = sum(1 for n in self.redactions_per_cell.values() if n)
            line += f", {self.redactions:,} secret(s) redacted in {cells} cell(s)"
        return line

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
            "redactions": self.redactions,
            "redactions_per_cell": {k: v for k, v in self.redactions_per_cell.items() if v},
        }


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


def read_run_json(run_dir: Path) -> dict[str, Any]:
    """A run's ``run.json`` as a dict; missing or unreadable is one BadInput line."""
    path = run_dir / RUN_FILE
    if not path.is_file():
        raise BadInput(f"not a lunasol run directory: {run_dir} (no {RUN_FILE})")

    return load_document(path, "run")[0]


def run_bundle(run_dir: Path) -> Path:
    """The bundle a run was exported from (``run.json`` stores it relative to the run directory)."""
    bundle = read_run_json(run_dir).get("bundle")
    if not isinstance(bundle, str):
        raise BadInput(f"{run_dir / RUN_FILE} names no bundle")
    return (run_dir / bundle).resolve()


def _write_run_json(run_dir: Path, bundle: Path, request: AnalysisRequest, digest: str, export: dict[str, Any]) -> None:
    path = run_dir / RUN_FILE
    data: dict[str, Any] = read_run_json(run_dir) if path.is_file() else {}
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


def _load_cells(
    writer: IRWriter,
    bundle: Path,
    cells: list[CellSpec],
    manifest: Manifest,
    fmt: str,
    redactions: dict[str, int],
) -> dict[str, int]:
    """Stream every eligible cell into ``events`` (one INSERT), then ``segments``; return events per cell.

    ``redactions`` gets the secrets redacted per cell (pipeline.ir.redact, called by both paths).
    """
    counts: dict[str, int] = {}
    segments: list[tuple[Any, ...]] = []
    if fmt == "native":
        try:
            with gc_paused():
                _load_native(writer, bundle, cells, manifest, counts, segments, redactions)
            writer.insert_table("segments", to_arrow(segments, SEGMENT_ROW))
            return counts
        except fast.IllTyped:
            # A value no IR column can hold: start again on the generic path, which reports it
            # exactly as it always has (the same one-line BadInput).
            writer.reset()
            counts.clear()
            segments.clear()
            redactions.clear()
    schema = to_arrow([], EVENT_ROW).schema
    batches = event_batches(bundle, cells, manifest, reader_for(fmt), counts, segments, redactions)
    with gc_paused():
        writer.insert_stream(_INSERT_EVENTS, "_lunasol_events", schema, batches)
    writer.insert_table("segments", to_arrow(segments, SEGMENT_ROW))
    return counts


def export_workers() -> int:
    """Worker processes for a big native export: ``LUNASOL_EXPORT_WORKERS`` or the CPU count (at most 2).

    0 reads every cell in this process. Measured on 2 CPUs (bench/README.md): 2 workers (while
    this process runs the DuckDB insert) beat 1 and 0 on the 1M-event benchmark.
    """
    raw = os.environ.get("LUNASOL_EXPORT_WORKERS")
    if raw is not None:
        try:
            return max(0, int(raw))
        except ValueError:
            raise BadInput(f"LUNASOL_EXPORT_WORKERS must be a whole number, not {raw!r}") from None
    cpus = os.cpu_count() or 1
    return 0 if cpus < 2 else min(cpus, MAX_WORKERS)


def _cell_bytes(manifest: Manifest, cells: list[CellSpec]) -> list[int]:
    """Raw bytes under each cell's directory, from the manifest (sorted by path: two bisects a cell)."""
    paths = [f.path for f in manifest.files]
    total = [0]
    for f in manifest.files:
        total.append(total[-1] + f.size)
    out = []
    for cell in cells:
        prefix = cell.path.rstrip("/") + "/"
        lo, hi = bisect.bisect_left(paths, prefix), bisect.bisect_left(paths, prefix + "\U0010ffff")
        out.append(total[hi] - total[lo])
    return out


def _load_native(
    writer: IRWriter,
    bundle: Path,
    cells: list[CellSpec],
    manifest: Manifest,
    counts: dict[str, int],
    segments: list[tuple[Any, ...]],
    redactions: dict[str, int],
) -> None:
    sizes = _cell_bytes(manifest, cells)
    workers = export_workers() if sum(sizes) >= PARALLEL_MIN_BYTES and sys.executable else 0
    if workers and len(cells) > 1:
        batches = _parallel_batches(bundle, cells, manifest, sizes, workers, counts, segments, redactions)
    else:
        batches = _serial_batches(bundle, cells, manifest, counts, segments, redactions)
    try:
        writer.insert_stream(_INSERT_EVENTS, "_lunasol_events", fast.fast_schema(), batches)
    finally:
        batches.close()  # stops a worker pool at once if DuckDB failed first


def _serial_batches(
    bundle: Path,
    cells: list[CellSpec],
    manifest: Manifest,
    counts: dict[str, int],
    segments: list[tuple[Any, ...]],
    redactions: dict[str, int],
) -> Generator[pa.RecordBatch, None, None]:
    builder = fast.ColumnBuilder(bundle, manifest)
    for cell in cells:
        builder.add(cell)
        if builder.rows >= events_module.BATCH_ROWS:
            batch = builder.flush()
            if batch is not None:
                yield batch
    batch = builder.flush()
    if batch is not None:
        yield batch
    counts.update(builder.counts)
    segments.extend(builder.segments)
    redactions.update(builder.redactions)


def _parallel_batches(
    bundle: Path,
    cells: list[CellSpec],
    manifest: Manifest,
    sizes: list[int],
    workers: int,
    counts: dict[str, int],
    segments: list[tuple[Any, ...]],
    redactions: dict[str, int],
) -> Generator[pa.RecordBatch, None, None]:
    """Cells read by ``workers`` worker processes (``fast.worker_main``); results in request order.

    Tasks of about TASK_BYTES of cells go round-robin to the workers, and results are taken in
    task order, so the first error in cell order is the one raised, as in one process. A worker
    blocks on its pipe until its result is taken, so memory stays bounded whatever the size.
    """
    tasks: list[list[CellSpec]] = [[]]
    task_bytes = 0
    for cell, size in zip(cells, sizes, strict=True):
        if tasks[-1] and task_bytes + size > TASK_BYTES:
            tasks.append([])
            task_bytes = 0
        tasks[-1].append(cell)
        task_bytes += size
    workers = min(workers, len(tasks))
    root = str(Path(pipeline.__file__).resolve().parent.parent)
    code = f"import sys; sys.path.insert(0, {root!r}); from pipeline.ir.fast import worker_main; worker_main()"
    procs: list[tuple[subprocess.Popen[bytes], BinaryIO]] = []
    try:
        for _ in range(workers):
            read_fd, write_fd = os.pipe()
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-c", code, str(write_fd)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    # A worker reports its errors through the pipe; its stderr only with LUNASOL_DEBUG.
                    stderr=None if os.environ.get("LUNASOL_DEBUG") else subprocess.DEVNULL,
                    pass_fds=(write_fd,),
                )
            finally:
                os.close(write_fd)
            procs.append((proc, os.fdopen(read_fd, "rb")))
        for k, (proc, _) in enumerate(procs):
            assert proc.stdin is not None
            with contextlib.suppress(BrokenPipeError):  # a worker that died is reported below
                proc.stdin.write(pickle.dumps((bundle, manifest, tasks[k::workers]), protocol=pickle.HIGHEST_PROTOCOL))
                proc.stdin.close()
        for i in range(len(tasks)):
            proc, results = procs[i % workers]
            try:
                result = pickle.load(results)
            except EOFError:
                raise RuntimeError(f"export worker {proc.pid} stopped early (exit code {proc.wait()})") from None
            if result[0] == "err":
                raise result[1]
            _, batch, cell_counts, cell_segments, cell_redactions = result
            counts.update(cell_counts)
            segments.extend(cell_segments)
            redactions.update(cell_redactions)
            if batch is not None:
                yield batch
    finally:
        for proc, results in procs:
            if proc.poll() is None:
                proc.kill()  # only our own worker, by its handle: all its results were taken or we failed
            proc.wait()
            results.close()


def _harnesses(bundle: Path, request: AnalysisRequest) -> list[str | None]:
    # Imported cells keep their own harness (a mixed import holds several systems); native: the request's.
    if request.format == "native":
        return [request.parent_harness for _ in request.cells]
    return [cell_harness(bundle, c.cell_id, request.parent_harness) for c in request.cells]


def _step_bases(bundle: Path, request: AnalysisRequest) -> list[int | None]:
    if request.format == "native":
        return [None for _ in request.cells]
    return [step_index_base(bundle, c.cell_id) if c.eligibility == "valid_behavior" else None for c in request.cells]


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
    reader_for(request.format)  # an unknown format fails here, before anything is written
    outcomes = _read_outcomes(bundle, manifest, request)  # checked before anything is written
    excluded = {
        c.cell_id: request.exclusion_reason(c.cell_id) or "" for c in request.cells if c.eligibility == "excluded"
    }

    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    ir_path = run_dir / IR_FILE
    writer: IRWriter | None = None
    try:
        writer = IRWriter(ir_path)
        redactions: dict[str, int] = {}
        counts = _load_cells(writer, bundle, cells, manifest, request.format, redactions)
        total = sum(counts.values())
        if total == 0:
            raise BundleError(f"empty bundle: no events in any of the {len(cells)} eligible cells of {bundle}")
        ids = [c.cell_id for c in request.cells]
        writer.insert_table(
            "meta",
            pa.table(
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
        )
        writer.insert_table(
            "cells",
            pa.table(
                {
                    "cell_id": ids,
                    "task_id": [c.task_id for c in request.cells],
                    "run_id": [c.run_id for c in request.cells],
                    "eligibility": [c.eligibility for c in request.cells],
                    "exclusion_reason": [excluded.get(i) for i in ids],
                    "harness": _harnesses(bundle, request),
                    "step_index_base": pa.array(_step_bases(bundle, request), type=pa.int32()),
                }
            ),
        )
        writer.insert_table(
            "outcomes",
            pa.table(
                {
                    k: pa.array(v, type=pa.float64() if k in _OUTCOME_NUMBERS else pa.string())
                    for k, v in outcomes.items()
                }
            ),
        )
        writer.insert_table(
            "coverage",
            pa.table(
                {
                    "cell_id": ids,
                    "status": ["excluded" if i in excluded else "included" for i in ids],
                    "reason": [excluded.get(i) for i in ids],
                    "events": pa.array([counts.get(i, 0) for i in ids], type=pa.int32()),
                    "redactions": pa.array([redactions.get(i, 0) for i in ids], type=pa.int32()),
                }
            ),
        )
        writer.commit()
        written = write_parquet(ir_path, parquet_dir) if parquet_dir is not None else []
    except BaseException:
        if writer is not None:
            writer.abort()
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
        redactions_per_cell=redactions,
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
            # Only when there were any, so a run without secrets (the demo) records what it always did.
            **({"redactions": result.redactions} if result.redactions else {}),
        },
    )
    return result


def stage(ctx: RunContext) -> str:
    """Runner stage: export the run's bundle into ``ctx.run_dir``; one-line summary."""
    return export(ctx.bundle, ctx.run_dir).summary()


def export_bundle(
    bundle: Path, run_id: str | None = None, runs_dir: Path = Path("runs"), parquet_dir: Path | None = None
) -> ExportReport:
    """``lunasol export``: the run id defaults to the request's ``analysis_run_id``."""
    if run_id is None:
        if not bundle.is_dir():
            raise BundleError(f"bundle not found: {bundle}")
        run_id = load_request(bundle).analysis_run_id
    if not run_id or "/" in run_id or run_id in (".", ".."):
        raise BadInput(f"bad run id {run_id!r}")
    return export(bundle, runs_dir / run_id, parquet_dir)
