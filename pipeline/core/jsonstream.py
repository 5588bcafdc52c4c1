"""Pretty JSON written piece by piece: a document whose lists are too large to hold whole in Python.

The bytes equal :func:`pipeline.core.canonical.pretty_json_plain` of the whole document (orjson,
2-space indent, sorted keys), for the same data: strings, whole numbers, booleans and None.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

_OPTS = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS


@dataclass(frozen=True)
class Items:
    """A list value given as an iterable of its items, written one at a time."""

    items: Iterable[Any]


def _indented(obj: Any, depth: int) -> bytes:
    # JSON strings never hold a raw newline, so every b"\n" is a line break of the layout
    pad = b"  " * depth
    return orjson.dumps(obj, option=_OPTS).replace(b"\n", b"\n" + pad)


@dataclass(frozen=True)
class Fields:
    """An object value written field by field: its values may be :class:`Items` or :class:`Fields` themselves."""

    fields: dict[str, Any]


def _chunks(value: Any, depth: int) -> Iterator[bytes]:
    # ``value`` at ``depth`` levels of indentation, its first line already placed by the caller
    pad = b"\n" + b"  " * depth
    if isinstance(value, Items):
        first = True
        for item in value.items:
            yield (b"[" if first else b",") + pad + b"  "
            yield from _chunks(item, depth + 1)
            first = False
        yield b"[]" if first else pad + b"]"
    elif isinstance(value, Fields):
        if not value.fields:
            yield b"{}"
            return
        for i, key in enumerate(sorted(value.fields)):
            yield (b"," if i else b"{") + pad + b"  " + orjson.dumps(key) + b": "
            yield from _chunks(value.fields[key], depth + 1)
        yield pad + b"}"
    else:
        yield _indented(value, depth)


def pretty_object(fields: dict[str, Any]) -> Iterator[bytes]:
    """Chunks of the pretty JSON of an object whose values may be :class:`Items` (streamed lists) or :class:`Fields`."""
    if not fields:
        yield b"{}\n"
        return
    yield from _chunks(Fields(fields), 0)
    yield b"\n"


def atomic_write_chunks(path: Path, chunks: Iterable[bytes]) -> None:
    """Write ``chunks`` via a synced temp file in the same directory and rename (never half a file)."""
    from pipeline.core.canonical import _umask  # the same mode as every other artifact

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as fh:
            for chunk in chunks:
                fh.write(chunk)
            fh.flush()
            if os.environ.get("LUNASOL_TEST_NO_FSYNC") != "1":  # as canonical._synced_temp
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
