"""Evidence visibility on labelled public data: is a labelled mistake step's event in the requests that judge it?

For each labelled dataset in ``../shared/data`` (Who&When: ``mistake_step``; AgentRx: every failure's
``step_number``, when its ground-truth file is there; MAST labels failure modes per run, not steps, so
it has no step to look for), the data is
imported and exported to the IR as ``lunasol`` does, then, with no model (requests are rendered, never sent):

* **Luna**: the labelled step's events (the agent's events at that step, as ``lunasol eval`` numbers them)
  must be in the Luna request of their cell, each with its line; "whole" also counts the ones whose text
  was not trimmed for length (a long message keeps its head and tail around a marker);
* **Sol**: Luna's answer is stood in for by the probes' candidates, each confirmed as it is, plus one
  pattern per labelled cell citing its labelled step (so that every labelled step is cited by a pattern
  group); the Coordinator groups them, Sol plans its requests (one call, or map/reduce at a small
  context), and every cited labelled event must be in the request that holds its cell, with its text.

Usage::

    python bench/bench_evidence.py [--context-tokens 8192 32768 131072]

Prints rates per dataset; the target is 100% / 100%.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import duckdb  # noqa: E402
import pytest  # noqa: E402

from pipeline.adapters import import_bundle  # noqa: E402
from pipeline.coordinator.groups import run_coordinator  # noqa: E402
from pipeline.core.errors import Blocked  # noqa: E402
from pipeline.core.settings import ModelSettings  # noqa: E402
from pipeline.eval import agentrx  # noqa: E402
from pipeline.eval.events import USER_ACTORS  # noqa: E402
from pipeline.eval.predict import read_json_field  # noqa: E402
from pipeline.ir.export import export  # noqa: E402
from pipeline.luna.render import load_cells, split_parts  # noqa: E402
from pipeline.luna.stage import TABLES_DDL, part_budget  # noqa: E402
from pipeline.models import render  # noqa: E402
from pipeline.probes.engine import read_probe_hits, run_probes, write_probe_hits  # noqa: E402
from pipeline.sol.cards import SolAnswer  # noqa: E402
from pipeline.sol.corpus import load_batch  # noqa: E402
from pipeline.sol.partition import Renderer  # noqa: E402
from pipeline.sol.plan import MAP_ROLE, ROLE, plan_sol  # noqa: E402
from pipeline.sol.stage import single_context  # noqa: E402
from tests.adapters.adapter_helpers import SHARED_DATA  # noqa: E402

pytestmark = pytest.mark.bench
SHARED = SHARED_DATA
DATASETS = {"who-and-when": "who-and-when", "mast": "mast-mad-human", "agentrx": "agentrx-examples"}
NO_STEPS = {
    "mast": "MAST labels failure modes per run, not steps: nothing to look for",
    "agentrx": "no AgentRx ground-truth file in this copy (it holds runs and policies only): no step label",
    "who-and-when": "no usable mistake_step",
}
MODEL = "openai/bench-model"
SAME_TEXT = re.compile(r": same text as (\S+)$")  # Luna's line for a text an event in the same part holds
# an own text (message, tool call) repeated whole, its first occurrence in another part
SAME_NOTE = re.compile(r" \(same text as \S+ \(in part \d+\)\)")


def labelled_steps(con: duckdb.DuckDBPyConnection, dataset: str) -> dict[str, set[int]]:
    """Per eligible cell, the labelled steps in the IR's own step numbering."""
    out: dict[str, set[int]] = {}
    rows = con.execute(
        "SELECT c.cell_id, o.extra, c.step_index_base FROM cells c LEFT JOIN outcomes o USING (cell_id) "
        "WHERE c.eligibility = 'valid_behavior'"
    ).fetchall()
    for cell, extra_raw, base in rows:
        extra = read_json_field(extra_raw)
        if dataset == "who-and-when":
            step = str(extra.get("mistake_step", "")).strip()
            if step.lstrip("-").isdigit():
                out[cell] = {int(step) + int(base or 0)}  # labels count from 0
        elif dataset == "agentrx":
            gold = agentrx.gold_of(extra)
            if gold is not None:
                out[cell] = {s + int(base or 0) - agentrx.LABEL_BASE for s in gold.steps}
    return out


