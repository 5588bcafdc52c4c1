"""Export benchmark: a synthetic native bundle of >= 1,000,000 events, timed against DuckDB's own scan.

Run: ``python bench/bench_export.py [--events N] [--keep DIR]`` (or ``make bench``, which runs the
pytest wrapper below). Prints events/s, peak RSS of the export (measured in a child process),
and the ratio of export time to ``SELECT count(*) FROM read_json(...)`` over the same JSONL files,
plus two more DuckDB references on the same files: the same count with ``union_by_name`` (reads
every file's schema) and DuckDB's own ingest of the lines into a DuckDB file.
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
ru = resource.getrusage(resource.RUSAGE_SELF)
cpu = ru.ru_utime + ru.ru_stime
self_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
kids_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"events": report.events, "seconds": secs, "cpu": cpu, "peak_rss_mib": (self_kib + kids_kib) / 1024}))
"""

# DuckDB's own work on the same files, each in a fresh process. `scan` is the reference
# (count(*) over read_json); `scan_union` reads every file's schema (the files differ in shape);
# `ingest` is DuckDB loading the same lines into a DuckDB file, i.e. what export also has to do.
_SCAN = r"""
import duckdb, json, os, sys, time
files = json.loads(open(sys.argv[1]).read())
mode, target = sys.argv[2], sys.argv[3]
sql = {
    "scan": "SELECT count(*) FROM read_json(?, format='newline_delimited')",
    "scan_union": "SELECT count(*) FROM read_json(?, format='newline_delimited', union_by_name=true)",
    "ingest": "CREATE TABLE t AS SELECT * FROM read_json(?, format='newline_delimited', union_by_name=true)",
}[mode]
t0 = time.perf_counter()
con = duckdb.connect(target if mode == "ingest" else ":memory:")
con.execute(sql, [files])
n = con.execute("SELECT count(*) FROM t").fetchone()[0] if mode == "ingest" else con.fetchone()[0]
if mode == "ingest":
    con.execute("CHECKPOINT")
con.close()
import resource
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"rows": n, "seconds": time.perf_counter() - t0, "cpu": ru.ru_utime + ru.ru_stime}))
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
        ref: dict[str, float] = {}
        ref_cpu: dict[str, float] = {}
        rows = 0
        for mode in ("scan", "scan_union", "ingest"):
            times, cpus = [], []
            for i in range(repeats):
                target = tmp / f"duckdb-ingest-{i}.duckdb"
                target.unlink(missing_ok=True)
                out = _child(_SCAN, str(listing), mode, str(target))
                target.unlink(missing_ok=True)
                times.append(out["seconds"])
                cpus.append(out["cpu"])
                rows = int(out["rows"])
            ref[mode] = min(times)
            ref_cpu[mode] = min(cpus)
        exports = []
        for i in range(repeats):
            run_dir = tmp / f"run{i}"
            shutil.rmtree(run_dir, ignore_errors=True)
            exports.append(_child(_CHILD, str(bundle), str(run_dir)))
        export_s = min(e["seconds"] for e in exports)
        figures = {
            "events": exports[0]["events"],
            "log_lines": lines,
            "jsonl_files": len(files),
            "jsonl_mib": round(size / 2**20, 1),
            "generate_s": round(gen_s, 2),
            "export_s": round(export_s, 2),
            "export_cpu_s": round(min(e["cpu"] for e in exports), 2),
            "events_per_s": round(exports[0]["events"] / export_s),
            "peak_rss_mib": round(max(e["peak_rss_mib"] for e in exports)),
            "duckdb_rows": rows,
            "duckdb_scan_s": round(ref["scan"], 2),
            "duckdb_scan_union_s": round(ref["scan_union"], 2),
            "duckdb_ingest_s": round(ref["ingest"], 2),
            "duckdb_cpu_s": {k: round(v, 2) for k, v in ref_cpu.items()},
            "ratio_export_to_scan": round(export_s / ref["scan"], 1),
            "ratio_export_to_scan_union": round(export_s / ref["scan_union"], 1),
            "ratio_export_to_duckdb_ingest": round(export_s / ref["ingest"], 1),
            "cpus": os.cpu_count() or 0,
            "load_avg_1m": round(os.getloadavg()[0], 2),
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
