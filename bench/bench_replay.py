"""Demo replay CPU against its floor, in the same run: what replaying answers costs beyond the pipeline itself.

Each variant runs in a fresh child process (imports included); the CPU seconds (user + system,
from ``wait4``) of the best of ``--repeats`` runs are kept.

- ``replay``: ``lunasol run fixtures/bundles/h0-demo --replay fixtures/recordings/h0-demo`` up to gate 1.
- ``floor``: the same run in the same code with every model call answered by its outcome, already
  parsed, from memory (``ModelClient.call`` replaced; the outcomes were captured from a replay
  beforehand, outside the timing). It pays python, the lunasol and duckdb imports, the export,
  probes and coordinator SQL and the stages' own bookkeeping; the replay adds the model layer on
  top of it (render, key, read, parse, check, and whatever the model layer imports).
- ``imports``: ``import pipeline.cli.app, pipeline.run.runner, duckdb`` alone, for reference.

Target (issue 12): replay ≤ 2× floor. ``--tree DIR`` runs the children on another checkout's
``pipeline`` (e.g. ``--tree /work/main`` for the "before" figure).

Run: ``python bench/bench_replay.py [--repeats 3] [--tree DIR] [--json]`` or
``pytest -q -m bench bench/bench_replay.py -o addopts="" -s``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = ROOT / "fixtures" / "bundles" / "h0-demo"
STORE = ROOT / "fixtures" / "recordings" / "h0-demo"
HEAVY = ("litellm", "instructor", "openai")

_REPLAY = """
import json, sys
from pipeline.cli.app import main
sys.argv = ["lunasol", "run", {bundle!r}, "--replay", {store!r}, "--runs-dir", {runs!r}]
try:
    main()
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}} & set({heavy!r}))))
"""

_CAPTURE = """
import pickle
from pathlib import Path
from pipeline.core.context import RunOptions
from pipeline.core.settings import ModelSettings
from pipeline.models.client import ModelClient
from pipeline.run.runner import run

outcomes = {{}}
real = ModelClient.call

async def capture(self, **kw):
    out = await real(self, **kw)
    outcomes[(kw["role"], kw["cell_id"])] = out
    return out

ModelClient.call = capture
settings = ModelSettings(mode="replay", store=Path({store!r}))
run(RunOptions(bundle=Path({bundle!r}), runs_dir=Path({runs!r}), models=settings), log=lambda _m: None)
with open({out!r}, "wb") as f:
    pickle.dump(outcomes, f)
"""

_FLOOR = """
import pickle, sys
from pipeline.models.client import ModelClient

with open({answers!r}, "rb") as f:
    outcomes = pickle.load(f)

async def answered(self, **kw):
    return outcomes[(kw["role"], kw["cell_id"])]

ModelClient.call = answered
from pipeline.cli.app import main
sys.argv = ["lunasol", "run", {bundle!r}, "--replay", {store!r}, "--runs-dir", {runs!r}]
try:
    main()
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
print("[]")
"""

_IMPORTS = 'import pipeline.cli.app, pipeline.run.runner, duckdb\nprint("[]")\n'


def _env(tree: Path | None) -> dict[str, str]:
    env = {**os.environ, "LUNASOL_PROGRESS_EVERY": "0"}
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree), env.get("PYTHONPATH")) if p)
    return env


def _child(code: str, tree: Path | None, cwd: Path) -> tuple[float, float, list[str]]:
    """CPU seconds (user + system), wall seconds and the heavy packages a child imported.

    ``cwd`` is a scratch folder: ``python -c`` puts the working directory first on ``sys.path``.
    """
    import time

    with tempfile.TemporaryFile() as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-c", code], stdout=out, stderr=subprocess.PIPE, env=_env(tree), cwd=cwd
        )
        _pid, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        err = proc.stderr.read().decode() if proc.stderr else ""
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise RuntimeError(f"child failed ({proc.returncode}): {err[-2000:]}")
        out.seek(0)
        heavy = json.loads(out.read().decode().strip().splitlines()[-1])
    return usage.ru_utime + usage.ru_stime, wall, heavy


def _where(tree: Path | None, cwd: Path) -> str:
    code = "import pipeline; print(pipeline.__file__)"
    out = subprocess.run([sys.executable, "-c", code], env=_env(tree), cwd=cwd, capture_output=True, text=True)
    return str(Path(out.stdout.strip()).parent)


def measure(repeats: int = 3, tree: Path | None = None) -> dict[str, Any]:
    """Best-of-``repeats`` CPU of the replay, its floor and the imports alone, alternating in one run."""
    work = Path(tempfile.mkdtemp(prefix="bench-replay-"))
    base = tree or ROOT  # that checkout's own demo: its recordings match its prompts
    bundle, store = base / BUNDLE.relative_to(ROOT), base / STORE.relative_to(ROOT)
    try:
        answers = work / "outcomes.pickle"
        capture = _CAPTURE.format(store=str(store), bundle=str(bundle), runs=str(work / "capture"), out=str(answers))
        subprocess.run([sys.executable, "-c", capture], check=True, env=_env(tree), capture_output=True, cwd=work)
        best: dict[str, tuple[float, float, list[str]]] = {}
        for i in range(repeats):
            runs = {name: str(work / f"{name}-{i}") for name in ("replay", "floor")}
            codes = {
                "replay": _REPLAY.format(bundle=str(bundle), store=str(store), runs=runs["replay"], heavy=HEAVY),
                "floor": _FLOOR.format(answers=str(answers), bundle=str(bundle), store=str(store), runs=runs["floor"]),
                "imports": _IMPORTS,
            }
            for name, code in codes.items():
                got = _child(code, tree, work)
                if name not in best or got[0] < best[name][0]:
                    best[name] = got
        replay, floor, imports = best["replay"], best["floor"], best["imports"]
        return {
            "tree": str(tree or ROOT),
            "pipeline": _where(tree, work),
            "repeats": repeats,
            "load_avg_1m": os.getloadavg()[0],
            "replay_cpu_s": round(replay[0], 3),
            "replay_wall_s": round(replay[1], 3),
            "replay_imported": replay[2],
            "floor_cpu_s": round(floor[0], 3),
            "floor_wall_s": round(floor[1], 3),
            "imports_cpu_s": round(imports[0], 3),
            "ratio": round(replay[0] / floor[0], 3),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _print(r: dict[str, Any]) -> None:
    print(f"pipeline {r['pipeline']}  best of {r['repeats']}  load {r['load_avg_1m']:.2f}")
    wall, heavy = r["replay_wall_s"], r["replay_imported"]
    print(f"replay   {r['replay_cpu_s']:6.2f} s CPU ({wall:.2f} s wall); imported: {heavy}")
    print(f"floor    {r['floor_cpu_s']:6.2f} s CPU ({r['floor_wall_s']:.2f} s wall)")
    print(f"imports  {r['imports_cpu_s']:6.2f} s CPU (pipeline.cli.app + pipeline.run.runner + duckdb)")
    print(f"replay / floor = {r['ratio']:.2f}x (target <= 2x)")


@pytest.mark.bench
def test_bench_replay() -> None:
    r = measure(repeats=2)
    _print(r)
    assert r["replay_imported"] == []
    assert r["ratio"] <= 2.0


def main() -> None:
    """CLI entry: print (or --json) the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tree", type=Path, default=None, help="run the children on this checkout's pipeline/")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = measure(args.repeats, args.tree)
    print(json.dumps(r, indent=2)) if args.json else _print(r)


if __name__ == "__main__":
    main()
