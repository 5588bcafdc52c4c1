"""The IR rules, once: how one cell's records become ordered, numbered event rows and segments.

Every export path goes through :class:`ColumnBuilder`: the native reader's records, an adapter's
:class:`~pipeline.adapters.contract.SourceEvent` s (as records), in this process or in a worker
(:mod:`pipeline.ir.pool`). Per cell it

- orders events by time, ties by file then line (a stable sort, so a reader's order breaks the rest),
- numbers them (``seq``, 0-based) and cuts segments (maximal runs of the same stage, session, actor),
- carries the controller state forward (the latest ``state_change`` digest, in time order),
- trims long text with a visible marker (``pipeline.ir.schema.trim_text``),

and keeps the columns to hand them to DuckDB as one Arrow batch. ``cell_id``, ``source_path``
and ``source_sha256`` repeat within a batch, so they go to Arrow as dictionary arrays: DuckDB
reads them as the same VARCHAR values.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.adapters import reader_for
from pipeline.adapters.contract import Record, event_record
from pipeline.adapters.native import cell_records
from pipeline.bundle.manifest import Manifest
from pipeline.bundle.request import CellSpec
from pipeline.core.errors import BadInput
from pipeline.core.limits import check_count
from pipeline.ir.redact import display_paths, redact_column
from pipeline.ir.schema import TEXT_LIMIT, trim_text

if TYPE_CHECKING:
    import pyarrow as pa


# Columns of the Arrow batches, in this order. event_id and segment_id are derived in SQL from
# (cell_id, seq, seg_no) on insert: same rule as schema.event_id, no Python strings.
EVENT_ROW: tuple[tuple[str, str], ...] = (
    ("cell_id", "string"),
    ("seq", "int32"),
    ("seg_no", "int32"),
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
SEGMENT_ROW: tuple[tuple[str, str], ...] = (
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
# Rows per Arrow batch handed to DuckDB: bounds memory, keeps DuckDB busy while Python reads on.
BATCH_ROWS = 65_536
_DICT_COLUMNS = frozenset({"cell_id", "source_path", "source_sha256"})

RecordReader = Callable[[Path, CellSpec, Manifest], list[Record]]


def record_reader(fmt: str) -> RecordReader:
    """How export reads one cell of format ``fmt`` as records.

    Native bundles skip the SourceEvent objects (their reader builds record tuples directly);
    every other format goes through its reader's SourceEvents.
    """
    if fmt == "native":
        return cell_records
    reader = reader_for(fmt)

    def read(bundle: Path, cell: CellSpec, manifest: Manifest) -> list[Record]:
        return [event_record(e) for e in reader(bundle, cell, manifest)]

    return read


def to_arrow(rows: list[tuple[Any, ...]], spec: tuple[tuple[str, str], ...]) -> pa.Table:
    """Row tuples -> an Arrow table with the given (name, pyarrow type name) columns."""
    import pyarrow as pa

    cols = list(zip(*rows, strict=True)) if rows else [() for _ in spec]
    return pa.table({name: pa.array(col, type=getattr(pa, typ)()) for (name, typ), col in zip(spec, cols, strict=True)})


def event_schema() -> pa.Schema:
    """The Arrow schema of the event batches: ``EVENT_ROW`` with three dictionary columns."""
    import pyarrow as pa

    return pa.schema(
        [
            (name, pa.dictionary(pa.int32(), pa.string()) if name in _DICT_COLUMNS else getattr(pa, typ)())
            for name, typ in EVENT_ROW
        ]
    )


def _order(r: Record) -> tuple[str, str, int]:
    # Time order; ties by file then line.
    return (r[0] or "", r[1], r[2])


def _ill_typed(cell_id: str, exc: Exception) -> BadInput:
    # Only a reader can get here (wrong value types); say which cell, not a traceback.
    return BadInput(f"the reader produced an ill-typed event field in cell {cell_id}: {exc}")


def bundle_display(manifest: Manifest, redact: bool = True) -> dict[str, str]:
    """Raw -> shown path of every bundle file whose name holds a secret ({} with ``redact`` off).

    Over the whole manifest, in the export process (two names that would show alike are told apart
    in manifest order, :func:`pipeline.ir.redact.display_paths`); a worker gets the entries of its
    task's files only.
    """
    return display_paths(manifest.files.paths) if redact else {}


class ColumnBuilder:
    """Accumulates the event columns of whole cells; ``flush`` hands them over as one Arrow batch."""

    def __init__(
        self,
        bundle: Path,
        manifest: Manifest,
        display: Mapping[str, str],
        read: RecordReader = cell_records,
        *,
        redact: bool = True,
    ) -> None:
        self.bundle = bundle
        self.manifest = manifest  # the whole bundle's, or (in a worker) the part holding the task's cells
        self.display = display  # bundle_display(), or the entries of the manifest part's files
        self.read = read
        self.redact = redact  # False only with --no-redact: the text goes in as written
        self.counts: list[tuple[str, int]] = []  # (cell_id, events) in cell order
        self.segments: list[tuple[Any, ...]] = []  # SEGMENT_ROW tuples in cell order
        self.redactions: list[tuple[str, int]] = []  # (cell_id, secrets redacted) in cell order
        self._reset()

    def _reset(self) -> None:
        self.rows = 0
        self._cell_ids: list[str] = []
        self._starts: list[int] = []  # first row of each cell in the columns
        self._paths: dict[str, int] = {}
        self._shas: list[str] = []
        self._shown: list[str] = []  # each path of self._paths as the IR stores it (redacted names)
        self._cols: list[list[Any]] = [[] for _ in range(19)]
        self._path_idx: list[int] = []
        self._lines: list[int] = []
        self._line_ends: list[int] | None = None  # None while every line_end equals its line_start
        self._pointers: list[str | None] | None = None  # None while no json_pointer is set

    def add(self, cell: CellSpec) -> None:
        """Read one cell and add its events (see the module doc for the rules)."""
        records = self.read(self.bundle, cell, self.manifest)
        try:
            self.add_records(cell.cell_id, records)
        except TypeError as exc:  # e.g. a non-string text or timestamp from a reader
            raise _ill_typed(cell.cell_id, exc) from None

    def add_records(self, cell_id: str, records: list[Record]) -> None:
        """Order, number and segment one cell's records and append their columns."""
        n = len(records)
        check_count(n, "LUNASOL_MAX_CELL_EVENTS", f"cell {cell_id}", "events")
        self.counts.append((cell_id, n))
        if not n:
            return
        records.sort(key=_order)
        cols = list(zip(*records, strict=True))
        (ts, paths, lines, kinds, details, actors, stages, sessions, steps, texts, tools, calls, args_d, result_d,
         state_d, targets) = cols[:16]  # fmt: skip
        n_session = 0
        if self.redact:  # a session id is often a file name: a secret in it is one too
            distinct = list(dict.fromkeys(sessions))  # a cell has a few sessions: each redacted once
            red_sessions, n_session = redact_column(distinct)
            if red_sessions is not None:
                shown = dict(zip(distinct, red_sessions, strict=True))
                sessions = tuple(shown[v] for v in sessions)
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
        # Secrets out before anything is measured or trimmed: no secret reaches the IR (pipeline.ir.redact).
        red_texts, n_text = redact_column(texts) if self.redact else (None, 0)
        red_targets, n_target = redact_column(targets) if self.redact else (None, 0)
        if red_texts is not None:
            texts = tuple(red_texts)
        if red_targets is not None:
            targets = tuple(red_targets)
        self.redactions.append((cell_id, n_text + n_target + n_session))
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
                self._shown.append(self.display.get(p, p) if self.redact else p)
        self._starts.append(self.rows)
        cell_no = len(self._cell_ids)
        self._cell_ids.append(cell_id)
        c = self._cols
        c[0].extend([cell_no] * n)
        c[1].extend(range(n))
        c[2].extend(seg_nos)
        columns: tuple[Iterable[Any], ...] = (ts, kinds, details, actors, stages, sessions, steps, texts, cut, chars,
                                               tools, calls, args_d, result_d, states, targets)  # fmt: skip
        for col, values in zip(c[3:], columns, strict=True):
            col.extend(values)
        self._path_idx.extend(map(index.__getitem__, paths))
        self._lines.extend(lines)
        self._add_refs(cols, lines, n)
        self.rows += n

    def _add_refs(self, cols: list[tuple[Any, ...]], lines: tuple[Any, ...], n: int) -> None:
        """line_end and json_pointer: 18-field records carry them; 16-field records are one line each."""
        if len(cols) <= 16:
            if self._line_ends is not None:
                self._line_ends.extend(lines)
            if self._pointers is not None:
                self._pointers.extend([None] * n)
            return
        ends, pointers = cols[16], cols[17]
        if self._line_ends is None and ends != lines:
            self._line_ends = self._lines[: self.rows]  # the rows so far: line_end == line_start
        if self._line_ends is not None:
            self._line_ends.extend(ends)
        if self._pointers is None and pointers.count(None) != n:
            self._pointers = [None] * self.rows
        if self._pointers is not None:
            self._pointers.extend(pointers)

    def _arrays(self, lo: int, hi: int) -> list[pa.Array]:
        import pyarrow as pa

        c = self._cols
        i32, s = pa.int32(), pa.string()
        n = hi - lo
        types = (i32, i32, s, s, s, s, s, s, i32, s, pa.bool_(), i32, s, s, s, s, s, s)
        plain = [pa.array(col[lo:hi] if n != self.rows else col, type=t) for col, t in zip(c[1:], types, strict=True)]
        path_idx = pa.array(self._path_idx[lo:hi], type=i32)
        line = pa.array(self._lines[lo:hi], type=i32)
        line_end = line if self._line_ends is None else pa.array(self._line_ends[lo:hi], type=i32)
        pointer = pa.nulls(n, type=s) if self._pointers is None else pa.array(self._pointers[lo:hi], type=s)
        return [
            pa.DictionaryArray.from_arrays(pa.array(c[0][lo:hi], type=i32), pa.array(self._cell_ids, type=s)),
            *plain,
            pa.DictionaryArray.from_arrays(path_idx, pa.array(self._shown, type=s)),
            line,
            line_end,
            pa.DictionaryArray.from_arrays(path_idx, pa.array(self._shas, type=s)),
            pointer,
        ]

    def flush(self) -> pa.RecordBatch | None:
        """The accumulated rows as one batch of :func:`event_schema` (None when empty); starts afresh."""
        import pyarrow as pa

        if not self.rows:
            self._reset()
            return None
        try:
            arrays = self._arrays(0, self.rows)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            raise self._first_bad_cell() from None
        batch = pa.RecordBatch.from_arrays(arrays, schema=event_schema())
        self._reset()
        return batch

    def _first_bad_cell(self) -> BadInput:
        """The error of the first cell (in cell order) whose values no IR column can hold."""
        import pyarrow as pa

        bounds = [*self._starts, self.rows]
        for k, cell_id in enumerate(self._cell_ids):
            try:
                self._arrays(bounds[k], bounds[k + 1])
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
                return _ill_typed(cell_id, exc)
        return BadInput("the reader produced an ill-typed event field")  # not reached: the whole batch failed


