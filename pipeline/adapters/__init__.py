"""Adapters: public agent-trajectory formats in, frozen lunasol bundles and IR events out.

Public API: :data:`FORMATS`, :func:`reader_for` (export calls it for non-native bundles),
:func:`detect`, :func:`import_bundle`, :func:`resolve_ref`. One module per format; see
docs/adapters.md for what each reads, where labels go and how refs point into the raw files.
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from pipeline.adapters import (
    aider,
    atif,
    claude_code,
    copilot_cli,
    inspect_log,
    mast,
    mini_swe_agent,
    native,
    opencode,
    openhands,
    otel,
    swe_agent,
    tau,
    who_and_when,
)
from pipeline.adapters.base import Adapter
from pipeline.adapters.contract import Reader, SourceEvent
from pipeline.adapters.importer import MIXED, ImportResult
from pipeline.adapters.importer import import_bundle as _import_bundle
from pipeline.adapters.spans import resolve_element
from pipeline.bundle.manifest import read_manifest, resolve_in_bundle
from pipeline.core.canonical import sha256_bytes
from pipeline.core.errors import BadInput, BundleError

if TYPE_CHECKING:
    from pipeline.bundle.manifest import Manifest
    from pipeline.bundle.request import CellSpec

# Order matters for auto-detection ties: the more specific shapes first.
ADAPTERS: dict[str, Adapter] = {
    "otel-genai": otel.ADAPTER,
    "copilot-cli": copilot_cli.ADAPTER,
    "opencode": opencode.ADAPTER,
    "aider": aider.ADAPTER,
    "mini-swe-agent": mini_swe_agent.ADAPTER,
    "who-and-when": who_and_when.ADAPTER,
    "mast": mast.ADAPTER,
    "swe-agent": swe_agent.ADAPTER,
    "openhands": openhands.ADAPTER,
    "inspect": inspect_log.ADAPTER,
    "claude-code": claude_code.ADAPTER,
    "atif": atif.ADAPTER,
    "tau": tau.ADAPTER,
}
FORMATS: tuple[str, ...] = tuple(ADAPTERS)

__all__ = [
    "FORMATS",
    "MIXED",
    "ImportResult",
    "adapter",
    "cell_harness",
    "detect",
    "import_bundle",
    "reader_for",
    "resolve_ref",
    "sniff_file",
]


def adapter(fmt: str) -> Adapter:
    """The adapter of one format name; an unknown name is BadInput."""
    found = ADAPTERS.get(fmt)
    if found is None:
        raise BadInput(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    return found


def _all() -> dict[str, Adapter]:
    return dict(ADAPTERS)


def sniff_file(path: Path, rel: str) -> str | None:
    """The format one file looks like (the most specific adapter whose sniff matches), or None."""
    try:
        with path.open("rb") as fh:
            # Enough for the markers that follow a long system prompt (mini-SWE-agent, Magentic-One).
            head = fh.read(32768).decode("utf-8", errors="replace")
    except OSError:
        return None
    return next((name for name, ad in ADAPTERS.items() if ad.sniff(rel, head)), None)


def detect(src: Path) -> str:
    """The format of a file or folder of logs: each file votes for the formats it looks like."""
    files = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file() and not p.is_symlink())
    votes: Counter[str] = Counter()
    for p in files:
        name = sniff_file(p, p.name if src.is_file() else p.relative_to(src).as_posix())
        if name is not None:
            votes[name] += 1
    if not votes:
        raise BadInput(f"cannot tell the format of {src}; name it: {', '.join(FORMATS)}")
    best = max(votes.values())
    return next(f for f in FORMATS if votes[f] == best)


def import_bundle(fmt: str, src: Path, dest: Path) -> ImportResult:
    """Import ``src`` in format ``fmt`` (or ``auto``: each file with the adapter it looks like) into ``dest``."""
    if fmt != "auto" and fmt not in ADAPTERS:
        raise BadInput(f"unknown format {fmt!r}; known: auto, {', '.join(FORMATS)}")
    return _import_bundle(fmt, src, dest, adapters=_all(), detect=detect, sniff=sniff_file)


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
    if fmt not in ADAPTERS and fmt != MIXED:
        raise BadInput(f"unknown bundle format {fmt!r}; known: native, {MIXED}, {', '.join(FORMATS)}")

    def read(bundle: Path, cell: CellSpec, manifest: Manifest) -> list[SourceEvent]:
        block = cell_block(bundle, cell.cell_id)
        name = str(block.get("adapter") or fmt)  # a mixed bundle names each cell's adapter
        ad = ADAPTERS.get(name)
        if ad is None:
            raise BundleError(f"analysis-request.json: cell {cell.cell_id} names unknown adapter {name!r}")
        for rel in block.get("files") or [cell.path]:
            manifest.get(rel)  # a raw file that is not frozen is a BundleError, before any event
        try:
            return keep_reader_order(list(ad.read(bundle, block)))
        except RecursionError:  # JSON held in a string of the log (tool arguments, a trace), nested too deep
            raise BundleError(f"{cell.path} (cell {cell.cell_id}): JSON nested too deeply to read") from None

    return read


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
