"""Test harness: offline switches, a network guard, and a private run directory per test."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")  # before anything imports litellm
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["LUNASOL_TEST_NO_WAIT"] = "1"  # retry waits are zero in tests
# No fsync of artifacts: tests kill processes, never the machine, and a killed process's writes
# are in the page cache (pipeline.core.canonical). =0 keeps the syncs (to measure their cost).
os.environ.setdefault("LUNASOL_TEST_NO_FSYNC", "1")
os.environ.setdefault("LUNASOL_PROGRESS_EVERY", "0")  # no timed progress lines in a slow CI's one-line checks
# Per-user caches (the tokenizer's parsed ranks) go to a directory of this test process, never the home.
os.environ["LUNASOL_CACHE_DIR"] = tempfile.mkdtemp(prefix="lunasol-test-cache-")

import pytest

atexit.register(shutil.rmtree, os.environ["LUNASOL_CACHE_DIR"], True)
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
    d.mkdir(exist_ok=True)
    return d


@pytest.fixture
def artifact_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The file names :class:`pipeline.artifacts.rundir.RunDir` parses during the test, in order (JSON and JSONL)."""
    from pipeline.artifacts import rundir

    read: list[str] = []
    for name in ("read_jsonl", "_parse"):
        real = getattr(rundir, name)
        monkeypatch.setattr(rundir, name, lambda path, *a, _real=real: read.append(Path(path).name) or _real(path, *a))
    return read


# -- the demo, replayed once per session ---------------------------------------------------------


@pytest.fixture(scope="session")
def demo_gate1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo replayed once per session up to gate 1 (library call, fixture recordings).

    Read it; to change it, copy it first (:func:`copy_demo`, or the ``demo_copy`` fixture).
    """
    from pipeline.core.context import RunOptions
    from pipeline.core.settings import ModelSettings
    from pipeline.run.runner import run

    if not any(DEMO_RECORDINGS.glob("*/*.json")):
        pytest.skip("demo recordings absent (run: python fixtures/record_demo.py)")
    runs = tmp_path_factory.mktemp("demo") / "runs"
    settings = ModelSettings(mode="replay", store=DEMO_RECORDINGS)
    return run(RunOptions(bundle=DEMO_BUNDLE, runs_dir=runs, models=settings), log=lambda _m: None).ctx.run_dir


def copy_demo(demo: Path, root: Path) -> Path:
    """A private copy of a demo run at ``root/runs/<run id>``.

    ``root`` must sit at the depth of a pytest temporary directory: run.json keeps the bundle's path
    relative to the run, and every pytest temporary directory is one level under the same base.
    """
    dest = root / "runs" / demo.name
    shutil.copytree(demo, dest)
    return dest


@pytest.fixture
def demo_copy(demo_gate1: Path, tmp_path: Path) -> Path:
    """A private copy of the session's demo run (at gate 1) for a test that changes it."""
    return copy_demo(demo_gate1, tmp_path)
