"""Fleet benchmark: ``lunasol run`` over two local endpoints (``--api-base A,B``), one of them dying mid-run.

Run: ``python bench/bench_fleet.py [--cells 100] [--delay-ms 200] [--die-after 30]`` (or
``pytest -q -m bench bench/bench_fleet.py -o addopts="" -s``).

The demo cloned to N cells (``bench_scale``'s scripted model: valid Luna and Sol answers made from
each prompt) runs live in a child process against two shipped local servers, each adding a delay
per reply; the first one stops after ``--die-after`` requests (it stops listening and drops every
open connection, as a crashed replica would). Printed: exit code, wall, calls answered by each
endpoint, cells Luna finished and failed; then the same bundle over two healthy endpoints and over one
(``LUNASOL_CONCURRENCY=4``: per endpoint in a fleet, in all for one endpoint).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pipeline.bundle.synth import clone_bundle
from pipeline.testing.openai_server import FakeOpenAI, Reply
from pipeline.testing.scripted import ScriptedModel

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "fixtures" / "bundles" / "h0-demo"


class Dying:
    """A handler that answers like ``inner`` for ``n`` requests, then stops its server for good."""

    def __init__(self, inner: Any, n: int) -> None:
        self.inner, self.n, self.seen = inner, n, 0
        self.answered = 0
        self.server: FakeOpenAI | None = None
        self.lock = threading.Lock()

    def __call__(self, request: dict[str, Any]) -> Reply:
        with self.lock:
            self.seen += 1
            dead = self.seen > self.n
            if self.seen == self.n + 1 and self.server is not None:
                threading.Thread(target=self.server.stop, daemon=True).start()
            if not dead:
                self.answered += 1
        return Reply(drop=True) if dead else self.inner(request)


def run_once(bundle: Path, runs: Path, api_base: str) -> tuple[int, float, dict[str, int], str]:
    """``lunasol run`` in a child process: (exit code, wall seconds, Luna cells per status, stderr tail)."""
    env = {**os.environ, "OPENAI_API_KEY": "sk-bench-not-a-key", "LUNASOL_CONCURRENCY": "4"}
    cmd = [sys.executable, "-c", "from pipeline.cli.app import main; main()", "run", str(bundle)]
    cmd += ["--runs-dir", str(runs), "--run-id", "r"]
    cmd += ["--model", "openai/bench-model", "--api-base", api_base, "--mode", "tools"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    status: dict[str, int] = {}
    for line in (runs / "r" / "calls.jsonl").read_text(encoding="utf-8").splitlines() if (runs / "r").is_dir() else []:
        row = json.loads(line)
        if row.get("role") == "luna":
            status[str(row.get("outcome"))] = status.get(str(row.get("outcome")), 0) + 1
    return proc.returncode, wall, status, proc.stderr.strip()[-400:]


def bench(cells: int, delay_ms: float, die_after: int) -> dict[str, Any]:
    """The fleet run with one endpoint dying, then the same bundle against one endpoint."""
    root = Path(tempfile.mkdtemp(prefix="lunasol-fleet-"))
    try:
        bundle = clone_bundle(DEMO, root / "bundle", cells)
        dying = Dying(ScriptedModel(), die_after)
        live = ScriptedModel()
        with FakeOpenAI(dying, delay_s=delay_ms / 1000) as a, FakeOpenAI(live, delay_s=delay_ms / 1000) as b:
            dying.server = a
            code, wall, status, err = run_once(bundle, root / "fleet", f"{a.base_url},{b.base_url}")
            fleet = {"exit": code, "wall_s": round(wall, 1), "luna_calls": status, "answered_by_a": dying.answered,
                     "answered_by_b": len(b.requests), "a_died_after": die_after, "stderr": err}  # fmt: skip
        with FakeOpenAI(live, delay_s=delay_ms / 1000) as a, FakeOpenAI(live, delay_s=delay_ms / 1000) as b:
            code, wall, status, err = run_once(bundle, root / "healthy", f"{a.base_url},{b.base_url}")
            healthy = {"exit": code, "wall_s": round(wall, 1), "luna_calls": status,
                       "answered_by_a": len(a.requests), "answered_by_b": len(b.requests)}  # fmt: skip
        with FakeOpenAI(ScriptedModel(), delay_s=delay_ms / 1000) as one:
            code, wall, status, err = run_once(bundle, root / "single", one.base_url)
            single = {"exit": code, "wall_s": round(wall, 1), "luna_calls": status, "answered": len(one.requests)}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"cells": cells, "delay_ms": delay_ms, "fleet": fleet, "healthy_fleet": healthy, "single": single}


@pytest.mark.bench
def test_fleet_benchmark() -> None:
    """100 cells over two endpoints, one dying after 30 calls: exit 0 and every Luna call ok."""
    out = bench(100, 200, 30)
    print(json.dumps(out, indent=1))
    assert out["fleet"]["exit"] == 0 and out["fleet"]["answered_by_a"] == 30 and out["fleet"]["answered_by_b"] > 0


def main() -> None:
    """CLI entry: prints every figure as JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cells", type=int, default=100)
    ap.add_argument("--delay-ms", type=float, default=200.0)
    ap.add_argument("--die-after", type=int, default=30)
    ns = ap.parse_args()
    print(json.dumps(bench(ns.cells, ns.delay_ms, ns.die_after), indent=1))


if __name__ == "__main__":
    main()
