"""``manifest.json``: every raw file of a bundle with its sha256 and size; freeze and verify.

Format (fixed; other tools write bundles with it)::

    {"schema_version": 1,
     "files": [{"path": "<posix relative>", "sha256": "sha256:<hex>", "size": <int>}, ...]}

sorted by path, ``manifest.json`` itself left out. Paths never leave the bundle: an
absolute path, a ``..`` part or a symlink that resolves outside is a :class:`BundleError`,
and symlinks are never followed out.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from pipeline.artifacts.versions import VERSIONS
from pipeline.bundle.request import check_relative, parse_bundle_json, read_bundle_bytes
from pipeline.bundle.sources import SOURCES_FILE
from pipeline.core.canonical import (
    StatKey,
    atomic_write_bytes,
    pretty_json_bytes,
    sha256_bytes,
    sha256_file,
    stat_key,
)
from pipeline.core.errors import BundleError
from pipeline.core.limits import check_count, check_size

MANIFEST_FILE = "manifest.json"
MANIFEST_SCHEMA_VERSION = VERSIONS["manifest"]
# describe the freeze, are not part of it (pipeline.bundle.sources: where an imported bundle's bytes came from)
_NOT_FROZEN = frozenset({MANIFEST_FILE, SOURCES_FILE})


class ManifestFileEntry(BaseModel):
    """One line of the manifest's file list (the schema of :class:`FileEntry`)."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="POSIX path relative to the bundle root")
    sha256: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    size: int = Field(ge=0)


class ManifestDoc(BaseModel):
    """The schema of ``manifest.json`` (read by :func:`read_manifest`, which checks more: path safety)."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = MANIFEST_SCHEMA_VERSION
    files: list[ManifestFileEntry] = Field(description="sorted by path, manifest.json itself left out")


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One frozen file."""

    path: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Manifest:
    """The frozen file list of a bundle."""

    files: tuple[FileEntry, ...]
    schema_version: int = MANIFEST_SCHEMA_VERSION
    by_path: dict[str, FileEntry] = field(init=False, repr=False, compare=False)
    # path -> stat_key (size, mtime_ns, ctime_ns, inode) of files whose bytes verify() hashed and found equal: a later
    # read_frozen of an unchanged file need not hash it again (the same idea as git's stat cache).
    hashed_ok: dict[str, StatKey] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_path", {f.path: f for f in self.files})

    def get(self, path: str) -> FileEntry:
        """The entry of one bundle-relative path; a file not in the manifest is a BundleError."""
        entry = self.by_path.get(path)
        if entry is None:
            raise BundleError(f"{path} is not in the bundle's {MANIFEST_FILE} (freeze the bundle again?)")
        return entry

    def to_json(self) -> dict[str, Any]:
        """The manifest as written to disk."""
        return {
            "schema_version": self.schema_version,
            "files": [{"path": f.path, "sha256": f.sha256, "size": f.size} for f in self.files],
        }


@dataclass
class VerifyReport:
    """What differs between a bundle and its manifest."""

    bundle: str
    files: int
    changed: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    unchanged_stat: int = 0  # files not hashed again: stat and manifest entry as when last hashed
    started_ns: int = 0  # wall clock before the first stat (what a stat cache must be older than)

    @property
    def ok(self) -> bool:
        """True when every file matches and nothing appeared."""
        return not (self.changed or self.missing or self.extra)

    def lines(self) -> list[str]:
        """One line per problem: ``changed: PATH``, ``missing: PATH``, ``extra: PATH``."""
        return (
            [f"changed: {p}" for p in self.changed]
            + [f"missing: {p}" for p in self.missing]
            + [f"extra: {p}" for p in self.extra]
        )

    def summary(self, limit: int = 5) -> str:
        """The problems on one line (first few names)."""
        lines = self.lines()
        text = "; ".join(lines[:limit])
        if len(lines) > limit:
            text += f"; and {len(lines) - limit} more"
        return text

    def to_json(self) -> dict[str, Any]:
        """Machine-readable form for ``--json``."""
        return {
            "bundle": self.bundle,
            "files": self.files,
            "ok": self.ok,
            "changed": self.changed,
            "missing": self.missing,
            "extra": self.extra,
        }


