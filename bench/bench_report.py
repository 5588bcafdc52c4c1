"""Report benchmark: ``lunasol report`` of a demo-shaped run at 100 and 1,000 cells, and the page in Chromium.

Run: ``python bench/bench_report.py [--cells 100,1000] [--run DIR] [--work DIR]`` (or ``make bench``,
which runs the pytest wrapper with 100 cells). The runs are built by ``bench/scale_demo.py`` (the
demo's cells cloned, answered by the local server with the demo's HAND-WRITTEN answers); ``--run``
measures an existing run instead (building 1,000 cells takes minutes).

Per run it prints: the report's build time (wall and CPU), refs embedded, ms per ref, page size,
and, in headless Chromium (Debian's, no download), the page's load time, the time to open a ref
and a cell timeline, and to search every cell. The baseline, measured in the same run on the same
refs: resolving each ref alone (:func:`pipeline.ir.refs.resolve_ref`: manifest read and file hashed
per ref, what the report did before) on a sample of refs, as ms per ref.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.scale_demo import run_scaled  # noqa: E402
from pipeline import api  # noqa: E402
from pipeline.artifacts.rundir import RunDir  # noqa: E402
from pipeline.diff.match import cited_ids  # noqa: E402
from pipeline.ir.refs import resolve_ref  # noqa: E402
from pipeline.report import write_report  # noqa: E402
from pipeline.report.evidence import EvidenceReader  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
BASELINE_SAMPLE = 100


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def baseline_ms_per_ref(run_dir: Path) -> float:
    """The old path: each ref resolved alone (manifest re-read, file re-hashed), on a sample of refs."""
    arts = RunDir(run_dir).read()
    keys: set[str] = set()
    for part in (arts.patterns, arts.groups, arts.shortlist):
        if part is not None:
            keys |= cited_ids(part)
    snippets = EvidenceReader(run_dir)._place(keys)
    refs = sorted(s.ref for s in snippets.values() if s.ref)
    sample = random.Random(7).sample(refs, min(BASELINE_SAMPLE, len(refs)))
    t0 = time.perf_counter()
    for ref in sample:
        resolve_ref(run_dir, ref)
    return 1000 * (time.perf_counter() - t0) / max(len(sample), 1)


def browser(page: Path) -> dict[str, float]:
    """Load, open a ref, open a cell, search every cell: seconds each, in headless Chromium."""
    from playwright.sync_api import sync_playwright

    out: dict[str, float] = {}
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            pg = b.new_page(viewport={"width": 1400, "height": 900})
            t = time.perf_counter()
            pg.goto(page.as_uri())
            pg.wait_for_load_state("load")
            out["load_s"] = time.perf_counter() - t
            t = time.perf_counter()
            pg.locator("#weaknesses a.ref").first.click()
            pg.wait_for_selector("#viewer:not([hidden]) .lines")
            out["open_ref_s"] = time.perf_counter() - t
            t = time.perf_counter()
            # the last shown cell with a timeline (an excluded cell has none, and may sort last)
            pg.locator("#cells-table tr:not([hidden]):not([data-outcome='excluded']) a.cell").last.click()
            pg.wait_for_selector("#viewer .tl")
            out["open_cell_s"] = time.perf_counter() - t
            t = time.perf_counter()
            pg.fill("#search", "permission")
            pg.locator("#search-status", has_text="match").wait_for(timeout=300_000)
            out["search_all_s"] = time.perf_counter() - t
        finally:
            b.close()
    return out


def measure(run_dir: Path) -> dict[str, float]:
    """Every figure of one run (see the module docstring)."""
    t0, c0 = time.perf_counter(), _cpu()
    path, stats = write_report(run_dir)
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    figures: dict[str, float] = {
        "cells": float(api.load_run(run_dir).table("cells").num_rows),
        "report_s": wall,
        "report_cpu_s": cpu,
        "refs": stats["refs"],
        "ms_per_ref": 1000 * wall / max(stats["refs"], 1),
        "page_mib": stats["bytes"] / 2**20,
        "baseline_ms_per_ref": baseline_ms_per_ref(run_dir),
    }
    figures["speedup_per_ref"] = figures["baseline_ms_per_ref"] / figures["ms_per_ref"]
    if CHROMIUM.exists():
        figures.update(browser(path))
    return figures


def main() -> None:
    """Command line: build (or take) the runs and print one JSON line of figures per run."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default="100,1000")
    ap.add_argument("--run", type=Path, action="append", help="measure this existing run (repeatable)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/lunasol-bench-report"))
    args = ap.parse_args()
    runs = args.run or [run_scaled(args.work / n, int(n), log=lambda _m: None) for n in args.cells.split(",")]
    for run_dir in runs:
        print(json.dumps({"run": str(run_dir), **{k: round(v, 3) for k, v in measure(run_dir).items()}}))


@pytest.mark.bench
def test_report_at_100_cells(tmp_path: Path) -> None:
    run_dir = run_scaled(tmp_path, 100, log=lambda _m: None)
    f = measure(run_dir)
    print(json.dumps({k: round(v, 3) for k, v in f.items()}))
    assert f["ms_per_ref"] <= 5.0
    assert f["speedup_per_ref"] > 5


if __name__ == "__main__":
    main()
