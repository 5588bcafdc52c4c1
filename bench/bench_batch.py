"""``--batch`` client-side cost at 1,000 calls: batch mode against synchronous calls, same run, same server.

The local server answers at once (no added delay), so the figure is lunasol's own work per call:
synchronously litellm + HTTP + parse at concurrency 8; in batch mode capturing each request body
from litellm, one upload, polls, reading the output file and parsing. A real batch adds the
provider's hours on top; this shows what the machine spends.

The mode is the one a live run would choose: the preflight's probe of the server
(:mod:`pipeline.models.servermodes`). Without it the default for a model litellm does not know was
``json``, which this server (like llama-cpp-python's) does not answer in shape: every call failed
validation and the bench failed as shipped.

Run: ``python bench/bench_batch.py [N]`` or ``pytest -m bench bench/bench_batch.py``
(``LUNASOL_BENCH_CALLS`` sets N there, default 1000).
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("LUNASOL_TEST_NO_WAIT", "1")
os.environ["LUNASOL_BATCH_POLL_S"] = "0"

import pytest
from pydantic import BaseModel

import pipeline  # noqa: F401  (sets the offline switches first)
from pipeline.core.settings import ModelSettings
from pipeline.models import ModelClient, servermodes
from pipeline.models.batch_submit import read_batches
from pipeline.testing.openai_server import FakeOpenAI, auto_answer

TEMPLATE = "{% block system %}Bench.{% endblock %}{% block user %}Cell {{ cell_id }}: {{ text }}{% endblock %}"


class Out(BaseModel):
    """Output model of the bench calls."""

    statement: str
    event_ids: list[str]


async def _calls(client: ModelClient, n: int, prefix: str) -> list[Any]:
    return await client.gather(
        [
            client.call(
                role="luna",
                cell_id=f"{prefix}{i}",
                context={"cell_id": f"{prefix}{i}", "text": "x" * 200},
                response_model=Out,
            )
            for i in range(n)
        ],
        label="bench",
    )


async def batch_bench(n: int = 1000) -> dict[str, Any]:
    """Wall time of n Luna-shaped calls, synchronous (concurrency 8) then as one batch."""
    d = Path(tempfile.mkdtemp(prefix="bench-prompts-"))
    (d / "luna.j2").write_text(TEMPLATE)
    os.environ["LUNASOL_PROMPTS_DIR"] = str(d)
    out: dict[str, Any] = {"calls": n}
    with FakeOpenAI(auto_answer) as srv, tempfile.TemporaryDirectory() as tmp:
        os.environ["LUNASOL_CACHE_DIR"] = str(Path(tmp) / "cache")  # the probe's cache: not the user's
        probed = servermodes.probe(srv.base_url, "openai/test-model")  # what a live run's preflight does
        out["mode"] = probed["chosen"]
        for name, batch in (("sync", False), ("batch", True)):
            settings = ModelSettings(model="openai/test-model", api_base=srv.base_url, concurrency=8, batch=batch)
            client = ModelClient(settings, Path(tmp) / f"{name}-warm")
            await _calls(client, 8, "warm")  # litellm/instructor setup and connections are not the figure
            client = ModelClient(settings, Path(tmp) / name)
            start = time.perf_counter()
            outs = await _calls(client, n, "C")
            out[f"{name}_s"] = time.perf_counter() - start
            failed = [o for o in outs if not o.ok]
            assert not failed, f"{len(failed)} of {n} {name} calls failed: {failed[0].errors[:1]}"
            if batch:
                assert len(read_batches(Path(tmp) / name)[-1]["keys"]) == n
    out["ratio"] = out["batch_s"] / out["sync_s"]
    out["batch_ms_per_call"] = out["batch_s"] / n * 1000
    return out


@pytest.mark.bench
def test_batch_bench() -> None:
    """Batch mode costs the machine no more than 2x the synchronous calls it replaces (zero-latency server)."""
    r = asyncio.run(batch_bench(int(os.environ.get("LUNASOL_BENCH_CALLS", "1000"))))
    print(r)
    assert r["ratio"] < 2.0


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    print(asyncio.run(batch_bench(n)))
