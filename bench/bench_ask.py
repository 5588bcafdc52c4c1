"""``lunasol ask`` at N cells against the local server: its CPU per cell beside Luna's, same run.

The demo's cells are cloned to N (``bench/scale_demo.py``) and run live to gate 1 against
:class:`~pipeline.testing.openai_server.FakeOpenAI` answering with the demo's hand-written answers;
the Luna stage's CPU is measured around ``run_luna``. Then one yes-no ask over every cell against
the same kind of server (it answers yes and cites the log's first event), then the same ask
planned by ``--dry-run`` (nothing sent). The server runs in a process of its own (``--in-process``:
a thread of this one, as before), so lunasol's CPU is this process's time (user + system) and the
server's is reported apart; per cell, and as the ask's ratio to Luna's.

    python bench/bench_ask.py --cells 1000 --out /tmp/bench-ask [--json] [--in-process]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import re
import resource
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.scale_demo import MODEL, SINGLE_CALL_CONTEXT, _answer_for, clone_bundle, run_scaled  # noqa: E402
from fixtures.record_demo import answer_name  # noqa: E402
from pipeline.ask import AskSpec, run_ask  # noqa: E402
from pipeline.ask.stage import plan_ask  # noqa: E402
from pipeline.core.context import RunOptions  # noqa: E402
from pipeline.core.settings import ModelSettings  # noqa: E402
from pipeline.run.runner import run  # noqa: E402
from pipeline.testing.openai_server import FakeOpenAI, Reply, completion_body  # noqa: E402

EVENT = re.compile(r"\b([A-Z]\d{3,}-e\d{4})\b")


def _ask_handler(request: dict[str, Any]) -> Reply:
    user = next(m["content"] for m in request["messages"] if m["role"] == "user")
    ids = EVENT.findall(user.split("<<<log", 1)[-1])
    data = {"answer": "yes" if ids else "no", "explanation": "the log shows it", "evidence": ids[:1]}
    return Reply(body=completion_body(request, tool_arguments=json.dumps(data)))


def _luna_handler(source: dict[str, str]) -> Any:
    def handle(request: dict[str, Any]) -> Reply:
        name = answer_name(request)
        if name is None:
            return Reply(status=400, body={"error": {"message": "no router matched this request"}})
        return Reply(body=completion_body(request, tool_arguments=json.dumps(_answer_for(source, name))))

    return handle


def _serve(kind: str, source: dict[str, str], conn: Any) -> None:
    """A server process: send its URL, serve until told to stop, then send its own CPU seconds."""
    server = FakeOpenAI(_ask_handler if kind == "ask" else _luna_handler(source)).start()
    conn.send(server.base_url)
    conn.recv()  # stop
    server.stop()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    conn.send(ru.ru_utime + ru.ru_stime)


@contextmanager
def _server(kind: str, source: dict[str, str], cpu: dict[str, float]) -> Iterator[str]:
    """A server in a process of its own (its CPU lands in ``cpu[kind + '_server']``); yields its URL."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(kind, source, child), daemon=True)
    proc.start()
    try:
        yield str(parent.recv())
    finally:
        parent.send("stop")
        cpu[f"{kind}_server"] = float(parent.recv()) if parent.poll(30) else float("nan")
        proc.join(10)


def _settings(api_base: str) -> ModelSettings:
    return ModelSettings.from_env(model=MODEL, api_base=api_base, concurrency=8, instructor_mode="tools")


