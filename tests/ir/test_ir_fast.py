"""The native fast export path and its worker processes give exactly the generic path's tables.

Both paths build rows with the one implementation of the IR rules (pipeline.ir.rows.ColumnBuilder);
they differ in how records are read. The generic path (read_cell -> SourceEvent -> event_record)
is the reference; it is forced by making ``record_reader`` return it for native bundles too.
"""

from __future__ import annotations

import json
import os
import pickle
import random
from concurrent.futures import Future
from pathlib import Path
from typing import Any, ClassVar

import duckdb
import pytest

import pipeline.ir.export as ex
import pipeline.ir.pool as pool
import pipeline.ir.rows as rows
from pipeline.adapters.contract import event_record
from pipeline.adapters.native import read_cell
from pipeline.bundle import freeze
from pipeline.bundle.manifest import Manifest, read_manifest
from pipeline.bundle.synth import tree_snapshot, write_bundle
from pipeline.core.errors import BadInput, BundleError
from pipeline.ir.export import export
from pipeline.ir.store import TABLES

_VALUES: list[Any] = [
    "x", "", None, 0, 1, -3, 1.5, 1e20, 1e-7, 0.00001, float("nan"), float("inf"), True, False, [1, "a"],
    {"k": "v", "a": [1.0, None]}, "ünïcødé ✓", "src/a.py", "line\nbreak", "x" * 2500, 12345, -0.0, 2.5e-5,
    {"z": 1, "a": {"y": 1e300}},
    # secrets: both paths redact them the same way (pipeline.ir.redact), also in a long, trimmed text
    "key sk-proj-Ab3dEf9hIj2lMn5pQr8tUv1xYz40123456789abcd", {"url": "https://u:pw12345678@h.example/x"},
    "Authorization: Bearer x9Yk2Lm4Np6Qr8St0Uv2Wx4Yz6Ab8Cd " + "y" * 2500,
]  # fmt: skip
_CONTROLLER_KEYS = ("ts", "stage", "actor", "by", "to", "reason", "artifact", "digest", "state_digest",
                    "current_stage", "confirmed", "from", "note", "obligation_id", "text", "evidence",
                    "status")  # fmt: skip
_CONTROLLER = ["stage_started", "stage_accepted", "stage_sent_back", "artifact_written", "state", "handoff",
               "obligation_opened", "obligation_closed", "workflow_finished", "mystery", None, 7, "state",
               "state"]  # fmt: skip


def _odd_bundle(root: Path, seed: int) -> Path:
    """A synthetic bundle plus odd but valid records: every type in every field, ties, blanks, long text."""
    rng = random.Random(seed)
    write_bundle(root, cells=4, events_per_cell=40, excluded=1, seed=seed, freeze_it=False)

    def ts() -> Any:
        r = rng.random()
        return None if r < 0.1 else rng.choice(_VALUES) if r < 0.15 else f"2026-08-09T00:00:{rng.randrange(20):02d}Z"

    def session() -> dict[str, Any]:
        rec: dict[str, Any] = {"type": rng.choice(["tool_call", "tool_result", "message", "error", "weird", None, 5])}
        for key in ("ts", "stage", "actor", "session", "step", "call_id", "tool", "role", "content", "output",
                    "exit_code", "source", "message", "args"):  # fmt: skip
            if rng.random() < 0.6:
                rec[key] = ts() if key == "ts" else rng.choice(_VALUES)
        if rec["type"] == "tool_call" and rng.random() < 0.7:
            rec["args"] = {k: rng.choice(_VALUES) for k in ("path", "file", "cwd", "limit") if rng.random() < 0.4}
            if rng.random() < 0.3:
                rec["args"]["paths"] = rng.choice([["a.py", "b.py"], ["a.py", 3], [], [1]])
        if rng.random() < 0.5:
            rec["call_id"] = f"c{rng.randrange(6)}"
        if rng.random() < 0.3:
            rec["step"] = rng.choice([0, 3, True, "4", 2.0, None])
        return rec

    def controller() -> dict[str, Any]:
        rec: dict[str, Any] = {"event": rng.choice(_CONTROLLER)}
        for key in _CONTROLLER_KEYS:
            if rng.random() < 0.6:
                rec[key] = ts() if key == "ts" else rng.choice(_VALUES)
        if rng.random() < 0.3:
            rec["state_digest"] = f"sha256:{rng.randrange(10**6)}"
        return rec

    def lines(make: Any, n: int) -> str:
        out = []
        for _ in range(n):
            if rng.random() < 0.05:
                out.append(rng.choice(["", "   ", "\t"]))
            out.append(json.dumps(make(), ensure_ascii=rng.random() < 0.5))
        return "\n".join(out) + ("\n" if rng.random() < 0.7 else "")

    for i in range(1, 5):
        cell = root / "cells" / f"C{i:03d}"
        (cell / "controller.jsonl").write_text(lines(controller, 30), encoding="utf-8")
        for name in ("03-odd-stage-actor.jsonl", "nomatch.jsonl"):
            (cell / "sessions" / name).write_text(lines(session, 50), encoding="utf-8")
    freeze(root)
    return root


