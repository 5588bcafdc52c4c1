"""Report benchmark: ``lunasol report`` of demo-shaped runs, and the report in Chromium.

Run: ``python bench/bench_report.py [--cells 100,1000] [--run DIR] [--expand 10,100] [--work DIR]`` (or
``make bench``, which runs the pytest wrapper with 100 cells). The runs are built by ``bench/scale_demo.py``
(the demo's cells cloned, answered by the local server with the demo's HAND-WRITTEN answers); ``--run``
measures an existing run instead (building 1,000 cells takes minutes), and ``--expand K`` first clones
that run's cells K times with ``bench/report_runs.py`` (synthetic in shape: each clone's events point at
its source cell's raw lines; no pipeline run, no model) — how the 10,000- and 100,000-cell rows are made.

Per run it prints: the report's build (``lunasol report`` in a child process: wall, CPU, peak RSS), refs
embedded, the page a reader opens (index.html) and the whole directory in MiB, and, in headless Chromium
(Debian's, no download), the page's load time, the first rows of the cells table, opening a ref and a cell
timeline, and a search (a common word, and a rare one: a cell's own id). The per-ref baseline, measured
in the same run on the same refs: resolving each ref alone (:func:`pipeline.ir.refs.resolve_ref`: manifest
read and file hashed per ref, what the report did before) on a sample of refs, as ms per ref (runs up to
20,000 cells: the sample is drawn from every pattern and group, read whole).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report_runs import expand_run  # noqa: E402
from bench.scale_demo import run_scaled  # noqa: E402
from pipeline import api  # noqa: E402
from pipeline.artifacts.rundir import RunDir  # noqa: E402
from pipeline.core import duck  # noqa: E402
from pipeline.diff.match import cited_ids  # noqa: E402
from pipeline.ir.refs import resolve_ref  # noqa: E402
from pipeline.report.evidence import EvidenceReader  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
BASELINE_SAMPLE = 100


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def per_ref_ms(run_dir: Path) -> tuple[float, float]:
    """ms per ref on a sample of the run's refs: resolved in one batch (the report's way), and each alone
    (the old path: manifest re-read, file re-hashed per ref)."""
    arts = RunDir(run_dir).read()
    keys: set[str] = set()
    for part in (arts.patterns, arts.groups, arts.shortlist):
        if part is not None:
            keys |= cited_ids(part)
    snippets = EvidenceReader(run_dir)._place(keys)
    refs = sorted(s.ref for s in snippets.values() if s.ref)
    sample = random.Random(7).sample(refs, min(BASELINE_SAMPLE, len(refs)))
    t0 = time.perf_counter()
    EvidenceReader(run_dir).resolve(set(sample))
    batched = time.perf_counter() - t0
    t0 = time.perf_counter()
    for ref in sample:
        resolve_ref(run_dir, ref)
    alone = time.perf_counter() - t0
    n = max(len(sample), 1)
    return 1000 * batched / n, 1000 * alone / n


def browser(page: Path, rare: str) -> dict[str, float]:
    """Load, first rows, open a ref, open a cell, search a common word and a rare one: seconds each."""
    from playwright.sync_api import expect, sync_playwright

    out: dict[str, float] = {}
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            pg = b.new_page(viewport={"width": 1400, "height": 900})
            t = time.perf_counter()
            pg.goto(page.as_uri())
            pg.wait_for_load_state("load")
            out["load_s"] = time.perf_counter() - t
            pg.wait_for_selector("#cells-table tbody tr")
            out["rows_s"] = time.perf_counter() - t
            ref = pg.locator("#weaknesses a.ref")
            if ref.count():
                t = time.perf_counter()
                ref.first.click()
                pg.wait_for_selector("#viewer:not([hidden]) .lines")
                out["open_ref_s"] = time.perf_counter() - t
            t = time.perf_counter()
            # the last shown cell with a timeline (an excluded cell has none, and may sort last)
            pg.locator("#cells-table tr:not([data-outcome='excluded']) a.cell").last.click()
            pg.wait_for_selector("#viewer .tl")
            out["open_cell_s"] = time.perf_counter() - t
            for key, query in (("search_s", "permission"), ("search_rare_s", rare)):
                pg.fill("#search", "")
                expect(pg.locator("#search-status")).to_have_text("")
                t = time.perf_counter()
                pg.fill("#search", query)
                pg.locator("#search-status", has_text="match").wait_for(timeout=300_000)
                out[key] = time.perf_counter() - t
                print(f"  search {query!r}: {pg.inner_text('#search-status')}", file=sys.stderr)
        finally:
            b.close()
    return out


def build(run_dir: Path) -> tuple[Path, dict[str, float]]:
    """``lunasol report RUN --json`` in a child process: its stats, wall, CPU and peak RSS."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-c", "from pipeline.cli.app import main; main()", "report", str(run_dir), "--json"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if res.returncode != 0:
        raise SystemExit(f"lunasol report {run_dir} failed (exit {res.returncode}): {res.stderr.strip()[-2000:]}")
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    doc = json.loads(res.stdout)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    figures = {
        "report_s": wall,
        "report_cpu_s": cpu,
        "peak_rss_mib": after.ru_maxrss / 1024,  # the largest child so far: run one build per process
        "refs": float(doc["refs"]),
        "page_mib": doc["bytes"] / 2**20,
        "report_dir_mib": doc["total_bytes"] / 2**20,
        "files": float(doc["files"]),
    }
    return Path(doc["path"]), figures


