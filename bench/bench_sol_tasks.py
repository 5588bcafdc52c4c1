"""Sol's plan at real task diversity: one batch, its task ids rewritten to N distinct tasks, no model call.

A synthetic batch (``--cells`` cells, Luna's patterns written directly: three noise patterns per
cell over 12 concerns, plus one planted concern in a few failed cells) is exported once; for each
``--tasks N`` its IR's task ids are rewritten to N distinct names in ~sqrt(N) families
(``repoK__repoK-I``), the Coordinator groups it, and Sol's dry-run plan is made at each
``--contexts`` size: map calls, the largest map request, round-one reduce calls (three stand-in
drafts per map call, as ``--dry-run`` sizes them) and the largest reduce request, in tokens counted
the way the budget counts them. Planning that blocks is reported with its one line.

    python bench/bench_sol_tasks.py --cells 1000 --tasks 8,100,1000 --contexts 128000,32000
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.bundle.synth import write_bundle
from pipeline.coordinator.groups import run_coordinator
from pipeline.core.context import RunContext, RunOptions
from pipeline.core.errors import Blocked
from pipeline.core.settings import ModelSettings
from pipeline.ir.export import export
from pipeline.sol.stage import plan as sol_plan
from pipeline.testing.planted import write_patterns


def plant(ir: Path, seed: int = 3) -> None:
    """Luna's output written directly: three noise patterns per cell, the planted concern in 10% of failed cells."""
    con = duckdb.connect(str(ir))
    try:
        failed = {c for (c,) in con.execute("SELECT cell_id FROM outcomes WHERE label <> 'completed'").fetchall()}
        write_patterns(con, lambda cell, rng: cell in failed and rng.random() < 0.1, seed)
    finally:
        con.close()


def task_name(i: int, tasks: int) -> str:
    """The i-th of ``tasks`` distinct names, in ~sqrt(tasks) families (``repoK__repoK-I``)."""
    families = max(1, math.isqrt(tasks))
    k = i % families
    return f"repo{k}__repo{k}-{1000 + i}"


def rewrite_tasks(ir: Path, tasks: int) -> None:
    """Give the IR's cells ``tasks`` distinct task ids (cell i -> task i mod N)."""
    con = duckdb.connect(str(ir))
    try:
        cells = [c for (c,) in con.execute("SELECT cell_id FROM cells ORDER BY cell_id").fetchall()]
        for i, c in enumerate(cells):
            con.execute("UPDATE cells SET task_id = ? WHERE cell_id = ?", [task_name(i % tasks, tasks), c])
    finally:
        con.close()


def plan_row(run_dir: Path, ir: Path, context: int) -> dict[str, Any]:
    """Sol's dry-run plan at ``context`` tokens: map and round-one reduce calls, largest request of each."""
    settings = ModelSettings(model="openai/test-model", context_tokens=context)
    opts = RunOptions(bundle=run_dir, run_id=run_dir.name, runs_dir=run_dir.parent, models=settings)
    ctx = RunContext(options=opts, run_dir=run_dir, log=lambda _m: None)
    t0 = time.process_time()
    try:
        calls = sol_plan(ctx)
    except Blocked as exc:
        return {"context": context, "blocked": str(exc).splitlines()[0][:160], "cpu_s": time.process_time() - t0}
    from pipeline.models.budget import request_tokens, role_budget
    from pipeline.models.prompts import render

    out: dict[str, Any] = {"context": context, "cpu_s": round(time.process_time() - t0, 1)}
    for role in ("sol", "sol_map", "sol_reduce"):
        mine = [c for c in calls if c.role == role]
        if not mine:
            continue
        budget = role_budget(settings, role)
        sizes = [
            request_tokens(budget, render(role, c.context, response_model=c.response_model).messages, c.response_model)
            for c in mine
        ]
        out[role] = {"calls": len(mine), "largest_tokens": max(sizes), "budget": budget.input_tokens}
    return out


def main() -> None:
    """Plan Sol over one batch at several task counts and contexts; print one JSON line per row."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cells", type=int, default=1000)
    parser.add_argument("--tasks", default="8,100,1000")
    parser.add_argument("--contexts", default="128000,32000")
    parser.add_argument("--keep", type=Path, default=None, help="reuse/keep the exported base batch here")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-sol-tasks-"))
    base = root / "base"
    if not (base / "run" / "ir.duckdb").is_file():
        write_bundle(root / "bundle", cells=args.cells, events_per_cell=16, excluded=2, seed=11, output_chars=40)
        (base / "run").mkdir(parents=True, exist_ok=True)
        export(root / "bundle", base / "run")
        plant(base / "run" / "ir.duckdb")
    for n in (int(x) for x in args.tasks.split(",")):
        run_dir = root / f"t{n}" / "run"
        if run_dir.parent.exists():
            shutil.rmtree(run_dir.parent)
        shutil.copytree(base / "run", run_dir)
        rewrite_tasks(run_dir / "ir.duckdb", n)
        run_coordinator(run_dir / "ir.duckdb", run_dir)
        for context in (int(x) for x in args.contexts.split(",")):
            row = {"cells": args.cells, "tasks": n, **plan_row(run_dir, run_dir / "ir.duckdb", context)}
            print(json.dumps(row), flush=True)
    if args.keep is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