def _tables(run_dir: Path) -> dict[str, list[tuple[Any, ...]]]:
    con = duckdb.connect(str(run_dir / "ir.duckdb"), read_only=True)
    try:
        return {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in TABLES}
    finally:
        con.close()


def _same(a: dict[str, list[tuple[Any, ...]]], b: dict[str, list[tuple[Any, ...]]]) -> None:
    for table in TABLES:
        # repr: NaN-free rows compare equal by value; repr also pins types (True vs 1, '' vs None)
        assert [repr(r) for r in a[table]] == [repr(r) for r in b[table]], table


def _generic(monkeypatch: pytest.MonkeyPatch) -> None:
    def through_source_events(fmt: str) -> rows.RecordReader:
        assert fmt == "native"
        return lambda bundle, cell, manifest: [event_record(e) for e in read_cell(bundle, cell, manifest)]

    monkeypatch.setattr(ex, "record_reader", through_source_events)


def _parallel(monkeypatch: pytest.MonkeyPatch, workers: int = 2) -> None:
    monkeypatch.setattr(pool, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(pool, "TASK_BYTES", 20_000)  # several tasks per worker
    monkeypatch.setenv("LUNASOL_EXPORT_WORKERS", str(workers))


@pytest.mark.parametrize("seed", [1, 2])
def test_fast_path_equals_generic_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    bundle = _odd_bundle(tmp_path / "b", seed)
    fast = export(bundle, tmp_path / "fast")
    with monkeypatch.context() as m:
        _generic(m)
        generic = export(bundle, tmp_path / "generic")
    assert fast.events == generic.events > 300
    assert fast.events_per_cell == generic.events_per_cell
    a, b = _tables(tmp_path / "fast"), _tables(tmp_path / "generic")
    assert any(r for r in a["events"] if r[12])  # some text was trimmed: the rule is exercised
    _same(a, b)


def test_worker_processes_equal_one_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = _odd_bundle(tmp_path / "b", 3)
    monkeypatch.setenv("LUNASOL_EXPORT_WORKERS", "0")
    one = export(bundle, tmp_path / "one")
    _parallel(monkeypatch)
    before = tree_snapshot(bundle)
    two = export(bundle, tmp_path / "two")
    assert tree_snapshot(bundle) == before
    assert list(two.events_per_cell.items()) == list(one.events_per_cell.items())  # request order kept
    _same(_tables(tmp_path / "one"), _tables(tmp_path / "two"))


# Two cell directories whose names hold different secrets but show alike: the later one (in manifest
# order, over the whole bundle) is told apart by "-2", though its cell is read in another task.
_SECRET_DIRS = {
    "C002": "cells/run-sk-proj-Ab3dEf9hIj2lMn5pQr8tUv1xYz40123456789abcd",
    "C004": "cells/run-sk-proj-Zb3dEf9hIj2lMn5pQr8tUv1xYz40123456789abcd",
}


def _secret_dirs_bundle(root: Path) -> Path:
    bundle = _odd_bundle(root, 4)
    req = bundle / "analysis-request.json"
    doc = json.loads(req.read_text(encoding="utf-8"))
    for cell in doc["cells"]:
        if cell["cell_id"] in _SECRET_DIRS:
            (bundle / cell["path"]).rename(bundle / _SECRET_DIRS[cell["cell_id"]])
            cell["path"] = _SECRET_DIRS[cell["cell_id"]]
    req.write_text(json.dumps(doc, indent=2), encoding="utf-8")
    freeze(bundle)
    return bundle


def _one_process_then_a_task_per_cell(
    bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, list[tuple[Any, ...]]]:
    """``bundle`` exported in one process, then by workers one cell a task: the IRs equal; the second's tables."""
    monkeypatch.setenv("LUNASOL_EXPORT_WORKERS", "0")
    export(bundle, tmp_path / "one")
    _parallel(monkeypatch)
    monkeypatch.setattr(pool, "TASK_BYTES", 1)
    export(bundle, tmp_path / "two")
    two = _tables(tmp_path / "two")
    _same(_tables(tmp_path / "one"), two)
    return two


def test_workers_show_paths_and_hashes_as_one_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # One cell a task: a worker that worked out display paths from its own files only, or took the
    # sha256 of the wrong entry of its part of the manifest, would differ from one process here.
    bundle = _secret_dirs_bundle(tmp_path / "b")
    two = _one_process_then_a_task_per_cell(bundle, tmp_path, monkeypatch)
    shown = {(r[1], r[-5], r[-2]) for r in two["events"]}  # (cell_id, source_path, source_sha256)
    assert {p.split("/")[1] for c, p, _ in shown if c in _SECRET_DIRS} == {
        "run-REDACTED-openai-key",
        "run-REDACTED-openai-key-2",
    }
    manifest = read_manifest(bundle)
    raw = dict(zip(manifest.files.paths, (f.sha256 for f in manifest.files), strict=True))
    for cell_id, path, sha in shown:
        if cell_id not in _SECRET_DIRS:
            assert raw[path] == sha  # the file's own sha256


class _InlinePool:
    """Stands in for the ProcessPoolExecutor: runs each task here, after a pickle round trip, and keeps it."""

    made: ClassVar[list[_InlinePool]] = []

    def __init__(self, workers: int, mp_context: Any, initializer: Any, initargs: tuple[Any, ...]) -> None:
        self.initargs = initargs
        self.tasks: list[pool.Task] = []
        bundle, fmt, _pid, redact = initargs
        pool._WORKER.update(bundle=bundle, read=rows.record_reader(fmt), redact=redact)
        _InlinePool.made.append(self)

    def submit(self, fn: Any, task: pool.Task) -> Future[Any]:
        task = pickle.loads(pickle.dumps(task))
        self.tasks.append(task)
        done: Future[Any] = Future()
        done.set_result(fn(task))
        return done

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        pool._WORKER.clear()


def test_workers_get_only_their_tasks_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = _secret_dirs_bundle(tmp_path / "b")
    monkeypatch.setattr(pool, "ProcessPoolExecutor", _InlinePool)
    _InlinePool.made.clear()
    _one_process_then_a_task_per_cell(bundle, tmp_path, monkeypatch)
    (made,) = _InlinePool.made
    assert not any(isinstance(a, Manifest) for a in made.initargs)  # no whole manifest for every worker
    manifest = read_manifest(bundle)
    assert len(made.tasks) == 4  # one cell a task
    for task in made.tasks:
        (cell,) = task.cells
        assert task.manifest.files.paths == [p for p in manifest.files.paths if p.startswith(cell.path + "/")]
        assert list(task.manifest.files) == [manifest.get(p) for p in task.manifest.files.paths]
        secret = cell.cell_id in _SECRET_DIRS
        assert bool(task.display) is secret and set(task.display) == (
            set(task.manifest.files.paths) if secret else set()
        )
        # verify() found these files unchanged: a worker does not hash them again
        assert len(task.manifest.hashed_ok) == len(task.manifest.files)


def test_worker_error_is_the_first_in_cell_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = tmp_path / "b"
    write_bundle(bundle, cells=6, events_per_cell=40, excluded=0, seed=5, freeze_it=False)
    for cell in ("C003", "C005"):  # two bad cells: the earlier one must be named, as in one process
        with (bundle / "cells" / cell / "sessions" / "02-design-candidate.jsonl").open("a") as fh:
            fh.write("[1, 2\n")
    freeze(bundle)
    with pytest.raises(BundleError) as serial:
        export(bundle, tmp_path / "serial")
    _parallel(monkeypatch)
    with pytest.raises(BundleError) as parallel:
        export(bundle, tmp_path / "parallel")
    assert "cells/C003/" in str(serial.value)
    assert str(parallel.value) == str(serial.value)
    assert not (tmp_path / "parallel").exists() and not (tmp_path / "serial").exists()


@pytest.mark.parametrize("workers", [0, 2])
def test_ill_typed_value_reported_as_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int) -> None:
    bundle = tmp_path / "b"
    write_bundle(bundle, cells=3, events_per_cell=40, excluded=0, seed=5, freeze_it=False)
    with (bundle / "cells" / "C002" / "sessions" / "01-proposal-candidate.jsonl").open("a") as fh:
        fh.write('{"ts": "2026-08-09T00:00:09Z", "type": "message", "content": "x", "step": 1099511627776}\n')
    freeze(bundle)
    with monkeypatch.context() as m:
        _generic(m)
        with pytest.raises(BadInput) as generic:
            export(bundle, tmp_path / "generic")
    if workers:
        _parallel(monkeypatch, workers)
    with pytest.raises(BadInput) as fast:
        export(bundle, tmp_path / "fast")
    assert "ill-typed event field in cell C002:" in str(generic.value)
    assert str(fast.value) == str(generic.value)
    assert not (tmp_path / "fast").exists()