def step_events(con: duckdb.DuckDBPyConnection, labels: dict[str, set[int]]) -> dict[str, list[str]]:
    """Per labelled cell, the agent's events at its labelled steps (what ``lunasol eval`` calls that step)."""
    out: dict[str, list[str]] = {}
    for cell, steps in labels.items():
        rows = con.execute(
            "SELECT event_id, step_index, kind, actor FROM events WHERE cell_id = ? AND step_index IS NOT NULL "
            "ORDER BY seq",
            [cell],
        ).fetchall()
        agent = [
            e
            for e, s, kind, actor in rows
            if s in steps and kind not in ("tool_result", "error") and (actor or "").lower() not in USER_ACTORS
        ]
        out[cell] = agent or [e for e, s, _, _ in rows if s in steps]
    return out


def luna_visibility(con: duckdb.DuckDBPyConnection, events: dict[str, list[str]], settings: ModelSettings) -> dict:
    """How many labelled events are in their cell's Luna request with their text, and with untrimmed text.

    An event whose text repeats an earlier one is shown as "same text as ID": it counts as shown when
    that event's whole line is in the same request (a reference to another part does not count).
    """
    cells = {c.cell_id: c for c in load_cells(con, sorted(events))}
    shown = whole = total = 0
    parts: list[int] = []
    budget = part_budget(settings)
    for cell_id, ids in events.items():
        cell = cells[cell_id]
        cell_parts = split_parts(cell, budget.tokens, budget.chars_per_token, budget.count)
        parts.append(len(cell_parts))
        lines = {ln.split(" ", 1)[0]: ln for seg in cell.segments for ln in seg.lines}
        for e in ids:
            total += 1
            for part in cell_parts:
                line = next((ln for ln in part.text.splitlines() if ln.startswith(e + " ")), None)
                if line is None:
                    continue
                same = SAME_TEXT.search(line)
                full = lines.get(same[1], "") if same else lines.get(e, "")
                if full and full in SAME_NOTE.sub("", part.text, count=0).splitlines():
                    shown += 1
                    whole += "chars trimmed…]" not in full
                break
    return {"events": total, "shown": shown, "whole": whole, "parts_max": max(parts, default=0)}


