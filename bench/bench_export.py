"""Export benchmark: a synthetic native bundle of >= 1,000,000 events, timed against DuckDB's own scan.

Run: ``python bench/bench_export.py [--events N] [--keep DIR]`` (or ``make bench``, which runs the
pytest wrapper below). Prints events/s, peak RSS of the export (measured in a child process),
and the ratio of export time to ``SELECT count(*) FROM read_json(...)`` over the same JSONL files.
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

import pytest

_CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from pipeline.ir.export import export
t0 = time.perf_counter()
report = export(Path(sys.argv[1]), Path(sys.argv[2]))
secs = time.perf_counter() - t0
peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"events": report.events, "seconds": secs, "peak_rss_mib": peak_kib / 1024}))
"""

_SCAN = r"""
import duckdb, json, sys, time
files = json.loads(open(sys.argv[1]).read())
t0 = time.perf_counter()
con = duckdb.connect()
n = con.execute(
    "SELECT count(*) FROM read_json(?, format='newline_delimited', union_by_name=true)", [files]
).fetchone()[0]
print(json.dumps({"rows": n, "seconds": time.perf_counter() - t0}))
"""


def generate(root: Path, events: int) -> int:
    """Write the synthetic bundle; return its number of log lines (= IR events)."""
    from pipeline.bundle.synth import write_bundle

    per_cell = 1000
    cells = max(1, (events + per_cell - 1) // per_cell)
    # Each cell writes a few more controller lines than asked, so the total is >= events.
    return write_bundle(root, cells=cells, events_per_cell=per_cell, excluded=1, seed=11, output_chars=160)


def _child(code: str, *args: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def run(events: int = 1_000_000, keep: Path | None = None, repeats: int = 2) -> dict[str, float]:
    """Generate, export (child process, for an honest peak RSS) and scan; return the figures."""
    tmp = Path(tempfile.mkdtemp(prefix="lunasol-bench-")) if keep is None else keep
    try:
        bundle = tmp / "bundle"
        t0 = time.perf_counter()
        lines = generate(bundle, events) if not (bundle / "manifest.json").exists() else -1
        gen_s = time.perf_counter() - t0
        files = sorted(str(p) for p in bundle.glob("cells/*/**/*.jsonl"))
        size = sum(os.path.getsize(f) for f in files)
        listing = tmp / "jsonl-files.json"
        listing.write_text(json.dumps(files))
        scans = [_child(_SCAN, str(listing)) for _ in range(repeats)]
        exports = []
        for i in range(repeats):
            run_dir = tmp / f"run{i}"
            shutil.rmtree(run_dir, ignore_errors=True)
            exports.append(_child(_CHILD, str(bundle), str(run_dir)))
        scan_s = min(s["seconds"] for s in scans)
        export_s = min(e["seconds"] for e in exports)
        figures = {
            "events": exports[0]["events"],
            "log_lines": lines,
            "jsonl_files": len(files),
            "jsonl_mib": size / 2**20,
            "generate_s": gen_s,
            "export_s": export_s,
            "events_per_s": exports[0]["events"] / export_s,
            "peak_rss_mib": max(e["peak_rss_mib"] for e in exports),
            "duckdb_scan_s": scan_s,
            "duckdb_rows": scans[0]["rows"],
            "ratio_export_to_scan": export_s / scan_s,
            "cpus": os.cpu_count() or 0,
        }
        return figures
    finally:
        if keep is None:
            shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.bench
def test_export_benchmark() -> None:
    figures = run(int(os.environ.get("LUNASOL_BENCH_EVENTS", "1000000")))
    print(json.dumps(figures, indent=2))
    assert figures["events"] >= 1_000_000 or "LUNASOL_BENCH_EVENTS" in os.environ
    assert figures["duckdb_rows"] == figures["events"]  # both read every line of the same files
    assert figures["peak_rss_mib"] < 2048


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keep", type=Path, default=None, help="Keep (and reuse) the bundle in this directory.")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    figures = run(args.events, args.keep, args.repeats)
    print(json.dumps(figures, indent=2))
    print(
        f"self peak RSS (parent) {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB", file=sys.stderr
    )


if __name__ == "__main__":
    main()
