"""A rerun at 300 cells after one cell changed: one Luna call, that cell alone re-exported, re-probed, re-rendered.

Live through the local OpenAI-compatible server with the scripted model (pipeline.testing.scripted:
answers derived from each prompt). Asserted on counters and the ledger, never on timing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import duckdb

from pipeline.bundle import freeze
from pipeline.bundle.synth import write_bundle
from pipeline.core.context import RunOptions
from pipeline.core.settings import ModelSettings
from pipeline.run.runner import run
from pipeline.state.ledger import Ledger
from pipeline.testing.openai_server import FakeOpenAI
from pipeline.testing.scripted import ScriptedModel

CELLS = 300
CHANGED = "C150"


def test_one_changed_cell_of_300_costs_one_luna_call(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    model = ScriptedModel()
    fake_llm.handler = model
    bundle = tmp_path / "bundle"
    write_bundle(bundle, cells=CELLS, events_per_cell=24, excluded=1, seed=3)
    opts = RunOptions(bundle=bundle, run_id="r", runs_dir=tmp_path / "runs", models=model_settings())
    run_dir = tmp_path / "runs" / "r"

    run(opts, log=lambda _m: None)
    first, _ = model.take()
    assert first["luna"] == CELLS
    before = Ledger(run_dir)
    untouched = {n: e.model_dump() for n, e in before.data.entries.items() if n.startswith(("ir/", "luna/"))}

    session = bundle / "cells" / CHANGED / "sessions" / "03-implementation-candidate.jsonl"
    with session.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps({"ts": "2026-08-10T23:00:00Z", "type": "message", "role": "operator", "content": "x"}))
        fh.write("\n")
    freeze(bundle)
    logs: list[str] = []
    res = run(opts, log=logs.append)
    calls, _ = model.take()

    assert res.ran == ["export", "select", "probes", "luna", "coordinator", "sol"]
    assert calls["luna"] == 1  # exactly one Luna call, for the changed cell
    assert calls.get("sol", 0) >= 1  # Sol reruns over the batch, as before
    line = {stage: next(m for m in logs if m.startswith(f"[{stage}] ") and "invalidated" not in m) for stage in res.ran}
    assert f"{CELLS - 1} unchanged cells reused, 1 read" in line["export"]
    assert f"1 changed cell(s) probed, {CELLS - 1} reused" in line["probes"]  # eligible cells, as export counts them
    assert f"1 cell(s) rendered, {CELLS - 1} unchanged" in line["luna"]
    led = Ledger(run_dir)
    changed = {n for n, e in led.data.entries.items() if n in untouched and e.model_dump() != untouched[n]}
    assert changed == {f"ir/{CHANGED}", f"luna/{CHANGED}"}  # every other cell's entries are as they were
    con = duckdb.connect(str(run_dir / "ir.duckdb"), read_only=True)
    try:
        reused = con.execute("SELECT count(*) FROM luna_cells WHERE reused").fetchall()[0][0]
        cached = con.execute("SELECT count(*) FROM luna_cache").fetchall()[0][0]
    finally:
        con.close()
    assert reused == CELLS - 1 and cached == CELLS
