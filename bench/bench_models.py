"""Model-layer benchmarks: concurrency against a 200 ms server, replay overhead, CLI import time.

Run: ``python bench/bench_models.py`` (prints figures) or ``pytest -m bench bench/bench_models.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("LUNASOL_TEST_NO_WAIT", "1")

import pytest
from pydantic import BaseModel

import pipeline  # noqa: F401  (sets the offline switches first)
from pipeline.core.settings import ModelSettings
from pipeline.models import ModelClient
from pipeline.testing.openai_server import FakeOpenAI, auto_answer

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = "{% block system %}Bench.{% endblock %}{% block user %}Cell {{ cell_id }}: {{ text }}{% endblock %}"


class Out(BaseModel):
    """Output model of the bench calls."""

    statement: str
    event_ids: list[str]


def _prompts() -> Path:
    d = Path(tempfile.mkdtemp(prefix="bench-prompts-"))
    (d / "b.j2").write_text(TEMPLATE)
    os.environ["LUNASOL_PROMPTS_DIR"] = str(d)
    return d


async def _calls(client: ModelClient, n: int, prefix: str = "C") -> list[Any]:
    return await client.gather(
        [
            client.call(
                role="b",
                cell_id=f"{prefix}{i}",
                context={"cell_id": f"{prefix}{i}", "text": "x" * 200},
                response_model=Out,
            )
            for i in range(n)
        ],
        label="bench",
    )


@contextlib.contextmanager
def server_process(delay_ms: float) -> Iterator[str]:
    """The local server in its own process (as a real endpoint would be): yields its base URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.testing.openai_server", "--port", "0", "--delay-ms", str(delay_ms)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "serving OpenAI chat completions on http://127.0.0.1:PORT/v1"
        yield line.split()[-1]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def concurrency_bench(
    n: int = 48, concurrency: int = 8, delay_s: float = 0.2, in_process: bool = False, repeats: int = 3
) -> dict[str, Any]:
    """Wall time of n calls at a concurrency bound against a server adding delay_s per call."""
    _prompts()
    with contextlib.ExitStack() as stack:
        if in_process:
            srv = stack.enter_context(FakeOpenAI(auto_answer, delay_s=delay_s))
            base = srv.base_url
        else:
            base = stack.enter_context(server_process(delay_s * 1000))
        run = stack.enter_context(tempfile.TemporaryDirectory())
        client = ModelClient(
            ModelSettings(model="openai/test-model", api_base=base, concurrency=concurrency, instructor_mode="tools"),
            Path(run),
        )
        await _calls(client, concurrency, "warm")  # first calls pay litellm/instructor setup and connections
        walls = []
        for rep in range(repeats):  # best of N: other processes on a 2-core box add noise, never speed
            start = time.perf_counter()
            outs = await _calls(client, n, prefix=f"R{rep}-C")
            walls.append(time.perf_counter() - start)
            assert all(o.ok for o in outs)
        if in_process:
            assert srv.max_in_flight <= concurrency
    ideal = (n / concurrency) * delay_s
    wall = min(walls)
    return {
        "calls": n,
        "concurrency": concurrency,
        "wall_s": wall,
        "ideal_s": ideal,
        "ratio": wall / ideal,
        "all_ratios": [round(w / ideal, 3) for w in walls],
    }


async def replay_bench(n: int = 200) -> dict[str, float]:
    """Per-call time of replay (store read + parse + validate + log), excluding imports and warm-up."""
    _prompts()
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store"
        with FakeOpenAI(auto_answer) as srv:
            rec = ModelClient(
                ModelSettings(
                    model="openai/test-model",
                    api_base=srv.base_url,
                    mode="record",
                    store=store,
                    instructor_mode="tools",
                ),
                Path(tmp) / "rec",
            )
            await _calls(rec, n)
        rep = ModelClient(ModelSettings(model="openai/test-model", mode="replay", store=store), Path(tmp) / "rep")
        await _calls(rep, 5)  # warm-up
        per_call = []
        for i in range(n):
            t = time.perf_counter()
            await rep.call(
                role="b", cell_id=f"C{i}", context={"cell_id": f"C{i}", "text": "x" * 200}, response_model=Out
            )
            per_call.append(time.perf_counter() - t)
    return {
        "calls": n,
        "median_ms": statistics.median(per_call) * 1000,
        "p95_ms": sorted(per_call)[int(0.95 * n)] * 1000,
        "mean_ms": statistics.mean(per_call) * 1000,
    }


def import_bench(runs: int = 5) -> dict[str, float]:
    """Wall time of ``import pipeline.cli.app`` in a fresh interpreter, minus interpreter start."""

    def wall(code: str) -> float:
        best = float("inf")
        for _ in range(runs):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
            best = min(best, time.perf_counter() - t)
        return best

    base = wall("pass")
    cli = wall("import pipeline.cli.app")
    litellm = wall("import litellm")
    return {"python_start_s": base, "import_pipeline_cli_s": cli - base, "import_litellm_s": litellm - base}


@pytest.mark.bench
async def test_concurrency_within_1_3x_of_ideal() -> None:
    r = await concurrency_bench()
    print(r)
    assert r["ratio"] <= 1.3


@pytest.mark.bench
async def test_replay_overhead_under_5ms() -> None:
    r = await replay_bench()
    print(r)
    assert r["median_ms"] < 5


@pytest.mark.bench
def test_cli_import_time() -> None:
    r = import_bench()
    print(r)
    assert r["import_pipeline_cli_s"] < 1.0


def main() -> None:
    """Print every figure."""
    for in_process in (False, True):
        c = asyncio.run(concurrency_bench(in_process=in_process))
        where = "in-process server" if in_process else "server in its own process"
        print(
            f"concurrency ({where}): {c['calls']} calls @ {c['concurrency']} vs 200 ms/call: {c['wall_s']:.3f} s "
            f"(ideal {c['ideal_s']:.2f} s, best ratio {c['ratio']:.3f} of {c['all_ratios']}, target <= 1.3)"
        )
    r = asyncio.run(replay_bench())
    print(
        f"replay: per call median {r['median_ms']:.2f} ms, p95 {r['p95_ms']:.2f} ms, mean {r['mean_ms']:.2f} ms "
        f"over {r['calls']} calls (target < 5 ms)"
    )
    i = import_bench()
    print(
        f"import: pipeline.cli.app {i['import_pipeline_cli_s'] * 1000:.0f} ms, litellm "
        f"{i['import_litellm_s'] * 1000:.0f} ms (interpreter start {i['python_start_s'] * 1000:.0f} ms)"
    )


if __name__ == "__main__":
    main()
