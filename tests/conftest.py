"""Test harness: offline switches, a network guard, and a private run directory per test."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")  # before anything imports litellm
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["LUNASOL_TEST_NO_WAIT"] = "1"  # retry waits are zero in tests

import pytest

pytest_plugins = ["pipeline.testing.pytest_plugin"]

ROOT = Path(__file__).resolve().parent.parent
DEMO_BUNDLE = ROOT / "fixtures" / "bundles" / "h0-demo"
DEMO_RECORDINGS = ROOT / "fixtures" / "recordings" / "h0-demo"


def _shared_dir() -> Path:
    """The workplace's read-only shared folder (public data, seeds): beside the clone, or LUNASOL_SHARED_DIR."""
    for candidate in (os.environ.get("LUNASOL_SHARED_DIR"), ROOT.parent / "shared", "/work/shared"):
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return ROOT.parent / "shared"  # absent: tests that need it skip and say where they looked


SHARED = _shared_dir()
SHARED_DATA = SHARED / "data"
SHARED_SEEDS = SHARED / "seeds"

_LOOPBACK = ("127.0.0.1", "::1", "localhost", "0.0.0.0")


def _network_guard(event: str, args: tuple[object, ...]) -> None:
    # Any attempt to resolve or reach a non-loopback host fails the test loudly.
    if event == "socket.getaddrinfo":
        host = args[0]
        if isinstance(host, bytes):
            host = host.decode()
        if host is not None and str(host) not in _LOOPBACK:
            raise RuntimeError(f"network access attempted in tests: getaddrinfo({host!r})")
    elif event == "socket.connect":
        addr = args[1]
        if isinstance(addr, tuple) and addr and str(addr[0]) not in _LOOPBACK:
            raise RuntimeError(f"network access attempted in tests: connect({addr!r})")


sys.addaudithook(_network_guard)


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    """A private runs directory for one test."""
    d = tmp_path / "runs"
    d.mkdir()
    return d
