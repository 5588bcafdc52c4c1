"""What every reader yields: one :class:`SourceEvent` per raw record, with its exact place.

A reader is ``reader(bundle, cell, manifest) -> Iterable[SourceEvent]``. This module imports
nothing of lunasol's, so the native reader, every adapter and the IR all depend on it and on
nothing of each other's; :data:`pipeline.adapters.READERS` is the one place that picks a reader.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

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
