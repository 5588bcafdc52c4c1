"""Files a teammate can read, temp files of a killed export cleaned up, --resume on a new run starts it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.core.canonical import write_json
from pipeline.core.context import RunOptions
from pipeline.core.settings import ModelSettings
from pipeline.ir.export import export
from pipeline.run.runner import run
from pipeline.testing.openai_server import FakeOpenAI
from tests.sol.sol_helpers import make_bundle
from tests.state.test_ledger import handler as ledger_handler


def test_artifacts_honour_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        write_json(tmp_path / "a.json", {"x": 1})
        assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o644
        os.umask(0o077)
        write_json(tmp_path / "b.json", {"x": 1})
        assert (tmp_path / "b.json").stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)


def test_a_dead_exports_temp_files_are_removed_by_the_next_export(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)  # that process has exited: its pid names no live process
    stale = [run_dir / f".ir.duckdb.{pid}.tmp", run_dir / f".ir.duckdb.{pid}.tmp.wal"]
    for p in stale:
        p.write_bytes(b"left by a kill -9")
    live = run_dir / f".ir.duckdb.{os.getppid()}.tmp"  # a live process's (our parent's) file is left alone
    live.write_bytes(b"in use")
    export(bundle, run_dir)
    assert not any(p.exists() for p in stale)
    assert live.exists() and (run_dir / "ir.duckdb").is_file()


def test_resume_with_nothing_to_resume_starts_the_run(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.handler = ledger_handler
    bundle = make_bundle(tmp_path)
    logs: list[str] = []
    opts = RunOptions(bundle=bundle, run_id="r", runs_dir=tmp_path / "runs", resume=True, models=model_settings())
    res = run(opts, log=logs.append)
    assert res.ran == ["export", "select", "probes", "luna", "coordinator", "sol"]
    assert any("nothing to resume" in line and "starting the run" in line for line in logs)


def test_artifacts_are_synced_to_disk_outside_the_tests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite skips fsync (LUNASOL_TEST_NO_FSYNC, tests/conftest.py); a user's write always syncs."""
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", synced.append)
    write_json(tmp_path / "a.json", {"a": 1})
    assert synced == []  # the suite's switch
    monkeypatch.delenv("LUNASOL_TEST_NO_FSYNC")
    write_json(tmp_path / "b.json", {"b": 1})
    assert len(synced) == 1 and (tmp_path / "b.json").is_file()
