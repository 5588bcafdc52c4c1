"""No input ends in exit 70: DuckDB spills inside the run and names its knob; counts are bounded like sizes.

The hostile case that crashed (exit 70 after 235 s): 20,000 one-line session files in one cell.
Here 3,000 such files, with DuckDB's limit lowered so the same path (export, probes over one huge
cell) meets its limit: it spills inside the run, and where even that cannot help the one error line
names ``LUNASOL_DUCKDB_MEMORY`` (exit 2). Counts (files per bundle, members per archive, events per
cell) are refused in one line naming their env knob, and ``bundle freeze`` refuses what ``run`` would.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from pipeline.bundle import freeze
from pipeline.cli.app import app
from pipeline.core.errors import BundleError
from pipeline.core.zips import open_zip
from pipeline.testing.openai_server import FakeOpenAI
from tests.sol.sol_helpers import make_bundle
from tests.state.test_ledger import handler as ledger_handler

runner = CliRunner()
FILES = 3_000


def _many_files_bundle(root: Path, files: int = FILES) -> Path:
    bundle = make_bundle(root)
    sessions = bundle / "cells" / "C001" / "sessions"
    for i in range(files):
        row = {"ts": f"2099-01-01T{i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z", "type": "message",
               "role": "reviewer", "content": f"line {i} " + "word " * 30}  # fmt: skip
        (sessions / f"20-x-{i:05d}.jsonl").write_text(json.dumps(row) + "\n", encoding="utf-8")
    freeze(bundle)
    return bundle


def _run(bundle: Path, runs_dir: Path, settings: Any, env: dict[str, str], run_id: str = "m") -> Any:
    args = ["run", str(bundle), "--runs-dir", str(runs_dir), "--run-id", run_id, "--model", settings.model,
            "--api-base", settings.api_base, "--mode", "tools"]  # fmt: skip
    return runner.invoke(app, args, env=env)


def test_many_one_line_files_in_one_cell_spill_inside_the_run_or_name_the_memory_knob(
    tmp_path: Path, runs_dir: Path, fake_llm: FakeOpenAI, model_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_llm.handler = ledger_handler
    bundle = _many_files_bundle(tmp_path)
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    s = model_settings()
    # a small limit: what does not fit spills (to <ir>.tmp, inside the run), the run finishes
    spilled = _run(bundle, runs_dir, s, {"LUNASOL_DUCKDB_MEMORY": "64MB"}, "spill")
    assert spilled.exit_code == 0, spilled.output
    assert (runs_dir / "spill" / "weakness-shortlist.json").is_file()
    assert list(work.iterdir()) == []  # nothing spilled into the working directory
    # a limit nothing fits in: one line naming the knob, exit 2, never "internal error" / exit 70
    starved = _run(bundle, runs_dir, s, {"LUNASOL_DUCKDB_MEMORY": "4MB"}, "starved")
    assert starved.exit_code == 2, starved.output
    lines = starved.stderr.strip().splitlines()
    assert len(lines) == 1 and "LUNASOL_DUCKDB_MEMORY" in lines[0] and "ran out of memory" in lines[0]
    assert "internal error" not in starved.stderr and "SET memory_limit" not in starved.stderr


def test_freeze_refuses_what_run_would_refuse_files_per_bundle(tmp_path: Path, runs_dir: Path) -> None:
    bundle = make_bundle(tmp_path)
    files = len(json.loads((bundle / "manifest.json").read_text(encoding="utf-8"))["files"])
    env = {"LUNASOL_MAX_BUNDLE_FILES": str(files - 1)}
    before = (bundle / "manifest.json").read_bytes()
    res = runner.invoke(app, ["bundle", "freeze", str(bundle)], env=env)
    assert res.exit_code == 2 and "LUNASOL_MAX_BUNDLE_FILES" in res.stderr, res.output
    assert len(res.stderr.strip().splitlines()) == 1
    assert (bundle / "manifest.json").read_bytes() == before  # no manifest a run would refuse is written
    ran = runner.invoke(app, ["run", str(bundle), "--runs-dir", str(runs_dir), "--dry-run"], env=env)
    assert ran.exit_code == 2 and "LUNASOL_MAX_BUNDLE_FILES" in ran.stderr, ran.output
    # a manifest over the document limit is frozen and read: it is streamed entry by entry, not one document
    res = runner.invoke(app, ["bundle", "freeze", str(bundle)], env={"LUNASOL_MAX_DOC_BYTES": "200"})
    assert res.exit_code == 0, res.output
    assert (bundle / "manifest.json").stat().st_size > 200 and (bundle / "manifest.json").read_bytes() == before


def test_events_per_cell_are_bounded(tmp_path: Path, runs_dir: Path, fake_llm: FakeOpenAI, model_settings: Any) -> None:
    fake_llm.handler = ledger_handler
    bundle = _many_files_bundle(tmp_path, files=30)
    res = _run(bundle, runs_dir, model_settings(), {"LUNASOL_MAX_CELL_EVENTS": "25"})
    assert res.exit_code == 2, res.output
    assert "cell C001" in res.stderr and "LUNASOL_MAX_CELL_EVENTS" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert not fake_llm.requests  # refused before any model call


def test_members_per_archive_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "log.eval"
    with zipfile.ZipFile(path, "w") as zf:
        for i in range(12):
            zf.writestr(f"samples/{i}.json", "{}")
    with open_zip(path) as zf:
        assert len(zf.namelist()) == 12
    monkeypatch.setenv("LUNASOL_MAX_ZIP_MEMBERS", "10")
    with pytest.raises(BundleError, match=r"12 members, over the 10 limit \(raise LUNASOL_MAX_ZIP_MEMBERS"):
        open_zip(path)
