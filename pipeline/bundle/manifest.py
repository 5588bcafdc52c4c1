"""``manifest.json``: every raw file of a bundle with its sha256 and size; freeze and verify.

Format (fixed; other tools write bundles with it)::

    {"schema_version": 1,
     "files": [{"path": "<posix relative>", "sha256": "sha256:<hex>", "size": <int>}, ...]}

sorted by path, ``manifest.json`` itself left out. Paths never leave the bundle: an
absolute path, a ``..`` part or a symlink that resolves outside is a :class:`BundleError`,
and symlinks are never followed out.

Sized for 100,000 cells (1.2 million files, a 213 MB manifest): the file is read and written
one entry at a time, entries are held by column (:class:`FileList`, ~145 bytes a file), and what
:func:`verify` keeps per file (``hashed_ok``, the walk's stats, a run's known files) is arrays by
manifest position (:class:`StatTable`, ~33 bytes a file). Read + verify at 1.2 million files:
peak RSS 354 MiB (204 MiB held), where the tuple of entries alone took 695 MiB.
"""

from __future__ import annotations

import codecs
import hashlib
import os
import time
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any, BinaryIO, overload

import ijson
import orjson
from pydantic import BaseModel, ConfigDict, Field

from pipeline.artifacts.versions import VERSIONS
from pipeline.bundle.request import check_relative
from pipeline.bundle.sources import SOURCES_FILE
from pipeline.core.canonical import (
    StatKey,
    atomic_write_chunks,
    sha256_bytes,
    sha256_file,
    stat_key,
)
from pipeline.core.errors import BundleError
from pipeline.core.limits import check_count, limit

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


_DIGEST = 32  # bytes of a raw sha256
_PREFIX = "sha256:"


class PathList(Sequence[str]):
    """Sorted bundle paths held as one string and an ``array('q')`` of where each ends (~60 bytes a path).

    Not 1.2 million str objects (100,000 cells), ~100 bytes each: a manifest held ~100 bytes a file
    with its digest and size, where a list of paths made it 151 (a 100,000-cell run's start: 212 ->
    147 MiB). A path is made (a slice of the string) when it is indexed or iterated.
    """

    __slots__ = ("_ends", "_text")

    def __init__(self, text: str, ends: array[int]) -> None:
        self._text = text
        self._ends = ends  # each path's end in ``_text``; a path starts where the previous one ended

    @classmethod
    def of(cls, paths: Iterable[str]) -> PathList:
        """The paths of ``paths``, in order."""
        made = PathListBuilder()
        for path in paths:
            made.append(path)
        return made.build()

    def __len__(self) -> int:
        return len(self._ends)

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self._ends)))]
        end = self._ends[i]  # IndexError as a list's
        i %= len(self._ends)
        return self._text[self._ends[i - 1] if i else 0 : end]

    def __iter__(self) -> Iterator[str]:
        text, start = self._text, 0
        for end in self._ends:
            yield text[start:end]
            start = end

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PathList):
            return self._ends == other._ends and self._text == other._text
        if isinstance(other, list | tuple):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal by value, like the list it replaces

    def __repr__(self) -> str:
        return f"PathList({len(self._ends):,} paths)"


class PathListBuilder:
    """A :class:`PathList` made a path at a time: paths are joined a block at a time, never all held as objects."""

    __slots__ = ("_block", "_blocks", "_ends", "_size")
    BLOCK = 4096

    def __init__(self) -> None:
        self._blocks: list[str] = []
        self._block: list[str] = []
        self._ends = array("q")
        self._size = 0

    def append(self, path: str) -> None:
        """Add ``path`` after the others."""
        self._block.append(path)
        self._size += len(path)
        self._ends.append(self._size)
        if len(self._block) >= self.BLOCK:
            self._blocks.append("".join(self._block))
            self._block.clear()

    def build(self) -> PathList:
        """The paths added so far."""
        return PathList("".join([*self._blocks, *self._block]), self._ends)


