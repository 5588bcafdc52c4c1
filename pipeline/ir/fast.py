"""The fast export path of native bundles: records straight to Arrow columns, and its worker process.

The generic path (pipeline.ir.events.cell_rows over read_cell) builds one SourceEvent and one
row tuple per event, then transposes. For native bundles export instead sorts the Record tuples,
transposes them once (zip, in C) and computes seq / segments / state carry / trimming per
column. The rules are exactly those of cell_rows (tests compare both paths row by row).
cell_id, source_path and source_sha256 repeat within a batch, so they go to Arrow as
dictionary arrays: DuckDB reads them as the same VARCHAR values.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.adapters.native import Record, cell_records
from pipeline.bundle.manifest import Manifest
from pipeline.bundle.request import CellSpec
from pipeline.ir.events import EVENT_ROW
from pipeline.ir.redact import redact_column
from pipeline.ir.schema import TEXT_LIMIT, trim_text

if TYPE_CHECKING:
    import pyarrow as pa


class IllTyped(Exception):
    """A value no IR column can hold (a step number beyond int32).

    Export then re-runs the generic path, which reports it exactly as before.
    """


def _order(r: Record) -> tuple[str, str, int]:
    # Same key as cell_rows: time order, ties by file then line (unique per native record).
    return (r[0] or "", r[1], r[2])


class ColumnBuilder:
    """Accumulates the event columns of whole cells; ``flush`` hands them over as one Arrow batch."""

    def __init__(self, bundle: Path, manifest: Manifest) -> None:
        self.bundle = bundle
        self.manifest = manifest
        self.counts: list[tuple[str, int]] = []  # (cell_id, events) in cell order
        self.segments: list[tuple[Any, ...]] = []  # SEGMENT_ROW tuples in cell order
        self.redactions: list[tuple[str, int]] = []  # (cell_id, secrets redacted) in cell order
        self._reset()

    def _reset(self) -> None:
        self.rows = 0
        self._cell_ids: list[str] = []
        self._paths: dict[str, int] = {}
        self._shas: list[str] = []
        self._cols: list[list[Any]] = [[] for _ in range(19)]
        self._path_idx: list[int] = []
        self._lines: list[int] = []

    def add(self, cell: CellSpec) -> None:
        """Read, order and number one cell's events (the rules of ``pipeline.ir.events.cell_rows``)."""
        cell_id = cell.cell_id
        records = cell_records(self.bundle, cell, self.manifest)
        n = len(records)
        self.counts.append((cell_id, n))
        if not n:
            return
        records.sort(key=_order)
        (ts, paths, lines, kinds, details, actors, stages, sessions, steps, texts, tools, calls, args_d, result_d,
         state_d, targets) = zip(*records, strict=True)  # fmt: skip
        # Segments: maximal runs of the same (stage, session, actor).
        seg_nos: list[int] = []
        seg_append = seg_nos.append
        segments = self.segments
        seg_key: tuple[Any, ...] | None = None
        seg_no, first = -1, 0
        for seq, key in enumerate(zip(stages, sessions, actors, strict=True)):
            if key != seg_key:
                if seg_key is not None:
                    segments.append(
                        (f"{cell_id}-s{seg_no:03d}", cell_id, seg_no, *seg_key, first, seq - 1, seq - first)
                    )
                seg_key, seg_no, first = key, seg_no + 1, seq
            seg_append(seg_no)
        assert seg_key is not None
        segments.append((f"{cell_id}-s{seg_no:03d}", cell_id, seg_no, *seg_key, first, n - 1, n - first))
        # The controller state in force at each event: the latest state_change digest, in time order.
        states: list[str | None] = []
        st_append = states.append
        state: str | None = None
        for kind, digest in zip(kinds, state_d, strict=True):
            if kind == "state_change" and digest:
                state = digest
            elif digest is None:
                digest = state
            st_append(digest)
        # Secrets out before anything is measured or trimmed (the same call as cell_rows makes).
        red_texts, n_text = redact_column(texts)
        red_targets, n_target = redact_column(targets)
        if red_texts is not None:
            texts = red_texts  # type: ignore[assignment]
        if red_targets is not None:
            targets = red_targets  # type: ignore[assignment]
        self.redactions.append((cell_id, n_text + n_target))
        chars = list(map(len, texts))
        cut = [False] * n
        if max(chars) > TEXT_LIMIT:
            texts = list(texts)  # type: ignore[assignment]
            for i, size in enumerate(chars):
                if size > TEXT_LIMIT:
                    texts[i], cut[i] = trim_text(texts[i])  # type: ignore[index]
        index = self._paths
        for p in dict.fromkeys(paths):
            if p not in index:
                index[p] = len(index)
                self._shas.append(self.manifest.get(p).sha256)
        cell_no = len(self._cell_ids)
        self._cell_ids.append(cell_id)
        c = self._cols
        c[0].extend([cell_no] * n)
        c[1].extend(range(n))
        c[2].extend(seg_nos)
        c[3].extend(ts)
        c[4].extend(kinds)
        c[5].extend(details)
        c[6].extend(actors)
        c[7].extend(stages)
        c[8].extend(sessions)
        c[9].extend(steps)
        c[10].extend(texts)
        c[11].extend(cut)
        c[12].extend(chars)
        c[13].extend(tools)
        c[14].extend(calls)
        c[15].extend(args_d)
        c[16].extend(result_d)
        c[17].extend(states)
        c[18].extend(targets)
        self._path_idx.extend(map(index.__getitem__, paths))
        self._lines.extend(lines)
        self.rows += n

    def flush(self) -> pa.RecordBatch | None:
        """The accumulated rows as one batch of :func:`fast_schema` (None when empty); starts afresh."""
        import pyarrow as pa

        if not self.rows:
            self._reset()
            return None
        c = self._cols
        i32, s = pa.int32(), pa.string()
        n = self.rows
        try:
            step = pa.array(c[9], type=i32)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
            raise IllTyped(str(exc)) from None
        path_idx = pa.array(self._path_idx, type=i32)
        line = pa.array(self._lines, type=i32)
        arrays = [
            pa.DictionaryArray.from_arrays(pa.array(c[0], type=i32), pa.array(self._cell_ids, type=s)),
            pa.array(c[1], type=i32),
            pa.array(c[2], type=i32),
            pa.array(c[3], type=s),
            pa.array(c[4], type=s),
            pa.array(c[5], type=s),
            pa.array(c[6], type=s),
            pa.array(c[7], type=s),
            pa.array(c[8], type=s),
            step,
            pa.array(c[10], type=s),
            pa.array(c[11], type=pa.bool_()),
            pa.array(c[12], type=i32),
            pa.array(c[13], type=s),
            pa.array(c[14], type=s),
            pa.array(c[15], type=s),
            pa.array(c[16], type=s),
            pa.array(c[17], type=s),
            pa.array(c[18], type=s),
            pa.DictionaryArray.from_arrays(path_idx, pa.array(list(self._paths), type=s)),
            line,
            line,  # line_end: one native record is one line
            pa.DictionaryArray.from_arrays(path_idx, pa.array(self._shas, type=s)),
            pa.nulls(n, type=s),  # json_pointer: never set by native records
        ]
        self._reset()
        return pa.RecordBatch.from_arrays(arrays, schema=fast_schema())


