"""Bounded reads: how much of a hostile input lunasol parses before it refuses, with one line.

A bundle or an imported log is data from elsewhere. Without bounds a 60 MB JSON line became
2 GB of Python objects, a 1.5 MB ``.eval`` zip held a 1.5 GiB member, and a 100k-deep array
overflowed the parser's stack. Every refusal here is a :class:`BundleError` (exit 2) naming
the file and the line or member. The limits are far above any real log (the largest line in
the public data under /work/shared/data is 0.3 MB) and each can be raised by an env var:

=============================  ==========  ==========================================
``LUNASOL_MAX_LINE_BYTES``     16 MiB      one JSON Lines record
``LUNASOL_MAX_DOC_BYTES``      64 MiB      one whole JSON document (a ``.json`` log, a zip member)
``LUNASOL_MAX_FILE_BYTES``     256 MiB     one log file read whole (native JSON Lines)
``LUNASOL_MAX_ZIP_RATIO``      200         decompressed / compressed size of a zip member over 1 MiB
``LUNASOL_MAX_BUNDLE_FILES``   5,000,000   files in one bundle (``bundle freeze`` refuses what ``run`` would)
``LUNASOL_MAX_ZIP_MEMBERS``    50,000      members of one archive (an Inspect ``.eval``)
``LUNASOL_MAX_CELL_EVENTS``    1,000,000   events read from one cell
=============================  ==========  ==========================================

Counts are bounded like sizes: a 200,000-member ``.eval`` imported at 1.57 GiB; it is now one
line up front. A bundle's ``manifest.json`` is not a document under ``LUNASOL_MAX_DOC_BYTES``: it
is read one entry at a time and held by column (~150 bytes a file), so what bounds it is the file
count, checked as the entries come (a native bundle holds ~12 files a cell: 100,000 cells are 1.2
million files, a 213 MB manifest; the cap leaves room for four times that).

Nesting depth needs no setting: orjson refuses past 1,024 levels and the standard parser's
recursion error is caught (:func:`parse_json`), so a deep document is one clear line too.
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Callable
from typing import Any

from pipeline.core.errors import BadInput, BundleError

MiB = 1024 * 1024
_DEFAULTS = {
    "LUNASOL_MAX_LINE_BYTES": 16 * MiB,
    "LUNASOL_MAX_DOC_BYTES": 64 * MiB,
    "LUNASOL_MAX_FILE_BYTES": 256 * MiB,
    "LUNASOL_MAX_ZIP_RATIO": 200,
    "LUNASOL_MAX_BUNDLE_FILES": 5_000_000,
    "LUNASOL_MAX_ZIP_MEMBERS": 50_000,
    "LUNASOL_MAX_CELL_EVENTS": 1_000_000,
}
_RATIO_FLOOR = MiB  # small members may compress extremely well (a run of spaces); only large ones are judged
_CHUNK = MiB


def limit(name: str) -> int:
    """The limit ``name`` (one of the env vars above): the env value, else the default."""
    raw = os.environ.get(name)
    if not raw:
        return _DEFAULTS[name]
    try:
        value = int(raw.replace("_", ""))
    except ValueError:
        value = 0
    if value <= 0:
        raise BadInput(f"invalid {name}: expected a positive whole number, got {raw!r}")
    return value


def _size(n: int) -> str:
    return f"{n / MiB:.1f} MiB" if n >= MiB else f"{n:,} bytes"


def check_size(size: int, name: str, where: str, what: str) -> None:
    """Refuse ``size`` bytes of ``what`` at ``where`` when it is over the limit ``name``."""
    cap = limit(name)
    if size > cap:
        raise BundleError(f"{where}: {what} is {_size(size)}, over the {_size(cap)} limit (raise {name} to read it)")


def check_count(count: int, name: str, where: str, what: str) -> None:
    """Refuse ``count`` ``what`` (files, members, events) at ``where`` when over the limit ``name``."""
    cap = limit(name)
    if count > cap:
        raise BundleError(f"{where}: {count:,} {what}, over the {cap:,} limit (raise {name} to read it)")


def check_lines(lines: list[bytes] | list[str], where: str) -> None:
    """Refuse the first line longer than ``LUNASOL_MAX_LINE_BYTES`` (``where`` is the file)."""
    cap = limit("LUNASOL_MAX_LINE_BYTES")
    if max(map(len, lines), default=0) <= cap:
        return
    for n, line in enumerate(lines, 1):
        if len(line) > cap:
            check_size(len(line), "LUNASOL_MAX_LINE_BYTES", f"{where} line {n}", "the line")


def parse_json(text: str | bytes, where: str, loads: Callable[[Any], Any] = json.loads) -> Any:
    """``loads(text)``, with a document nested too deep for the parser as one BundleError.

    Other parse errors (``ValueError``) pass through for the caller to judge.
    """
    try:
        return loads(text)
    except RecursionError:
        raise BundleError(f"{where}: JSON nested too deeply to read (more than ~1,000 levels)") from None


def read_member(zf: zipfile.ZipFile, name: str, where: str) -> bytes:
    """One zip member's bytes, streamed and refused past ``LUNASOL_MAX_DOC_BYTES`` or the zip ratio.

    The declared size is checked first and the bytes are counted as they come (a forged header
    cannot get more through), so a zip bomb costs at most the limit in memory.
    """
    info = zf.getinfo(name)
    label = f"{where} member {name}"
    cap = limit("LUNASOL_MAX_DOC_BYTES")
    check_size(info.file_size, "LUNASOL_MAX_DOC_BYTES", label, "the decompressed member")
    ratio = limit("LUNASOL_MAX_ZIP_RATIO")
    if info.file_size > _RATIO_FLOOR and info.file_size > ratio * max(info.compress_size, 1):
        raise BundleError(
            f"{label}: decompresses {info.file_size / max(info.compress_size, 1):,.0f}x "
            f"({_size(info.compress_size)} to {_size(info.file_size)}), over the {ratio}x limit "
            "(raise LUNASOL_MAX_ZIP_RATIO to read it)"
        )
    chunks: list[bytes] = []
    total = 0
    with zf.open(info) as fh:
        while chunk := fh.read(_CHUNK):
            total += len(chunk)
            if total > cap:
                check_size(total, "LUNASOL_MAX_DOC_BYTES", label, "the decompressed member (at least)")
            chunks.append(chunk)
    return b"".join(chunks)
