"""tiktoken's ``cl100k_base`` loaded from a per-user cache of its parsed ranks.

tiktoken builds an encoding from a text file of 100,000 base64 tokens, decoded one by one in
Python: ~0.14 CPU s, then ~0.08 s for its Rust tables. Every process that counts a request too
large for the byte bound pays that, a thirtieth of a rerun with one changed cell. The parsed
constructor arguments (the same dict tiktoken's plugin returns) are kept with :mod:`marshal`,
which loads them in ~0.03 s, under ``$LUNASOL_CACHE_DIR`` (default ``$XDG_CACHE_HOME/lunasol``
or ``~/.cache/lunasol``).

The cache file is named by what it was made from (tiktoken's version, Python's, for marshal's
format, and the stat of every file in the tokenizer folder) and carries the sha256 of its payload:
a file that does not match is ignored and made again. A cache that cannot be written is no error.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import sys
from pathlib import Path
from typing import Any

from pipeline.core.canonical import atomic_write_bytes, digest

CACHE_ENV = "LUNASOL_CACHE_DIR"
ENCODING = "cl100k_base"


def cache_dir() -> Path:
    """Where lunasol keeps per-user caches (``$LUNASOL_CACHE_DIR``, else the XDG cache home)."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lunasol"


def _made_from(folder: Path | None) -> str:
    import tiktoken

    files: list[list[Any]] = []
    if folder is not None and folder.is_dir():
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            if entry.is_file():
                st = entry.stat()
                files.append([entry.name, st.st_size, st.st_mtime_ns])
    return digest({"tiktoken": tiktoken.__version__, "python": sys.version, "folder": str(folder), "files": files})


def _valid(kwargs: Any) -> bool:
    return (
        isinstance(kwargs, dict)
        and isinstance(kwargs.get("name"), str)
        and isinstance(kwargs.get("pat_str"), str)
        and isinstance(kwargs.get("mergeable_ranks"), dict)
        and isinstance(kwargs.get("special_tokens"), dict)
    )


def _read(path: Path) -> dict[str, Any] | None:
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    head, payload = raw[:32], raw[32:]
    if len(head) != 32 or hashlib.sha256(payload).digest() != head:
        return None  # torn or edited: marshal never reads bytes it did not write
    try:
        kwargs = marshal.loads(payload)
    except (ValueError, EOFError, TypeError):
        return None
    return kwargs if _valid(kwargs) else None


def encoding(folder: Path | None) -> Any:
    """Tiktoken's ``cl100k_base`` (tiktoken reads its file from ``folder``, set as TIKTOKEN_CACHE_DIR by the caller)."""
    import tiktoken

    path = cache_dir() / "tiktoken" / f"{ENCODING}-{_made_from(folder).removeprefix('sha256:')[:32]}.marshal"
    kwargs = _read(path)
    if kwargs is None:
        from tiktoken_ext.openai_public import ENCODING_CONSTRUCTORS  # tiktoken's plugin contract

        kwargs = ENCODING_CONSTRUCTORS[ENCODING]()
        payload = marshal.dumps(kwargs)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(path, hashlib.sha256(payload).digest() + payload)
        except OSError:
            pass  # a read-only home: counted all the same, only slower next time
    return tiktoken.Encoding(**kwargs)