class FileList(Sequence[FileEntry]):
    """A manifest's entries, held by column: ~140 bytes a file where a tuple of FileEntry took ~600.

    Paths (a sorted :class:`PathList`), one blob of raw 32-byte digests and an ``array('q')`` of sizes;
    a :class:`FileEntry` is made only when one is indexed or iterated. At 100,000 cells (1.2 million
    files) this is what a run keeps of the manifest.
    """

    __slots__ = ("_digests", "_sizes", "paths")

    def __init__(self, paths: Sequence[str], digests: bytes | bytearray, sizes: array[int]) -> None:
        if len(digests) != _DIGEST * len(paths) or len(sizes) != len(paths):
            raise ValueError("columns of unequal length")
        self.paths = paths if isinstance(paths, PathList) else PathList.of(paths)  # sorted by path; never mutated
        self._digests = digests
        self._sizes = sizes

    @classmethod
    def of(cls, entries: Iterable[FileEntry]) -> FileList:
        """The columns of ``entries`` (already sorted by path)."""
        paths = PathListBuilder()
        digests = bytearray()
        sizes = array("q")
        for e in entries:
            paths.append(e.path)
            digests += _raw_digest(e.sha256)
            sizes.append(e.size)
        return cls(paths.build(), digests, sizes)

    def __len__(self) -> int:
        return len(self.paths)

    @overload
    def __getitem__(self, i: int) -> FileEntry: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[FileEntry, ...]: ...

    def __getitem__(self, i: int | slice) -> FileEntry | tuple[FileEntry, ...]:
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(len(self.paths))))
        path = self.paths[i]  # IndexError as a tuple's
        i %= len(self.paths)
        return FileEntry(path, self.sha256(i), self._sizes[i])

    def __iter__(self) -> Iterator[FileEntry]:
        d = self._digests
        for i, (path, size) in enumerate(zip(self.paths, self._sizes, strict=True)):
            yield FileEntry(path, _PREFIX + d[i * _DIGEST : (i + 1) * _DIGEST].hex(), size)

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, FileEntry):
            return False
        i = self.position(value.path)
        return i >= 0 and self[i] == value

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FileList):
            return self.paths == other.paths and self._sizes == other._sizes and self._digests == other._digests
        if isinstance(other, tuple | list):
            return tuple(self) == tuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal by value, like the list it replaces

    def __repr__(self) -> str:
        return f"FileList({len(self.paths):,} files)"

    def under(self, root: str) -> range:
        """Positions of the files under directory ``root`` (``root/...``): two bisections of the sorted paths."""
        prefix = root.rstrip("/") + "/"
        lo = bisect_left(self.paths, prefix)
        return range(lo, bisect_left(self.paths, prefix + "\U0010ffff", lo))

    def position(self, path: str) -> int:
        """The index of ``path`` (a bisection of the sorted paths), -1 when it is not listed."""
        i = bisect_left(self.paths, path)
        return i if i < len(self.paths) and self.paths[i] == path else -1

    def sha256(self, i: int) -> str:
        """The ``sha256:<hex>`` of the ``i``-th file."""
        return _PREFIX + self._digests[i * _DIGEST : (i + 1) * _DIGEST].hex()

    def digest(self, i: int) -> bytes:
        """The raw 32-byte sha256 of the ``i``-th file."""
        return bytes(self._digests[i * _DIGEST : (i + 1) * _DIGEST])

    def size(self, i: int) -> int:
        """The size in bytes of the ``i``-th file."""
        return self._sizes[i]

    @property
    def sizes(self) -> array[int]:
        """Every file's size, in order (read-only by convention)."""
        return self._sizes


def _raw_digest(sha: str) -> bytes:
    raw = bytes.fromhex(sha[len(_PREFIX) :]) if sha.startswith(_PREFIX) and len(sha) == 71 else b""
    if len(raw) != _DIGEST or raw.hex() != sha[len(_PREFIX) :]:  # fromhex skips spaces and takes capitals
        raise ValueError(f"not a sha256:<64 lowercase hex>: {sha!r}")
    return raw


