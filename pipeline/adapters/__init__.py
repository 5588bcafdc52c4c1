"""Adapters: public agent-trajectory formats in, frozen lunasol bundles and IR events out.

Public API: :data:`FORMATS`, :func:`reader_for` (export calls it for non-native bundles),
:func:`detect`, :func:`import_bundle`, :func:`resolve_ref`. One module per format; see
docs/adapters.md for what each reads, where labels go and how refs point into the raw files.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from functools import lru_cache
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from pipeline.adapters import native
from pipeline.adapters.contract import Reader, SourceEvent
from pipeline.adapters.importer import MIXED, ImportResult
from pipeline.adapters.importer import import_bundle as _import_bundle
from pipeline.adapters.registry import adapter, adapters, cannot_tell, detect_file, installed, judge
from pipeline.adapters.spans import resolve_element
from pipeline.bundle.manifest import read_manifest, resolve_in_bundle
from pipeline.core.canonical import sha256_bytes
from pipeline.core.errors import BadInput, BundleError

if TYPE_CHECKING:
    from pipeline.adapters.remote import FetchStats
    from pipeline.bundle.manifest import Manifest
    from pipeline.bundle.request import CellSpec

__all__ = [
    "FORMATS",
    "MIXED",
    "ImportResult",
    "adapter",
    "adapters",
    "cell_harness",
    "detect",
    "import_bundle",
    "import_from_url",
    "installed",
    "judge",
    "link_results",
    "reader_for",
    "resolve_ref",
    "sniff_file",
]


def __getattr__(name: str) -> Any:
    # FORMATS is the registry's (installed plugins included), read when asked, not at import.
    if name == "FORMATS":
        return tuple(adapters())
    raise AttributeError(name)


def sniff_file(path: Path, rel: str) -> str | None:
    """The format one file clearly is (the best, clear score of every installed adapter), or None."""
    return detect_file(path, rel)[0]


def detect(src: Path) -> str:
    """The format of a file or folder of logs: each file whose format is clear votes for it.

    A single file whose format is not clear is one line naming the closest format and why.
    """
    if src.is_file():
        name, why = detect_file(src, src.name)
        if name is None:
            raise cannot_tell(src, why)
        return name
    files = sorted(p for p in src.rglob("*") if p.is_file() and not p.is_symlink())
    votes: Counter[str] = Counter()
    closest = ""  # the first file a format came close to, for the refusal
    for p in files:
        name, why = detect_file(p, p.relative_to(src).as_posix())
        if name is not None:
            votes[name] += 1
        elif not closest and why.startswith("closest"):
            closest = f"{p.relative_to(src).as_posix()}: {why}"
    if not votes:
        raise cannot_tell(src, closest or "no installed format recognises any file")
    best = max(votes.values())
    return next(f for f in adapters() if votes[f] == best)


def import_bundle(fmt: str, src: Path, dest: Path) -> ImportResult:
    """Import ``src`` in format ``fmt`` (or ``auto``: each file with the adapter it looks like) into ``dest``."""
    found = adapters()
    if fmt != "auto" and fmt not in found:
        raise BadInput(f"unknown format {fmt!r}; known: auto, {', '.join(found)} (see `lunasol formats`)")
    return _import_bundle(fmt, src, dest, adapters=found, detect=detect, sniff=detect_file)


def import_from_url(fmt: str, url: str, dest: Path) -> tuple[ImportResult, FetchStats]:
    """Import the objects under ``url`` (``s3://``, ``gs://``, ``az://``, ``file://``) as :func:`import_bundle` does.

    The objects are fetched into a staging folder beside ``dest`` and imported from there (see
    :mod:`pipeline.adapters.remote`); the bundle also gets ``manifest.sources.json``.
    """
    from pipeline.adapters.remote import import_url  # only a URL source loads fsspec's staging code

    found = adapters()
    if fmt != "auto" and fmt not in found:
        raise BadInput(f"unknown format {fmt!r}; known: auto, {', '.join(found)} (see `lunasol formats`)")

    def local(src: Path, to: Path, hook: Callable[[Path], None]) -> ImportResult:
        return _import_bundle(fmt, src, to, adapters=found, detect=detect, sniff=detect_file, before_rename=hook)

    return import_url(fmt, url, dest, local)


@lru_cache(maxsize=32)
def _source_blocks(request_path: str, mtime_ns: int) -> dict[str, Any]:
    data = orjson.loads(Path(request_path).read_bytes())
    source = data.get("source") or {}
    cells: dict[str, Any] = source.get("cells") or {}
    return cells


def cell_block(bundle: Path, cell_id: str) -> dict[str, Any]:
    """Where one imported cell's records are (``source.cells[cell_id]`` of the request)."""
    req = bundle / "analysis-request.json"
    blocks = _source_blocks(str(req.resolve()), req.stat().st_mtime_ns)
    block = blocks.get(cell_id)
    if block is None:
        raise BundleError(f"analysis-request.json: source.cells has no entry for imported cell {cell_id}")
    return dict(block)


def reader_for(fmt: str) -> Reader:
    """The reader export uses for a bundle of format ``fmt`` (``native`` or an adapter's name)."""
    if fmt == "native":
        return native.read_cell
    known = adapters()
    if fmt not in known and fmt != MIXED:
        raise BadInput(f"unknown bundle format {fmt!r}; known: native, {MIXED}, {', '.join(known)}")

    def read(bundle: Path, cell: CellSpec, manifest: Manifest) -> list[SourceEvent]:
        block = cell_block(bundle, cell.cell_id)
        name = str(block.get("adapter") or fmt)  # a mixed bundle names each cell's adapter
        ad = known.get(name)
        if ad is None:
            raise BundleError(
                f"analysis-request.json: cell {cell.cell_id} is format {name!r}, which is not installed "
                "(`lunasol formats` lists what is)"
            )
        for rel in block.get("files") or [cell.path]:
            manifest.get(rel)  # a raw file that is not frozen is a BundleError, before any event
        try:
            return link_results(keep_reader_order(list(ad.read(bundle, block))))
        except RecursionError:  # JSON held in a string of the log (tool arguments, a trace), nested too deep
            raise BundleError(f"{cell.path} (cell {cell.cell_id}): JSON nested too deeply to read") from None

    return read


def link_results(events: list[SourceEvent]) -> list[SourceEvent]:
    """Give a tool call and the result that answers it one call id when the source names none.

    Formats that write an action and its observation as one step (SWE-agent's ``.traj``, ATIF
    steps, chat logs) carry no call id, so the zero-gain probes (same call, same result again)
    could not join a result to its call. Within a session, results with no id answer the calls
    with no id in order (first call first); a message starts a new turn, leaving unanswered calls
    unanswered. The id is the call's own ref, so it is unique in the cell and says where it points.
    """
    pending: dict[str | None, list[SourceEvent]] = {}
    for e in events:
        queue = pending.setdefault(e.session_id, [])
        if e.kind == "tool_call" and not e.call_id:
            queue.append(e)
        elif e.kind == "message":
            queue.clear()
        elif not e.call_id and queue and (e.kind == "tool_result" or (e.kind == "error" and e.detail == "tool_error")):
            call = queue.pop(0)
            call.call_id = e.call_id = f"{call.source_path}#L{call.line_start}{call.json_pointer or ''}"
    return events


def _order_key(e: SourceEvent) -> tuple[str, str, int]:
    return (e.ts or "", e.source_path, e.line_start)


def keep_reader_order(events: list[SourceEvent]) -> list[SourceEvent]:
    """Make export's (ts, path, line) sort keep the source's own event order.

    Export orders events by timestamp, ties by file and line. Foreign logs often stamp only some
    records, or stamp a later record earlier; then the timestamps are dropped for that cell so the
    order stays the one the source defines (the raw lines still hold every timestamp).
    """
    keys = [_order_key(e) for e in events]
    if all(a <= b for a, b in pairwise(keys)):
        return events
    for e in events:
        e.ts = None
    return events


def cell_harness(bundle: Path, cell_id: str, default: str | None) -> str | None:
    """The harness one imported cell ran under (with its subset when an import spans several)."""
    block = cell_block(bundle, cell_id)
    harness = block.get("harness") or default
    subset = block.get("subset")
    return f"{harness} [{subset}]" if harness and subset else harness


def step_index_base(bundle: Path, cell_id: str) -> int | None:
    """0 or 1 when the source numbers its steps, else None (goes to ``cells.step_index_base``)."""
    base = cell_block(bundle, cell_id).get("step_index_base")
    return base if isinstance(base, int) else None


def resolve_ref(bundle: Path, source_path: str, line_start: int, line_end: int, json_pointer: str | None) -> str:
    """The raw text behind one ref, after checking the file against the manifest's sha256."""
    entry = read_manifest(bundle).get(source_path)
    raw = resolve_in_bundle(bundle, source_path).read_bytes()
    if sha256_bytes(raw) != entry.sha256:
        raise BundleError(f"{source_path} changed since the bundle was frozen")
    try:
        return resolve_element(raw, line_start, line_end, json_pointer)
    except (ValueError, KeyError, IndexError) as exc:
        raise BundleError(
            f"ref {source_path}#L{line_start}-L{line_end}{json_pointer or ''} does not resolve: {exc}"
        ) from None
