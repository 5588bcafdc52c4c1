"""Redaction's cost in the export: the same bundle exported with and without it, alternating, in one run.

Run: ``python bench/bench_redact.py [--events N] [--repeats R]`` (or ``pytest -q -m bench
bench/bench_redact.py -o addopts="" -s``). Each export runs in a fresh child process with
``LUNASOL_EXPORT_WORKERS=0`` (redaction happens where cells are read; one process shows its whole
cost); "off" replaces :func:`pipeline.ir.redact.redact_column` by a no-op in that child. The best
of R runs of each is kept; the figure is the ratio on/off, both measured on the same machine state.
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

import pytest

from pipeline.bundle.synth import write_bundle

_CHILD = r"""
import sys, time
from pathlib import Path
import pipeline.ir.rows as R
if sys.argv[1] == "off":
    R.redact_column = lambda values: (None, 0)
    R.display_paths = lambda paths: {}  # file names too: "off" does no redaction work at all
from pipeline.ir.export import export
t = time.perf_counter()
report = export(Path(sys.argv[2]), Path(sys.argv[3]))
print(time.perf_counter() - t, report.events, report.redactions)
"""


def run(events: int = 200_000, repeats: int = 3, bundle: Path | None = None) -> dict[str, object]:
    """Export a bundle (``bundle``, else a synthetic one of about ``events`` events) with and without redaction."""
    tmp = Path(tempfile.mkdtemp(prefix="lunasol-bench-redact-"))
    try:
        if bundle is None:
            bundle = tmp / "bundle"
            write_bundle(bundle, cells=max(1, events // 200), events_per_cell=200, excluded=1, seed=11,
                         output_chars=160)  # fmt: skip
        best: dict[str, float] = {}
        n = 0
        for i in range(repeats):
            for mode in ("off", "on"):
                out = tmp / f"run-{mode}-{i}"
                env = {**os.environ, "LUNASOL_EXPORT_WORKERS": "0"}
                proc = subprocess.run(
                    [sys.executable, "-c", _CHILD, mode, str(bundle), str(out)],
                    capture_output=True, text=True, check=True, env=env,
                )  # fmt: skip
                secs, n_events, _ = proc.stdout.split()
                best[mode] = min(best.get(mode, float("inf")), float(secs))
                n = int(n_events)
                shutil.rmtree(out, ignore_errors=True)
        return {
            "events": n,
            "off_s": round(best["off"], 2),
            "on_s": round(best["on"], 2),
            "ratio_on_off": round(best["on"] / best["off"], 3),
            "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.bench
def test_redaction_benchmark() -> None:
    figures = run(int(os.environ.get("LUNASOL_BENCH_EVENTS", "200000")), repeats=2)
    print(json.dumps(figures, indent=2))
    assert float(str(figures["ratio_on_off"])) < 1.5  # loose: the shared machine moves wall times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bundle", type=Path, default=None, help="a frozen bundle (real text) instead of synthetic")
    args = parser.parse_args()
    print(json.dumps(run(args.events, args.repeats, args.bundle), indent=2))


if __name__ == "__main__":
    main()
