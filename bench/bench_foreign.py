"""Foreign logs end to end: every dataset of ../shared/data in one bundle, live to gate 1, then the report.

Run: ``python bench/bench_foreign.py [--context-tokens 32000] [--copies 1] [--keep DIR] [--json]``.

``lunasol bundle import auto`` over a copy of all of ../shared/data (each file read by the adapter
whose format it looks like: a ``mixed`` bundle), then ``lunasol run`` in a child process against the
shipped local server with the scripted model (pipeline.testing.scripted), a small declared context so
Sol runs map/reduce, then ``lunasol report``. ``--copies N`` adds N-1 copies of every Who&When run,
each with its first message changed (N runs per task family, as a batch of repeated runs has).
Printed: cells, events, redactions, calls per role, Sol's plan, CPU and peak RSS of the run (via
bench_scale), the report's size and its refs (embedded, hash mismatches, unresolved: any
unresolved ref is a claim that does not resolve to raw bytes).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_scale import lunasol_run, start_server  # the same child run, server and figures as the scale bench

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the tests package: where the shared data is (beside the clone, or LUNASOL_SHARED_DIR)

from pipeline.adapters import import_bundle  # noqa: E402
from pipeline.report.build import write_report  # noqa: E402
from pipeline.testing.scripted import ScriptedModel  # noqa: E402
from tests.adapters.adapter_helpers import SHARED_DATA as SHARED  # noqa: E402


def stage(dest: Path, copies: int) -> None:
    """Copy every dataset (writable), plus ``copies - 1`` edited copies of each Who&When run."""
    shutil.copytree(SHARED, dest, ignore=shutil.ignore_patterns("SOURCE.md", "README.md", "LICENSE*"))
    for p in dest.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    for k in range(1, copies):
        for p in sorted((SHARED / "who-and-when").rglob("*.json")):
            doc = json.loads(p.read_text(encoding="utf-8"))
            if not (isinstance(doc, dict) and isinstance(doc.get("history"), list) and doc["history"]):
                continue
            doc["history"][0]["content"] = f"{doc['history'][0].get('content', '')}\n(run {k + 1})"
            out = dest / f"who-and-when-run{k + 1}" / p.relative_to(SHARED / "who-and-when")
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(doc, indent=4, ensure_ascii=False), encoding="utf-8")


def measure(work: Path, context_tokens: int, copies: int) -> dict[str, Any]:
    """Import, run live to gate 1 and render the report; the figures."""
    src, bundle = work / "src", work / "bundle"
    stage(src, copies)
    t0 = time.perf_counter()
    imported = import_bundle("auto", src, bundle)
    import_s = time.perf_counter() - t0
    model = ScriptedModel()
    server, _ = start_server(model)
    try:
        budget = ("--context-tokens", str(context_tokens))
        run = lunasol_run(bundle, work / "runs", server, model, False, extra_args=budget)
    finally:
        server.stop()
    t0 = time.perf_counter()
    _, stats = write_report(work / "runs" / "r")
    report_s = time.perf_counter() - t0
    return {
        "cells": imported.cells,
        "formats": imported.formats,
        "not_runs": len(imported.skipped),
        "import_s": round(import_s, 2),
        "run": {k: run[k] for k in ("exit", "cpu", "stages", "peak_tree_rss_mib", "calls") if k in run},
        "lines": [line for line in run["lines"] if line.startswith(("[export]", "[luna]", "[sol]"))],
        "report": {**stats, "seconds": round(report_s, 2)},
    }


def main() -> None:
    """CLI: print the figures (or JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context-tokens", type=int, default=32000, help="declared context (small: Sol maps)")
    ap.add_argument("--copies", type=int, default=1, help="runs per Who&When task (1: the data as it is)")
    ap.add_argument("--keep", type=Path, help="work here and keep it (default: a temp dir, removed)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not SHARED.is_dir():
        sys.exit(f"shared data not found at {SHARED}")
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-foreign-"))
    if args.keep and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    try:
        res = measure(work, args.context_tokens, args.copies)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(res, indent=1))
        return
    run, rep = res["run"], res["report"]
    formats = ", ".join(res["formats"])
    print(f"import: {res['cells']} cells, formats {formats}; {res['not_runs']} files not runs; {res['import_s']} s")
    rss = run["peak_tree_rss_mib"]
    print(f"run: exit {run['exit']}, CPU {run['cpu']:.1f} s, peak RSS {rss:.0f} MiB, calls {run['calls']}")
    for line in res["lines"]:
        print(f"  {line[:300]}")
    print(
        f"report: {rep['bytes']:,} bytes, {rep['refs']} refs embedded, {rep['hash_mismatches']} hash mismatches, "
        f"{rep['unresolved']} unresolved, {rep['seconds']} s"
    )


if __name__ == "__main__":
    main()