def _inside(root: Path, target: Path) -> bool:
    return target == root or root in target.parents


def resolve_in_bundle(bundle: Path, rel: str, what: str = "manifest path") -> Path:
    """The real path of a bundle-relative path, refusing absolute paths, ``..`` and symlinks out."""
    check_relative(rel, what)
    root = bundle.resolve()
    path = root / rel
    real = path.resolve()  # resolves symlinks along the whole path; never trusted blindly
    if not _inside(root, real):
        raise BundleError(f"{what} {rel!r} resolves outside the bundle (symlink to {real})")
    return path


def _walk(bundle: Path) -> dict[str, int]:
    """Every file under the bundle (POSIX relative path -> size), manifest.json left out (see :func:`_walk_stats`)."""
    return {rel: key[0] for rel, key in _walk_stats(bundle).items()}


def _walk_stats(bundle: Path) -> dict[str, StatKey]:
    """Every file under the bundle (POSIX relative path -> its stat_key), manifest.json left out.

    Symlinks are not followed: a symlink to a file inside the bundle is listed (its content is
    hashed); a symlink to a directory inside is skipped (its files are listed where they live);
    any symlink that resolves outside the bundle is a BundleError. os.scandir keeps this to about
    one system call per file, which matters for bundles of thousands of files.
    """
    root = bundle.resolve()
    found: dict[str, StatKey] = {}
    stack: list[tuple[str, str]] = [(str(root), "")]
    while stack:
        path, prefix = stack.pop()
        with os.scandir(path) as it:
            for entry in it:
                rel = prefix + entry.name
                if entry.is_symlink():
                    target = Path(entry.path).resolve()
                    if not _inside(root, target):
                        raise BundleError(f"bundle entry {rel!r} is a symlink that points outside the bundle")
                    if target.is_dir():
                        continue  # never walk through links, even inside
                    if not target.is_file():
                        raise BundleError(f"bundle entry {rel!r} is a symlink to something that is not a file")
                    found[rel] = stat_key(target.stat())
                elif entry.is_dir(follow_symlinks=False):
                    stack.append((entry.path, rel + "/"))
                elif entry.is_file(follow_symlinks=False):
                    if rel not in _NOT_FROZEN:
                        found[rel] = stat_key(entry.stat(follow_symlinks=False))
                else:
                    raise BundleError(f"bundle entry {rel!r} is not a regular file")
    return found


def iter_files(bundle: Path) -> Iterator[str]:
    """Every file of the bundle as a sorted POSIX relative path (see :func:`_walk` for symlinks)."""
    return iter(sorted(_walk(bundle)))


HASH_CHUNK_BYTES = 16 << 20  # bytes of files one thread hashes per task
# Below this many bytes one thread hashes everything: threads save little wall time on it (~0.25 s
# per 100 MB in one thread) and cost CPU (88 MB of a 1,000-cell bundle: 0.33 CPU s in threads, 0.24
# in one), which every rerun pays.
HASH_THREADS_FROM = 256 << 20


def _hash_all(paths: list[Path]) -> list[str]:
    return [sha256_file(p) for p in paths]


def _hash_many(paths: list[Path], sizes: list[int]) -> list[str]:
    """The sha256 of every file, in order; bundles of :data:`HASH_THREADS_FROM` bytes or more by a few threads.

    hashlib releases the GIL on large buffers, so threads hash big files in parallel; a task per
    file cost more than the hashing itself on a bundle of small files (11,500 files: 0.49 CPU s,
    against 0.21 in one thread), so each thread takes ~16 MiB of files per task.
    """
    if sum(sizes) < HASH_THREADS_FROM:
        return _hash_all(paths)
    chunks: list[list[Path]] = [[]]
    size = 0
    for p, n in zip(paths, sizes, strict=True):
        if size >= HASH_CHUNK_BYTES:
            chunks.append([])
            size = 0
        chunks[-1].append(p)
        size += n
    if len(chunks) == 1:
        return _hash_all(paths)
    with ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 2) + 1, len(chunks))) as pool:
        return [d for part in pool.map(_hash_all, chunks) for d in part]


