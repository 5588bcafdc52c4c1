"""Handing freed memory back to the operating system after a large transient allocation.

glibc keeps the memory of freed objects in its heaps for reuse, and large blocks freed in
the middle of a heap are not returned: a ``--batch`` run that builds a batch file of ~50 MB of
prompts a dozen times kept each build's pages (10,000 cells: 3 GiB peak in the Luna stage, of
which most was free memory). ``malloc_trim(0)`` returns those pages; dask's workers do the same.
Elsewhere (another C library, another OS) this is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
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
