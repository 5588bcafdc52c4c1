"""How a cell's :class:`~pipeline.adapters.contract.SourceEvent` s become IR rows.

:func:`event_batches` orders each cell's events (ts, file, line), numbers them, cuts segments,
carries the controller state digest forward, and yields Arrow batches for a bulk insert.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.adapters.contract import Reader, SourceEvent
from pipeline.bundle.manifest import Manifest
from pipeline.bundle.request import CellSpec
from pipeline.core.errors import BadInput
from pipeline.ir.redact import redact_column
from pipeline.ir.schema import TEXT_LIMIT, trim_text

if TYPE_CHECKING:
    import pyarrow as pa


# Columns built in Python for each event, in this order. event_id and segment_id are derived
# in SQL from (cell_id, seq, seg_no) on insert: same rule as schema.event_id, no Python strings.
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


def to_arrow(rows: list[tuple[Any, ...]], spec: tuple[tuple[str, str], ...]) -> pa.Table:
    """Row tuples -> an Arrow table with the given (name, pyarrow type name) columns."""
    import pyarrow as pa

    cols = list(zip(*rows, strict=True)) if rows else [() for _ in spec]
    arrays = {}
    for (name, typ), col in zip(spec, cols, strict=True):
        pa_type = getattr(pa, typ)()
        # A column with no value at all (json_pointer, step_index in native bundles) costs nothing.
        none = col.count(None) == len(col)
        arrays[name] = pa.nulls(len(col), type=pa_type) if none else pa.array(col, type=pa_type)
    return pa.table(arrays)


def cell_rows(
    cell_id: str, events: list[SourceEvent], manifest: Manifest, redactions: dict[str, int] | None = None
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Order one cell's events and turn them into event rows and segment rows (see ``EVENT_ROW``).

    Secrets in ``text`` and ``target`` are redacted here (:mod:`pipeline.ir.redact`), before any
    trimming; ``redactions[cell_id]`` gets how many.
    """
    # Time order; ties by file then line. sort() is stable, so a reader's order breaks the rest.
    events.sort(key=lambda e: (e.ts or "", e.source_path, e.line_start))
    texts, n_text = redact_column([e.text for e in events])
    targets, n_target = redact_column([e.target for e in events])
    if redactions is not None:
        redactions[cell_id] = n_text + n_target
    rows: list[tuple[Any, ...]] = []
    segments: list[tuple[Any, ...]] = []
    append = rows.append
    shas: dict[str, str] = {}
    state: str | None = None
    seg_key: tuple[str | None, str | None, str | None] | None = None
    seg_no = -1
    seg_first = 0
    for seq, e in enumerate(events):
        if e.kind == "state_change" and e.state_digest:
            state = e.state_digest
        elif e.state_digest is None:
            e.state_digest = state  # the controller state in force at this event
        key = (e.stage, e.session_id, e.actor)
        if key != seg_key:
            if seg_key is not None:
                segments.append(_segment(cell_id, seg_no, seg_key, seg_first, seq - 1))
            seg_key, seg_no, seg_first = key, seg_no + 1, seq
        path = e.source_path
        sha = shas.get(path)
        if sha is None:
            sha = shas[path] = manifest.get(path).sha256
        text = e.text if texts is None else texts[seq]
        assert text is not None
        chars = len(text)
        cut = False
        if chars > TEXT_LIMIT:
            text, cut = trim_text(text)
        append(
            (cell_id, seq, seg_no, e.ts, e.kind, e.detail, e.actor, e.stage, e.session_id, e.step_index,
             text, cut, chars, e.tool_name, e.call_id, e.args_digest, e.result_digest, e.state_digest,
             e.target if targets is None else targets[seq], path, e.line_start, e.line_end, sha, e.json_pointer)
        )  # fmt: skip
    if seg_key is not None:
        segments.append(_segment(cell_id, seg_no, seg_key, seg_first, len(events) - 1))
    return rows, segments


def _segment(
    cell_id: str, no: int, key: tuple[str | None, str | None, str | None], first: int, last: int
) -> tuple[Any, ...]:
    return (f"{cell_id}-s{no:03d}", cell_id, no, key[0], key[1], key[2], first, last, last - first + 1)


def _serial_batches(
    bundle: Path,
    cells: list[CellSpec],
    manifest: Manifest,
    reader: Reader,
    counts: dict[str, int],
    segments: list[tuple[Any, ...]],
    redactions: dict[str, int] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Read every eligible cell; yield event rows as Arrow batches, fill counts, segments and redactions."""
    pending: list[tuple[Any, ...]] = []
    in_batch: list[str] = []
    for cell in cells:
        rows, segs = cell_rows(cell.cell_id, list(reader(bundle, cell, manifest)), manifest, redactions)
        counts[cell.cell_id] = len(rows)
        pending.extend(rows)
        segments.extend(segs)
        in_batch.append(cell.cell_id)
        if len(pending) >= BATCH_ROWS:
            yield _batch(pending, in_batch)
            pending, in_batch = [], []
    if pending:
        yield _batch(pending, in_batch)


def _batch(rows: list[tuple[Any, ...]], cell_ids: list[str]) -> pa.RecordBatch:
    import pyarrow as pa

    try:
        return to_arrow(rows, EVENT_ROW).to_batches()[0]
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
        # Only a reader can get here (wrong value types); say which cells, not a traceback.
        where = cell_ids[0] if len(cell_ids) == 1 else f"{cell_ids[0]}..{cell_ids[-1]}"
        raise BadInput(f"the reader produced an ill-typed event field in cell(s) {where}: {exc}") from None


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


def event_batches(
    bundle: Path,
    cells: list[CellSpec],
    manifest: Manifest,
    reader: Reader,
    counts: dict[str, int],
    segments: list[tuple[Any, ...]],
    redactions: dict[str, int] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Every eligible cell as Arrow batches of ``EVENT_ROW`` in request order; fills counts, segments, redactions."""
    yield from _serial_batches(bundle, cells, manifest, reader, counts, segments, redactions)
