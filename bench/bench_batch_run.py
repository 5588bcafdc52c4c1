"""``--batch`` at N cells, live against the shipped local server: wall, peak RSS, and how the batches overlapped.

Run: ``python bench/bench_batch_run.py [--cells 1000] [--keep DIR]``. The bundle is the demo cloned to N
cells (as in bench_scale.py); the scripted model answers every batch item. The local server finishes
a batch within a few polls, far faster than a provider (minutes to hours), so what matters here is
whether a later batch is submitted before the earlier ones finish (printed as ``overlapped``), not
the wall time.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from bench_export import tree_rss  # the same whole-process-tree RSS sampling as the export benchmark

from pipeline.bundle.synth import clone_bundle
from pipeline.testing.openai_server import FakeOpenAI
from pipeline.testing.scripted import ScriptedModel

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "fixtures" / "bundles" / "h0-demo"


def run(cells: int, root: Path) -> dict[str, object]:
    """One ``lunasol run --batch`` over ``cells`` cells; its figures."""
    bundle = clone_bundle(DEMO, root / f"bundle-{cells}", cells)
    model = ScriptedModel()
    server = FakeOpenAI(model, context_tokens=128_000).start()
    try:
        env = {**os.environ, "OPENAI_API_KEY": "sk-bench-not-a-key", "LUNASOL_BATCH_POLL_S": "0.2"}
        args = ["lunasol", "run", str(bundle), "--runs-dir", str(root / "runs"), "--run-id", "b"]
        args += ["--model", "openai/bench-model", "--api-base", server.base_url, "--mode", "tools"]
        args += ["--context-tokens", "128000", "--batch"]
        start = time.perf_counter()
        proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, tree_rss(proc.pid))
            time.sleep(0.1)
        out = proc.stdout.read() if proc.stdout else ""
        wall = time.perf_counter() - start
    finally:
        server.stop()
    # a batch submitted while another is still open (not yet "completed" in the log) overlapped it
    open_batches: set[str] = set()
    overlapped = 0
    for line in out.splitlines():
        m = re.match(r"batch (\S+): (\d+ requests submitted|completed)", line)
        if not m:
            continue
        if m.group(2) == "completed":
            open_batches.discard(m.group(1))
        else:
            overlapped += bool(open_batches)
            open_batches.add(m.group(1))
    submitted = sum("requests submitted" in line for line in out.splitlines())
    return {
        "exit": proc.returncode,
        "wall_s": round(wall, 1),
        "peak_rss_mib": round(peak / 2**20),
        "calls": model.take()[0],
        "batches": submitted,
        "overlapped": overlapped,
    }


def main() -> None:
    """CLI entry."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cells", type=int, default=1000)
    parser.add_argument("--keep", type=Path, default=None, help="keep the bundle and the run here")
    ns = parser.parse_args()
    root = ns.keep or Path(tempfile.mkdtemp(prefix="lunasol-batch-"))
    if ns.keep is not None and ns.keep.exists():
        shutil.rmtree(ns.keep)
    try:
        print(run(ns.cells, root))
    finally:
        if ns.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
