"""Handing freed memory back to the operating system after a large transient allocation.

glibc keeps the memory of freed objects in its heaps for reuse, and large blocks freed in
the middle of a heap are not returned: a ``--batch`` run builds a batch file of up to 20M
characters of prompts, and copies of it, once per batch. Trimming after each one returned
130-160 MB per batch in a 2,000-cell run (most of the 10,000-cell run's 2.8 GiB was something
else: frames that kept every prompt, see ``pipeline.models.batch_api``). ``malloc_trim(0)`` returns
those pages; dask's workers do the same. Elsewhere (another C library, another OS) this is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from typing import Any


@functools.cache
def _libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def give_back() -> bool:
    """Return free heap memory to the OS where the C library can (glibc); True when it could."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def resident_bytes() -> int | None:
    """The resident memory (RSS) of the process in bytes, or None where ``/proc`` does not say (not Linux)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
