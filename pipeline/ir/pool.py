"""The export's worker processes: big bundles are read in parallel, results taken in cell order.

A :class:`concurrent.futures.ProcessPoolExecutor` on the ``forkserver`` context: fork alone is
unsafe next to DuckDB's threads, and the forkserver (started clean, with this module preloaded)
forks each worker without re-importing pyarrow. Each worker gets the bundle's path once (the
initializer), then tasks of about ``TASK_BYTES`` of cells, each with what it needs of the manifest:
the entries of its cells' files (:meth:`~pipeline.bundle.manifest.Manifest.part`) and their display
paths, computed once over the whole bundle here (a worker never holds the whole manifest: 1.2 million
files at 100,000 cells). It builds each task's Arrow batch with the one implementation of the IR
rules (:class:`pipeline.ir.rows.ColumnBuilder`).

Results are taken in task order and at most ``2 x workers`` tasks are in flight, so the first
error in cell order is the one raised (as in one process) and memory stays bounded whatever the
bundle's size. Workers ignore SIGINT: Ctrl-C is the export process's, which then stops them.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
import types
from collections.abc import Generator, Iterator, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.adapters import cell_block
from pipeline.bundle.manifest import Manifest
from pipeline.bundle.request import CellSpec
from pipeline.core.errors import BadInput
from pipeline.ir.rows import ColumnBuilder, RecordReader, bundle_display, record_reader

if TYPE_CHECKING:
    import pyarrow as pa

# Bundles whose eligible cells hold at least this many raw bytes are read by worker processes;
# below it, starting processes costs more than it saves.
PARALLEL_MIN_BYTES = 48 * 2**20
# Raw bytes of cells per worker task: ~13k events of a diverse clone, a ~6 MiB batch. Each worker holds
# a task's rows twice over (lists, then the batch); 8 MiB tasks made workers of ~170 MiB, 4 MiB ~123.
TASK_BYTES = 4 * 2**20
MAX_WORKERS = 2
_IN_FLIGHT_PER_WORKER = 2

TaskResult = tuple[Any, ...]  # ("ok", batch | None, counts, segments, redactions) or ("err", exception)


@dataclass(frozen=True)
class Task:
    """One worker task: consecutive cells, their files' manifest entries and those files' display paths."""

    cells: list[CellSpec]
    manifest: Manifest  # a part of the bundle's: the files of these cells only
    display: dict[str, str]  # raw -> shown path, for the part's files whose names hold a secret


def export_workers() -> int:
    """Worker processes for a big export: ``LUNASOL_EXPORT_WORKERS`` or the CPU count (at most 2).

    0 reads every cell in this process. Measured on 2 CPUs (bench/README.md): 2 workers (while
    the export process runs the DuckDB insert) beat 1 and 0 on the 1M-event benchmark.
    """
    raw = os.environ.get("LUNASOL_EXPORT_WORKERS")
    if raw is not None:
        try:
            return max(0, int(raw))
        except ValueError:
            raise BadInput(f"LUNASOL_EXPORT_WORKERS must be a whole number, not {raw!r}") from None
    cpus = os.cpu_count() or 1
    return 0 if cpus < 2 else min(cpus, MAX_WORKERS)


def plan_tasks(cells: list[CellSpec], sizes: list[int], task_bytes: int | None = None) -> list[list[CellSpec]]:
    """Consecutive cells cut into tasks of about ``task_bytes`` raw bytes (request order kept)."""
    limit = TASK_BYTES if task_bytes is None else task_bytes
    tasks: list[list[CellSpec]] = [[]]
    size_now = 0
    for cell, size in zip(cells, sizes, strict=True):
        if tasks[-1] and size_now + size > limit:
            tasks.append([])
            size_now = 0
        tasks[-1].append(cell)
        size_now += size
    return tasks


# -- in the worker -------------------------------------------------------------------------------

_WORKER: dict[str, Any] = {}


def _watch(export_pid: int) -> None:
    # A worker's parent is the forkserver, and the pool's queues stay open while sibling workers
    # live: if the export process is killed outright (no Ctrl-C, no cleanup), nothing else ends us.
    while True:
        time.sleep(0.5)
        try:
            os.kill(export_pid, 0)
        except ProcessLookupError:
            os._exit(1)
        except PermissionError:
            continue


def _init_worker(bundle: Path, fmt: str, export_pid: int, redact: bool) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the export process's to handle: it stops us
    threading.Thread(target=_watch, args=(export_pid,), name="lunasol-export-watch", daemon=True).start()
    gc.disable()  # the load makes no reference cycles; the cyclic GC would rescan millions of objects
    read: RecordReader = record_reader(fmt)
    _WORKER.update(bundle=bundle, read=read, redact=redact)


def _run_task(task: Task) -> TaskResult:
    try:
        builder = ColumnBuilder(
            _WORKER["bundle"], task.manifest, task.display, _WORKER["read"], redact=_WORKER["redact"]
        )
        for cell in task.cells:
            builder.add(cell)
        return ("ok", builder.flush(), builder.counts, builder.segments, builder.redactions)
    except Exception as exc:
        try:
            pickle.loads(pickle.dumps(exc))
        except Exception as why:  # an exception that does not survive pickling: keep its text
            return ("err", RuntimeError(f"{type(exc).__name__}: {exc} ({why})"))
        return ("err", exc)


# -- in the export process -----------------------------------------------------------------------


def _roots(bundle: Path, cell: CellSpec, fmt: str) -> list[str]:
    """The bundle paths a cell's events are read from: its directory (or file), and an imported cell's files."""
    if fmt == "native":
        return [cell.path]
    try:
        named = cell_block(bundle, cell.cell_id).get("files") or []
    except Exception:  # the reader says what is wrong with the cell, in cell order: not here, ahead of it
        named = []
    return [cell.path, *(f for f in named if isinstance(f, str))]


def cell_positions(manifest: Manifest, roots: list[str]) -> list[int]:
    """Manifest positions of each root path and of every file under it (``root/...``), ascending."""
    files = manifest.files
    found: set[int] = set()
    for root in roots:
        i = files.position(root.rstrip("/"))
        if i >= 0:
            found.add(i)
        found.update(files.under(root))
    return sorted(found)


def make_task(bundle: Path, cells: list[CellSpec], manifest: Manifest, display: Mapping[str, str], fmt: str) -> Task:
    """The task of ``cells``: the part of ``manifest`` holding their files, with those files' display paths."""
    positions = cell_positions(manifest, [root for cell in cells for root in _roots(bundle, cell, fmt)])
    part = manifest.part(positions)
    shown = {p: display[p] for p in part.files.paths if p in display} if display else {}
    return Task(cells, part, shown)


