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
import sys
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pipeline
from pipeline.adapters import cell_block, cell_harness, reader_for, step_index_base
from pipeline.adapters.native import iter_lines
from pipeline.artifacts.run_info import RUN_SCHEMA_VERSION
from pipeline.artifacts.rundir import RUN
from pipeline.artifacts.schemas import load_document
from pipeline.bundle import verified
from pipeline.bundle.manifest import MANIFEST_FILE, Manifest, read_frozen, read_manifest, verify
from pipeline.bundle.request import AnalysisRequest, CellSpec, load_request
from pipeline.core.canonical import canonical_json, digest, sha256_file, write_json
from pipeline.core.errors import BadInput, BundleError
from pipeline.core.memory import give_back
from pipeline.ir import cache, digests, pool
from pipeline.ir.redact import NO_REDACT_NOTE
from pipeline.ir.rows import SEGMENT_ROW, event_schema, gc_paused, record_reader, serial_batches, to_arrow
from pipeline.ir.schema import IR_SCHEMA_VERSION
from pipeline.ir.store import IR_FILE, IRWriter, write_parquet

if TYPE_CHECKING:
    import pyarrow as pa

    from pipeline.core.context import RunContext

OUTCOMES_FILE = "sidecar/outcomes.jsonl"
RUN_FILE = RUN.filename
_OUTCOME_NUMBERS = ("quality", "completion", "cost", "stability")

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
    reused: list[str] = field(default_factory=list)  # cells whose rows were copied from the previous IR
    redactions_per_cell: dict[str, int] = field(default_factory=dict)
    redacted: bool = True  # False: made with --no-redact (secrets left in the IR's text as written)

    @property
    def redactions(self) -> int:
        """Secrets replaced by ``[REDACTED:<kind>]`` in the IR's event text (pipeline.ir.redact)."""
        return sum(self.redactions_per_cell.values())

    def summary(self) -> str:
        """One line: cells in, excluded, events (and secrets redacted, cells reused, when there are any)."""
        line = f"{self.cells_in} cells in, {len(self.excluded)} excluded, {self.events:,} events"
        if self.redactions:
            cells = sum(1 for n in self.redactions_per_cell.values() if n)
            line += f", {self.redactions:,} secret(s) redacted in {cells} cell(s)"
        if self.reused:
            line += f" ({len(self.reused)} unchanged cells reused, {self.cells_in - len(self.reused)} read)"
        if not self.redacted:
            line += f"; {NO_REDACT_NOTE}"
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
            "cells_reused": len(self.reused),
            "redactions": self.redactions,
            "redactions_per_cell": {k: v for k, v in self.redactions_per_cell.items() if v},
            "redacted": self.redacted,
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


def _outcomes_table(cols: dict[str, list[Any]]) -> pa.Table:
    import pyarrow as pa  # here, not at module top: `lunasol --help` never loads Arrow

    return pa.table(
        {k: pa.array(v, type=pa.float64() if k in _OUTCOME_NUMBERS else pa.string()) for k, v in cols.items()}
    )


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
    redact: bool = True,
) -> dict[str, int]:
    """Stream every eligible cell into ``events`` and ``segments``; return events per cell.

    A big bundle is read by worker processes (:mod:`pipeline.ir.pool`), a small one in this
    process; both build their rows with :class:`pipeline.ir.rows.ColumnBuilder`. The segments
    made while a statement of events was inserted go in right after it: none is held for the batch.
    """
    counts: dict[str, int] = {}
    segments: list[tuple[Any, ...]] = []  # appended to by the producer thread, taken from the front here
    sizes = _cell_bytes(manifest, cells)
    workers = pool.export_workers() if sum(sizes) >= pool.PARALLEL_MIN_BYTES and sys.executable else 0
    batches: Generator[pa.RecordBatch, None, None]
    if workers and len(cells) > 1:
        batches = pool.parallel_batches(
            bundle, cells, manifest, fmt, sizes, workers, counts, segments, redactions, redact
        )
    else:
        batches = serial_batches(bundle, cells, manifest, record_reader(fmt), counts, segments, redactions, redact)

    def insert_segments() -> None:
        # The producer only appends: the first n rows taken here are never touched again.
        n = len(segments)
        if n:
            writer.insert_table("segments", to_arrow(segments[:n], SEGMENT_ROW))
            del segments[:n]

    try:
        with gc_paused():
            writer.insert_stream(_INSERT_EVENTS, "_lunasol_events", event_schema(), batches, between=insert_segments)
    finally:
        batches.close()  # stops a worker pool at once if DuckDB failed first
    insert_segments()
    return counts


