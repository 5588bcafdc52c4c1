"""What every reader yields: one :class:`SourceEvent` per raw record, with its exact place.

A reader is ``reader(bundle, cell, manifest) -> Iterable[SourceEvent]``. This module imports
nothing of lunasol's, so the native reader, every adapter and the IR all depend on it and on
nothing of each other's; :data:`pipeline.adapters.READERS` is the one place that picks a reader.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

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


# One event as a plain tuple, the form export's IR rules (pipeline.ir.rows) work on:
# (ts, source_path, line_start, kind, detail, actor, stage, session_id, step_index, text, tool_name,
#  call_id, args_digest, result_digest, state_digest, target[, line_end, json_pointer]).
# The native reader builds 16-field records directly (one line each, no pointer); any other reader's
# SourceEvents become 18-field records through event_record.
Record = tuple[Any, ...]


def event_record(e: SourceEvent) -> Record:
    """The 18-field :data:`Record` of one SourceEvent."""
    return (e.ts, e.source_path, e.line_start, e.kind, e.detail, e.actor, e.stage, e.session_id, e.step_index,
            e.text, e.tool_name, e.call_id, e.args_digest, e.result_digest, e.state_digest, e.target, e.line_end,
            e.json_pointer)  # fmt: skip