class StatTable(MutableMapping[str, StatKey]):
    """Path -> stat key of some files of a manifest, stored by position in four arrays (~33 bytes a file).

    ``Manifest.hashed_ok`` (and a run's known files, :class:`KnownFiles`) at 1.2 million files:
    a dict of path -> tuple took ~250 bytes a file. The arrays are made at the first entry.
    """

    __slots__ = ("_cols", "_count", "_has", "files")

    def __init__(self, files: FileList) -> None:
        self.files = files
        self._count = 0
        self._has: bytearray | None = None
        self._cols: tuple[array[int], array[int], array[int], array[int]] | None = None

    def _make(self) -> tuple[bytearray, tuple[array[int], array[int], array[int], array[int]]]:
        n = len(self.files)
        self._has = bytearray(n)
        # size, mtime_ns, ctime_ns: signed 64-bit; an inode is unsigned 64-bit
        self._cols = (array("q", [0]) * n, array("q", [0]) * n, array("q", [0]) * n, array("Q", [0]) * n)
        return self._has, self._cols

    def at(self, i: int) -> StatKey | None:
        """The stat key kept for the ``i``-th file of the manifest, None when there is none."""
        if self._has is None or self._cols is None or not self._has[i]:
            return None
        s, m, c, n = self._cols
        return (s[i], m[i], c[i], n[i])

    def put(self, i: int, key: StatKey) -> None:
        """Keep ``key`` for the ``i``-th file of the manifest."""
        has, cols = (self._has, self._cols) if self._has is not None and self._cols is not None else self._make()
        if not has[i]:
            has[i] = 1
            self._count += 1
        for col, value in zip(cols, key, strict=True):
            col[i] = value

    def keep_from(self, other: StatTable, ok: bytearray) -> None:
        """Add ``other``'s keys where ``ok`` is set; an empty table takes ``other``'s arrays (no copy)."""
        if other._has is None or other._cols is None:
            return
        if self._count == 0:
            self._has, self._cols = _bytes_and(other._has, ok), other._cols
            self._count = self._has.count(1)
            other._has, other._cols, other._count = None, None, 0
            return
        for i in other.positions():
            key = other.at(i)
            if ok[i] and key is not None:
                self.put(i, key)

    def positions(self) -> Iterator[int]:
        """The manifest positions that have a stat key, ascending."""
        has = self._has
        if has is None:
            return iter(())
        return (i for i, flag in enumerate(has) if flag)

    def get(self, path: str, default: Any = None) -> Any:  # Mapping.get, without an exception per miss
        """The stat key of ``path``, else ``default``."""
        i = self.files.position(path)
        key = self.at(i) if i >= 0 else None
        return default if key is None else key

    def __getitem__(self, path: str) -> StatKey:
        key = self.get(path)
        if key is None:
            raise KeyError(path)
        return key  # type: ignore[no-any-return]

    def __setitem__(self, path: str, key: StatKey) -> None:
        i = self.files.position(path)
        if i < 0:
            raise KeyError(f"{path} is not in the manifest")
        self.put(i, key)

    def __delitem__(self, path: str) -> None:
        i = self.files.position(path)
        if i < 0 or self._has is None or not self._has[i]:
            raise KeyError(path)
        self._has[i] = 0
        self._count -= 1

    def __iter__(self) -> Iterator[str]:
        paths = self.files.paths
        return (paths[i] for i in self.positions())

    def __len__(self) -> int:
        return self._count


def _bytes_and(flags: bytearray, mask: bytearray) -> bytearray:
    """``flags`` where ``mask`` is set too (two flag arrays of 0 and 1, equal length), as a new array."""
    both = int.from_bytes(flags, "little") & int.from_bytes(mask, "little")
    return bytearray(both.to_bytes(len(flags), "little"))


