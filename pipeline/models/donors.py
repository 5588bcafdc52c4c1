"""Answers another run of the same bundle already received: never pay twice across run ids.

A live run keeps every raw answer in its own ``exchanges/`` store, keyed by the exact request
(:func:`pipeline.models.store.request_key`). A later run of the same bundle in the same runs
directory (a full run after a pilot on a few cells, a rerun under a new run id) makes many of the
same requests: before a request goes to the provider, the other runs' stores are looked up by its
key and an answer found there is copied into this run's store and served, exactly as this run's
own stored answers are. What a run never serves again from its own store is not served from
another's either: the answers of calls that failed (a retry wants a new answer). Runs of another
bundle are never read. Found lazily, on the first request this run's own store cannot answer.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.artifacts.run_info import read_run_info
from pipeline.artifacts.rundir import EXCHANGES_DIR, RunDir
from pipeline.core.errors import BadInput
from pipeline.models.calllog import used_keys
from pipeline.models.store import RecordingStore


def _bundle_digest(run_dir: Path) -> str | None:
    try:
        info = read_run_info(run_dir)
    except BadInput:  # a broken run.json: that run lends nothing
        return None
    return (info.inputs.bundle_digest if info.inputs else None) or info.bundle_digest


@dataclass
class _Donor:
    name: str
    store: RecordingStore
    failed: frozenset[str]  # keys whose answers a failed call of that run used


@dataclass
class Donors:
    """The other runs of this run's bundle under the same runs directory, looked up by request key."""

    run_dir: Path
    taken: dict[str, int] = field(default_factory=dict)  # donor run -> answers taken from it
    _donors: list[_Donor] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _load(self) -> list[_Donor]:
        mine = _bundle_digest(self.run_dir)
        out: list[_Donor] = []
        root = self.run_dir.parent
        if mine is None or not root.is_dir():
            return out
        for other in sorted(root.iterdir()):
            if other.resolve() == self.run_dir.resolve() or not (other / EXCHANGES_DIR).is_dir():
                continue
            if not RunDir(other).run_json.is_file() or _bundle_digest(other) != mine:
                continue
            try:
                failed = used_keys(other)
            except BadInput:
                continue  # a broken call log: which of its answers failed is unknown, so none is taken
            out.append(_Donor(other.name, RecordingStore(other / EXCHANGES_DIR, "record"), failed))
        return out

    def find(self, key: str) -> dict[str, Any] | None:
        """The stored exchange another run of the bundle received for ``key`` (its call did not fail), or None."""
        with self._lock:
            if self._donors is None:
                self._donors = self._load()
            donors = self._donors
        for d in donors:
            if key in d.failed or not d.store.has(key):
                continue
            record = d.store.load(key)
            if record is not None:
                with self._lock:
                    self.taken[d.name] = self.taken.get(d.name, 0) + 1
                return record
        return None

    def said(self) -> str | None:
        """One line on what was taken since the last line (None: nothing)."""
        with self._lock:
            taken, self.taken = self.taken, {}
        if not taken:
            return None
        n = sum(taken.values())
        runs = ", ".join(f"{k} ({v})" for k, v in sorted(taken.items()))
        return f"{n} answer(s) taken from earlier run(s) of this bundle: {runs}; the same requests, not paid again"