def _context() -> multiprocessing.context.BaseContext:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])  # only takes effect when the forkserver starts
    return ctx


@contextlib.contextmanager
def _no_main_module() -> Iterator[None]:
    """Start workers without multiprocessing re-running the caller's ``__main__`` in each of them.

    Every worker would otherwise import the program's main script (``lunasol``'s entry point, a
    user's script that calls the library, or ``<stdin>``, which fails). Workers need nothing from
    it: they import this module. Only while pool processes start (a few ms), in our own submit calls.
    """
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _stop(pool: ProcessPoolExecutor, finished: bool) -> None:
    if not finished:
        # An error, Ctrl-C or DuckDB failing first: do not wait for tasks nobody will take.
        # Python 3.11 has no public kill for pool workers; the executor's own process table is it.
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.kill()  # only our own workers, by their handles
    pool.shutdown(wait=True, cancel_futures=True)


def parallel_batches(
    bundle: Path,
    cells: list[CellSpec],
    manifest: Manifest,
    fmt: str,
    sizes: list[int],
    workers: int,
    counts: dict[str, int],
    segments: list[tuple[Any, ...]],
    redactions: dict[str, int],
    redact: bool = True,
) -> Generator[pa.RecordBatch, None, None]:
    """Cells read by ``workers`` worker processes; batches in request order; fills counts, segments, redactions."""
    tasks = plan_tasks(cells, sizes)
    workers = min(workers, len(tasks))
    display = bundle_display(manifest, redact)  # once, over the whole bundle: each task takes its files'
    pool = ProcessPoolExecutor(
        workers, mp_context=_context(), initializer=_init_worker, initargs=(bundle, fmt, os.getpid(), redact)
    )
    pending: collections.deque[Future[TaskResult]] = collections.deque()
    # made as they are sent (a few in flight), each holding only its cells' files
    todo: Iterator[Task] = (make_task(bundle, task, manifest, display, fmt) for task in tasks)
    finished = False
    try:
        with _no_main_module():  # the first submits start every worker (forkserver pools start them on demand)
            for task in todo:
                pending.append(pool.submit(_run_task, task))
                if len(pending) >= workers * _IN_FLIGHT_PER_WORKER:
                    break
        while pending:
            try:
                result = pending.popleft().result()
            except BrokenProcessPool:
                raise RuntimeError("an export worker process stopped early") from None
            following = next(todo, None)
            if following is not None:
                pending.append(pool.submit(_run_task, following))
            if result[0] == "err":
                raise result[1]
            _, batch, cell_counts, cell_segments, cell_redactions = result
            counts.update(cell_counts)
            segments.extend(cell_segments)
            redactions.update(cell_redactions)
            if batch is not None:
                yield batch
        finished = True
    finally:
        _stop(pool, finished)
