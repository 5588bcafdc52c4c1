"""The report's data files: JSON deflated, base64'd, wrapped in one call each, loaded by ``<script>`` tags.

A report directory holds ``index.html`` (what a reader opens: the decisions and bounded aggregates)
and ``data/NAME.js`` files, each ``lunasolPut("NAME","<base64 of deflated JSON>")``. The page adds a
``<script src="data/NAME.js">`` when it needs one (``fetch()`` of a ``file://`` URL is blocked in
Chromium; a script tag is not), so opening the page costs only the index whatever the run's size.
Each file is written as soon as it is complete: nothing waits in memory for the others.
"""

from __future__ import annotations

import base64
import json
import re
import zlib
from pathlib import Path
from typing import Any

from pipeline.core.errors import BadInput

DATA_DIR = "data"
INDEX = "index.html"
MARKER = ".lunasol-report"  # a report directory says it is one: only such a directory is ever replaced
_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_FILE = re.compile(r'^lunasolPut\("([A-Za-z0-9_-]+)","([A-Za-z0-9+/=]*)"\);\n$')


def pack(obj: Any) -> str:
    """Deflate + base64 (the page inflates it with the browser's DecompressionStream). Deterministic."""
    raw = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode("utf-8")
    return base64.b64encode(zlib.compress(raw, 6)).decode("ascii")


def unpack(text: str) -> Any:
    """The JSON value of :func:`pack`'s text."""
    return json.loads(zlib.decompress(base64.b64decode(text)).decode("utf-8"))


class ShardWriter:
    """Writes ``data/NAME.js`` files into a report directory and counts their bytes."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.dir = root / DATA_DIR
        self.dir.mkdir(parents=True, exist_ok=True)
        self.files = 0
        self.bytes = 0

    def put(self, name: str, obj: Any) -> str:
        """Write one shard now; return its name."""
        if not _NAME.match(name):  # names are the report's own; a bad one is a bug, not input
            raise ValueError(f"bad shard name {name!r}")
        text = f'lunasolPut("{name}","{pack(obj)}");\n'
        (self.dir / f"{name}.js").write_text(text, encoding="ascii")
        self.files += 1
        self.bytes += len(text)
        return name


def read_shard(root: Path, name: str) -> Any:
    """One shard's JSON (for tests and benchmarks)."""
    text = (root / DATA_DIR / f"{name}.js").read_text(encoding="ascii")
    m = _FILE.match(text)
    if m is None or m.group(1) != name:
        raise BadInput(f"not a lunasol report shard: {root / DATA_DIR / name}.js")
    return unpack(m.group(2))


def shard_names(root: Path) -> list[str]:
    """Every shard of a report directory, sorted."""
    return sorted(p.stem for p in (root / DATA_DIR).glob("*.js"))
