"""A demo-shaped run at any size: the demo's cells cloned, then run live against the local server.

Nothing here is a model's output. ``clone_bundle`` copies the demo bundle's 24 eligible cells (and its
excluded one) and adds clones ``X0026 ...`` of them (same bytes, new cell id and run id), then freezes.
``run_scaled`` runs the real pipeline with ``--model`` against
:class:`pipeline.testing.openai_server.FakeOpenAI`, which answers each Luna request with the
HAND-WRITTEN demo answer of the clone's source cell (ids rewritten to the clone's) and Sol with the
demo's hand-written shortlist (which cites only the original cells, so it stays valid at any size).

    python bench/scale_demo.py --cells 1000 --out /tmp/scale   # prints the run directory
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fixtures.record_demo import answer_name  # noqa: E402
from pipeline.bundle.manifest import freeze  # noqa: E402
from pipeline.core.context import RunOptions  # noqa: E402
from pipeline.core.settings import ModelSettings  # noqa: E402
from pipeline.run.runner import run  # noqa: E402
from pipeline.testing.openai_server import FakeOpenAI, Reply, completion_body  # noqa: E402

DEMO = ROOT / "fixtures" / "bundles" / "h0-demo"
ANSWERS = ROOT / "fixtures" / "answers" / "h0-demo"
MODEL = "openai/fixture-model"
SINGLE_CALL_CONTEXT = 50_000_000  # tokens: larger than Sol's one prompt at 1,000 cells (~1.1M)


def clone_bundle(out: Path, cells: int) -> tuple[Path, dict[str, str]]:
    """A frozen bundle of ``cells`` eligible cells (the demo's 24 plus clones); clone id -> source id."""
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(DEMO, out, ignore=shutil.ignore_patterns("manifest.json"))
    req = json.loads((out / "analysis-request.json").read_text())
    eligible = [c for c in req["cells"] if c["eligibility"] == "valid_behavior"]
    outcomes = {
        json.loads(line)["cell_id"]: json.loads(line)
        for line in (out / "sidecar" / "outcomes.jsonl").read_text().splitlines()
        if line
    }
    source: dict[str, str] = {}
    new_outcomes = list(outcomes.values())
    for i in range(len(eligible), cells):
        src = eligible[i % len(eligible)]
        cid = f"X{i + 1:04d}"
        source[cid] = src["cell_id"]
        shutil.copytree(out / src["path"], out / "cells" / cid)
        meta_path = out / "cells" / cid / "cell.json"
        meta = json.loads(meta_path.read_text())
        meta["cell_id"], meta["run_id"] = cid, f"{src['run_id']}-{cid}"
        meta_path.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        req["cells"].append({**src, "cell_id": cid, "path": f"cells/{cid}", "run_id": meta["run_id"]})
        if src["cell_id"] in outcomes:
            new_outcomes.append({**outcomes[src["cell_id"]], "cell_id": cid})
    (out / "analysis-request.json").write_text(json.dumps(req, indent=2, sort_keys=True) + "\n")
    (out / "sidecar" / "outcomes.jsonl").write_text(
        "".join(json.dumps(o, sort_keys=True, separators=(",", ":")) + "\n" for o in new_outcomes)
    )
    freeze(out)
    return out, source


def _answer_for(source: dict[str, str], name: str) -> Any:
    """The hand-written answer for a request id, with a clone's ids rewritten from its source cell's."""
    role, _, rest = name.partition("/")
    if role == "luna":
        cell, dot, part = rest.partition(".")
        src = source.get(cell, cell)
        text = (ANSWERS / "luna" / f"{src}{dot}{part}.json").read_text()
        if src != cell:
            text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(src)}(?![0-9])", cell, text)
        return json.loads(text)
    return json.loads((ANSWERS / f"{name}.json").read_text())


def run_scaled(work: Path, cells: int, *, log: Any = print) -> Path:
    """Build the bundle and run it to gate 1 against the local server; return the run directory."""
    bundle, source = clone_bundle(work / "bundle", cells)

    def handle(request: dict[str, Any]) -> Reply:
        name = answer_name(request)
        if name is None:
            return Reply(status=400, body={"error": {"message": "no router matched this request"}})
        return Reply(body=completion_body(request, tool_arguments=json.dumps(_answer_for(source, name))))

    with FakeOpenAI(handle) as server:
        # One Sol call over the whole batch, answered with the demo's hand-written shortlist: these runs
        # measure what comes after Sol (the report); Sol's map/reduce has its own benchmark (bench/sol_sizes.py).
        settings = ModelSettings.from_env(
            model=MODEL,
            api_base=server.base_url,
            concurrency=8,
            context_tokens=SINGLE_CALL_CONTEXT,
            instructor_mode="tools",
        )
        opts = RunOptions(bundle=bundle, run_id=f"scale-{cells}", runs_dir=work / "runs", models=settings)
        result = run(opts, log=log)
    return result.ctx.run_dir


def main() -> None:
    """Command line: build and run; print the run directory."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=1000)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    print(run_scaled(args.out, args.cells))


if __name__ == "__main__":
    main()
