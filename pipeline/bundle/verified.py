"""Which bundle files a run has already hashed, kept across reruns (git's stat cache, one per run).

``verify`` hashes every file of a bundle, and a run verifies it every time: 0.25 CPU s on a
1,000-cell bundle of 88 MB, a twentieth of a rerun with one changed cell, and seconds on the
bundles of gigabytes researchers freeze. A file whose size, mtime, ctime and inode are those it had
when it was hashed and found equal to the manifest has the same bytes (an edit in place changes
the mtime or the size, and always the ctime, which no user can set back; an atomic write is a new
inode), so its hash is taken from ``runs/<id>/verified-files.json`` instead.

The file is only trusted whole: it is read when it parses, names this bundle's resolved path and
holds well-formed entries; each entry counts only when its stat key and its manifest sha256 are
both unchanged. ``lunasol bundle verify`` never reads it: it always hashes every byte.

Files are named by their position in the manifest (sorted and frozen), not by their path: a run
directory never holds a bundle file name, which may hold a secret (``pipeline.ir.redact``). A
position that now names another file cannot pass: its stat key holds the inode.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ijson
import orjson

from pipeline.artifacts import rundir
from pipeline.bundle.manifest import KnownFiles, Manifest, VerifyReport
from pipeline.core.canonical import atomic_write_chunks, same_bytes, settled

VERIFIED_FILE = rundir.VERIFIED_FILE
SCHEMA = 2  # 2: files keyed by manifest position (1: by path, which may hold a secret)

Known = KnownFiles
"""Bundle-relative path -> (its stat key when hashed, the sha256 it had), held by manifest position."""

_ENTRIES_PER_CHUNK = 8192


def _header(path: Path) -> tuple[Any, Any] | None:
    """(schema, bundle) from the top of the file, read up to its ``files`` (None when they do not come first)."""
    schema: Any = None
    bundle: Any = None
    with path.open("rb") as fh:
        events = ijson.basic_parse(fh)
        if next(events, ("", None))[0] != "start_map":
            return None
        for event, key in events:
            if event != "map_key" or key == "files":
                break
            event, value = next(events)
            if key == "schema":
                schema = value
            elif key == "bundle":
                bundle = value
            if event in ("start_map", "start_array"):
                return None  # not this file's shape: trusted whole or not at all
        else:
            return None
    return schema, bundle


def load(run_dir: Path, bundle: Path, manifest: Manifest) -> Known:
    """The files of ``bundle`` this run hashed before, with what they hashed to (empty when unknown).

    Read one entry at a time (16 MB at 10,000 cells, ~160 MB at 100,000) into arrays by position;
    an entry counts when its sha256 is the manifest's still.
    """
    path = run_dir / VERIFIED_FILE
    files = manifest.files
    known = Known(files)
    try:
        head = _header(path)
        if head is None or head[0] != SCHEMA or head[1] != str(bundle.resolve()):
            return Known(files)
        n = len(files)
        table = known.table
        with path.open("rb") as fh:
            for pos, value in ijson.kvitems(fh, "files"):
                # one pass per bundle file (1.2 million at 100,000 cells): unpacked and checked inline
                if not (type(value) is list and len(value) == 5 and pos.isdigit() and int(pos) < n):
                    return Known(files)  # never trust part of a file someone edited
                size, mtime, ctime, inode, sha = value
                if not (
                    type(size) is int
                    and type(mtime) is int
                    and type(ctime) is int
                    and type(inode) is int
                    and type(sha) is str
                ):
                    return Known(files)
                i = int(pos)
                if sha == files.sha256(i) and 0 <= size < 1 << 63 and 0 <= inode < 1 << 64:
                    table.put(i, (size, mtime, ctime, inode))
    except (OSError, ijson.JSONError, OverflowError):  # absent, torn or out of range: hash everything
        return Known(files)
    return known


def _chunks(bundle: Path, manifest: Manifest, positions: array[int]) -> Iterator[bytes]:
    """The bytes ``orjson.dumps({"schema": ..., "bundle": ..., "files": {...}})`` wrote, a few thousand a chunk."""
    files, table = manifest.files, manifest.hashed_ok
    yield b'{"schema":%d,"bundle":%s,"files":{' % (SCHEMA, orjson.dumps(str(bundle.resolve())))
    for lo in range(0, len(positions), _ENTRIES_PER_CHUNK):
        parts = []
        for i in positions[lo : lo + _ENTRIES_PER_CHUNK]:
            key = table.at(i)
            assert key is not None
            parts.append('"%d":[%d,%d,%d,%d,"%s"]' % (i, *key, files.sha256(i)))  # noqa: UP031  # 2x f-string's speed
        yield ("," if lo else "").encode() + ",".join(parts).encode()
    yield b"}}"


def save(run_dir: Path, bundle: Path, manifest: Manifest, report: VerifyReport) -> None:
    """Keep every file ``report``'s :func:`~pipeline.bundle.manifest.verify` found equal, with its stat key.

    Files whose mtime or ctime is less than :data:`~pipeline.core.canonical.RACY_NS` older than the verify
    are left out. Written as it is made, never held whole (~160 MB at 100,000 cells).
    """
    table = manifest.hashed_ok
    positions = array("q", (i for i in table.positions() if settled(table.at(i) or (0, 0, 0, 0), report.started_ns)))
    if not positions:
        return  # a bundle frozen moments ago: hashed again next time
    path = run_dir / VERIFIED_FILE
    if same_bytes(path, _chunks(bundle, manifest, positions)):
        return  # nothing new: no write, no fsync
    atomic_write_chunks(path, _chunks(bundle, manifest, positions))
