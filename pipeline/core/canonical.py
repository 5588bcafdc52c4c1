"""Canonical JSON, algorithm-tagged digests and atomic writes: the one place for each."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel


def _default(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if isinstance(obj, Path):
        return obj.as_posix()
    if isinstance(obj, set | frozenset):
        return sorted(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def canonical_json(obj: Any) -> str:
    """Sorted keys, compact separators, UTF-8 kept: equal data gives equal bytes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_default)


_PLAIN_SCALARS = frozenset({str, int, bool, type(None)})
_STR_ONLY = frozenset({str})
_PLAIN_OPTIONS = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS


def _is_plain(obj: Any) -> bool:
    """True when ``obj`` holds only dicts with str keys, lists, tuples, str, int, bool and None (exact types).

    For such data orjson writes the bytes ``json.dumps`` would (floats are spelt differently, and
    anything else goes through :func:`_default`); one pass over the tree costs a fraction of
    ``json.dumps(indent=2)``, which runs in pure Python (its C encoder does not indent).
    """
    stack = [obj]
    pop, extend = stack.pop, stack.extend
    while stack:
        x = pop()
        t = type(x)
        if t is dict:
            if not _STR_ONLY.issuperset(map(type, x)):
                return False
            extend(x.values())
        elif t is list or t is tuple:
            extend(x)
        elif t not in _PLAIN_SCALARS:
            return False
    return True


def _orjson_pretty(obj: Any) -> bytes | None:
    """The pretty bytes of plain data from orjson (equal to json.dumps'); None when json.dumps must spell it."""
    try:
        # orjson first: it refuses what it cannot spell (other types, ints past 64 bits, lone
        # surrogates, nesting past 254 levels), so the walk below never meets a cycle
        data = orjson.dumps(obj, option=_PLAIN_OPTIONS)
    except orjson.JSONEncodeError:
        return None
    return data + b"\n" if _is_plain(obj) else None


def _json_pretty(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False, default=_default) + "\n"


def pretty_json(obj: Any) -> str:
    """Sorted keys and indentation for artifacts people read; still deterministic."""
    fast = _orjson_pretty(obj)
    return fast.decode("utf-8") if fast is not None else _json_pretty(obj)


def pretty_json_bytes(obj: Any) -> bytes:
    """:func:`pretty_json` as UTF-8 bytes (orjson for plain data, see :func:`_is_plain`: the same bytes)."""
    fast = _orjson_pretty(obj)
    return fast if fast is not None else _json_pretty(obj).encode("utf-8")


def pretty_json_plain(obj: Any) -> bytes:
    """:func:`pretty_json` as UTF-8 bytes, fast (orjson), for data of strings, whole numbers, booleans and None.

    For such data the bytes are equal to pretty_json's (tested); floats are spelt differently by
    orjson, so documents that may hold one go through pretty_json.
    """
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"


def sha256_bytes(data: bytes) -> str:
    """Digest of raw bytes as ``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def sha256_text(text: str) -> str:
    """Digest of UTF-8 text as ``sha256:<hex>``."""
    return sha256_bytes(text.encode("utf-8"))


def digest(obj: Any) -> str:
    """Digest of the canonical JSON of ``obj``."""
    return sha256_text(canonical_json(obj))


StatKey = tuple[int, int, int, int]


RACY_NS = 3_000_000_000
"""A file changed less than this before its stat was taken is never trusted by that stat later.

Filesystems stamp times coarsely (a few ms on ext4, 2 s on FAT): an edit made in the same tick as
the stat, after the read, would leave the stat key unchanged (git's "racy" entries).
"""


def settled(key: StatKey, now_ns: int) -> bool:
    """Whether a stat key taken at ``now_ns`` (wall clock) may stand for the file's bytes later."""
    return key[1] < now_ns - RACY_NS and key[2] < now_ns - RACY_NS


def stat_key(st: os.stat_result) -> StatKey:
    """(size, mtime_ns, ctime_ns, inode): equal keys mean a file hashed once need not be hashed again.

    An atomic write is a new inode; an edit in place changes the size, the mtime or the ctime.
    """
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Digest of a file's bytes, streamed."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return "sha256:" + h.hexdigest()


def _umask() -> int:
    """The process umask (read by setting it and putting it back: the only portable way)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _synced_temp(path: Path, data: bytes) -> str:
    """A temp file holding ``data``, synced, in ``path``'s directory (so a rename or link is atomic)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes 0600; a shared runs directory needs what the user's umask gives (0644 under 022)
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            # The tests kill processes but never the machine: a file in the page cache survives a
            # kill, so their LUNASOL_TEST_NO_FSYNC=1 skips the disk wait (most of a loaded CI's I/O).
            if os.environ.get("LUNASOL_TEST_NO_FSYNC") != "1":
                os.fsync(fh.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write via a temp file in the same directory and rename, so readers never see half a file."""
    tmp = _synced_temp(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_chunks(path: Path, chunks: Iterable[bytes]) -> str:
    """:func:`atomic_write_bytes` of the chunks' concatenation, never held whole; its ``sha256:`` digest."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    h = hashlib.sha256()
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as fh:
            for chunk in chunks:
                h.update(chunk)
                fh.write(chunk)
            fh.flush()
            if os.environ.get("LUNASOL_TEST_NO_FSYNC") != "1":  # as in _synced_temp
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return "sha256:" + h.hexdigest()


def same_bytes(path: Path, chunks: Iterable[bytes]) -> bool:
    """Whether the file at ``path`` holds exactly ``b"".join(chunks)`` (read alongside; False when absent)."""
    try:
        fh = path.open("rb")
    except OSError:
        return False
    with fh:
        for chunk in chunks:
            if fh.read(len(chunk)) != chunk:
                return False
        return not fh.read(1)


def atomic_create_bytes(path: Path, data: bytes) -> bool:
    """Create ``path`` with ``data`` only if it does not exist (False if it does); never half a file.

    A hard link of a synced temp file: the link fails when ``path`` exists, so of two writers
    racing for the same path exactly one wins.
    """
    tmp = _synced_temp(path, data)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        Path(tmp).unlink(missing_ok=True)
    return True


def atomic_write_text(path: Path, text: str) -> None:
    """Atomic write of UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: Path, obj: Any) -> str:
    """Atomically write ``obj`` as pretty canonical JSON; return the digest of the written bytes."""
    data = pretty_json_bytes(obj)
    atomic_write_bytes(path, data)
    return sha256_bytes(data)


def write_jsonl(path: Path, rows: list[Any]) -> str:
    """Atomically write one canonical JSON object per line; return the digest of the written bytes."""
    data = "".join(canonical_json(r) + "\n" for r in rows).encode("utf-8")
    atomic_write_bytes(path, data)
    return sha256_bytes(data)


def read_json(path: Path) -> Any:
    """Read a JSON file (UTF-8)."""
    return json.loads(path.read_text(encoding="utf-8"))