class KnownFiles(Mapping[str, tuple[StatKey, str]]):
    """Path -> (stat key when hashed, sha256) of files an earlier verify hashed, held as a :class:`StatTable`.

    Only files whose recorded sha256 is still the manifest's are kept (:mod:`pipeline.bundle.verified`).
    """

    __slots__ = ("table",)

    def __init__(self, files: FileList) -> None:
        self.table = StatTable(files)

    def __getitem__(self, path: str) -> tuple[StatKey, str]:
        i = self.table.files.position(path)
        key = self.table.at(i) if i >= 0 else None
        if key is None:
            raise KeyError(path)
        return key, self.table.files.sha256(i)

    def __iter__(self) -> Iterator[str]:
        return iter(self.table)

    def __len__(self) -> int:
        return len(self.table)


class _ByPath(Mapping[str, FileEntry]):
    """``Manifest.by_path``: a path's entry by bisection of the sorted paths (no dict of every file)."""

    __slots__ = ("files",)

    def __init__(self, files: FileList) -> None:
        self.files = files

    def __getitem__(self, path: str) -> FileEntry:
        i = self.files.position(path)
        if i < 0:
            raise KeyError(path)
        return self.files[i]

    def __contains__(self, path: object) -> bool:
        return isinstance(path, str) and self.files.position(path) >= 0

    def __iter__(self) -> Iterator[str]:
        return iter(self.files.paths)

    def __len__(self) -> int:
        return len(self.files)


@dataclass(frozen=True)
class Manifest:
    """The frozen file list of a bundle (``files`` may be given as any sorted sequence of FileEntry)."""

    files: FileList
    schema_version: int = MANIFEST_SCHEMA_VERSION
    by_path: Mapping[str, FileEntry] = field(init=False, repr=False, compare=False)
    # stat_key (size, mtime_ns, ctime_ns, inode) of files whose bytes verify() hashed and found equal, by path: a
    # later read_frozen of an unchanged file need not hash it again (the same idea as git's stat cache).
    hashed_ok: StatTable = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.files, FileList):
            object.__setattr__(self, "files", FileList.of(self.files))
        object.__setattr__(self, "by_path", _ByPath(self.files))
        object.__setattr__(self, "hashed_ok", StatTable(self.files))

    def part(self, positions: Sequence[int]) -> Manifest:
        """The entries at ``positions`` (ascending) as a manifest of their own, with their ``hashed_ok`` keys.

        What an export worker is given for one task (:mod:`pipeline.ir.pool`): the files of the
        task's cells, not the whole bundle's (1.2 million files at 100,000 cells). A file
        verify() found unchanged stays so in the part (read_frozen does not hash it again).
        """
        files = self.files
        d = files._digests
        paths = [files.paths[i] for i in positions]
        digests = b"".join(d[i * _DIGEST : (i + 1) * _DIGEST] for i in positions)
        sizes = array("q", (files.sizes[i] for i in positions))
        part = Manifest(files=FileList(paths, digests, sizes), schema_version=self.schema_version)
        for j, i in enumerate(positions):
            key = self.hashed_ok.at(i)
            if key is not None:
                part.hashed_ok.put(j, key)
        return part

    def get(self, path: str) -> FileEntry:
        """The entry of one bundle-relative path; a file not in the manifest is a BundleError."""
        i = self.files.position(path)
        if i < 0:
            raise BundleError(f"{path} is not in the bundle's {MANIFEST_FILE} (freeze the bundle again?)")
        return self.files[i]

    def to_json(self) -> dict[str, Any]:
        """The manifest as written to disk."""
        return {
            "schema_version": self.schema_version,
            "files": [{"path": f.path, "sha256": f.sha256, "size": f.size} for f in self.files],
        }

    def json_chunks(self, entries_per_chunk: int = 4096) -> Iterator[bytes]:
        """``manifest.json``'s bytes (equal to ``pretty_json_bytes(self.to_json())``), a few thousand files a chunk."""
        files = self.files
        yield b'{\n  "files": [' if files else b'{\n  "files": [],'
        d, sizes, paths = files._digests, files._sizes, files.paths
        for lo in range(0, len(paths), entries_per_chunk):
            parts: list[bytes] = []
            for i in range(lo, min(lo + entries_per_chunk, len(paths))):
                try:
                    path = orjson.dumps(paths[i])
                except orjson.JSONEncodeError:
                    raise BundleError(f"bundle path {paths[i]!r} is not valid UTF-8") from None
                parts.append(
                    b'%s\n    {\n      "path": %s,\n      "sha256": "sha256:%s",\n      "size": %d\n    }'
                    % (b"," if i else b"", path, d[i * _DIGEST : (i + 1) * _DIGEST].hex().encode(), sizes[i])
                )
            yield b"".join(parts)
        yield (
            b'\n  ],\n  "schema_version": %d\n}\n' % self.schema_version
            if files
            else (b'\n  "schema_version": %d\n}\n' % self.schema_version)
        )


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
    """Every file under the bundle (POSIX relative path -> size), manifest.json left out (see :func:`_scan`)."""
    return {rel: key[0] for rel, key in _scan(bundle)}