def _cell_spans(manifest: Manifest, cells: list[CellSpec]) -> list[tuple[int, int]]:
    """Each cell directory's files as a slice of ``manifest.files`` (sorted by path: two bisects a cell)."""
    spans = (manifest.files.under(cell.path) for cell in cells)
    return [(r.start, r.stop) for r in spans]


def _cell_bytes(manifest: Manifest, cells: list[CellSpec]) -> list[int]:
    """Raw bytes under each cell's directory, from the manifest (no list of every file's: one sum a cell)."""
    files = manifest.files
    return [sum(f.size for f in files[lo:hi]) for lo, hi in _cell_spans(manifest, cells)]


def source_digests(bundle: Path, request: AnalysisRequest, manifest: Manifest) -> dict[str, str]:
    """What each eligible cell's events are read from, as one digest per cell.

    Native: every frozen file under the cell's directory; an imported format: the cell's source
    block and the files it names. Plus the cell's request entry, the format and lunasol's version
    (the reader's code), so equal digests mean equal event rows.
    """
    cells = request.eligible_cells
    base = {
        "format": request.format,
        "harness": request.parent_harness,
        "lunasol": pipeline.__version__,
        "ir_schema": IR_SCHEMA_VERSION,
    }
    out: dict[str, str] = {}
    if request.format == "native":
        files = manifest.files
        for cell, (lo, hi) in zip(cells, _cell_spans(manifest, cells), strict=True):
            listed = [[f.path, f.sha256] for f in files[lo:hi]]
            out[cell.cell_id] = digest({**base, "cell": cell.as_json(), "files": listed})
        return out
    for cell in cells:
        block = cell_block(bundle, cell.cell_id)
        listed = [[rel, manifest.get(rel).sha256] for rel in block.get("files") or [cell.path]]
        out[cell.cell_id] = digest({**base, "cell": cell.as_json(), "block": block, "files": listed})
    return out


def _fill_digests(writer: IRWriter, sources: dict[str, str]) -> None:
    """Table ``cell_digests``: the source and content digests of every cell that has none yet.

    Those are the cells read by this export (the copied ones came with theirs). A few cells' digests
    (at most :data:`~pipeline.ir.digests.PYTHON_FILL_EVENTS` events) are made in Python from their
    rows; more are computed in DuckDB, range by range.
    """
    import pyarrow as pa

    todo = writer.fetch(digests.TODO_SQL)  # (cell, events, bytes of their JSON, about)
    if not todo:
        return  # every cell's digests came with its rows (the check below scans every event when none is to do)
    string = pa.string()
    if sum(n for _, n, _ in todo) <= digests.PYTHON_FILL_EVENTS:  # a rerun's few changed cells
        made = digests.python_digests(writer.fetch, [cell for cell, _, _ in todo])
        cells = sorted(made)
        columns = {
            "cell_id": cells,
            "source_digest": [sources.get(c) for c in cells],  # None: an excluded cell, as in the SQL
            "content_digest": [made[c] for c in cells],
        }
        writer.insert_table("cell_digests", pa.table({k: pa.array(v, string) for k, v in columns.items()}))
        return
    # the exact escape path only when some event needs it (its plan alone costs more than the digests)
    exact = bool(writer.fetch(digests.NEEDS_EXACT_SQL)[0][0])
    macros, fill = digests.fill_sql(exact)
    table = pa.table(
        {"cell_id": pa.array(list(sources), string), "source_digest": pa.array(list(sources.values()), string)}
    )
    writer.register("_lunasol_sources", table)
    writer.execute("CHECKPOINT")  # the tables inserted since the load's last one: on disk, not in the limit
    sized = sorted((cell, size) for cell, _, size in todo)  # fill_ranges' own sort of it is then one pass
    ids = [cell for cell, _ in sized]
    try:
        writer.execute(macros)
        for lo, hi in digests.fill_ranges(sized):
            _fill_range(writer, fill, ids, bisect.bisect_left(ids, lo), bisect.bisect_right(ids, hi))
    finally:
        writer.unregister("_lunasol_sources")


