"""Adapters on the full shared datasets: files, cells, events, import/export time, refs resolved, eval baselines.

Run: ``python bench/bench_adapters.py [--json]`` (or ``make bench``, which runs the pytest wrapper
below). For every dataset folder of ``../shared/data`` it imports the whole folder, verifies the
bundle, exports the IR, re-reads every ref (hash, line range, JSON pointer span) and counts label
leaks; on Who&When it also prints the deterministic baselines of ``lunasol eval``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the tests package (tests/adapters/adapter_helpers.py)

from pipeline.adapters import import_bundle  # noqa: E402
from pipeline.bundle.manifest import verify  # noqa: E402
from pipeline.eval import evaluate  # noqa: E402
from pipeline.ir.export import export  # noqa: E402
from tests.adapters.adapter_helpers import SHARED_DATA, check_refs, events_of  # noqa: E402

DATASETS = [
    ("who-and-when", "who-and-when"),
    ("mast", "mast-mad-human"),
    ("swe-agent", "swe-agent-trajectories"),
    ("openhands", "openhands-trajectories"),
    ("inspect", "inspect-ai-logs"),
    ("inspect", "docent-samples/tests/integration/data"),
    ("claude-code", "claude-code-sessions"),
    ("atif", "atif-trajectories"),
    ("atif", "claude-code-sessions/codetracer/data/traj/kimi_k2.5"),
    ("tau", "agentrx-examples/trajectories/tau-retail"),
    ("tau", "docent-samples/docent/docent/samples"),
    ("who-and-when", "agentrx-examples/data/magentic_dataset"),
    # Samples written for the tests (an absolute folder is taken as it is)
    ("mini-swe-agent", str(ROOT / "tests/fixtures/foreign/mini-swe-agent")),
    ("openhands", str(ROOT / "tests/fixtures/foreign/openhands-v1")),
    ("auto", str(ROOT / "tests/fixtures/foreign/agentrx-like")),
]


def measure(fmt: str, folder: str, work: Path) -> dict[str, Any]:
    """Import, verify, export and check refs for one dataset folder."""
    src = SHARED_DATA / folder
    bundle = work / folder.strip("/").replace("/", "_")
    t0 = time.perf_counter()
    result = import_bundle(fmt, src, bundle)
    t_import = time.perf_counter() - t0
    assert verify(bundle).ok
    t0 = time.perf_counter()
    report = export(bundle, work / "runs" / bundle.name)
    t_export = time.perf_counter() - t0
    events = events_of(report.run_dir)
    t0 = time.perf_counter()
    ok, bad = check_refs(bundle, events)
    t_refs = time.perf_counter() - t0
    texts: dict[str, str] = {}
    for e in events:
        texts[e["cell_id"]] = texts.get(e["cell_id"], "") + "\n" + (e["text"] or "")
    leaks = sum(1 for c, labels in result.label_texts.items() for v in labels if v[:200] in texts.get(c, ""))
    con = duckdb.connect(str(report.ir_path), read_only=True)
    kinds = dict(con.execute("SELECT kind, count(*) FROM events GROUP BY 1 ORDER BY 1").fetchall())
    con.close()
    return {
        "format": fmt,
        "dataset": folder,
        "files": sum(1 for p in src.rglob("*") if p.is_file()),
        "skipped_files": len(result.skipped),
        "cells": result.cells,
        "events": report.events,
        "kinds": kinds,
        "import_s": round(t_import, 3),
        "export_s": round(t_export, 3),
        "refs_resolved": ok,
        "refs_failed": len(bad),
        "refs_pct": round(100.0 * ok / len(events), 2) if events else None,
        "ref_check_s": round(t_refs, 3),
        "label_leaks": leaks,
        "run_dir": str(report.run_dir),
    }


def run_all() -> dict[str, Any]:
    """Every dataset, then the Who&When baselines."""
    with tempfile.TemporaryDirectory(prefix="lunasol-bench-adapters-") as tmp:
        rows = [measure(fmt, folder, Path(tmp)) for fmt, folder in DATASETS if (SHARED_DATA / folder).exists()]
        ww = next(r for r in rows if r["dataset"] == "who-and-when")
        rep = evaluate(Path(ww["run_dir"]), "who-and-when")
        mast = next(r for r in rows if r["dataset"] == "mast-mad-human")
        rep_mast = evaluate(Path(mast["run_dir"]), "mast")
    for r in rows:
        r.pop("run_dir")
    return {"datasets": rows, "who_and_when_eval": rep, "mast_eval": rep_mast}


def _print(out: dict[str, Any]) -> None:
    print(f"{'dataset':58} {'fmt':12} files cells events import_s export_s refs_ok  leaks")
    for r in out["datasets"]:
        print(
            f"{r['dataset']:58} {r['format']:12} {r['files']:5} {r['cells']:5} {r['events']:6} "
            f"{r['import_s']:8.3f} {r['export_s']:8.3f} {r['refs_pct']:6.2f}% {r['label_leaks']:5}"
        )
    rep = out["who_and_when_eval"]
    print(f"\nWho&When: {rep['labelled_cells']} labelled cells")
    for name, s in rep["sources"].items():
        print(
            f"  {name:28} predicted {s['predicted']:2}/{s['labelled']}  exact {s['exact_acc']:.3f}  "
            f"±1 {s['within_1_acc']:.3f}  ±3 {s['within_3_acc']:.3f}  agent {s['agent_acc']:.3f}"
        )
    print("\nMAST (dev, 5 traces) baseline_mode_checks:")
    for mode, m in out["mast_eval"]["sources"]["baseline_mode_checks"].get("modes", {}).items():
        print(f"  {mode:45} tp {m['tp']} fp {m['fp']} fn {m['fn']}")


@pytest.mark.bench
def test_bench_adapters() -> None:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data folder not found at {SHARED_DATA}")
    out = run_all()
    _print(out)
    assert all(r["refs_failed"] == 0 for r in out["datasets"])
    assert all(r["label_leaks"] == 0 for r in out["datasets"])


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result = run_all()
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        _print(result)