def fast_schema() -> pa.Schema:
    """The Arrow schema of the fast path's batches: ``EVENT_ROW`` with three dictionary columns."""
    import pyarrow as pa

    dict_cols = {"cell_id", "source_path", "source_sha256"}
    return pa.schema(
        [
            (name, pa.dictionary(pa.int32(), pa.string()) if name in dict_cols else getattr(pa, typ)())
            for name, typ in EVENT_ROW
        ]
    )


def worker_main() -> None:
    """Entry of one export worker process (started by :mod:`pipeline.ir.export`).

    Reads ``(bundle, manifest, tasks)`` pickled on stdin, then for each task (a list of cells)
    writes one pickled ``("ok", batch, counts, segments, redactions)`` to the file descriptor named in argv;
    on an error, ``("err", exception)`` and stop. A plain subprocess, not multiprocessing: spawn
    would re-run the caller's ``__main__`` and fork is unsafe next to DuckDB's threads.
    """
    import gc
    import pickle
    import signal
    import sys

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the export process's to handle: it stops us
    gc.disable()  # the load makes no reference cycles; the cyclic GC would rescan millions of objects
    with open(int(sys.argv[1]), "wb") as out:
        bundle, manifest, tasks = pickle.load(sys.stdin.buffer)
        for cells in tasks:
            result: tuple[Any, ...]
            try:
                builder = ColumnBuilder(bundle, manifest)
                for cell in cells:
                    builder.add(cell)
                result = ("ok", builder.flush(), builder.counts, builder.segments, builder.redactions)
            except Exception as exc:
                result = ("err", exc)
            try:
                data = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:  # an exception that cannot be pickled: keep its text
                result = ("err", RuntimeError(f"{type(result[1]).__name__}: {result[1]} ({exc})"))
                data = pickle.dumps(result)
            out.write(data)
            out.flush()
            if result[0] == "err":
                return