def _fill_range(writer: IRWriter, fill: str, ids: list[str], lo: int, hi: int) -> None:
    """Fill the digests of cells ``ids[lo:hi]`` (sorted ids); a range DuckDB runs out of memory on is halved.

    A range's size is an estimate (:data:`~pipeline.ir.digests.TODO_SQL`), and DuckDB's memory under
    its limit varies with its threads' timing: a 100,000-cell export whose fill passed alone ran out of
    its 256 MiB in one range while another process loaded both cores. The failed INSERT is rolled back
    (each statement commits alone), so its two halves are filled instead; a single cell's error stands.
    """
    import duckdb

    try:
        writer.execute(fill, {"lo": ids[lo], "hi": ids[hi - 1]})
    except duckdb.OutOfMemoryException:
        if hi - lo < 2:
            raise
        mid = (lo + hi) // 2
        _fill_range(writer, fill, ids, lo, mid)
        _fill_range(writer, fill, ids, mid, hi)


def _harnesses(bundle: Path, request: AnalysisRequest) -> list[str | None]:
    # Imported cells keep their own harness (a mixed import holds several systems); native: the request's.
    if request.format == "native":
        return [request.parent_harness for _ in request.cells]
    return [cell_harness(bundle, c.cell_id, request.parent_harness) for c in request.cells]


def cell_facts(bundle: Path) -> tuple[list[tuple[str, str, str, str, str | None]], dict[str, str | None]]:
    """The cells as export writes them, read without writing anything.

    Returns (cell, task, run, eligibility, harness) rows and each cell's outcome label: what a pilot's
    ``--where`` is evaluated on before a run directory exists.
    """
    manifest = read_manifest(bundle)
    request = load_request(bundle)
    rows: list[tuple[str, str, str, str, str | None]] = [
        (c.cell_id, c.task_id, c.run_id, str(c.eligibility), h)
        for c, h in zip(request.cells, _harnesses(bundle, request), strict=True)
    ]
    outcomes = _read_outcomes(bundle, manifest, request)
    return rows, dict(zip(outcomes["cell_id"], outcomes["label"], strict=True))


def _step_bases(bundle: Path, request: AnalysisRequest) -> list[int | None]:
    if request.format == "native":
        return [None for _ in request.cells]
    return [step_index_base(bundle, c.cell_id) if c.eligibility == "valid_behavior" else None for c in request.cells]


