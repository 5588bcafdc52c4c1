"""``--batch`` at N cells, live against the shipped local server: CPU, peak RSS, and how the batches overlapped.

Run: ``python bench/bench_batch_run.py [--cells 1000] [--keep DIR] [--queue-tokens N]``. The bundle is
the demo cloned to N cells and the run is bench_scale.py's (same child process, server and scripted model), with
``--batch``. The local server finishes a batch within a few polls, far faster than a provider
(minutes to hours), so what matters here is whether a later batch is submitted before the earlier
ones finish (printed as ``overlapped``), not the wall time. ``--queue-tokens N`` gives the server
OpenAI's enqueued-token limit (its own count; lunasol is not told it): printed are the batches it
refused as full (``refused``) and the most tokens it held at once (``peak_enqueued``).
"""

from __future__ import annotations

import argparse
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from bench_scale import DEMO, lunasol_run, start_server

from pipeline.bundle.synth import clone_bundle
from pipeline.testing.scripted import ScriptedModel

_BATCH_LINE = re.compile(r"batch (\S+): (\d+ requests submitted|completed)")


def overlaps(lines: list[str]) -> tuple[int, int]:
    """(batches submitted, of which submitted while an earlier one was still open) from a run's log."""
    open_batches: set[str] = set()
    submitted = overlapped = 0
    for line in lines:
        m = _BATCH_LINE.match(line)
        if m is None:
            continue
        if m.group(2) == "completed":
            open_batches.discard(m.group(1))
            continue
        submitted += 1
        overlapped += bool(open_batches)
        open_batches.add(m.group(1))
    return submitted, overlapped


def run(cells: int, root: Path, queue_tokens: int | None = None) -> dict[str, Any]:
    """One ``lunasol run --batch`` over ``cells`` cells (the server's batch queue limited to ``queue_tokens``)."""
    from pipeline.models.batch_submit import read_batches

    model = ScriptedModel()
    server, context = start_server(model)
    server.batch.queue_tokens = queue_tokens
    try:
        bundle = clone_bundle(DEMO, root / f"bundle-{cells}", cells)
        r = lunasol_run(
            bundle, root / "runs", server, model, context, extra_args=("--batch",),
            extra_env={"LUNASOL_BATCH_POLL_S": "0.2"},
        )  # fmt: skip
        peak_enqueued = server.batch.peak_enqueued
    finally:
        server.stop()
    batches, overlapped = overlaps(r["lines"])
    refused = sum(b["status"] == "failed" for b in read_batches(root / "runs" / "r"))
    return {
        "exit": r["exit"],
        "cpu_s": round(r["cpu"], 1),
        "wall_s": round(r["wall_s"], 1),
        "peak_rss_mib": round(r["peak_tree_rss_mib"]),
        "stage_peak_rss_mib": r["stage_peak_rss_mib"],
        "self_maxrss_mib": round(r.get("self_maxrss_mib", 0)),  # the lunasol process alone (getrusage)
        "calls": r["calls"],
        "batches": batches,
        "overlapped": overlapped,
        "refused": refused,
        "peak_enqueued": peak_enqueued,
    }


def main() -> None:
    """CLI entry."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cells", type=int, default=1000)
    parser.add_argument("--keep", type=Path, default=None, help="keep the bundle and the run here")
    parser.add_argument("--queue-tokens", type=int, default=None, help="the server's batch queue limit (tokens)")
    ns = parser.parse_args()
    root = ns.keep or Path(tempfile.mkdtemp(prefix="lunasol-batch-"))
    if ns.keep is not None and ns.keep.exists():
        shutil.rmtree(ns.keep)
    try:
        print(run(ns.cells, root, ns.queue_tokens))
    finally:
        if ns.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
