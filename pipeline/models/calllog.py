"""Per-run call log ``calls.jsonl``: one line per logical model call, appended whole under a lock."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, Literal

from pydantic import BaseModel, ConfigDict, Field

from pipeline.artifacts.rundir import CALLS
from pipeline.artifacts.schemas import upgrade
from pipeline.artifacts.versions import VERSIONS
from pipeline.core.canonical import canonical_json
from pipeline.core.errors import BadInput

CALLLOG_NAME = CALLS.filename
CALLLOG_SCHEMA_VERSION = VERSIONS["calls"]


class CallRow(BaseModel):
    """One line of ``calls.jsonl``: one logical model call (all its attempts)."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = CALLLOG_SCHEMA_VERSION
    role: str
    cell_id: str | None
    template_hash: str
    keys: list[str] = Field(description="replay key of each attempt, in order")
    mode: Literal["live", "record", "replay"]
    model: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = Field(default=0, description="prompt tokens the provider served from its prompt cache")
    cost_usd: float | None = Field(description="None when litellm knows no price (never guessed)")
    latency_ms: float = Field(description="the call's own time: its requests and parsing, without queue_ms")
    queue_ms: float = Field(default=0.0, description="time spent waiting for a slot behind --concurrency")
    attempts: int
    transport_retries: int
    outcome: str = Field(
        description="ok, invalid, check_failed, cancelled, interrupted, error, or the error's kind "
        "(replay_miss, budget_exceeded, model_unavailable, model_refused)"
    )
    errors: list[Any] = Field(default_factory=list, description="what went wrong, per attempt")


class CallLog:
    """Append-only ``run_dir/calls.jsonl``; safe from many tasks and threads of one process."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / CALLLOG_NAME
        self._lock = threading.Lock()
        self._fh: BinaryIO | None = None

    def append(self, entry: dict[str, Any]) -> None:
        """Write one whole line (a single write, flushed) so a crash never leaves half a record mid-file."""
        line = (canonical_json({"schema_version": CALLLOG_SCHEMA_VERSION, **entry}) + "\n").encode("utf-8")
        with self._lock:
            if self._fh is None or self._fh.closed:
                # Opened once (O_APPEND): opening per line costs ~0.4 ms on this filesystem, per call.
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fh = self.path.open("ab", buffering=0)
            self._fh.write(line)

    def close(self) -> None:
        """Close the file (appending again reopens it)."""
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None

    def __del__(self) -> None:
        fh = getattr(self, "_fh", None)
        if fh is not None:
            fh.close()


UNFINISHED = ("cancelled", "interrupted")  # calls cut short: their last answer (if any arrived) was never judged


def iter_calls(run_dir: Path) -> Iterator[dict[str, Any]]:
    """Every entry of a run's call log, one at a time; a torn last line (crash mid-write) is skipped.

    One at a time because the log grows with the batch: at Sol's start at 100,000 cells it holds Luna's
    100,000 lines, and read whole as dicts they took +367 MiB for a moment when Sol's client was made
    (the largest moment of Sol alone at that size). Every model stage's client reads it.
    """
    path = Path(run_dir) / CALLLOG_NAME
    if not path.is_file():
        return
    torn: int | None = None  # the line that is not JSON: only the last one may be (a crash mid-write)
    rows = 0
    with path.open("rb") as fh:
        for n, line in enumerate(fh, 1):  # lines end at "\n" only: a U+2028 inside a JSON string is text
            if not line.strip():
                continue
            if torn is not None:
                raise BadInput(f"{path} line {torn} is not JSON")
            try:
                row = json.loads(line)
            except ValueError:  # not JSON, or not UTF-8
                torn = n
                continue
            if isinstance(row, dict):
                rows += 1
                yield upgrade(row, "calls", f"{path} row {rows}")[0]


def read_calls(run_dir: Path) -> list[dict[str, Any]]:
    """Every entry of a run's call log (:func:`iter_calls`, as a list)."""
    return list(iter_calls(run_dir))


