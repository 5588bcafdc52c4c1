"""The benchmark table of bench/README.md: one row per benchmark, regenerated from this file.

Each benchmark is what it measures, how to run it, its target and its latest figure. The figures
live in ``bench/latest.json`` (benchmark name -> the latest figure, as a sentence); after running a
benchmark, record what it printed with ``python bench/table.py --set NAME 'FIGURE'``, which also
rewrites the table. ``python bench/table.py`` rewrites it from the two files (``make bench`` does, after
the benchmarks); ``--check`` exits 1 when the README's table is not what they give. History belongs
to git: the table keeps the latest figure only, with no date, commit or machine path.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
README = HERE / "README.md"
LATEST = HERE / "latest.json"
START = "<!-- table:start (python bench/table.py rewrites it) -->"
END = "<!-- table:end -->"


@dataclass(frozen=True)
class Bench:
    """One benchmark."""

    name: str
    measures: str
    run: str
    target: str


BENCHMARKS: tuple[Bench, ...] = (
    Bench("export", "IR export of a large synthetic bundle (1,013,000 events, 5,000 files): wall and CPU, events/s, "
          "peak RSS of the export and its workers, against DuckDB's own scans of the same files",
          "`python bench/bench_export.py --events 1000000 [--keep DIR] --repeats 2`", "≤ 3× DuckDB `scan_all`"),
    Bench("models", "the model layer: 48 calls at concurrency 8 to the local server adding 200 ms a call, as a "
          "ratio of the ideal; replay overhead per call; import time of the CLI beside litellm's",
          "`python bench/bench_models.py`", "≤ 1.3× ideal; replay < 5 ms a call"),
    Bench("replay", "the demo replayed to gate 1 (CPU of a fresh process) against the floor: the same run with "
          "every answer already parsed, from memory", "`python bench/bench_replay.py --repeats 3 [--before CHECKOUT]`",
          "≤ 2× the floor"),
    Bench("batch", "1,000 Luna-shaped calls, synchronous then as one provider batch, against the local server: "
          "what lunasol itself spends per call", "`python bench/bench_batch.py 1000`", "batch < 2× sync"),
    Bench("batch-run", "`lunasol run --batch` on the demo cloned to N cells: CPU, peak RSS, batches and overlap",
          "`python bench/bench_batch_run.py --cells 1000 [--keep DIR]`", "—"),
    Bench("redact", "the export with and without secret redaction, same bundle, one export process",
          "`python bench/bench_redact.py --events 200000 --repeats 3`", "—"),
    Bench("sol-sizes", "Sol's plan and largest request as the demo's cells are cloned to N, against a server "
          "declaring a 128K context", "`python bench/sol_sizes.py --cells 24 100 300`",
          "no request over the declared context"),
    Bench("scale", "the main job live at 100 and 1,000 cells (scripted model, 128K context): CPU per stage, "
          "bookkeeping share, peak RSS, calls; a rerun after one changed cell; an unchanged rerun",
          "`python bench/bench_scale.py --cells 100,1000 [--keep DIR]` (10,000: `--cells 10000 --no-reruns`)",
          "bookkeeping ≤ 5%; 100 → 1,000 CPU ≤ 11×; one changed cell ≤ 0.1×; unchanged rerun 0 calls, "
          "< 400 MiB; 10,000 cells < 2 GiB"),
    Bench("scale-tasks", "the main job on demo clones spread over N distinct tasks in name families (per-task outcome "
          "mixes, varied cell lengths): CPU and peak RSS per stage, Sol calls per level, the largest request per role "
          "by the server's own count and its sections", "`python bench/bench_scale.py --cells 1000 --tasks 1000,100` "
          "(rows: `--rows 10000x2500@32000,...`; `--reruns` adds one changed cell and an unchanged rerun, `--keep DIR "
          "--kept` takes a row's full run kept in DIR; 100,000 x 5,000: `pytest -m 'bench and slow' "
          "bench/bench_scale.py -k 100000x5000`)", "every row reaches gate 1 with no request over the context; one "
          "changed cell at 10,000 x 2,500 <= 0.1x, unchanged rerun 0 calls"),
    Bench("fleet", "Luna over two local endpoints through litellm's Router, one stopped mid-run: calls per endpoint, "
          "cells finished, wall time against one endpoint", "`python bench/bench_fleet.py`",
          "an endpoint that dies takes no cell with it"),
    Bench("sol-tasks", "Sol's plan on one exported 1,000-cell batch with its task ids rewritten to N distinct tasks: "
          "map calls, largest map request, reduce calls per round, largest reduce request against the budget",
          "`python bench/bench_sol_tasks.py`", "plans at one task per cell; no request over the budget"),
    Bench("adapters", "every public dataset imported, verified and exported; every ref re-read; label leaks "
          "counted; the deterministic Who&When / MAST baselines of `lunasol eval`",
          "`python bench/bench_adapters.py` (data: `LUNASOL_SHARED_DIR`)", "no label leak; every ref resolves"),
    Bench("formats", "every installed format (plugins included): its samples imported with `auto`, exported and "
          "probed offline: cells, events, adapters used, probe hits, refs resolved, import MB/s vs an orjson parse",
          "`python bench/bench_foreign.py --formats [--full]`", "every ref resolves"),
    Bench("prompt-sizes", "Sol's prompt rendered from the same batch as indented JSON and as today's compact table, "
          "with the cited evidence counted apart", "`python bench/bench_prompt_sizes.py --cells 24 1000`", "—"),
    Bench("ask", "`lunasol ask` over the demo cloned to N cells against the local server in a process of its own: "
          "lunasol's CPU per cell for the ask beside Luna's in the same run (the server's apart), and the dry run's "
          "plan", "`python bench/bench_ask.py --cells 1000 --out DIR`", "ask ≤ Luna per cell"),
    Bench("evidence", "on labelled data, with no model: whether each labelled mistake step's event is in its cell's "
          "Luna request and in the Sol request that holds its cell, with its text",
          "`python bench/bench_evidence.py [--context-tokens 8192 32768 131072]`", "100% (exit 1 under it)"),
    Bench("foreign", "every public dataset imported with `auto` into one bundle, run live to gate 1 (32K "
          "context, Sol maps), then the report", "`python bench/bench_foreign.py [--copies N]`",
          "0 unresolved refs"),
    Bench("report", "`lunasol report` on demo-shaped runs of 1,000, 10,000 and 100,000 cells (the larger ones the "
          "1,000-cell run's cells cloned, `bench/report_runs.py`): build CPU and peak RSS, the page a reader opens "
          "and the whole directory; in headless Chromium the load, first rows, open-a-ref, open-a-cell and search "
          "times", "`python bench/bench_report.py --cells 100,1000` or `--run DIR [--expand 10,100]`",
          "100,000 cells: page < 25 MiB, load < 3 s, search < 2 s; ≤ 5 ms per ref"),
    Bench("review", "the reading verbs (`runs`, `status`, `show`, `diff`, `export-tables`, `report`) on a kept "
          "run, each a fresh process, CPU as a ratio of `lunasol --version`",
          "`python bench/bench_review.py --run DIR`", "—"),
    Bench("live-local", "lunasol live against a real local model (llama-cpp-python, Gemma 3 270M): opt-in, "
          "never in CI or `make bench`; see docs/models.md", "`python bench/live_local.py [--python VENV_PYTHON]`",
          "—"),
)  # fmt: skip


def latest() -> dict[str, str]:
    """The latest figure of each benchmark."""
    return dict(json.loads(LATEST.read_text(encoding="utf-8"))) if LATEST.is_file() else {}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(figures: dict[str, str]) -> str:
    """The Markdown table."""
    rows = ["| benchmark | what it measures | how to run it | target | latest figure |", "|---|---|---|---|---|"]
    for b in BENCHMARKS:
        cells = (b.name, b.measures, b.run, b.target, figures.get(b.name, "not measured yet"))
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(rows)


def rewrite(text: str, table: str) -> str:
    """``text`` with the table between the markers replaced."""
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    if not rest:
        raise SystemExit(f"{README}: no {START!r} marker")
    return f"{head}{START}\n{table}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    """Rewrite (or ``--check``) the README's table; ``--set NAME FIGURE`` records a latest figure first."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the README's table is stale")
    ap.add_argument("--set", nargs=2, metavar=("NAME", "FIGURE"), help="record a benchmark's latest figure")
    args = ap.parse_args(argv)
    figures = latest()
    if args.set:
        name, figure = args.set
        if name not in {b.name for b in BENCHMARKS}:
            raise SystemExit(f"no benchmark {name!r}; known: {', '.join(b.name for b in BENCHMARKS)}")
        figures[name] = figure
        LATEST.write_text(json.dumps(figures, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    text = README.read_text(encoding="utf-8")
    new = rewrite(text, render(figures))
    if args.check:
        if new != text:
            print(f"{README}: the benchmark table is stale; run: python bench/table.py", file=sys.stderr)
            return 1
        return 0
    if new != text:
        README.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
