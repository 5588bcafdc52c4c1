"""What a reader yields per raw record, and how export finds the reader of a bundle's format.

A reader is ``reader(bundle, cell, manifest) -> Iterable[SourceEvent]``. The native format's
reader lives in :mod:`pipeline.bundle.native`; adapters for public trajectory formats
provide theirs through ``pipeline.adapters.reader_for(format)``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.errors import BadInput

if TYPE_CHECKING:
    from pipeline.bundle.manifest import Manifest
    from pipeline.bundle.request import CellSpec


@dataclass(slots=True)
class SourceEvent:
    """One raw record, before ordering: its meaning plus the exact place it came from.

    ``source_path`` is bundle-relative POSIX; ``line_start``/``line_end`` are 1-based inclusive;
    ``json_pointer`` picks one element when a line holds a whole document. ``state_digest`` may be
    left None: export carries the latest ``state_change`` digest forward in time order.
    """

    kind: str
    source_path: str
    line_start: int
    line_end: int
    ts: str | None = None
    detail: str | None = None
    actor: str | None = None
    stage: str | None = None
    session_id: str | None = None
    step_index: int | None = None
    text: str = ""
    tool_name: str | None = None
    call_id: str | None = None
    args_digest: str | None = None
    result_digest: str | None = None
    state_digest: str | None = None
    target: str | None = None
    json_pointer: str | None = None


Reader = Callable[[Path, "CellSpec", "Manifest"], Iterable[SourceEvent]]


def reader_for(fmt: str) -> Reader:
    """The reader of one bundle format: ``native`` here, anything else from ``pipeline.adapters``."""
    if fmt == "native":
        from pipeline.bundle.native import read_cell

        return read_cell
    try:
        adapters = importlib.import_module("pipeline.adapters")
    except ModuleNotFoundError as exc:
        if exc.name not in ("pipeline.adapters", "pipeline"):
            raise
        raise BadInput(f"unknown bundle format {fmt!r} (no adapters installed)") from None
    finder = getattr(adapters, "reader_for", None)
    if finder is None:
        raise BadInput(f"unknown bundle format {fmt!r} (adapters provide no reader_for)")
    reader: Reader = finder(fmt)
    return reader