def _walk_stats(bundle: Path) -> dict[str, StatKey]:
    """Every file under the bundle (POSIX relative path -> its stat_key), manifest.json left out (see :func:`_scan`)."""
    return dict(_scan(bundle))


def _scan(bundle: Path) -> Iterator[tuple[str, StatKey]]:
    """Every file under the bundle as (POSIX relative path, its stat_key), manifest.json left out, in no order.

    Symlinks are not followed: a symlink to a file inside the bundle is listed (its content is
    hashed); a symlink to a directory inside is skipped (its files are listed where they live);
    any symlink that resolves outside the bundle is a BundleError. os.scandir keeps this to about
    one system call per file, which matters for bundles of thousands of files; nothing is kept
    per file (1.2 million files at 100,000 cells).
    """
    root = bundle.resolve()
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
                    yield rel, stat_key(target.stat())
                elif entry.is_dir(follow_symlinks=False):
                    stack.append((entry.path, rel + "/"))
                elif entry.is_file(follow_symlinks=False):
                    if rel not in _NOT_FROZEN:
                        yield rel, stat_key(entry.stat(follow_symlinks=False))
                else:
                    raise BundleError(f"bundle entry {rel!r} is not a regular file")


def iter_files(bundle: Path) -> Iterator[str]:
    """Every file of the bundle as a sorted POSIX relative path (see :func:`_scan` for symlinks)."""
    return iter(sorted(rel for rel, _ in _scan(bundle)))


HASH_CHUNK_BYTES = 16 << 20  # bytes of files one thread hashes per task
# Below this many bytes one thread hashes everything: threads save little wall time on it (~0.25 s
# per 100 MB in one thread) and cost CPU (88 MB of a 1,000-cell bundle: 0.33 CPU s in threads, 0.24
# in one), which every rerun pays.
HASH_THREADS_FROM = 256 << 20


def _hash_range(root: Path, rels: Sequence[str], idx: Sequence[int], lo: int, hi: int) -> bytes:
    # the raw digests of rels[idx[lo:hi]], 32 bytes a file: no list of Path or str per file is kept
    return b"".join(bytes.fromhex(sha256_file(root / rels[idx[k]])[len(_PREFIX) :]) for k in range(lo, hi))


def _hash_many(root: Path, rels: Sequence[str], idx: Sequence[int], sizes: Sequence[int]) -> Iterator[bytes]:
    """The raw sha256 of each file ``root/rels[i]``, ``i`` in ``idx``: 32 bytes each, in order, a run of files a time.

    hashlib releases the GIL on large buffers, so threads hash big files in parallel; a task per
    file cost more than the hashing itself on a bundle of small files (11,500 files: 0.49 CPU s,
    against 0.21 in one thread), so each thread takes ~16 MiB of files per task. Under
    :data:`HASH_THREADS_FROM` bytes in all, one thread hashes everything.
    """
    total = sum(sizes[i] for i in idx)
    bounds: list[tuple[int, int]] = []
    lo, size = 0, 0
    for k, i in enumerate(idx):
        if size >= HASH_CHUNK_BYTES:
            bounds.append((lo, k))
            lo, size = k, 0
        size += sizes[i]
    bounds.append((lo, len(idx)))
    if total < HASH_THREADS_FROM or len(bounds) == 1:
        for lo, hi in bounds:
            yield _hash_range(root, rels, idx, lo, hi)
        return
    with ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 2) + 1, len(bounds))) as pool:
        yield from pool.map(lambda b: _hash_range(root, rels, idx, *b), bounds)