def freeze(bundle: Path) -> Manifest:
    """Hash every file of the bundle and write ``manifest.json`` at its root."""
    if not bundle.is_dir():
        raise BundleError(f"bundle not found: {bundle}")
    found = _walk(bundle)
    rels = sorted(found)
    if not [r for r in rels if r != MANIFEST_FILE]:
        raise BundleError(f"nothing to freeze: {bundle} holds no files")
    check_count(len(rels), "LUNASOL_MAX_BUNDLE_FILES", str(bundle), "files")  # what run would refuse
    paths = [bundle / r for r in rels]
    digests = _hash_many(paths, [found[r] for r in rels])
    files = tuple(FileEntry(r, d, p.stat().st_size) for r, d, p in zip(rels, digests, paths, strict=True))
    manifest = Manifest(files=files)
    data = pretty_json_bytes(manifest.to_json())
    # run reads the manifest as one document: one it would refuse is never written
    check_size(len(data), "LUNASOL_MAX_DOC_BYTES", f"{bundle}/{MANIFEST_FILE}", "the manifest")
    atomic_write_bytes(bundle / MANIFEST_FILE, data)
    return manifest


# Inside remember_manifests(): sha256 of a manifest.json's bytes -> its checked (version, entries).
_remembered: dict[str, tuple[int, tuple[FileEntry, ...]]] | None = None


@contextmanager
def remember_manifests() -> Iterator[None]:
    """Inside, a manifest whose bytes were read and checked already is not parsed and checked again.

    A run reads the manifest before it starts and again at export (~0.2 s at 1,000 cells each).
    The key is the digest of the file's bytes, so an edited manifest is read afresh; the checks
    are of the bytes alone, so they hold for any bundle whose manifest has these bytes. Each
    read still gets its own :class:`Manifest` (``hashed_ok`` is never shared). Entries are kept
    until the block ends (the last manifest only).
    """
    global _remembered
    if _remembered is not None:  # nested: the outer block keeps and clears
        yield
        return
    _remembered = {}
    try:
        yield
    finally:
        _remembered = None


def read_manifest(bundle: Path) -> Manifest:
    """Read and check ``manifest.json`` (format, versions, path safety)."""
    if not bundle.is_dir():
        raise BundleError(f"bundle not found: {bundle}")
    raw = read_bundle_bytes(bundle, MANIFEST_FILE, f" (run: lunasol bundle freeze {bundle})")
    memo = _remembered
    key = sha256_bytes(raw) if memo is not None else ""
    if memo is not None and key in memo:
        version, files = memo[key]
        return Manifest(files=files, schema_version=version)
    manifest = _check_manifest(parse_bundle_json(MANIFEST_FILE, raw))
    if memo is not None:
        memo.clear()
        memo[key] = (manifest.schema_version, manifest.files)
    return manifest