def serial_batches(
    bundle: Path,
    cells: list[CellSpec],
    manifest: Manifest,
    read: RecordReader,
    counts: dict[str, int],
    segments: list[tuple[Any, ...]],
    redactions: dict[str, int],
    redact: bool = True,
) -> Generator[pa.RecordBatch, None, None]:
    """Every cell read in this process, as batches of about ``BATCH_ROWS`` rows; fills counts, segments, redactions.

    A batch's segments are appended to ``segments`` before the batch is yielded (never held for the
    whole bundle here: the consumer may take them as it goes, see ``pipeline.ir.export``).
    """
    builder = ColumnBuilder(bundle, manifest, bundle_display(manifest, redact), read, redact=redact)

    def hand_over() -> pa.RecordBatch | None:
        counts.update(builder.counts)
        segments.extend(builder.segments)
        redactions.update(builder.redactions)
        builder.counts, builder.segments, builder.redactions = [], [], []
        return builder.flush()

    for cell in cells:
        builder.add(cell)
        if builder.rows >= BATCH_ROWS:
            batch = hand_over()
            if batch is not None:
                yield batch
    batch = hand_over()
    if batch is not None:
        yield batch


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for a bulk load."""
    # Millions of short-lived tuples make the cyclic GC rescan everything over and over; the
    # export creates no reference cycles worth collecting, so pause it for the bulk load.
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
