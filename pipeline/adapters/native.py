"""Reader of the native bundle format (docs/trajectory-format.md): raw lines -> SourceEvents.

Each non-blank line of ``controller.jsonl`` and ``sessions/*.jsonl`` becomes one event with
its exact line as the ref. Files are checked against the manifest before they are parsed.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

import orjson

from pipeline.adapters.contract import Record, SourceEvent
from pipeline.bundle.manifest import MANIFEST_FILE, Manifest, read_frozen, resolve_in_bundle
from pipeline.bundle.request import CellSpec, check_relative
from pipeline.core.canonical import canonical_json, sha256_bytes, stat_key
from pipeline.core.errors import BundleError
from pipeline.core.limits import check_lines, check_size, parse_json

_SESSION_NAME = re.compile(r"^(?P<nn>\d+)-(?P<stage>.+)-(?P<actor>[^-]+)\.jsonl$")

# Argument keys that name what a tool call acts on, most specific first.
_TARGET_KEYS = ("path", "file_path", "file", "filepath", "filename", "target", "dir", "directory", "url", "cwd")

_CONTROLLER_KIND = {
    "stage_started": "stage",
    "stage_accepted": "stage",
    "stage_sent_back": "stage",
    "workflow_finished": "stage",
    "artifact_written": "artifact",
    "state": "state_change",
    "handoff": "handoff",
    "obligation_opened": "obligation",
    "obligation_closed": "obligation",
}


# orjson and json.dumps agree on everything a log line can hold except float spelling in
# scientific or tiny notation, and NaN/Infinity (orjson writes null): any output that might hold
# one of those goes the slow canonical way.
_FLOAT_RISK = re.compile(rb"\d[eE]|0\.0000|null")


def canonical_args(args: Any) -> str:
    """``pipeline.core.canonical.canonical_json(args)``, fast (orjson) when the result is provably identical."""
    try:
        out = orjson.dumps(args, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return canonical_json(args)
    if _FLOAT_RISK.search(out):
        return canonical_json(args)
    return out.decode("utf-8")


def _str(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else canonical_json(value)


def tool_target(args: Any) -> str | None:
    """The file/path a tool call acts on, when its arguments have a path-like key."""
    if not isinstance(args, dict):
        return None
    for key in _TARGET_KEYS:
        value = args.get(key)
        if isinstance(value, str) and value:
            return value
    paths = args.get("paths")
    if isinstance(paths, list) and paths and isinstance(paths[0], str):
        return ",".join(p for p in paths if isinstance(p, str))
    return None


def _stdlib_loads(raw: bytes, rel: str, n: int, exc: Exception) -> Any:
    # pipeline.core.canonical writes NaN/Infinity (json.dumps does), which orjson refuses: ask the
    # standard parser before calling the line invalid. What is not valid Unicode (an escaped lone
    # surrogate) stays an error: it could not be hashed or stored as text.
    try:
        rec = parse_json(raw, f"{rel} line {n}")  # orjson stops at 1,024 levels; json.loads may recurse out
        canonical_json(rec).encode("utf-8")
    except (ValueError, UnicodeEncodeError):
        raise BundleError(f"invalid JSON in {rel} line {n}: {exc}") from None
    return rec


def iter_lines(data: bytes, rel: str) -> list[tuple[int, dict[str, Any]]]:
    """Parse a JSONL file: (1-based line number, object) for every non-blank line.

    Invalid UTF-8 or invalid JSON is a BundleError naming the file (and the line).
    """
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise BundleError(f"invalid UTF-8 in {rel} (line {line}, byte {exc.start})") from None
    loads = orjson.loads
    out: list[tuple[int, dict[str, Any]]] = []
    lines = data.split(b"\n")
    check_lines(lines, rel)  # one huge line would become many times its size in objects
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            rec = loads(raw)
        except orjson.JSONDecodeError as exc:
            rec = _stdlib_loads(raw, rel, n, exc)
        if not isinstance(rec, dict):
            raise BundleError(f"invalid record in {rel} line {n}: expected a JSON object")
        out.append((n, rec))
    return out


def _session_records(rel: str, data: bytes) -> list[Record]:
    name = rel.rsplit("/", 1)[-1]
    m = _SESSION_NAME.match(name)
    file_stage, file_actor = (m["stage"], m["actor"]) if m else (None, None)
    stem = name[: -len(".jsonl")] if name.endswith(".jsonl") else name
    targets: dict[str, str | None] = {}  # call_id -> target, so a result points at what its call touched
    events: list[Record] = []
    append = events.append
    sha256 = hashlib.sha256  # digests inline: a function call per event is measurable at 1M events
    for n, rec in iter_lines(data, rel):
        g = rec.get
        typ = g("type")
        # Fields are almost always strings already; _str only runs for the odd value.
        ts = g("ts")
        if ts.__class__ is not str:
            ts = _str(ts)
        stage = g("stage") or file_stage
        if stage.__class__ is not str:
            stage = _str(stage)
        actor = g("actor") or file_actor
        if actor.__class__ is not str:
            actor = _str(actor)
        session = g("session")
        if session.__class__ is not str:
            session = _str(session) or stem
        step = g("step")
        step_index = step if step.__class__ is int else None
        if typ == "tool_call":
            args = g("args")
            args_json = canonical_args(args if args is not None else {})
            call_id = g("call_id")
            if call_id.__class__ is not str:
                call_id = _str(call_id)
            tool = _str(g("tool"))
            target = tool_target(args)
            if call_id is not None:
                targets[call_id] = target
            append(
                (ts, rel, n, "tool_call", "tool_call", actor, stage, session, step_index, f"{tool} {args_json}",
                 tool, call_id, "sha256:" + sha256(args_json.encode()).hexdigest(), None, None, target)
            )  # fmt: skip
        elif typ == "tool_result":
            output = g("output")
            if output.__class__ is not str:
                output = _str(output) or ""
            call_id = g("call_id")
            if call_id.__class__ is not str:
                call_id = _str(call_id)
            code = g("exit_code")
            detail = "tool_result" if code == 0 or code is None else f"tool_result exit_code={code}"
            append(
                (ts, rel, n, "tool_result", detail, actor, stage, session, step_index, output, _str(g("tool")),
                 call_id, None, "sha256:" + sha256(output.encode()).hexdigest(), None,
                 targets.get(call_id) if call_id is not None else None)
            )  # fmt: skip
        elif typ == "message":
            role = g("role") or actor
            if role.__class__ is not str:
                role = _str(role)
            append(
                (ts, rel, n, "message", "message", role, stage, session, step_index, _str(g("content")) or "",
                 None, None, None, None, None, None)
            )  # fmt: skip
        elif typ == "error":
            append(
                (ts, rel, n, "error", _str(g("source")) or "error", actor, stage, session, step_index,
                 _str(g("message")) or "", None, None, None, None, None, None)
            )  # fmt: skip
        else:
            append(
                (ts, rel, n, "other", _str(typ), actor, stage, session, step_index, canonical_json(rec),
                 None, None, None, None, None, None)
            )  # fmt: skip
    return events


def _controller_text(ev: str, rec: dict[str, Any]) -> tuple[str, str | None]:
    """(readable text, target) of one controller record."""
    g = rec.get
    if ev == "stage_started":
        return f"stage {g('stage')} started (actor {g('actor')})", _str(g("stage"))
    if ev == "stage_accepted":
        return f"stage {g('stage')} accepted by {g('by')}", _str(g("stage"))
    if ev == "stage_sent_back":
        return f"stage {g('stage')} sent back to {g('to')}: {g('reason')}", _str(g("stage"))
    if ev == "artifact_written":
        return f"artifact {g('artifact')} written in stage {g('stage')} ({g('digest')})", _str(g("artifact"))
    if ev == "state":
        stages = g("confirmed")
        confirmed = ",".join(str(s) for s in (stages if isinstance(stages, list) else [stages] if stages else []))
        return (
            f"state {g('state_digest')}: current_stage={g('current_stage')} confirmed=[{confirmed}]",
            _str(g("current_stage")),
        )
    if ev == "handoff":
        return f"handoff {g('from')} -> {g('to')} in stage {g('stage')}: {g('note')}", _str(g("to"))
    if ev == "obligation_opened":
        return f"obligation {g('obligation_id')} opened in stage {g('stage')}: {g('text')}", _str(g("obligation_id"))
    if ev == "obligation_closed":
        return (
            f"obligation {g('obligation_id')} closed in stage {g('stage')}: {g('evidence')}",
            _str(g("obligation_id")),
        )
    if ev == "workflow_finished":
        return f"workflow finished: {g('status')}: {g('note')}", None
    return canonical_json(rec), None


def _controller_records(rel: str, data: bytes) -> list[Record]:
    events: list[Record] = []
    append = events.append
    for n, rec in iter_lines(data, rel):
        g = rec.get
        name = _str(g("event")) or "unknown"
        text, target = _controller_text(name, rec)
        stage = g("current_stage") if name == "state" else g("stage")
        append(
            (_str(g("ts")), rel, n, _CONTROLLER_KIND.get(name, "other"), name, "controller", _str(stage), None,
             None, text, None, None, None, _str(g("digest")) if name == "artifact_written" else None,
             _str(g("state_digest")) if name == "state" else None, target)
        )  # fmt: skip
    return events


def cell_files(bundle: Path, cell: CellSpec) -> list[tuple[str, Path | None]]:
    """The log files of one native cell in reading order (controller, then sessions by name).

    Each is ``(bundle-relative path, path)``; the path is None when a symlink is involved below
    the cell directory (then :func:`read_frozen` resolves it and refuses a link out).
    """
    cell_dir = resolve_in_bundle(bundle, cell.path, f"cell {cell.cell_id} path")
    if not cell_dir.is_dir():
        raise BundleError(f"cell {cell.cell_id} is listed in analysis-request.json but {cell.path} is absent")
    base = cell.path.rstrip("/")
    with os.scandir(cell_dir) as it:
        entries = {e.name: e for e in it if e.name in ("controller.jsonl", "sessions")}
    files: list[tuple[str, Path | None]] = []
    ctrl = entries.get("controller.jsonl")
    if ctrl is not None and ctrl.is_file():
        files.append((f"{base}/controller.jsonl", None if ctrl.is_symlink() else cell_dir / "controller.jsonl"))
    sessions = entries.get("sessions")
    if sessions is not None and sessions.is_dir():
        linked = sessions.is_symlink()
        with os.scandir(sessions.path) as it:
            names = sorted((e.name, not linked and e.is_file(follow_symlinks=False)) for e in it)
        files.extend(
            (f"{base}/sessions/{name}", cell_dir / "sessions" / name if plain else None)
            for name, plain in names
            if name.endswith(".jsonl")
        )
    return files


def _read_log(bundle: Path, rel: str, path: Path | None, manifest: Manifest) -> bytes:
    """``read_frozen(bundle, rel, manifest)``, without its two path resolutions for a plain file.

    ``path`` is a regular file (no symlink) in a directory that resolved inside the bundle, so it
    is inside: the same checks as read_frozen (listed, size, stat cache or sha256), same errors.
    """
    entry = manifest.get(rel)
    check_size(entry.size, "LUNASOL_MAX_FILE_BYTES", rel, "the log file")  # before reading it
    if path is None:
        return read_frozen(bundle, rel, manifest)
    check_relative(rel, "manifest path")
    try:
        with path.open("rb") as fh:
            data = fh.read()
            key = stat_key(os.fstat(fh.fileno()))
    except OSError:
        return read_frozen(bundle, rel, manifest)  # vanished or changed type meanwhile: the full checks say what
    if len(data) == entry.size and manifest.hashed_ok.get(rel) == key:
        return data
    if len(data) != entry.size or sha256_bytes(data) != entry.sha256:
        raise BundleError(f"{rel} changed since the bundle was frozen (sha256 differs from {MANIFEST_FILE})")
    return data


def cell_records(bundle: Path, cell: CellSpec, manifest: Manifest) -> list[Record]:
    """Every record of one native cell as a 16-field :data:`~pipeline.adapters.contract.Record`, in file order.

    Export works on these tuples directly; :func:`read_cell` turns them into SourceEvents.
    """
    records: list[Record] = []
    for rel, path in cell_files(bundle, cell):
        data = _read_log(bundle, rel, path, manifest)
        if rel.endswith("/controller.jsonl"):
            records.extend(_controller_records(rel, data))
        else:
            records.extend(_session_records(rel, data))
    return records


def read_cell(bundle: Path, cell: CellSpec, manifest: Manifest) -> list[SourceEvent]:
    """Every event of one native cell, in file order (export sorts them by time)."""
    return [
        SourceEvent(r[3], r[1], r[2], r[2], r[0], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11], r[12], r[13],
                    r[14], r[15])
        for r in cell_records(bundle, cell, manifest)
    ]  # fmt: skip
