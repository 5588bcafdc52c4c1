"""One stage of a kept run, alone in a fresh process: its CPU and its own peak RSS.

Run: ``python bench/bench_stage.py RUN_DIR STAGE [--bundle DIR] [--profile FILE] [--fresh] [--context-tokens N]``
(STAGE: any stage of ``lunasol run``; ``export`` needs ``--bundle`` and starts from an empty run directory)
on a run kept by ``python bench/bench_scale.py --rows 1000x250 --no-reruns --keep DIR``
(``DIR/runs-1000x250-128k/r``). The run is copied first (the kept run is never written). Sol's kept map
answers and token counts (``sol_map/``) are removed, so it plans and checks everything again; its
model calls go to a scripted local server started here in a child process (its CPU is not counted),
or are answered from the copied run's ``exchanges/`` when the requests are the same (``--fresh``
removes them: every call is made). ``--fresh`` also drops the Coordinator's tables and incident
cache from the copied IR, so the Coordinator groups from scratch as in a first run (probes: the
probe cache and hits, so every cell is probed; luna: its per-cell answers, ``luna/``, ``luna-parts/``,
and cache table, ``luna_cache``, so every cell is asked). ``--in-place`` runs on RUN_DIR itself, not a
copy (a scratch run too large to copy, e.g. a ``bench/report_runs.py`` clone).

Printed: one JSON line with the stage's one-line summary, CPU seconds of the stage (every thread of
the process), RSS before, the peak RSS sampled every 20 ms while the stage ran (and of the process
tree: export's workers, not the model server), RSS after and ``ru_maxrss``. Where a stage's memory
goes, a stage at a time, without the leftovers of the stages before it (``bench_scale`` prints the
whole run's peaks per stage); ``--profile`` writes cProfile stats.
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
import threading
import time
from pathlib import Path
from typing import Any

from bench_export import tree_rss  # the whole process tree's RSS, as bench_scale samples it

_SERVER = r"""
import sys, time
from pipeline.testing.openai_server import FakeOpenAI
from pipeline.testing.scripted import ScriptedModel
srv = FakeOpenAI(ScriptedModel(), context_tokens=int(sys.argv[1])).start()
print(srv.base_url, flush=True)
while True:  # the server keeps every request it served: not needed here
    time.sleep(1)
    with srv.lock:
        srv.requests.clear()
        srv.headers.clear()
"""


def rss_mib() -> float:
    """This process's resident set size now (MiB)."""
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return 0.0


def cpu_s() -> float:
    """CPU seconds of this process so far (every thread)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


_FRESH_TABLES = {
    "coordinator": ("incident_cache", "incident_links", "pattern_groups", "pattern_occurrences", "pattern_coverage"),
    "probes": ("probe_cache", "probe_hits"),  # every cell probed again
    "luna": ("luna_cache",),  # its per-cell results: without it (and luna/, luna-parts/) every cell is asked again
}


def _fresh_ir(ir: Path, stage: str) -> None:
    import duckdb

    con = duckdb.connect(str(ir))
    try:
        for table in _FRESH_TABLES.get(stage, ()):
            con.execute(f"DROP TABLE IF EXISTS {table}")
        if stage == "coordinator":
            con.execute("DROP VIEW IF EXISTS event_incidents")
    finally:
        con.close()


def run_stage(
    run_dir: Path,
    stage: str,
    work: Path,
    context_tokens: int,
    fresh: bool,
    profile: Path | None,
    bundle: Path | None = None,
    in_place: bool = False,
) -> Any:
    """Copy ``run_dir`` into ``work`` (export: an empty ``work``), run ``stage`` there and return its figures."""
    from pipeline.core.context import RunContext, RunOptions
    from pipeline.core.settings import ModelSettings
    from pipeline.run.runner import STAGES

    if in_place:
        work = run_dir
    elif stage == "export":
        work.mkdir(parents=True)
    else:
        shutil.copytree(run_dir, work)
    shutil.rmtree(work / "sol_map", ignore_errors=True)
    if fresh:
        shutil.rmtree(work / "exchanges", ignore_errors=True)
        if stage == "luna":  # Luna's stored per-cell answers (runs/<id>/luna/<cell>.json) and split parts
            shutil.rmtree(work / "luna", ignore_errors=True)
            shutil.rmtree(work / "luna-parts", ignore_errors=True)
        if stage in _FRESH_TABLES:
            _fresh_ir(work / "ir.duckdb", stage)
    server = subprocess.Popen([sys.executable, "-c", _SERVER, str(context_tokens)], stdout=subprocess.PIPE, text=True)
    try:
        base = (server.stdout.readline() if server.stdout else "").strip()
        settings = ModelSettings(
            model="openai/bench-model", api_base=base, instructor_mode="tools", context_tokens=context_tokens
        )
        ctx = RunContext(
            options=RunOptions(bundle=bundle or work / "no-bundle", models=settings), run_dir=work, log=lambda _m: None
        )
        run = {s.name: s.run for s in STAGES}[stage]
        peak, tree_peak = [0.0], [0.0]
        done = threading.Event()

        def sample() -> None:
            n = 0
            while not done.is_set():
                peak[0] = max(peak[0], rss_mib())
                if n % 5 == 0:  # the stage's child processes too (export's workers), less the model server
                    tree_peak[0] = max(tree_peak[0], (tree_rss(os.getpid()) - tree_rss(server.pid)) / 2**20)
                n += 1
                time.sleep(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        before, c0 = rss_mib(), cpu_s()
        sampler.start()
        import cProfile

        prof = cProfile.Profile() if profile else None
        if prof:
            prof.enable()
        line = run(ctx)
        if prof:
            prof.disable()
            prof.dump_stats(str(profile))
        cpu = cpu_s() - c0
        done.set()
        sampler.join()
    finally:
        server.kill()
        server.wait()
    return {
        "stage": stage,
        "summary": line,
        "cpu_s": round(cpu, 2),
        "rss_before_mib": round(before),
        "rss_peak_mib": round(max(peak[0], rss_mib())),
        "tree_rss_peak_mib": round(max(peak[0], tree_peak[0])),
        "rss_after_mib": round(rss_mib()),
        "maxrss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def main() -> None:
    """CLI entry."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("stage", choices=["export", "select", "probes", "luna", "coordinator", "sol"])
    parser.add_argument("--bundle", type=Path, default=None, help="the bundle export reads (RUN_DIR unused)")
    parser.add_argument("--context-tokens", type=int, default=128_000)
    parser.add_argument("--fresh", action="store_true", help="no exchanges, no stage caches: a first run")
    parser.add_argument("--profile", type=Path, default=None)
    parser.add_argument("--in-place", action="store_true", help="run on RUN_DIR itself (a scratch run), not a copy")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lunasol-stage-") as tmp:
        if ns.stage == "export" and ns.bundle is None:
            parser.error("export needs --bundle")
        out = run_stage(
            ns.run_dir, ns.stage, Path(tmp) / "r", ns.context_tokens, ns.fresh, ns.profile, ns.bundle, ns.in_place
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