def export(bundle: Path, run_dir: Path, parquet_dir: Path | None = None, *, redact: bool = True) -> ExportReport:
    """Verify ``bundle`` and write its IR to ``run_dir/ir.duckdb`` (and ``run.json``); see module doc.

    ``redact`` False (``--no-redact``) leaves secrets in the IR's text; run.json and the IR's
    ``meta.rows_made_with`` record it, so such rows are never reused by a redacting export (nor
    the other way round).
    """
    import pyarrow as pa

    t0 = time.perf_counter()
    if not bundle.is_dir():
        raise BundleError(f"bundle not found: {bundle}")
    for out, what in ((run_dir, "run directory"), (parquet_dir, "parquet directory")):
        if out is not None and _inside(bundle, out):
            raise BadInput(f"{what} {out} is inside the bundle; lunasol never writes inside a bundle")
    manifest = read_manifest(bundle)
    report = verify(bundle, manifest, verified.load(run_dir, bundle, manifest))  # files this run hashed before: by stat
    if not report.ok:
        raise BundleError(f"bundle {bundle} differs from its {MANIFEST_FILE}: {report.summary()}")
    request = load_request(bundle)
    bundle_digest = sha256_file(bundle / MANIFEST_FILE)  # streamed: 213 MB at 100,000 cells, never held whole
    cells = request.eligible_cells
    if not cells:
        raise BundleError(f"empty bundle: {bundle} lists no valid_behavior cells")
    reader_for(request.format)  # an unknown format fails here, before anything is written
    # checked before anything is written; held as Arrow (100,000 cells' lists of Python objects: ~40 MiB)
    outcomes = _outcomes_table(_read_outcomes(bundle, manifest, request))
    excluded = {
        c.cell_id: request.exclusion_reason(c.cell_id) or "" for c in request.cells if c.eligibility == "excluded"
    }

    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    ir_path = run_dir / IR_FILE
    writer: IRWriter | None = None
    sources = source_digests(bundle, request, manifest)
    previous = cache.previous_sources(ir_path, request.format, redact)
    reuse = [c.cell_id for c in cells if previous.get(c.cell_id) == sources[c.cell_id]]
    # Most cells unchanged: edit a copy of the previous IR (drop the other cells' rows) rather than
    # write every unchanged row again; else a new file, into which the unchanged cells are copied.
    edit = bool(previous) and len(reuse) * 2 >= len(cells) and IRWriter.can_start_from(ir_path)
    try:
        writer = IRWriter(ir_path, start_from=ir_path if edit else None)
        # Cells whose raw inputs are unchanged keep their rows from the previous IR; the rest are read.
        redactions: dict[str, int] = {}
        if edit:
            counts = cache.keep_cells(writer, reuse, redactions)
        else:
            counts = cache.copy_cells(writer, ir_path, reuse, redactions) if previous else {}
        reused = set(counts)
        fresh = [c for c in cells if c.cell_id not in reused]
        if fresh:
            counts.update(_load_cells(writer, bundle, fresh, manifest, request.format, redactions, redact))
        counts = {c.cell_id: counts[c.cell_id] for c in cells}  # request order
        total = sum(counts.values())
        if total == 0:
            raise BundleError(f"empty bundle: no events in any of the {len(cells)} eligible cells of {bundle}")
        ids = [c.cell_id for c in request.cells]
        writer.insert_table(
            "meta",
            pa.table(
                {
                    "key": [
                        "analysis_run_id",
                        "bundle_digest",
                        "format",
                        "ir_schema_version",
                        "lunasol_version",
                        "rows_made_with",
                    ],
                    "value": [
                        request.analysis_run_id,
                        bundle_digest,
                        request.format,
                        str(IR_SCHEMA_VERSION),
                        pipeline.__version__,
                        cache.rows_made_with(redact),
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
        writer.insert_table("outcomes", outcomes)
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
        _fill_digests(writer, sources)
        if edit:
            cache.prune_caches(writer)  # later stages' per-cell results of unchanged cells stay
        elif previous:
            cache.carry_caches(writer)  # later stages' per-cell results of unchanged cells
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
        reused=[c.cell_id for c in cells if c.cell_id in reused],
        redactions_per_cell=redactions,
        redacted=redact,
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
            **({"redactions": result.redactions} if result.redactions else {}),
            **({} if redact else {"redacted": False}),  # absent: redacted (the default, and older runs)
        },
    )
    verified.save(run_dir, bundle, manifest, report)
    return result


def stage(ctx: RunContext) -> str:
    """Runner stage: export the run's bundle into ``ctx.run_dir``; one-line summary."""
    line = export(ctx.bundle, ctx.run_dir, redact=ctx.options.redact).summary()
    give_back()  # the parsed manifest, the batches and DuckDB's buffers, freed: not carried into the next stages
    return line


def export_bundle(
    bundle: Path,
    run_id: str | None = None,
    runs_dir: Path = Path("runs"),
    parquet_dir: Path | None = None,
    *,
    redact: bool = True,
) -> ExportReport:
    """``lunasol export``: the run id defaults to the request's ``analysis_run_id``."""
    if run_id is None:
        if not bundle.is_dir():
            raise BundleError(f"bundle not found: {bundle}")
        run_id = load_request(bundle).analysis_run_id
    if not run_id or "/" in run_id or run_id in (".", ".."):
        raise BadInput(f"bad run id {run_id!r}")
    return export(bundle, runs_dir / run_id, parquet_dir, redact=redact)