def freeze(bundle: Path) -> Manifest:
    """Hash every file of the bundle and write ``manifest.json`` at its root (streamed, a few MB held at a time)."""
    if not bundle.is_dir():
        raise BundleError(f"bundle not found: {bundle}")
    cap = limit("LUNASOL_MAX_BUNDLE_FILES")
    found: list[tuple[str, int]] = []
    for rel, key in _scan(bundle):
        found.append((rel, key[0]))
        if len(found) > cap:  # what run would refuse; counted as found, so a huge tree costs at most the cap
            check_count(len(found), "LUNASOL_MAX_BUNDLE_FILES", str(bundle), "files (at least)")
    if not found:
        raise BundleError(f"nothing to freeze: {bundle} holds no files")
    found.sort()
    rels = [r for r, _ in found]
    sizes = array("q", (n for _, n in found))
    del found
    digests = b"".join(_hash_many(bundle, rels, range(len(rels)), sizes))
    manifest = Manifest(files=FileList(rels, digests, sizes))
    atomic_write_chunks(bundle / MANIFEST_FILE, manifest.json_chunks())
    return manifest


# Inside remember_manifests(): sha256 of a manifest.json's bytes -> its checked (version, entries).
_remembered: dict[str, tuple[int, FileList]] | None = None


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


def forget_manifests() -> None:
    """Drop what :func:`remember_manifests` holds (a later read parses again); the block goes on.

    The run calls it once its export is done: no later stage reads the manifest, and at 100,000
    cells its 1.2 million entries are ~170 MB the other stages need not carry.
    """
    if _remembered is not None:
        _remembered.clear()


def read_manifest(bundle: Path) -> Manifest:
    """Read and check ``manifest.json`` (format, versions, path safety), one entry at a time.

    The manifest is not read as one document (it is ~180 bytes a file: 213 MB at 1.2 million files),
    so ``LUNASOL_MAX_DOC_BYTES`` does not apply; the entries are bounded by ``LUNASOL_MAX_BUNDLE_FILES``,
    checked as they come, and held by column (:class:`FileList`).
    """
    if not bundle.is_dir():
        raise BundleError(f"bundle not found: {bundle}")
    path = bundle / MANIFEST_FILE
    if not path.is_file():
        raise BundleError(f"missing {MANIFEST_FILE} in bundle {bundle} (run: lunasol bundle freeze {bundle})")
    memo = _remembered
    with path.open("rb") as fh:
        key = ""
        if memo is not None:
            key = _PREFIX + hashlib.file_digest(fh, "sha256").hexdigest()
            if key in memo:
                version, files = memo[key]
                return Manifest(files=files, schema_version=version)
            fh.seek(0)
        manifest = _check_manifest(fh)
    if memo is not None:
        memo.clear()
        memo[key] = (manifest.schema_version, manifest.files)
    return manifest


_ENTRY_KEYS = frozenset({"path", "sha256", "size"})
_Events = Iterator[tuple[str, Any]]


def _skip(events: _Events, event: str) -> None:
    """Consume the rest of a value that began with ``event`` (nested ones without recursion)."""
    depth = 1 if event in ("start_map", "start_array") else 0
    while depth:
        event, _ = next(events)
        if event in ("start_map", "start_array"):
            depth += 1
        elif event in ("end_map", "end_array"):
            depth -= 1


def _first_line(exc: Exception) -> str:
    text = exc.args[0] if exc.args else str(exc)
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return str(text).strip().splitlines()[0] if str(text).strip() else type(exc).__name__


