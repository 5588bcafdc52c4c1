"""``lunasol ask`` at N cells against the local server: its CPU per cell beside Luna's, same process, same run.

The demo's cells are cloned to N (``bench/scale_demo.py``) and run live to gate 1 against
:class:`~pipeline.testing.openai_server.FakeOpenAI` answering with the demo's hand-written answers;
the Luna stage's CPU is measured around ``run_luna``. Then one yes-no ask over every cell against
the same kind of server (it answers yes and cites the log's first event). CPU is process time
(user + system of this process: lunasol and the in-process server alike, for both), reported as
seconds per cell and as the ask's ratio to Luna's.

    python bench/bench_ask.py --cells 1000 --out /tmp/bench-ask [--json]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.scale_demo import run_scaled  # noqa: E402
from pipeline.ask import AskSpec, run_ask  # noqa: E402
from pipeline.core.settings import ModelSettings  # noqa: E402
from pipeline.testing.openai_server import FakeOpenAI, Reply, completion_body  # noqa: E402

EVENT = re.compile(r"\b([A-Z]\d{3,}-e\d{4})\b")


def _ask_handler(request: dict[str, Any]) -> Reply:
    user = next(m["content"] for m in request["messages"] if m["role"] == "user")
    ids = EVENT.findall(user.split("<<<log", 1)[-1])
    data = {"answer": "yes" if ids else "no", "explanation": "the log shows it", "evidence": ids[:1]}
    return Reply(body=completion_body(request, tool_arguments=json.dumps(data)))


def measure(cells: int, out: Path) -> dict[str, Any]:
    """Build and run the scaled demo (Luna timed), then ask every cell (timed); the figures."""
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
        run_dir = run_scaled(out, cells, log=lambda _m: None)
    finally:
        luna_stage.run_luna = real
    with FakeOpenAI(_ask_handler) as server:
        settings = ModelSettings.from_env(
            model="openai/fixture-model", api_base=server.base_url, concurrency=8, instructor_mode="tools"
        )
        t0, w0 = time.process_time(), time.perf_counter()
        _, results = run_ask(run_dir, AskSpec("Did the reviewer re-read a file?", "yes-no"), settings)
        ask_cpu, ask_wall = time.process_time() - t0, time.perf_counter() - w0
    ok = sum(r.status == "ok" for r in results)
    return {
        "cells": len(results),
        "answered": ok,
        "luna_cpu_s": round(spent["luna"], 2),
        "ask_cpu_s": round(ask_cpu, 2),
        "ask_wall_s": round(ask_wall, 2),
        "luna_cpu_ms_per_cell": round(1000 * spent["luna"] / len(results), 1),
        "ask_cpu_ms_per_cell": round(1000 * ask_cpu / len(results), 1),
        "ask_over_luna": round(ask_cpu / spent["luna"], 3) if spent["luna"] else None,
    }


@pytest.mark.bench
def test_bench_ask(tmp_path: Path) -> None:
    """``make bench``: 100 cells; every cell answered, the ask's CPU printed beside Luna's."""
    figures = measure(100, tmp_path)
    print(json.dumps(figures))
    assert figures["answered"] == figures["cells"] == 100


def main() -> None:
    """Command line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=1000)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    figures = measure(args.cells, args.out)
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(
        f"{figures['cells']} cells ({figures['answered']} answered): Luna {figures['luna_cpu_s']} CPU s "
        f"({figures['luna_cpu_ms_per_cell']} ms/cell), ask {figures['ask_cpu_s']} CPU s "
        f"({figures['ask_cpu_ms_per_cell']} ms/cell, wall {figures['ask_wall_s']} s): "
        f"ask / Luna = {figures['ask_over_luna']}×"
    )


if __name__ == "__main__":
    main()