def measure(cells: int, out: Path, *, in_process: bool = False) -> dict[str, Any]:
    """Build and run the scaled demo (Luna timed), then ask every cell (timed), then plan it; the figures."""
    import importlib

    # the module, not the package's re-exported `stage` function of the same name
    luna_stage: Any = importlib.import_module("pipeline.luna.stage")

    spent: dict[str, float] = {}
    real = luna_stage.run_luna

    async def timed(ctx: Any) -> Any:
        t0 = time.process_time()
        try:
            return await real(ctx)
        finally:
            spent["luna"] = time.process_time() - t0

    luna_stage.run_luna = timed
    try:
        if in_process:
            run_dir = run_scaled(out, cells, log=lambda _m: None)
        else:
            bundle, source = clone_bundle(out / "bundle", cells)
            with _server("luna", source, spent) as url:
                settings = _settings(url).model_copy(update={"context_tokens": SINGLE_CALL_CONTEXT})
                opts = RunOptions(bundle=bundle, run_id=f"scale-{cells}", runs_dir=out / "runs", models=settings)
                run_dir = run(opts, log=lambda _m: None).ctx.run_dir
    finally:
        luna_stage.run_luna = real
    spec = AskSpec("Did the reviewer re-read a file?", "yes-no")
    if in_process:
        with FakeOpenAI(_ask_handler) as server:
            t0, w0 = time.process_time(), time.perf_counter()
            _, results = run_ask(run_dir, spec, _settings(server.base_url))
            ask_cpu, ask_wall = time.process_time() - t0, time.perf_counter() - w0
    else:
        with _server("ask", {}, spent) as url:
            t0, w0 = time.process_time(), time.perf_counter()
            _, results = run_ask(run_dir, spec, _settings(url))
            ask_cpu, ask_wall = time.process_time() - t0, time.perf_counter() - w0
    t0 = time.process_time()
    plan = plan_ask(run_dir, spec, _settings("http://127.0.0.1:9"))  # plans only: nothing is sent
    plan_cpu = time.process_time() - t0
    ok = sum(r.status == "ok" for r in results)
    n = len(results)
    figures: dict[str, Any] = {
        "cells": n,
        "answered": ok,
        "server": "thread of this process" if in_process else "own process",
        "luna_cpu_s": round(spent["luna"], 2),
        "ask_cpu_s": round(ask_cpu, 2),
        "ask_wall_s": round(ask_wall, 2),
        "luna_cpu_ms_per_cell": round(1000 * spent["luna"] / n, 1),
        "ask_cpu_ms_per_cell": round(1000 * ask_cpu / n, 1),
        "ask_over_luna": round(ask_cpu / spent["luna"], 3) if spent["luna"] else None,
        "dry_run_calls": plan.estimate.calls,
        "dry_run_cpu_ms_per_cell": round(1000 * plan_cpu / n, 1),
    }
    if not in_process:
        figures["luna_server_cpu_s"] = round(spent["luna_server"], 2)
        figures["ask_server_cpu_s"] = round(spent["ask_server"], 2)
    return figures


@pytest.mark.bench
def test_bench_ask(tmp_path: Path) -> None:
    """``make bench``: 100 cells; every cell answered, the ask's CPU printed beside Luna's."""
    figures = measure(100, tmp_path)
    print(json.dumps(figures))
    assert figures["answered"] == figures["cells"] == 100
    assert figures["dry_run_calls"] >= 100 and figures["ask_server_cpu_s"] > 0


def main() -> None:
    """Command line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=1000)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--in-process", action="store_true", help="the server in a thread of this process")
    args = ap.parse_args()
    figures = measure(args.cells, args.out, in_process=args.in_process)
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(
        f"{figures['cells']} cells ({figures['answered']} answered): Luna {figures['luna_cpu_s']} CPU s "
        f"({figures['luna_cpu_ms_per_cell']} ms/cell), ask {figures['ask_cpu_s']} CPU s "
        f"({figures['ask_cpu_ms_per_cell']} ms/cell, wall {figures['ask_wall_s']} s): "
        f"ask / Luna = {figures['ask_over_luna']}×; server {figures['server']}"
        + (
            f" (its CPU: Luna's {figures['luna_server_cpu_s']} s, the ask's {figures['ask_server_cpu_s']} s)"
            if "ask_server_cpu_s" in figures
            else ""
        )
        + f"; --dry-run plans {figures['dry_run_calls']} calls at {figures['dry_run_cpu_ms_per_cell']} ms/cell"
    )


if __name__ == "__main__":
    main()