def plant_patterns(con: duckdb.DuckDBPyConnection, events: dict[str, list[str]]) -> None:
    """Luna's answer stood in for: every probe candidate confirmed as is, one pattern per labelled step."""
    con.execute(TABLES_DDL)
    rows: list[list[Any]] = []
    hits = read_probe_hits(con)
    n: dict[str, int] = {}
    for h in hits:
        n[h.cell_id] = n.get(h.cell_id, 0) + 1
        rows.append([f"{h.cell_id}-P{n[h.cell_id]:02d}", h.cell_id, h.type, h.key, h.explanation, h.explanation,
                     h.evidence, "medium", False, [h.hit_id], "probe", False])  # fmt: skip
    for cell, ids in events.items():
        if not ids:
            continue
        n[cell] = n.get(cell, 0) + 1
        rows.append([f"{cell}-P{n[cell]:02d}", cell, "zero_information_gain", "target:labelled-step",
                     "the labelled step (bench stand-in)", "the labelled step (bench stand-in)", ids, "low", False,
                     [], "luna", False])  # fmt: skip
    if rows:
        con.executemany("INSERT INTO patterns VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    cells = [r[0] for r in con.execute("SELECT cell_id FROM cells WHERE eligibility = 'valid_behavior'").fetchall()]
    con.executemany(
        "INSERT INTO luna_cells VALUES (?, 'ok', 1, 100, 1, ?, NULL, FALSE)",
        [[c, sum(1 for r in rows if r[1] == c)] for c in cells],
    )


def sol_visibility(run_dir: Path, events: dict[str, list[str]], settings: ModelSettings) -> dict:
    """How many labelled events a pattern group cites, and how many of those the request holding their cell shows."""
    batch = load_batch(run_dir, run_dir / "ir.duckdb")
    cited = {e for _, occ in batch.group_stream(eligible_only=False) for o in occ for e in o.get("events") or []}
    try:
        decision = plan_sol(batch, settings, single_context(batch))
    except Blocked as exc:  # a cell whose one group does not fit this context: said, not hidden
        return {"cited": len(cited & {e for ids in events.values() for e in ids}), "shown": 0, "mode": "blocked",
                "calls": 0, "why": str(exc).split(" (context")[0]}  # fmt: skip
    if decision.mode == "single":
        texts = {c: render(ROLE, decision.single_context or {}, response_model=SolAnswer).messages[-1]["content"]
                 for c in [None]}  # fmt: skip
        holder: dict[str, list[str | None]] = {c: [None] for c in events}
    else:
        texts = {m.chunk.call_id: render(MAP_ROLE, m.context, response_model=SolAnswer).messages[-1]["content"]
                 for m in decision.maps}  # fmt: skip
        holder = {}  # a cell too large for one request is read in several (groups, occurrences or events apart)
        for m in decision.maps:
            for c in m.chunk.cells:
                holder.setdefault(c, []).append(m.chunk.call_id)
    wanted = shown = 0
    renderer = Renderer(batch)
    for cell, ids in events.items():
        text = "\n".join(str(texts.get(h, "")) for h in holder.get(cell) or [None])
        lines = renderer.evidence_for([cell]).events  # the cell's cited lines, read from the IR
        for e in ids:
            if e not in cited:
                continue
            wanted += 1
            line = lines.get(e, "")
            shown += bool(line) and line in text
    return {"cited": wanted, "shown": shown, "mode": decision.mode, "calls": max(len(decision.maps), 1)}


def measure(dataset: str, work: Path, contexts: list[int]) -> dict[str, Any]:
    """Import, export, render: the rates for one dataset at each context size."""
    src = SHARED / DATASETS[dataset]
    bundle, run_dir = work / "bundle", work / "runs" / "r"
    t0 = time.perf_counter()
    imported = import_bundle("auto", src, bundle)
    run_dir.mkdir(parents=True)
    export(bundle, run_dir)
    ir = run_dir / "ir.duckdb"
    con = duckdb.connect(str(ir))
    try:
        write_probe_hits(con, run_probes(con))
        events = step_events(con, labelled_steps(con, dataset))
        plant_patterns(con, events)
    finally:
        con.close()
    run_coordinator(ir, run_dir)
    out: dict[str, Any] = {"cells": imported.cells, "labelled_cells": len(events),
                           "labelled_events": sum(map(len, events.values())), "by_context": {}}  # fmt: skip
    for ctx in contexts:
        settings = ModelSettings(model=MODEL, context_tokens=ctx)
        con = duckdb.connect(str(ir), read_only=True)
        try:
            luna = luna_visibility(con, events, settings) if events else {}
        finally:
            con.close()
        sol = sol_visibility(run_dir, events, settings) if events else {}
        out["by_context"][ctx] = {"luna": luna, "sol": sol}
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def _rate(a: int, b: int) -> str:
    return f"{a}/{b} ({100 * a / b:.1f}%)" if b else "n/a (none)"


def main(argv: list[str] | None = None) -> int:
    """Print the visibility rates per dataset and context; exit 1 when a rate is under 100%."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context-tokens", type=int, nargs="+", default=[8192, 32768, 131072])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    report: dict[str, Any] = {}
    short = True
    for dataset in DATASETS:
        with tempfile.TemporaryDirectory(prefix="lunasol-evidence-") as tmp:
            report[dataset] = measure(dataset, Path(tmp), args.context_tokens)
    if args.json:
        print(json.dumps(report, indent=1))
    for dataset, r in report.items():
        print(f"{dataset}: {r['cells']} cells, {r['labelled_cells']} with a labelled step, "
              f"{r['labelled_events']} labelled events ({r['seconds']} s)")  # fmt: skip
        if not r["labelled_cells"]:
            print(f"  {NO_STEPS[dataset]}")
            continue
        for ctx, v in r["by_context"].items():
            luna, sol = v["luna"], v["sol"]
            print(f"  context {ctx:>7,}: Luna shown {_rate(luna['shown'], luna['events'])}, "
                  f"whole text {_rate(luna['whole'], luna['events'])}, parts per cell <= {luna['parts_max']}; "
                  f"Sol ({sol['mode']}, {sol['calls']} call(s)) shown {_rate(sol['shown'], sol['cited'])}")  # fmt: skip
            if sol.get("why"):
                print(f"    Sol cannot plan at this context: {sol['why']}")
            short = short and luna["shown"] == luna["events"] and sol["shown"] == sol["cited"]
    return 0 if short else 1


def test_bench_evidence() -> None:
    """The bench as a test (marker ``bench``): every labelled step visible to Luna and, where cited, to Sol."""
    assert main(["--context-tokens", "32768"]) == 0


if __name__ == "__main__":
    sys.exit(main())
