"""The reading verbs on a kept run: runs, show, diff, export-tables, report (CPU, wall, peak RSS).

Run: ``python bench/bench_review.py --run RUN_DIR [--skip report] [--json]``, e.g. on the 10,000-cell run
that ``python bench/bench_scale.py --cells 10000 --no-reruns --keep DIR`` leaves in ``DIR/runs-10000/r``.

Each verb is a fresh ``lunasol`` child process; its CPU (user + system, from the kernel's rusage) and
the peak RSS of its process tree (sampled from /proc) are printed beside the same figures of
``lunasol --version`` measured in the same run (the interpreter and the CLI's imports), as a ratio:
this machine is shared, so a verb's cost is read against that baseline, not as seconds alone.
Writes only under a temp dir (the report's page, the Parquet tables); the run is only read.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_export import tree_rss  # the same whole-process-tree RSS sampling as the export benchmark


def measure(args: list[str]) -> dict[str, Any]:
    """One ``lunasol ARGS`` child: exit code, CPU and wall seconds, peak tree RSS in MiB."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    env = {**os.environ}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed lunasol runs from bytecode
    proc = subprocess.Popen(
        [sys.executable, "-c", "from pipeline.cli.app import main; main()", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode("utf-8", "replace") if proc.stderr else ""
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"exit": proc.returncode, "cpu_s": round(cpu, 2), "wall_s": round(wall, 2),
            "peak_rss_mib": round(peak / 2**20), "error": err.strip()[-300:] if proc.returncode else ""}  # fmt: skip


def first_ids(run: Path) -> dict[str, str]:
    """A weakness, event, cell, pattern and group of the run to show."""
    shortlist = json.loads((run / "weakness-shortlist.json").read_text(encoding="utf-8"))
    w = shortlist["weaknesses"][0]
    with (run / "patterns.jsonl").open(encoding="utf-8") as fh:
        pattern = json.loads(next(line for line in fh if line.strip()))
    return {
        "weakness": w["weakness_id"],
        "event": w["support"]["event_refs"][0],
        "cell": pattern["cell_id"],
        "pattern": pattern["pattern_id"],
        "group": w["support"]["pattern_groups"][0],
    }


def main() -> None:
    """CLI: time every reading verb on the run and print the figures (or JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, required=True, help="a run directory reached gate 1")
    ap.add_argument("--skip", action="append", default=[], help="a verb to leave out (e.g. report: minutes at 10,000)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    run = args.run.resolve()
    ids = first_ids(run)
    out = Path(tempfile.mkdtemp(prefix="bench-review-"))
    verbs: dict[str, list[str]] = {
        "baseline (--version)": ["--version"],
        "runs": ["runs", "--runs-dir", str(run.parent)],
        "status": ["status", str(run)],
        **{f"show {k}": ["show", str(run), v] for k, v in ids.items()},
        "diff (run with itself)": ["diff", str(run), str(run)],
        "export-tables": ["export-tables", str(run), "--parquet", str(out / "tables")],
        "report": ["report", str(run), "--output", str(out / "report.html")],
    }
    results: dict[str, Any] = {}
    try:
        for name, argv in verbs.items():
            if name.split(" ")[0] in args.skip:
                continue
            results[name] = measure(argv)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    base = results["baseline (--version)"]["cpu_s"] or 0.01
    for r in results.values():
        r["cpu_vs_baseline"] = round(r["cpu_s"] / base, 1)
    if args.json:
        print(json.dumps({"run": str(run), "ids": ids, "verbs": results}, indent=1))
        return
    print(f"run {run}; ids {ids}")
    print(f"{'verb':<24} {'exit':>4} {'CPU s':>8} {'x base':>7} {'wall s':>8} {'peak MiB':>9}")
    for name, r in results.items():
        cols = (r["exit"], r["cpu_s"], r["cpu_vs_baseline"], r["wall_s"], r["peak_rss_mib"])
        print(f"{name:<24} {cols[0]:>4} {cols[1]:>8} {cols[2]:>7} {cols[3]:>8} {cols[4]:>9}")
        if r["error"]:
            print(f"  {r['error']}")


if __name__ == "__main__":
    main()
