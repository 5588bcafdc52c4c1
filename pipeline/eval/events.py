"""The IR events eval reads, and which actors are not the agent (shared by predictions and checks)."""

from __future__ import annotations

from dataclasses import dataclass

USER_ACTORS = {"user", "human", "system", "harness", "environment", "tool"}


@dataclass(frozen=True)
class Event:
    """The IR columns eval needs."""

    event_id: str
    cell_id: str
    seq: int
    kind: str
    actor: str | None
    step_index: int | None
    text: str
    tool_name: str | None
    args_digest: str | None
    source_path: str
    line_start: int
    line_end: int
    detail: str | None = None  # the source's sub-kind (tool_error, api_retry, harness_traceback, ...)
