"""``--batch``: the demo's Luna calls as one provider batch against the local server (recordings as answers).

The local server answers from the demo's fixture recordings (a labelled fixture), synchronously
or as batch items, so every test compares a batch run with the synchronous run of the same answers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.context import RunOptions
from pipeline.core.errors import Blocked
from pipeline.core.settings import ModelSettings
from pipeline.models import batch_submit as batching
from pipeline.models import client as client_module
from pipeline.models import progress, read_calls
from pipeline.models.batch_submit import read_batches
from pipeline.run.runner import run
from pipeline.run.status import format_status, status
from pipeline.testing.openai_server import BatchPlan, FakeOpenAI, recordings_handler, server_error
from tests.conftest import DEMO_BUNDLE, DEMO_RECORDINGS, ROOT

MODEL = "openai/fixture-model"
ARTIFACTS = ("patterns.jsonl", "pattern-groups.json", "weakness-shortlist.json")

pytestmark = pytest.mark.skipif(not any(DEMO_RECORDINGS.glob("*/*.json")), reason="demo recordings absent")


@pytest.fixture
def server(fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    monkeypatch.setenv("LUNASOL_BATCH_POLL_S", "0")
    fake_llm.handler = recordings_handler(DEMO_RECORDINGS)
    yield fake_llm


def settings(srv: FakeOpenAI, store: Path, *, batch: bool) -> ModelSettings:
    # tools mode, as the fixture recordings were made (a new store would take the mode from capabilities)
    return ModelSettings(
        model=MODEL, api_base=srv.base_url, mode="record", store=store, batch=batch, instructor_mode="tools"
    )


def go(srv: FakeOpenAI, root: Path, name: str, *, batch: bool, resume: bool = False) -> Path:
    opts = RunOptions(
        bundle=DEMO_BUNDLE, runs_dir=root / name, resume=resume, models=settings(srv, root / f"{name}-rec", batch=batch)
    )
    return run(opts, log=lambda _m: None).ctx.run_dir


def outputs(run_dir: Path) -> dict[str, bytes]:
    files = {n: (run_dir / n).read_bytes() for n in ARTIFACTS}
    files.update({f"luna/{p.name}": p.read_bytes() for p in sorted((run_dir / "luna").glob("*.json"))})
    return files


def store_bytes(store: Path) -> dict[str, bytes]:
    return {str(p.relative_to(store)): p.read_bytes() for p in sorted(store.glob("*/*.json"))}


@pytest.fixture(scope="module")
def sync_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    # The synchronous run of the same answers, once per module, on its own server.
    root = tmp_path_factory.mktemp("sync")
    with FakeOpenAI(recordings_handler(DEMO_RECORDINGS)) as srv:
        yield go(srv, root, "sync", batch=False), root / "sync-rec"


def test_batch_run_equals_the_synchronous_run(tmp_path: Path, server: FakeOpenAI, sync_run: tuple[Path, Path]) -> None:
    sync_dir, sync_store = sync_run
    run_dir = go(server, tmp_path, "b", batch=True)
    assert outputs(run_dir) == outputs(sync_dir)
    assert store_bytes(tmp_path / "b-rec") == store_bytes(sync_store)  # a batch-made recording is a recording
    # each result file is read once: litellm's async retrieve would download a finished batch's output
    # again in a background task of its own (for its cost logging), left pending when the stage's loop ends
    assert server.batch.downloads and set(server.batch.downloads.values()) == {1}, server.batch.downloads
    (b,) = read_batches(run_dir)
    assert b["status"] == "completed" and (server.batch.uploads, server.batch.created) == (1, 1)
    luna_calls = [c for c in read_calls(run_dir) if c["role"] == "luna"]
    assert sorted(b["keys"]) == sorted(c["keys"][0] for c in luna_calls)  # every cell's first request, once
    # Sol is not batched: its requests came synchronously
    assert sum("x-lunasol-batch-item" not in h for h in server.headers) == len(server.requests) - len(b["keys"])
    # and the batch-made recording replays offline to the same artifacts
    replayed = run(
        RunOptions(
            bundle=DEMO_BUNDLE,
            runs_dir=tmp_path / "replay",
            models=ModelSettings(mode="replay", store=tmp_path / "b-rec"),
        ),
        log=lambda _m: None,
    ).ctx.run_dir
    assert outputs(replayed) == outputs(sync_dir)


def test_requests_go_out_in_bounded_batches_before_any_call_waits(
    tmp_path: Path, server: FakeOpenAI, sync_run: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # At 10,000 cells a call waiting for its batch holds its cell and its prompt (~2.8 GiB in all):
    # the requests are submitted first, a bounded batch at a time, and the calls run after, bounded.
    monkeypatch.setattr(batching, "BATCH_MAX_REQUESTS", 10)
    limits: list[int] = []

    async def spy(coros: Any, limit: int, **kw: Any) -> Any:
        limits.append(limit)
        return await progress.gather_bounded(coros, limit, **kw)

    monkeypatch.setattr(client_module, "gather_bounded", spy)
    lines: list[str] = []
    models = settings(server, tmp_path / "b-rec", batch=True)
    opts = RunOptions(bundle=DEMO_BUNDLE, runs_dir=tmp_path / "b", models=models)
    run_dir = run(opts, log=lines.append).ctx.run_dir
    assert outputs(run_dir) == outputs(sync_run[0])
    batches = read_batches(run_dir)
    assert [len(b["keys"]) for b in batches] == [10, 10, 4] and (server.batch.uploads, server.batch.created) == (3, 3)
    said = [line for line in lines if line.startswith("batch ")]
    assert sum("requests submitted" in line for line in said) == 3
    assert limits[0] == 2 * ModelSettings().concurrency  # Luna's calls: the usual bound, not all 24 at once
    # every first request was answered from a batch: none of Luna's went out synchronously
    assert sum("x-lunasol-batch-item" not in h for h in server.headers) == len(server.requests) - 24
    luna_calls = [c for c in read_calls(run_dir) if c["role"] == "luna"]
    assert sorted(k for b in batches for k in b["keys"]) == sorted(c["keys"][0] for c in luna_calls)


def test_unfinished_batch_blocks_and_resume_collects_it_without_resubmitting(
    tmp_path: Path, server: FakeOpenAI, sync_run: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    server.batch.plan(BatchPlan(validating_polls=1, in_progress_polls=2))
    monkeypatch.setenv("LUNASOL_BATCH_MAX_WAIT_S", "0")
    with pytest.raises(Blocked, match="not finished") as info:
        go(server, tmp_path, "b", batch=True)
    assert "--batch" in info.value.unblock and "--resume" in info.value.unblock
    run_dir = tmp_path / "b" / sync_run[0].name
    (b,) = read_batches(run_dir)
    assert b["status"] in ("validating", "in_progress")
    # lunasol status shows it; --poll asks the provider (and changes nothing in the run)
    retrieves = server.batch.retrieves
    assert f"batch {b['id']}: 24 requests, {b['status']} when last seen" in format_status(status(run_dir))
    assert server.batch.retrieves == retrieves  # no provider call without --poll
    polled = status(run_dir, poll=True)["batches"][0]["provider"]
    assert polled["total"] == 24 and server.batch.retrieves == retrieves + 1
    assert read_batches(run_dir) == [b]
    # resumed (still without waiting) until the provider is done: the same batch every time
    for _ in range(3):
        try:
            go(server, tmp_path, "b", batch=True, resume=True)
            break
        except Blocked:
            continue
    assert outputs(run_dir) == outputs(sync_run[0])
    assert (server.batch.uploads, server.batch.created) == (1, 1)


def test_expired_batch_resubmits_only_the_missing_cells(
    tmp_path: Path, server: FakeOpenAI, sync_run: tuple[Path, Path]
) -> None:
    server.batch.plan(BatchPlan(outcome="expired", answered=10))
    with pytest.raises(Blocked, match="expired with 14 requests unanswered") as info:
        go(server, tmp_path, "b", batch=True)
    assert "submits only these 14" in str(info.value)
    assert info.value.unblock.endswith(" --batch --resume") and info.value.unblock.count("--batch") == 1
    run_dir = tmp_path / "b" / sync_run[0].name
    go(server, tmp_path, "b", batch=True, resume=True)
    first, second = read_batches(run_dir)
    assert (first["status"], second["status"]) == ("expired", "completed")
    assert len(second["keys"]) == 14 and not set(second["keys"]) & set(first["keys"][:10])
    assert outputs(run_dir) == outputs(sync_run[0])
    assert store_bytes(tmp_path / "b-rec") == store_bytes(sync_run[1])


def test_failed_items_are_asked_synchronously(tmp_path: Path, server: FakeOpenAI, sync_run: tuple[Path, Path]) -> None:
    answer_from_recordings = recordings_handler(DEMO_RECORDINGS)
    failed: list[int] = []

    def flaky(request: dict[str, Any]) -> Any:
        # the first two batch items fail at the provider; synchronous requests are answered
        if len(failed) < 2 and len(server.requests) <= 24:
            failed.append(1)
            return server_error(500)
        return answer_from_recordings(request)

    server.handler = flaky
    run_dir = go(server, tmp_path, "b", batch=True)
    (b,) = read_batches(run_dir)
    assert b["status"] == "completed" and len(failed) == 2
    assert outputs(run_dir) == outputs(sync_run[0])


def test_kill_between_submit_and_collect_loses_nothing(
    tmp_path: Path, server: FakeOpenAI, sync_run: tuple[Path, Path]
) -> None:
    server.batch.plan(BatchPlan(validating_polls=10**9))  # never finishes until the test says so
    runs, store = tmp_path / "b", tmp_path / "b-rec"
    cmd = [
        sys.executable,
        "-c",
        "from pipeline.cli.app import main; main()",
        "run",
        str(DEMO_BUNDLE),
        "--runs-dir",
        str(runs),
        "--model",
        MODEL,
        "--api-base",
        server.base_url,
        "--record",
        str(store),
        "--mode",
        "tools",
        "--batch",
    ]
    env = {**os.environ, "LUNASOL_BATCH_POLL_S": "0.05"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    run_dir = runs / sync_run[0].name
    deadline = time.monotonic() + 120
    while not read_batches(run_dir) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert read_batches(run_dir), f"no batch stored: {proc.stderr.read() if proc.stderr else ''!r}"
    while server.batch.retrieves < 3 and time.monotonic() < deadline:
        time.sleep(0.05)  # the process is waiting on the provider
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    (b,) = read_batches(run_dir)
    server.batch.batches[b["id"]].plan = BatchPlan(validating_polls=0, in_progress_polls=0)  # the provider finishes
    go(server, tmp_path, "b", batch=True, resume=True)
    assert (server.batch.uploads, server.batch.created) == (1, 1)  # counted at the server: one submission
    assert outputs(run_dir) == outputs(sync_run[0])
    assert json.loads((run_dir / "batches.json").read_text())["batches"][0]["status"] == "completed"


def test_a_failed_batch_blocks_with_the_providers_reason_and_resume_submits_it_again(
    tmp_path: Path, server: FakeOpenAI, sync_run: tuple[Path, Path]
) -> None:
    # Before, a batch the provider failed whole had every one of its requests asked synchronously,
    # one log line each, at the full price the user chose --batch to avoid.
    server.batch.plan(BatchPlan(outcome="failed"))
    with pytest.raises(Blocked, match="failed: batch failed validation") as info:
        go(server, tmp_path, "b", batch=True)
    assert "24 requests were not asked synchronously" in str(info.value)
    assert info.value.unblock.endswith(" --batch --resume") and info.value.unblock.count("--batch") == 1
    assert all("x-lunasol-batch-item" in h for h in server.headers)  # nothing went out on its own
    run_dir = tmp_path / "b" / sync_run[0].name
    go(server, tmp_path, "b", batch=True, resume=True)
    assert [b["status"] for b in read_batches(run_dir)] == ["failed", "completed"]
    assert outputs(run_dir) == outputs(sync_run[0])
    assert store_bytes(tmp_path / "b-rec") == store_bytes(sync_run[1])


def test_a_declared_queue_limit_paces_the_batches_and_the_unblock_keeps_it(
    tmp_path: Path, server: FakeOpenAI, sync_run: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.testing.openai_server import request_tokens

    # A third of the demo's requests fit in the queue at once (the server's count); lunasol is told a
    # limit of its own a little lower, and keeps it: no batch is refused, and they go one after another.
    recorded = [json.loads(p.read_text()) for p in sorted(DEMO_RECORDINGS.glob("*/*.json"))]
    luna = [r["request"] for r in recorded if r.get("role") == "luna" and isinstance(r.get("request"), dict)]
    per = max(request_tokens(r) for r in luna) if luna else 8_000
    server.batch.queue_tokens = 10 * per
    models = settings(server, tmp_path / "b-rec", batch=True).model_copy(update={"batch_queue_tokens": 8 * per})
    opts = RunOptions(bundle=DEMO_BUNDLE, runs_dir=tmp_path / "b", models=models)
    run_dir = run(opts, log=lambda _m: None).ctx.run_dir
    batches = read_batches(run_dir)
    assert len(batches) >= 3 and {b["status"] for b in batches} == {"completed"}
    assert 0 < server.batch.peak_enqueued <= 8 * per  # lunasol's weight errs high: its limit held at the server
    assert outputs(run_dir) == outputs(sync_run[0])
    from pipeline.artifacts.run_info import run_command

    assert f"--batch --batch-queue-tokens {8 * per} --resume" in run_command(run_dir)
