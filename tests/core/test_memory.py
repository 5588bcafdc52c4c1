"""pipeline.core.memory: freed heap memory goes back to the OS where glibc can do it."""

from __future__ import annotations

import platform

import pytest

from pipeline.core.memory import give_back


def _rss_mib() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        line = next(x for x in f if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_memory_freed_amid_a_heap_goes_back() -> None:
    # A batch file's worth of mid-sized strings, every other one kept: the freed half stays in
    # glibc's heap (fragmented) until malloc_trim returns its pages.
    blocks = [b"x" * 100_000 + bytes([i % 256]) for i in range(3000)]
    kept = blocks[1::2]
    del blocks
    before = _rss_mib()
    assert give_back() is True
    after = _rss_mib()
    assert before - after > 50, (before, after)  # ~150 MB were freed
    assert len(kept) == 1500  # what was kept is still there
