"""The run ledger: every artifact's state (pending / verified / invalidated) and the digests it was made from.

``runs/<id>/ledger.json`` maps an entry name (a stage such as ``luna``, a per-cell result such as
``luna/C004``, or a gate receipt such as ``gate1``) to its state, the digests of its inputs and of its
outputs. A rerun reuses an entry only when it is ``verified``, its inputs are the same and its
outputs on disk still have the recorded digests. When inputs change the entry is marked
``invalidated`` with the reason (kept, never deleted; its previous digests go to ``history``) and
everything downstream is invalidated with it.

Per-cell model results (Luna) live in :class:`CellResults`: ``runs/<id>/<role>/<cell>.json`` holds the
answer and the key it was made with (the cell's IR digest, the template hash, the model), written
as soon as the call finishes, so an unchanged cell is never asked again and ``--resume`` never
repeats a finished call.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

import pipeline
from pipeline.artifacts import rundir
from pipeline.artifacts.rundir import LEDGER
from pipeline.artifacts.schemas import artifact_from_bytes
from pipeline.artifacts.versions import VERSIONS
from pipeline.core.canonical import (
    StatKey,
    atomic_write_chunks,
    digest,
    pretty_json_plain,
    sha256_bytes,
    sha256_file,
    stat_key,
    write_json,
)
from pipeline.core.errors import BadInput

LEDGER_FILE = LEDGER.filename
LEDGER_LOCK = rundir.LEDGER_LOCK
LEDGER_SCHEMA_VERSION = VERSIONS["ledger"]

State = Literal["pending", "verified", "invalidated"]


CELL_RESULT_SCHEMA_VERSION = VERSIONS["cell-result"]


class CellResult(BaseModel):
    """One per-cell model result, ``runs/<id>/<role>/<cell>.json``."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = CELL_RESULT_SCHEMA_VERSION
    cell_id: str
    role: str
    key: str = Field(description="what the value was made with (cell IR digest, template, model); reused only if equal")
    inputs: dict[str, str | None] = Field(default_factory=dict)
    value: Any = Field(description="the role's result for the cell")
    lunasol: str = Field(description="lunasol version that wrote it")


class HistoryItem(BaseModel):
    """A previous state of an entry, kept when it was invalidated or recomputed."""

    model_config = ConfigDict(extra="forbid")

    state: State
    inputs: dict[str, str] = Field(default_factory=dict)
    outputs: dict[str, str] = Field(default_factory=dict)
    reason: str | None = None


class Entry(BaseModel):
    """One artifact (or group of artifacts) of a run and where it came from."""

    model_config = ConfigDict(extra="forbid")

    state: State
    stage: str
    inputs: dict[str, str] = Field(default_factory=dict, description="input name -> digest")
    outputs: dict[str, str] = Field(default_factory=dict, description="path relative to the run -> digest")
    reason: str | None = Field(default=None, description="why it is pending or invalidated")
    history: list[HistoryItem] = Field(default_factory=list)