def test_export_workers_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LUNASOL_EXPORT_WORKERS", "3")
    assert pool.export_workers() == 3
    monkeypatch.setenv("LUNASOL_EXPORT_WORKERS", "many")
    with pytest.raises(BadInput, match="LUNASOL_EXPORT_WORKERS"):
        pool.export_workers()
    monkeypatch.delenv("LUNASOL_EXPORT_WORKERS")
    assert 0 <= pool.export_workers() <= pool.MAX_WORKERS


_SCRIPT = """
from pathlib import Path
import sys
import pipeline.ir.pool as pool
from pipeline.ir.export import export
with open(sys.argv[3], "a") as fh:  # top-level code of an unguarded script: must run once, not once per worker
    fh.write("ran\\n")
pool.PARALLEL_MIN_BYTES = 0
pool.TASK_BYTES = 20_000
print(export(Path(sys.argv[1]), Path(sys.argv[2])).events)
"""


@pytest.mark.parametrize("how", ["script", "stdin"])
def test_workers_do_not_rerun_the_callers_main(tmp_path: Path, how: str) -> None:
    import subprocess
    import sys

    bundle = tmp_path / "b"
    write_bundle(bundle, cells=6, events_per_cell=40, excluded=0, seed=5)
    marker = tmp_path / "marker.txt"
    script = tmp_path / "unguarded.py"
    script.write_text(_SCRIPT, encoding="utf-8")
    args = [str(script)] if how == "script" else ["-"]
    res = subprocess.run(
        [sys.executable, *args, str(bundle), str(tmp_path / "run"), str(marker)],
        input=None if how == "script" else _SCRIPT,
        capture_output=True,
        text=True,
        env={**os.environ, "LUNASOL_EXPORT_WORKERS": "2"},
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert int(res.stdout.split()[-1]) > 200
    assert marker.read_text(encoding="utf-8") == "ran\n"
