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

Target (issue 12): replay ≤ 2× floor. ``--before DIR`` also replays another checkout's demo on
its own ``pipeline`` in the same rounds (e.g. ``--before /work/main`` for the "before" figure),
against the same floor.

Run: ``python bench/bench_replay.py [--repeats 3] [--before DIR] [--json]`` or
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


def _demo(tree: Path | None) -> tuple[Path, Path]:
    base = tree or ROOT  # that checkout's own demo: its recordings match its prompts
    return base / BUNDLE.relative_to(ROOT), base / STORE.relative_to(ROOT)


def measure(repeats: int = 3, before: Path | None = None) -> dict[str, Any]:
    """Best-of-``repeats`` CPU of the replay, its floor and the imports alone, interleaved in one run.

    ``before``: another checkout whose replay is measured too, in the same rounds, against the
    same floor (this checkout's: a floor on older code would carry that code's own imports).
    """
    work = Path(tempfile.mkdtemp(prefix="bench-replay-"))
    bundle, store = _demo(None)
    try:
        answers = work / "outcomes.pickle"
        capture = _CAPTURE.format(store=str(store), bundle=str(bundle), runs=str(work / "capture"), out=str(answers))
        subprocess.run([sys.executable, "-c", capture], check=True, env=_env(None), capture_output=True, cwd=work)
        best: dict[str, tuple[float, float, list[str]]] = {}
        for i in range(repeats):
            jobs: dict[str, tuple[str, Path | None]] = {
                "replay": (
                    _REPLAY.format(bundle=str(bundle), store=str(store), runs=str(work / f"r{i}"), heavy=HEAVY),
                    None,
                ),
                "floor": (
                    _FLOOR.format(answers=str(answers), bundle=str(bundle), store=str(store), runs=str(work / f"f{i}")),
                    None,
                ),
                "imports": (_IMPORTS, None),
            }
            if before is not None:
                b_bundle, b_store = _demo(before)
                code = _REPLAY.format(bundle=str(b_bundle), store=str(b_store), runs=str(work / f"b{i}"), heavy=HEAVY)
                jobs["before"] = (code, before)
            for name, (code, tree) in jobs.items():
                got = _child(code, tree, work)
                if name not in best or got[0] < best[name][0]:
                    best[name] = got
        floor = best["floor"][0]
        out: dict[str, Any] = {
            "pipeline": _where(None, work),
            "repeats": repeats,
            "load_avg_1m": round(os.getloadavg()[0], 2),
            "floor_cpu_s": round(floor, 3),
            "floor_wall_s": round(best["floor"][1], 3),
            "imports_cpu_s": round(best["imports"][0], 3),
        }
        for name in ("replay", "before"):
            if name in best:
                cpu, wall, heavy = best[name]
                where = _where(before, work) if name == "before" else out["pipeline"]
                out[name] = {"pipeline": where, "cpu_s": round(cpu, 3), "wall_s": round(wall, 3), "imported": heavy}
                out[name]["ratio"] = round(cpu / floor, 3)
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _print(r: dict[str, Any]) -> None:
    print(f"best of {r['repeats']}, load {r['load_avg_1m']:.2f} (1 min)")
    for name in ("replay", "before"):
        if name in r:
            x = r[name]
            print(
                f"{name:<8} {x['cpu_s']:6.2f} s CPU ({x['wall_s']:.2f} s wall) = {x['ratio']:.2f}x floor; "
                f"imported {x['imported'] or 'none of litellm/instructor/openai'}  [{x['pipeline']}]"
            )
    print(f"floor    {r['floor_cpu_s']:6.2f} s CPU ({r['floor_wall_s']:.2f} s wall): model calls answered pre-parsed")
    print(f"imports  {r['imports_cpu_s']:6.2f} s CPU (pipeline.cli.app + pipeline.run.runner + duckdb)")
    print("target: replay <= 2x floor")


@pytest.mark.bench
def test_bench_replay() -> None:
    r = measure(repeats=2)
    _print(r)
    assert r["replay"]["imported"] == []
    assert r["replay"]["ratio"] <= 2.0


def main() -> None:
    """CLI entry: print (or --json) the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--before", type=Path, default=None, help="also replay on this checkout (e.g. /work/main)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = measure(args.repeats, args.before)
    print(json.dumps(r, indent=2)) if args.json else _print(r)


if __name__ == "__main__":
    main()
