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

from pathlib import Path
from typing import Any

import orjson

from pipeline.artifacts import rundir
from pipeline.bundle.manifest import Manifest, VerifyReport
from pipeline.core.canonical import StatKey, atomic_write_bytes, settled

VERIFIED_FILE = rundir.VERIFIED_FILE
SCHEMA = 2  # 2: files keyed by manifest position (1: by path, which may hold a secret)

Known = dict[str, tuple[StatKey, str]]
"""Bundle-relative path -> (its stat key when hashed, the sha256 it had)."""


def _entry(value: Any) -> tuple[StatKey, str] | None:
    # One call per bundle file (115,000 at 10,000 cells): unpacked and checked inline, not by a generator.
    if type(value) is list and len(value) == 5:
        size, mtime, ctime, inode, sha = value
        if type(size) is int and type(mtime) is int and type(ctime) is int and type(inode) is int and type(sha) is str:
            return (size, mtime, ctime, inode), sha
    return None


def load(run_dir: Path, bundle: Path, manifest: Manifest) -> Known:
    """The files of ``bundle`` this run hashed before, with what they hashed to (empty when unknown)."""
    path = run_dir / VERIFIED_FILE
    try:
        raw = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):  # absent or torn: hash everything
        return {}
    if not (
        isinstance(raw, dict)
        and raw.get("schema") == SCHEMA
        and raw.get("bundle") == str(bundle.resolve())
        and isinstance(raw.get("files"), dict)
    ):
        return {}
    known: Known = {}
    files = manifest.files
    for pos, value in raw["files"].items():
        entry = _entry(value)
        if entry is None or not pos.isdigit() or int(pos) >= len(files):
            return {}  # never trust part of a file someone edited
        known[files[int(pos)].path] = entry
    return known


def save(run_dir: Path, bundle: Path, manifest: Manifest, report: VerifyReport) -> None:
    """Keep every file ``report``'s :func:`~pipeline.bundle.manifest.verify` found equal, with its stat key.

    Files whose mtime or ctime is less than :data:`~pipeline.core.canonical.RACY_NS` older than the verify
    are left out.
    """
    position = {f.path: i for i, f in enumerate(manifest.files)}
    files = {
        str(position[rel]): [*key, manifest.by_path[rel].sha256]
        for rel, key in sorted(manifest.hashed_ok.items(), key=lambda item: position[item[0]])
        if settled(key, report.started_ns)
    }
    if not files:
        return  # a bundle frozen moments ago: hashed again next time
    data = orjson.dumps({"schema": SCHEMA, "bundle": str(bundle.resolve()), "files": files})
    path = run_dir / VERIFIED_FILE
    try:
        if path.read_bytes() == data:
            return  # nothing new: no write, no fsync
    except OSError:
        pass
    atomic_write_bytes(path, data)