def _check_manifest(data: Any) -> Manifest:
    if not isinstance(data, dict) or not isinstance(data.get("files"), list):
        raise BundleError(f"{MANIFEST_FILE}: expected an object with a 'files' list")
    version = data.get("schema_version")
    if type(version) is not int or version > MANIFEST_SCHEMA_VERSION or version < 1:  # "1" and true are not 1
        raise BundleError(f"{MANIFEST_FILE}: unsupported schema_version {version!r}")
    entries: list[FileEntry] = []
    seen: set[str] = set()
    check_count(len(data["files"]), "LUNASOL_MAX_BUNDLE_FILES", MANIFEST_FILE, "files")
    for i, item in enumerate(data["files"]):
        if not isinstance(item, dict) or set(item) != {"path", "sha256", "size"}:
            raise BundleError(f"{MANIFEST_FILE}: files[{i}] must have exactly path, sha256 and size")
        rel, sha, size = item["path"], item["sha256"], item["size"]
        if not isinstance(rel, str) or not isinstance(sha, str) or type(size) is not int:
            raise BundleError(f"{MANIFEST_FILE}: files[{i}] has wrongly typed fields")
        if not sha.startswith("sha256:") or len(sha) != 71:
            raise BundleError(f"{MANIFEST_FILE}: files[{i}] sha256 must read 'sha256:<64 hex>'")
        check_relative(rel, f"{MANIFEST_FILE}: path")
        if rel in seen:
            raise BundleError(f"{MANIFEST_FILE}: path {rel!r} is listed twice")
        seen.add(rel)
        entries.append(FileEntry(rel, sha, size))
    entries.sort(key=lambda e: e.path)
    return Manifest(files=tuple(entries), schema_version=version)


def verify(
    bundle: Path, manifest: Manifest | None = None, known: Mapping[str, tuple[StatKey, str]] | None = None
) -> VerifyReport:
    """Re-hash every listed file; report changed, missing and extra files (path escapes raise).

    ``known``: path -> (stat key, sha256) of files an earlier verify hashed
    (:mod:`pipeline.bundle.verified`); a file whose stat key and manifest sha256 are both unchanged
    is not hashed again. Without it every byte is hashed.
    """
    manifest = manifest or read_manifest(bundle)
    known = known or {}
    report = VerifyReport(bundle=str(bundle), files=len(manifest.files), started_ns=time.time_ns())
    # raises on any symlink out, so every file found is safe to read; its stat (taken before the file
    # is hashed) is what read_frozen compares to skip a second hash
    found = _walk_stats(bundle)
    to_hash: list[tuple[FileEntry, Path]] = []
    stats: list[StatKey] = []
    for entry in manifest.files:
        key = found.get(entry.path)
        if key is None:
            # Not seen by the walk: missing, behind a directory link, or escaping. Resolve to tell.
            path = resolve_in_bundle(bundle, entry.path)
            if not path.is_file():
                report.missing.append(entry.path)
                continue
            key = stat_key(path.stat())
        if key[0] != entry.size:
            report.changed.append(entry.path)  # no need to hash: the size already differs
        elif known.get(entry.path) == (key, entry.sha256):
            manifest.hashed_ok[entry.path] = key
            report.unchanged_stat += 1
        else:
            to_hash.append((entry, bundle / entry.path))
            stats.append(key)
    digests = _hash_many([p for _, p in to_hash], [e.size for e, _ in to_hash])
    for (entry, _), dig, key in zip(to_hash, digests, stats, strict=True):
        if dig != entry.sha256:
            report.changed.append(entry.path)
        else:
            manifest.hashed_ok[entry.path] = key
    report.changed.sort()
    report.extra = sorted(rel for rel in found if rel not in manifest.by_path)
    return report


def read_frozen(bundle: Path, rel: str, manifest: Manifest) -> bytes:
    """The bytes of one listed file, checked against the manifest (size and sha256) before use.

    A file that :func:`verify` hashed with this manifest object and whose size, mtime, ctime and inode
    are unchanged is not hashed twice (a fresh ``read_manifest`` always hashes).
    """
    entry = manifest.get(rel)
    path = resolve_in_bundle(bundle, rel)
    try:
        with path.open("rb") as fh:
            data = fh.read()
            key = stat_key(os.fstat(fh.fileno()))
    except FileNotFoundError:
        raise BundleError(f"{rel} is listed in {MANIFEST_FILE} but missing") from None
    if len(data) == entry.size and manifest.hashed_ok.get(rel) == key:
        return data  # hashed by verify() moments ago and untouched since (same size, mtime, ctime, inode)
    if len(data) != entry.size or sha256_bytes(data) != entry.sha256:
        raise BundleError(f"{rel} changed since the bundle was frozen (sha256 differs from {MANIFEST_FILE})")
    return data