class LedgerData(BaseModel):
    """The whole ``ledger.json``."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = LEDGER_SCHEMA_VERSION
    entries: dict[str, Entry] = Field(default_factory=dict)


def _short(d: str | None) -> str:
    if not d:
        return "none"
    # Digests are cut for the log line; names (models, templates) are kept whole.
    return d.split(":", 1)[-1][:12] if d.startswith("sha256:") else d


def describe_changes(old: Mapping[str, str], new: Mapping[str, str]) -> str:
    """One line naming which inputs changed, appeared or vanished."""
    parts: list[str] = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if a is None:
            parts.append(f"{key} new")
        elif b is None:
            parts.append(f"{key} gone")
        else:
            parts.append(f"{key} {_short(a)}→{_short(b)}")
    return "inputs changed: " + ", ".join(parts) if parts else "inputs unchanged"


def output_digests(run_dir: Path, paths: Iterable[str]) -> dict[str, str] | None:
    """Digests of output files relative to ``run_dir``, or None when one is missing."""
    out: dict[str, str] = {}
    for rel in paths:
        p = run_dir / rel
        if not p.is_file():
            return None
        out[rel] = sha256_file(p)
    return out


# ledger.json as pretty_json_plain writes it: the entries' object, then the schema version. Each
# entry's text sits between a line ``    "name": {`` and a line ``    }`` (deeper lines are indented
# further, and JSON strings hold no raw newline), so a file in this form splits into entries by text.
_HEAD = b'{\n  "entries": {'
_EMPTY_TAIL = re.compile(rb'\},\n  "schema_version": (\d+)\n\}\n\Z')
_TAIL = re.compile(rb'\n  \},\n  "schema_version": (\d+)\n\}\n\Z')
_ENTRY = re.compile(rb'\n    ("(?:[^"\\\n]|\\.)*"): (\{\n.*?\n    \})(,?)', re.DOTALL)
_NESTED = b"\n    "  # an entry's lines, two objects deep


def _entry_text(entry: Entry) -> bytes:
    """One entry's JSON as it stands in ledger.json (pretty_json_plain's bytes, two objects deep)."""
    return pretty_json_plain(entry.model_dump(mode="json"))[:-1].replace(b"\n", _NESTED)


def _split(raw: bytes) -> tuple[int, dict[str, bytes]] | None:
    """(schema version, name -> entry text) of a ledger file in the form this module writes; else None."""
    if not raw.startswith(_HEAD):
        return None
    empty = _EMPTY_TAIL.match(raw, len(_HEAD))
    if empty is not None:
        return int(empty.group(1)), {}
    tail = _TAIL.search(raw)
    if tail is None:
        return None
    out: dict[str, bytes] = {}
    at, end, last = len(_HEAD), tail.start(), b","
    for m in _ENTRY.finditer(raw, at, end):
        if m.start() != at or last != b",":  # a gap, or an entry after the last one: not this form
            return None
        name = orjson.loads(m.group(1))
        if not isinstance(name, str) or name in out or (out and name < next(reversed(out))):
            return None  # keys are unique and sorted in this form
        out[name] = m.group(2)
        at, last = m.end(), m.group(3)
    return (int(tail.group(1)), out) if at == end and last == b"" else None


class Ledger:
    """Read-modify-write access to ``runs/<id>/ledger.json`` (every change is written atomically).

    Each change reloads, changes and saves the file under a lock; inside :meth:`batch` many
    changes share one reload and one save, so a stage records its per-cell entries in O(cells).
    The reload parses the file only when its digest differs from that of the bytes the entries were
    read from or saved as (another writer changed it): a run's own changes, in order, re-read nothing.

    Entries are held as their text in the file (about 430 bytes each), not as objects: a run has two
    per cell (its IR digest and its Luna result), 200,000 at 100,000 cells, which as pydantic objects
    took 3.3 KB each (66 MiB at 10,000 cells). :meth:`get` parses one when asked; a change writes the
    entry's text back, and a save joins the texts. :meth:`release` drops them while nothing needs
    them (a stage running): the next query or change reads the file again.
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.path = run_dir / LEDGER_FILE
        self._lock = threading.Lock()
        self._batch_owner: int | None = None  # the thread inside batch(), if any
        self._clean: str | None = None  # digest of the file's bytes that the entries hold (None: unknown)
        self._texts: dict[str, bytes] = {}  # name -> the entry's text in the file
        self._stages: dict[str, str] = {}  # name -> the entry's stage (interned: a handful of values)
        self._released = False  # the entries were dropped (release): read the file before using them
        self.schema_version = LEDGER_SCHEMA_VERSION
        self._load()

    def _load(self) -> None:
        """The entries as the file holds them now (parsed only when its digest differs from ``_clean``)."""
        try:
            raw = self.path.read_bytes()
        except (FileNotFoundError, IsADirectoryError):  # no ledger yet
            self._set({}, {})
            self._released = False
            return
        d = sha256_bytes(raw)
        if d == self._clean:
            return  # nobody wrote since this object read or saved it: the entries are what the file holds
        self._clean = None  # until the parse below succeeds
        split = _split(raw)
        if split is None or split[0] != LEDGER_SCHEMA_VERSION:
            # another form or version: newer refused (exit 2), older upgraded, then held as texts
            data = artifact_from_bytes(raw, self.path, "ledger", LedgerData)
            self._set({}, {})
            for name, entry in data.entries.items():
                self._put(name, entry)
        else:
            self._set(split[1], {})
            for name in self._texts:
                self._stages[name] = sys.intern(self._parse(name).stage)  # each entry is checked as it loads
        self._clean = d
        self._released = False

    def release(self) -> None:
        """Stop holding the entries in memory; the next query or change reads (and checks) the file again.

        A run has two entries per cell, ~620 bytes each with its name: 123 MiB at 100,000 cells that
        no stage reads while it runs. The runner releases them for each stage's duration (the reload
        costs ~1.3 CPU s at 100,000 cells, once per stage).
        """
        if self._batch_owner is not None:
            raise RuntimeError("Ledger.release() inside batch(): the batch's changes are not saved yet")
        self._set({}, {})
        self._clean = None
        self._released = True

    def _held(self) -> dict[str, bytes]:
        """The entries' texts, read from the file again when they were released."""
        if self._released:
            self._load()
        return self._texts

    def _set(self, texts: dict[str, bytes], stages: dict[str, str]) -> None:
        self._texts, self._stages = texts, stages

    def _parse(self, name: str) -> Entry:
        try:
            return Entry.model_validate_json(self._texts[name])
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            first = str(exc).splitlines()
            detail = " ".join(first[:3]) if first else type(exc).__name__
            raise BadInput(
                f"{self.path}: not a valid ledger (schema_version {LEDGER_SCHEMA_VERSION}): entry {name}: {detail}"
            ) from None

    def _put(self, name: str, entry: Entry) -> None:
        self._texts[name] = _entry_text(entry)
        self._stages[name] = sys.intern(entry.stage)

    def _chunks(self, entries_per_chunk: int = 4096) -> Iterator[bytes]:
        """The whole file (``pretty_json_plain`` of :attr:`data`) joined from the entries' texts, a chunk at a time.

        Never one list of every part: orjson gives each small result a 4 KiB allocation that stays
        taken while the result lives, so 200,000 quoted names held at once took 800 MiB (100,000 cells).
        """
        if not self._held():  # a released ledger is read again: a save never writes it empty
            yield _HEAD + b'},\n  "schema_version": %d\n}\n' % self.schema_version
            return
        names = sorted(self._texts)
        yield _HEAD
        for lo in range(0, len(names), entries_per_chunk):
            parts: list[bytes] = []
            for i in range(lo, min(lo + entries_per_chunk, len(names))):
                parts += (b",\n    " if i else b"\n    ", orjson.dumps(names[i]), b": ", self._texts[names[i]])
            yield b"".join(parts)
        yield b'\n  },\n  "schema_version": %d\n}\n' % self.schema_version

    @property
    def data(self) -> LedgerData:
        """Every entry as objects (a snapshot: changing it changes nothing; it costs 3.3 KB an entry)."""
        return LedgerData(schema_version=self.schema_version, entries={n: self._parse(n) for n in sorted(self._held())})

    def save(self) -> None:
        """Write the ledger atomically (no floats in it: its bytes are pretty_json_plain's)."""
        self._clean = None  # a failed write leaves the file's bytes unknown
        self._clean = atomic_write_chunks(self.path, self._chunks())

    @contextmanager
    def _mutate(self) -> Iterator[None]:
        """Reload, change and save under an exclusive file lock.

        Concurrent writers (a run and a gate decision) then never lose each other's entries.
        Inside :meth:`batch` (same thread) the batch's reload and save serve.
        """
        if self._batch_owner == threading.get_ident():
            yield
            return
        with self._lock:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.run_dir / LEDGER_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                self._load()
                try:
                    yield
                except BaseException:
                    self._clean = None  # entries may be half changed: the next change reads the file again
                    raise
                self.save()
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Many changes, one reload and one atomic save (under the lock the whole time).

        Nothing is saved when the block raises: the ledger keeps its state from before the batch.
        """
        if self._batch_owner == threading.get_ident():  # nested: the outer batch saves
            yield
            return
        with self._mutate():
            self._batch_owner = threading.get_ident()
            try:
                yield
            finally:
                self._batch_owner = None

    # -- queries -------------------------------------------------------------------------------

    def get(self, name: str) -> Entry | None:
        """The entry called ``name``, if any (a copy: change it through the ledger's methods)."""
        return self._parse(name) if name in self._held() else None

    def names(self) -> list[str]:
        """Every entry's name, sorted."""
        return sorted(self._held())

    def entries(self, *, per_cell: bool = True) -> Iterator[tuple[str, Entry]]:
        """(name, entry) in name order, one parsed at a time; ``per_cell=False`` skips names with a "/"."""
        for name in self.names():
            if per_cell or "/" not in name:
                yield name, self._parse(name)

    def output_digests(self, paths: Iterable[str]) -> dict[str, str] | None:
        """Digests of output files relative to the run, or None when one is missing."""
        return output_digests(self.run_dir, paths)

    def check(self, name: str, inputs: Mapping[str, str], outputs: Iterable[str] = ()) -> tuple[bool, str]:
        """Whether ``name`` can be reused with these inputs; else why not (one line)."""
        entry = self.get(name)
        if entry is None:
            return False, "never made"
        if entry.state != "verified":
            return False, entry.reason or entry.state
        if dict(entry.inputs) != dict(inputs):
            return False, describe_changes(entry.inputs, inputs)
        outs = list(outputs)
        if outs:
            now = self.output_digests(outs)
            if now is None:
                return False, "an output file is missing"
            recorded = {k: v for k, v in entry.outputs.items() if k in now}
            if recorded != now:
                return False, "an output was modified outside lunasol"
        return True, "verified"

    # -- changes ---------------------------------------------------------------------------------

    @staticmethod
    def _push_history(entry: Entry) -> None:
        entry.history.append(
            HistoryItem(state=entry.state, inputs=dict(entry.inputs), outputs=dict(entry.outputs), reason=entry.reason)
        )
        del entry.history[:-10]  # the recent past is enough to explain a state; the ledger stays small

    def _move(self, name: str, state: State, stage: str, inputs: Mapping[str, str], *, history_from: State) -> Entry:
        """Entry ``name`` (created when new) now in ``state`` from ``inputs``; leaving ``history_from`` is kept.

        The caller finishes the change and writes it back with :meth:`_put`.
        """
        entry = self.get(name)
        if entry is None:
            entry = Entry(state=state, stage=stage)
        elif entry.state == history_from:
            self._push_history(entry)
        entry.state = state
        entry.stage = stage
        entry.inputs = dict(inputs)
        return entry

    def mark_pending(self, name: str, stage: str, inputs: Mapping[str, str], reason: str = "in progress") -> None:
        """An entry is being (re)made from these inputs."""
        with self._mutate():
            entry = self._move(name, "pending", stage, inputs, history_from="verified")
            entry.reason = reason
            self._put(name, entry)

    def mark_verified(
        self, name: str, stage: str, inputs: Mapping[str, str], outputs: Mapping[str, str] | None = None
    ) -> None:
        """An entry was made from ``inputs`` and its outputs have these digests."""
        with self._mutate():
            entry = self._move(name, "verified", stage, inputs, history_from="invalidated")
            entry.outputs = dict(outputs or {})
            entry.reason = None
            self._put(name, entry)

    def _invalidate(self, name: str, reason: str) -> bool:
        entry = self.get(name)
        if entry is None or entry.state == "invalidated":
            return False
        self._push_history(entry)
        entry.state = "invalidated"
        entry.reason = reason
        self._put(name, entry)
        return True

    def invalidate(self, name: str, reason: str) -> bool:
        """Mark one entry invalidated (kept, with the reason); False when there was nothing to invalidate."""
        with self._mutate():
            return self._invalidate(name, reason)

    def invalidate_many(self, names: Iterable[str], reason: str) -> list[str]:
        """Invalidate several entries at once; return those that changed."""
        wanted = list(names)
        with self._mutate():
            return [n for n in wanted if self._invalidate(n, reason)]

    def names_for_stage(self, stage: str) -> list[str]:
        """Every entry that belongs to ``stage`` (the stage entry and its per-cell entries)."""
        self._held()
        return sorted(n for n, s in self._stages.items() if s == stage)

    def summary(self) -> list[dict[str, Any]]:
        """Rows for ``lunasol status``: name, stage, state, reason."""
        return [{"name": n, "stage": e.stage, "state": e.state, "reason": e.reason} for n, e in self.entries()]


# -- per-cell model results --------------------------------------------------------------------


def cell_key(**parts: str | None) -> str:
    """Key of one per-cell model result: digest of its named inputs (cell IR digest, template hash, model...)."""
    return digest({k: v for k, v in sorted(parts.items())})


@dataclass(frozen=True)
class ResultRecord:
    """What the ledger records of one stored per-cell result: its key, its inputs, the digest of its bytes."""

    key: str
    inputs: dict[str, Any]
    file_digest: str


# What this process read or wrote of each result file (by path), with the file's stat at that moment.
# After a model stage the runner records every stored result: the stage has just read (reused cells)
# or written (the others) each of them, so a file whose stat is unchanged is not read a second time.
# Folder -> file name -> one JSON string, [stat, key, inputs, file digest]: held through the whole stage,
# a record as objects (its path, a tuple, the stat's ints, a dataclass, its dict and strings) took ~0.8-1.1 KB,
# ~100 MB at 100,000 cells.
_seen: dict[str, dict[str, str]] = {}


def _remember(path: str, st: StatKey, record: ResultRecord) -> None:
    folder, name = os.path.split(path)
    _seen.setdefault(folder, {})[name] = orjson.dumps([st, record.key, record.inputs, record.file_digest]).decode()


def _recall(path: str, st: StatKey) -> ResultRecord | None:
    """The record of ``path`` remembered with the stat ``st``; None when not remembered, or the file changed since."""
    folder, name = os.path.split(path)
    raw = _seen.get(folder, {}).get(name)
    if raw is None:
        return None
    was, key, inputs, file_digest = orjson.loads(raw)
    return ResultRecord(key, inputs, file_digest) if tuple(was) == st else None


def _read_result(path: str) -> tuple[Any, ResultRecord | None]:
    """A result file's parsed content and its record (None: not a result), remembered in ``_seen``.

    Raises FileNotFoundError, or ValueError for bytes that are not UTF-8 JSON.
    """
    with open(path, "rb") as fh:
        data = fh.read()
        st = os.fstat(fh.fileno())
    raw = json.loads(data.decode("utf-8"))  # UnicodeDecodeError is a ValueError too
    if not isinstance(raw, dict) or "key" not in raw:
        return raw, None
    record = ResultRecord(str(raw["key"]), dict(raw.get("inputs") or {}), sha256_bytes(data))
    _remember(path, stat_key(st), record)
    return raw, record


class CellResults:
    """Per-cell model answers persisted as they complete: ``runs/<id>/<role>/<cell>.json``.

    Each file holds ``{"key", "inputs", "cell_id", "role", "value"}``; :meth:`get` returns the value
    only when the stored key equals the key asked for, so a changed cell (or template, or model)
    is asked again and an unchanged one never is.
    """

    def __init__(self, run_dir: Path, role: str = "luna") -> None:
        self.run_dir = run_dir
        self.role = role
        self.dir = run_dir / role

    def path(self, cell_id: str) -> Path:
        """Where the result of ``cell_id`` lives."""
        return self.dir / f"{cell_id}.json"

    def get(self, cell_id: str, key: str) -> Any | None:
        """The stored value for ``cell_id`` if it was made with ``key``; otherwise None."""
        p = self.path(cell_id)
        if not p.is_file():
            return None
        try:
            raw, _ = _read_result(str(p))
        except (FileNotFoundError, ValueError):  # a torn file cannot happen with atomic writes, but never trust it
            return None
        if not isinstance(raw, dict) or raw.get("key") != key:
            return None
        return raw.get("value")

    def put(self, cell_id: str, key: str, value: Any, inputs: Mapping[str, str | None] | None = None) -> str:
        """Persist one cell's answer atomically; return the file's digest."""
        payload = {
            "schema_version": CELL_RESULT_SCHEMA_VERSION,
            "cell_id": cell_id,
            "role": self.role,
            "key": key,
            "inputs": dict(inputs or {}),
            "value": value,
            "lunasol": pipeline.__version__,
        }
        path = self.path(cell_id)
        file_digest = write_json(path, payload)
        _remember(str(path), stat_key(path.stat()), ResultRecord(key, payload["inputs"], file_digest))
        return file_digest

    def forget(self) -> None:
        """Drop what this process remembers of this role's result files (``_seen``; about 0.5 KB a cell).

        Once the runner has recorded a stage's results nothing reads those records again; at 100,000
        cells they would hold ~50 MB under every later stage. A later :meth:`records` reads the files.
        """
        _seen.pop(str(self.dir), None)

    def records(self) -> dict[str, ResultRecord]:
        """Every stored result: cell id -> its key, inputs and file digest.

        A file this process read or wrote and whose stat is unchanged since is not read again
        (see ``_seen``); any other is read, parsed and hashed. Files that are not results are left out.
        """
        out: dict[str, ResultRecord] = {}
        if not self.dir.is_dir():
            return out
        with os.scandir(self.dir) as it:
            entries = sorted((e.name, e.path) for e in it if e.name.endswith(".json") and e.is_file())
        for name, path in entries:
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            seen = _recall(path, stat_key(st))
            if seen is not None:
                out[name[: -len(".json")]] = seen
                continue
            try:
                _, record = _read_result(path)
            except (FileNotFoundError, ValueError):  # gone meanwhile, or not a JSON document
                continue
            if record is not None:
                out[name[: -len(".json")]] = record
        return out