def used_keys(run_dir: Path, *, every: bool = False) -> frozenset[str]:
    """Request keys of the run's finished calls that failed (``every``: of every finished call).

    A failed call's answers were judged and refused, so they are asked again rather than reused.
    """
    return frozenset(
        k
        for row in iter_calls(run_dir)
        if row.get("outcome") not in UNFINISHED and (every or row.get("outcome") != "ok")
        for k in row.get("keys") or []
    )


def summarise(run_dir: Path) -> dict[str, Any]:
    """Per role: calls, HTTP attempts, re-asks, transport retries, tokens, cost, failures; plus totals.

    Cost is None for a role when any of its exchanges had no known price (stated, not guessed).
    """
    roles: dict[str, dict[str, Any]] = {}
    for row in iter_calls(run_dir):
        role = str(row.get("role", "?"))
        r = roles.setdefault(
            role,
            {
                "calls": 0,
                "attempts": 0,
                "reasks": 0,
                "transport_retries": 0,
                "prompt_tokens": 0,
                "completion_tokens": 0,
                "cached_tokens": 0,
                "cost_usd": 0.0,
                "cost_known": True,
                "failures": 0,
                "latency_ms": 0.0,
                "modes": [],
            },
        )
        r["calls"] += 1
        r["attempts"] += int(row.get("attempts") or 0)
        r["reasks"] += max(0, int(row.get("attempts") or 0) - 1)
        r["transport_retries"] += int(row.get("transport_retries") or 0)
        r["prompt_tokens"] += int(row.get("prompt_tokens") or 0)
        r["completion_tokens"] += int(row.get("completion_tokens") or 0)
        r["cached_tokens"] += int(row.get("cached_tokens") or 0)
        r["latency_ms"] += float(row.get("latency_ms") or 0.0)
        if row.get("cost_usd") is None:
            r["cost_known"] = False
        else:
            r["cost_usd"] += float(row["cost_usd"])
        if row.get("outcome") != "ok":
            r["failures"] += 1
        if row.get("mode") and row["mode"] not in r["modes"]:
            r["modes"].append(row["mode"])
    for r in roles.values():
        r["cost_usd"] = round(r["cost_usd"], 8) if r["cost_known"] else None
        r["latency_ms"] = round(r["latency_ms"], 1)
        r["modes"].sort()
    total_keys = (
        "calls",
        "attempts",
        "reasks",
        "transport_retries",
        "prompt_tokens",
        "completion_tokens",
        "cached_tokens",
        "failures",
    )
    totals: dict[str, Any] = {k: sum(r[k] for r in roles.values()) for k in total_keys}
    known = all(r["cost_known"] for r in roles.values())
    totals["cost_usd"] = round(sum(r["cost_usd"] or 0.0 for r in roles.values()), 8) if known else None
    totals["cost_known"] = known
    return {"roles": dict(sorted(roles.items())), "totals": totals}


def format_summary(summary: dict[str, Any]) -> str:
    """A plain-text table of :func:`summarise` (one row per role, then totals)."""
    head = f"{'role':<10} {'calls':>6} {'attempts':>8} {'reasks':>6} {'retries':>7} {'prompt':>9} {'cached':>8} "
    head += f"{'compl':>8} "
    head += f"{'cost_usd':>10} {'failed':>6}"
    lines = [head]

    def row(name: str, r: dict[str, Any]) -> str:
        cost = "unknown" if r.get("cost_usd") is None else f"{r['cost_usd']:.4f}"
        return (
            f"{name:<10} {r['calls']:>6} {r['attempts']:>8} {r['reasks']:>6} {r['transport_retries']:>7} "
            f"{r['prompt_tokens']:>9} {r.get('cached_tokens', 0):>8} {r['completion_tokens']:>8} {cost:>10} "
            f"{r['failures']:>6}"
        )

    for name, r in summary["roles"].items():
        lines.append(row(name, r))
    lines.append(row("total", summary["totals"]))
    if summary["totals"].get("cost_usd") is None and summary["roles"]:
        lines.append("cost unknown: no litellm price for at least one model (tokens are exact)")
    return "\n".join(lines)