def measure(run_dir: Path) -> dict[str, float]:
    """Every figure of one run (see the module docstring)."""
    cells = api.load_run(run_dir).table("cells")
    figures: dict[str, float] = {"cells": float(cells.num_rows)}
    path, built = build(run_dir)
    figures.update(built)
    if cells.num_rows <= 20_000:
        figures["ms_per_ref"], figures["baseline_ms_per_ref"] = per_ref_ms(run_dir)
        figures["speedup_per_ref"] = figures["baseline_ms_per_ref"] / figures["ms_per_ref"]
    if CHROMIUM.exists():
        # a rare query: the id of the last cell with events (its events' ids hold it; one cell has it)
        with duck.connect(run_dir / "ir.duckdb", read_only=True) as con:
            rare = con.execute("SELECT max(cell_id) FROM events").fetchone()[0]
        figures.update(browser(path, str(rare)))
    return figures


def main() -> None:
    """Command line: build (or take, or expand) the runs and print one JSON line of figures per run."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default="100,1000")
    ap.add_argument("--run", type=Path, action="append", help="measure this existing run (repeatable)")
    ap.add_argument("--expand", default="", help="with --run: clone its cells K times first (comma list of K)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/lunasol-bench-report"))
    args = ap.parse_args()
    runs = args.run or [run_scaled(args.work / n, int(n), log=lambda _m: None) for n in args.cells.split(",")]
    if args.expand:
        runs = [expand_run(r, int(k)) for r in runs for k in args.expand.split(",")]
    for run_dir in runs:
        print(json.dumps({"run": str(run_dir), **{k: round(v, 3) for k, v in measure(run_dir).items()}}), flush=True)


@pytest.mark.bench
def test_report_at_100_cells(tmp_path: Path) -> None:
    run_dir = run_scaled(tmp_path, 100, log=lambda _m: None)
    f = measure(run_dir)
    print(json.dumps({k: round(v, 3) for k, v in f.items()}))
    assert f["ms_per_ref"] <= 5.0
    assert f["speedup_per_ref"] > 5
    if CHROMIUM.exists():  # issue 33's targets hold at 100,000 cells; at 100 they hold with room to spare
        assert f["page_mib"] < 25 and f["load_s"] < 3 and f["search_s"] < 2 and f["search_rare_s"] < 2


if __name__ == "__main__":
    main()
