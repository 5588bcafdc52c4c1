"""Sol's request sizes on the demo's cells cloned to N cells, through the local server declaring a context.

Luna answers are the demo's hand-written fixture answers, re-keyed to each clone's cell id; Sol's
answers are empty (only the request sizes are measured). Prints, per batch size, the single call's
size (what Sol sent before map/reduce existed), the plan actually run, the largest Sol request and
how many requests the server refused for size::

    python bench/sol_sizes.py --cells 24 100 300 [--context-tokens 128000]
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fixtures.record_demo import answer_name  # noqa: E402
from pipeline.bundle.manifest import freeze  # noqa: E402
from pipeline.core.canonical import read_json, write_json  # noqa: E402
from pipeline.core.context import RunOptions  # noqa: E402
from pipeline.core.settings import ModelSettings  # noqa: E402
from pipeline.run.runner import run  # noqa: E402
from pipeline.sol.shortlist import read_shortlist  # noqa: E402
from pipeline.testing.openai_server import FakeOpenAI, Reply, completion_body, request_tokens  # noqa: E402

DEMO = ROOT / "fixtures" / "bundles" / "h0-demo"
ANSWERS = ROOT / "fixtures" / "answers" / "h0-demo" / "luna"


def clone(dest: Path, n: int) -> dict[str, str]:
    """The demo's eligible cells cloned to ``n`` cells (C0001...); returns clone -> original cell id."""
    req = read_json(DEMO / "analysis-request.json")
    eligible = [c for c in req["cells"] if c["eligibility"] == "valid_behavior"]
    outcomes = {
        json.loads(x)["cell_id"]: json.loads(x) for x in (DEMO / "sidecar/outcomes.jsonl").read_text().splitlines()
    }
    cells, rows, origin = [], [], {}
    for i in range(n):
        src = eligible[i % len(eligible)]
        cid = f"C{i + 1:04d}"
        origin[cid] = src["cell_id"]
        shutil.copytree(DEMO / src["path"], dest / "cells" / cid)
        meta = read_json(dest / "cells" / cid / "cell.json")
        meta.update(cell_id=cid, run_id=f"{src['run_id']}-c{i // len(eligible)}")
        write_json(dest / "cells" / cid / "cell.json", meta)
        cells.append({**src, "cell_id": cid, "path": f"cells/{cid}", "run_id": meta["run_id"]})
        rows.append({**outcomes[src["cell_id"]], "cell_id": cid})
    req["cells"] = cells
    req["exclusions"] = []
    write_json(dest / "analysis-request.json", req)
    (dest / "sidecar").mkdir(parents=True)
    (dest / "sidecar" / "outcomes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    freeze(dest)
    return origin


def _rid(request: dict[str, Any]) -> str:
    # routed by what the prompt names (fixtures/record_demo.py), never by a line added for routing
    return answer_name(request) or ""


def handler(origin: dict[str, str]) -> Any:
    def handle(request: dict[str, Any]) -> Reply:
        name = _rid(request)
        data: Any = {"weaknesses": [], "none_reason": "only the request sizes are measured here"}
        if name.startswith("luna/"):
            cell, _, part = name[5:].partition(".")
            orig = origin[cell]
            path = ANSWERS / (f"{orig}.{part}.json" if part else f"{orig}.json")
            text = (
                path.read_text(encoding="utf-8")
                if path.is_file()
                else '{"patterns": [], "rejected_candidates": [], "none_reason": "no step repeats on unchanged state"}'
            )
            data = json.loads(text.replace(f"{orig}-", f"{cell}-"))
        return Reply(body=completion_body(request, tool_arguments=json.dumps(data)))

    return handle


def measure(n: int, context: int, work: Path) -> dict[str, Any]:
    """One batch size: run up to gate 1, return Sol's sizes."""
    bundle = work / f"b{n}"
    origin = clone(bundle, n)
    with FakeOpenAI(handler(origin), context_tokens=context) as server:
        settings = ModelSettings(
            model="openai/fixture-model", api_base=server.base_url, context_tokens=context, instructor_mode="tools"
        )
        opts = RunOptions(bundle=bundle, run_id=f"r{n}", runs_dir=work / "runs", models=settings)
        started = time.process_time()
        run(opts, log=lambda _m: None)
        cpu = time.process_time() - started
        sol = [r for r in server.requests if _rid(r).startswith("sol")]
        refused = server.refused_for_size
    sl = read_shortlist(work / "runs" / f"r{n}" / "weakness-shortlist.json")
    plan = sl.plan
    assert plan is not None
    calls = plan.calls
    return {
        "cells": n,
        "mode": plan.mode,
        "sol_calls": len(calls),
        "largest_sol_request": max(c.request_tokens for c in calls),
        "server_largest_sol_request": max((request_tokens(r) for r in sol), default=0),
        "refused_for_size": refused,
        "cpu_s": round(cpu, 1),
    }


def single_size(n: int, context: int, work: Path) -> int:
    """Tokens of the single whole-batch request (what Sol sent before map/reduce), as the budget counts."""
    from pipeline.sol.corpus import load_batch  # bench only: keeps the script's import time short
    from pipeline.sol.plan import plan_sol
    from pipeline.sol.stage import single_context

    run_dir = work / "runs" / f"r{n}"
    batch = load_batch(run_dir, run_dir / "ir.duckdb")
    return plan_sol(
        batch,
        ModelSettings(model="openai/fixture-model", context_tokens=context),
        single_context(batch),
        count_whole=True,
    ).single_tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, nargs="+", default=[24, 100, 300])
    ap.add_argument("--context-tokens", type=int, default=128_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sol-sizes-") as tmp:
        for n in args.cells:
            m = measure(n, args.context_tokens, Path(tmp))
            m["single_request_before"] = single_size(n, args.context_tokens, Path(tmp))
            print(json.dumps(m), flush=True)


if __name__ == "__main__":
    main()