def _check_utf8(fh: BinaryIO) -> None:
    """Refuse bytes that are not UTF-8 naming the line and byte, as for the other bundle JSON files."""
    fh.seek(0)
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, lines = 0, 1
    while chunk := fh.read(1 << 20):
        try:
            decoder.decode(chunk)
        except UnicodeDecodeError as exc:
            at = offset + exc.start
            line = lines + chunk.count(b"\n", 0, exc.start)
            raise BundleError(f"{MANIFEST_FILE}: not UTF-8 (line {line}, byte {at}); save it as UTF-8") from None
        offset += len(chunk)
        lines += chunk.count(b"\n")


class _BadEntry(Exception):
    """An entry of the file list is malformed (reported once the schema_version is known)."""


def _check_manifest(fh: BinaryIO) -> Manifest:
    """Parse and check a manifest from its bytes, streamed: one BundleError line for anything wrong."""
    try:
        return _parse_manifest(ijson.basic_parse(fh, use_float=True))
    except ijson.JSONError as exc:
        size = fh.seek(0, os.SEEK_END)
        if size < 4096 and not (fh.seek(0) or fh.read().strip()):  # nothing but white space
            raise BundleError(f"{MANIFEST_FILE}: empty file (expected a JSON object)") from None
        _check_utf8(fh)
        raise BundleError(f"{MANIFEST_FILE}: invalid JSON ({_first_line(exc)})") from None
    except StopIteration:  # the parser ends a truncated document with an error, never here; kept for safety
        raise BundleError(f"{MANIFEST_FILE}: invalid JSON (truncated)") from None


def _parse_manifest(events: _Events) -> Manifest:
    shape = BundleError(f"{MANIFEST_FILE}: expected an object with a 'files' list")
    event, _ = next(events)
    if event != "start_map":
        _skip(events, event)
        for _ in events:  # trailing data is invalid JSON: the parser says so first
            pass
        raise shape
    version: Any = None
    keys: set[str] = set()
    columns: tuple[PathList, bytearray, array[int]] | None = None
    bad: str | None = None
    for event, key in events:
        if event == "end_map":
            break
        if key in keys:
            raise BundleError(f"{MANIFEST_FILE}: key {key!r} appears twice in one object")
        keys.add(key)
        event, value = next(events)
        if key == "files" and event == "start_array":
            try:
                columns = _read_entries(events)
            except _BadEntry as exc:
                bad = str(exc)
                _skip(events, "start_array")  # the rest of the list, to find the schema_version after it
        elif key == "schema_version" and event not in ("start_map", "start_array"):
            version = value
        else:
            _skip(events, event)
    for _ in events:
        pass  # to the end: trailing data is refused by the parser
    if columns is None and bad is None:
        raise shape
    if type(version) is not int or version > MANIFEST_SCHEMA_VERSION or version < 1:  # "1" and true are not 1
        raise BundleError(f"{MANIFEST_FILE}: unsupported schema_version {version!r}")
    if columns is None:
        raise BundleError(str(bad))
    return Manifest(files=_sorted_files(*columns), schema_version=version)


def _read_entries(events: _Events) -> tuple[PathList, bytearray, array[int]]:
    """The entries of the ``files`` list, checked one by one, into columns; the cap checked as they come."""
    cap = limit("LUNASOL_MAX_BUNDLE_FILES")
    paths = PathListBuilder()
    digests = bytearray()
    sizes = array("q")
    for i, (event, _) in enumerate(events):  # the loops inside take the rest of each entry
        if event == "end_array":
            return paths.build(), digests, sizes
        if i >= cap:
            check_count(i + 1, "LUNASOL_MAX_BUNDLE_FILES", MANIFEST_FILE, "files (at least)")
        where = f"{MANIFEST_FILE}: files[{i}]"
        if event != "start_map":
            _skip(events, event)  # to the end of this entry: the caller skips the rest of the list
            raise _BadEntry(f"{where} must have exactly path, sha256 and size")
        item: dict[str, tuple[str, Any]] = {}
        for event, key in events:
            if event == "end_map":
                break
            if key in item:
                raise BundleError(f"{MANIFEST_FILE}: key {key!r} appears twice in one object")
            event, value = next(events)
            _skip(events, event)
            item[key] = (event, value)
        if item.keys() != _ENTRY_KEYS:
            raise _BadEntry(f"{where} must have exactly path, sha256 and size")
        (pe, rel), (se, sha), (ze, size) = item["path"], item["sha256"], item["size"]
        if pe != "string" or se != "string" or ze != "number" or type(size) is not int:
            raise _BadEntry(f"{where} has wrongly typed fields")
        try:
            raw = _raw_digest(sha)
        except ValueError:
            raise _BadEntry(f"{where} sha256 must read 'sha256:<64 hex>'") from None
        if not 0 <= size < 1 << 63:
            raise _BadEntry(f"{where} size {size} is not a file size")
        check_relative(rel, f"{MANIFEST_FILE}: path")
        paths.append(rel)
        digests += raw
        sizes.append(size)
    raise StopIteration  # unreachable: the parser raises on a truncated document


