"""A small synthetic run for the run-dependent validator rules: run.json, a sealed weakness
shortlist (W-02, W-04, W-09) and, optionally, a gate-1 receipt made through pipeline.gates.gate1."""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.core.canonical import write_json
from pipeline.gates.gate1 import confirm
from pipeline.sol.cards import (
    CounterEvidence,
    FirstDivergence,
    HarnessAttribution,
    Support,
    SupportCounts,
    WeaknessCard,
    Where,
)
from pipeline.sol.shortlist import SHORTLIST_FILE, Denominator, Shortlist, write_shortlist
from pipeline.state import handoff

CELLS = [f"C{i:03d}" for i in range(1, 25)]


def _weakness(wid: str, cells: list[str], tasks: list[str], runs: list[str]) -> WeaknessCard:
    return WeaknessCard(
        weakness_id=wid,
        statement=f"{wid}: synthetic weakness for validator tests",
        first_divergence=FirstDivergence(
            where=Where(stage="implementation", actor="agent", what="acts without the information it needs"),
            cells=cells,
            event_refs=[f"{cells[0]}-e0001"],
        ),
        harness_attribution=HarnessAttribution(attributed=True, why="the harness decides what the agent sees"),
        support=Support(
            cells=cells,
            tasks=tasks,
            runs=runs,
            pattern_groups=["G-01"],
            event_refs=[f"{c}-e0001" for c in cells],
            counts=SupportCounts(cells=len(cells), tasks=len(tasks), runs=len(runs), pattern_groups=1),
        ),
        alternative_explanations=["the model, not the harness"],
        counter_evidence=CounterEvidence(items=[], none_reason="no successful cell of the same shape"),
        counterfactual_prediction="if wrong, the agent would diverge even with the information in view",
        confidence="medium",
    )


W02_RUNS = ["h0-flask-json-provider-r2", "h0-click-option-groups-r1", "h0-click-option-groups-r4"]
W02_TASKS = ["flask-json-provider", "click-option-groups"]


DEMO_BUNDLE = Path(__file__).resolve().parents[2] / "fixtures" / "bundles" / "h0-demo"


def make_run(runs_dir: Path, *, confirmed: bool = True, run_id: str = "h0-validator-test") -> Path:
    """Write the synthetic run; with ``confirmed`` also commit gate 1 (W-02 confirm, W-04 amend, W-09 reject).

    Refs resolve against the frozen demo bundle (run.json ``bundle``); the IR holds only an ``events``
    table with one event per supporting cell (``C007-e0001``, ...), enough for event-id checks.
    """
    import duckdb

    run_dir = runs_dir / run_id
    run_dir.mkdir(parents=True)
    run_json = {"schema_version": 1, "run_id": run_id, "parent_harness": "H0"}
    if DEMO_BUNDLE.is_dir():
        run_json["bundle"] = os.path.relpath(DEMO_BUNDLE, run_dir)
    write_json(run_dir / "run.json", run_json)
    con = duckdb.connect(str(run_dir / "ir.duckdb"))
    try:
        con.execute("CREATE TABLE events (event_id VARCHAR)")
        for cell in ("C002", "C007", "C009", "C011", "C019", "C021"):
            con.execute("INSERT INTO events VALUES (?)", [f"{cell}-e0001"])
    finally:
        con.close()
    shortlist = write_shortlist(
        run_dir / SHORTLIST_FILE,
        Shortlist(
            run_id=run_id,
            denominator=Denominator(eligible_cells=len(CELLS), cells=CELLS),
            weaknesses=[
                _weakness("W-02", ["C007", "C011", "C019"], W02_TASKS, W02_RUNS),
                _weakness(
                    "W-04",
                    ["C002", "C009", "C021"],
                    ["requests-retry-backoff", "httpx-proxy-env"],
                    ["h0-requests-retry-backoff-r1", "h0-httpx-proxy-env-r2", "h0-httpx-proxy-env-r5"],
                ),
                _weakness("W-09", ["C007", "C011", "C019"], W02_TASKS, W02_RUNS),
            ],
        ),
    )
    handoff.update(
        run_dir,
        {"phase": "rootCausesMined", "userRootCauseConfirmation": "pending", "shortlist_digest": shortlist.digest},
        "sol",
    )
    if confirmed:
        confirm(
            run_dir,
            {"W-02": "confirm", "W-04": "amend", "W-09": "reject"},
            notes={"W-04": "narrowed to denials of out-of-scope writes"},
            by="tester",
            expected_digest=shortlist.digest,
        )
    return run_dir