def _sorted_files(paths: Sequence[str], digests: bytearray, sizes: array[int]) -> FileList:
    """The columns sorted by path (a manifest is written sorted; another tool's may not be); a path twice refused."""
    if not all(a < b for a, b in pairwise(paths)):
        order = sorted(range(len(paths)), key=paths.__getitem__)
        paths = [paths[i] for i in order]
        digests = bytearray(b"".join(digests[i * _DIGEST : (i + 1) * _DIGEST] for i in order))
        sizes = array("q", (sizes[i] for i in order))
        for a, b in pairwise(paths):
            if a == b:
                raise BundleError(f"{MANIFEST_FILE}: path {a!r} is listed twice")
    return FileList(paths, digests, sizes)


def verify(
    bundle: Path, manifest: Manifest | None = None, known: Mapping[str, tuple[StatKey, str]] | None = None
) -> VerifyReport:
    """Re-hash every listed file; report changed, missing and extra files (path escapes raise).

    ``known``: path -> (stat key, sha256) of files an earlier verify hashed
    (:mod:`pipeline.bundle.verified`); a file whose stat key and manifest sha256 are both unchanged
    is not hashed again. Without it every byte is hashed. Per file only arrays are kept (the walk's
    stats and the files to hash by manifest position).
    """
    manifest = manifest or read_manifest(bundle)
    files = manifest.files
    report = VerifyReport(bundle=str(bundle), files=len(files), started_ns=time.time_ns())
    # raises on any symlink out, so every file found is safe to read; its stat (taken before the file
    # is hashed) is what read_frozen compares to skip a second hash
    found = StatTable(files)  # becomes hashed_ok, less the files that differ: one table per file, not two
    ok = bytearray(len(files))
    for rel, walked in _scan(bundle):
        i = files.position(rel)
        if i < 0:
            report.extra.append(rel)
        else:
            found.put(i, walked)
    table = known.table if isinstance(known, KnownFiles) and known.table.files is files else None
    by_path = known if known and table is None else None
    to_hash = array("q")
    for i, (rel, size) in enumerate(zip(files.paths, files.sizes, strict=True)):
        key = found.at(i)
        if key is None:
            # Not seen by the walk: missing, behind a directory link, or escaping. Resolve to tell.
            path = resolve_in_bundle(bundle, rel)
            if not path.is_file():
                report.missing.append(rel)
                continue
            key = stat_key(path.stat())
            found.put(i, key)
        if key[0] != size:
            report.changed.append(rel)  # no need to hash: the size already differs
        elif (table is not None and table.at(i) == key) or (
            by_path is not None and by_path.get(rel) == (key, files.sha256(i))
        ):
            ok[i] = 1
            report.unchanged_stat += 1
        else:
            to_hash.append(i)
    k = 0
    for digests in _hash_many(bundle, files.paths, to_hash, files.sizes):  # compared a chunk at a time
        for n in range(len(digests) // _DIGEST):
            i = to_hash[k + n]
            if digests[n * _DIGEST : (n + 1) * _DIGEST] != files.digest(i):
                report.changed.append(files.paths[i])
            else:
                ok[i] = 1
        k += len(digests) // _DIGEST
    manifest.hashed_ok.keep_from(found, ok)
    report.changed.sort()
    report.extra.sort()
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
