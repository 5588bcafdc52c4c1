"""Helpers for the sol/ledger/gates tests: a tiny native bundle, a hand-built index, a valid card."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.sol.checks import CellInfo, EvidenceIndex

TASKS = {"C001": "bat", "C002": "prom", "C003": "pytest", "C004": "bat", "C005": "prom"}
OUTCOME = {
    "C001": "workflow_failed",
    "C002": "workflow_failed",
    "C003": "workflow_failed",
    "C004": "completed",
    "C005": "completed",
}


def _lines(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)


def cell_logs(cell: str, *, variant: str = "") -> tuple[str, str]:
    """(controller.jsonl, session) text of one tiny cell; ``variant`` changes the review text."""
    ts = "2026-08-09T10:00:0{}Z"
    controller = [
        {"ts": ts.format(0), "event": "stage_started", "stage": "review", "actor": "reviewer"},
        {
            "ts": ts.format(1),
            "event": "state",
            "state_digest": "sha256:" + "a" * 64,
            "current_stage": "review",
            "confirmed": ["implementation"],
        },
        {"ts": ts.format(5), "event": "workflow_finished", "status": "stopped", "note": "stopped"},
    ]
    session = [
        {
            "ts": ts.format(2),
            "session": "s1",
            "type": "message",
            "role": "reviewer",
            "content": f"blocker in design for {cell}{variant}",
        },
        {
            "ts": ts.format(3),
            "session": "s1",
            "type": "tool_call",
            "call_id": "k1",
            "tool": "run_tests",
            "args": {"target": "tests"},
        },
        {
            "ts": ts.format(4),
            "session": "s1",
            "type": "tool_result",
            "call_id": "k1",
            "tool": "run_tests",
            "output": "2 passed",
            "exit_code": 0,
        },
    ]
    return _lines(controller), _lines(session)


def make_bundle(root: Path, cells: tuple[str, ...] = tuple(TASKS), excluded: tuple[str, ...] = ()) -> Path:
    """Write and freeze a tiny native bundle."""
    from pipeline.bundle.manifest import freeze

    b = root / "bundle"
    b.mkdir(parents=True)
    tasks = sorted({TASKS[c] for c in cells})
    req = {
        "schema_version": 1,
        "parent_harness": "H0",
        "generation": 0,
        "analysis_run_id": "tiny-run",
        "tasks": [{"task_id": t, "summary": t} for t in tasks],
        "cells": [
            {
                "cell_id": c,
                "task_id": TASKS[c],
                "run_id": f"h0-{TASKS[c]}-{c}",
                "eligibility": "excluded" if c in excluded else "valid_behavior",
                "path": f"cells/{c}",
            }
            for c in cells
        ],
        "exclusions": [{"cell_id": c, "reason": "infra failure"} for c in excluded],
    }
    (b / "analysis-request.json").write_text(json.dumps(req, indent=1), encoding="utf-8")
    outcomes = []
    for c in cells:
        d = b / "cells" / c
        (d / "sessions").mkdir(parents=True)
        (d / "cell.json").write_text(
            json.dumps(
                {
                    "cell_id": c,
                    "task_id": TASKS[c],
                    "run_id": f"h0-{TASKS[c]}-{c}",
                    "harness": "H0",
                    "workflow": ["implementation", "review"],
                    "started_at": "2026-08-09T10:00:00Z",
                }
            ),
            encoding="utf-8",
        )
        ctrl, sess = cell_logs(c)
        (d / "controller.jsonl").write_text(ctrl, encoding="utf-8")
        (d / "sessions" / "01-review-reviewer.jsonl").write_text(sess, encoding="utf-8")
        outcomes.append(
            {
                "cell_id": c,
                "label": OUTCOME[c],
                "quality": 0.5,
                "completion": 1.0 if OUTCOME[c] == "completed" else 0.0,
                "cost": 1.0,
                "stability": 0.5,
            }
        )
    (b / "sidecar").mkdir()
    (b / "sidecar" / "outcomes.jsonl").write_text(_lines(outcomes), encoding="utf-8")
    freeze(b)
    return b


def change_cell(bundle: Path, cell: str) -> None:
    """Change one cell's session log and re-freeze the bundle."""
    from pipeline.bundle.manifest import freeze

    _, sess = cell_logs(cell, variant=" (edited)")
    (bundle / "cells" / cell / "sessions" / "01-review-reviewer.jsonl").write_text(sess, encoding="utf-8")
    freeze(bundle)


def index() -> EvidenceIndex:
    """A hand-built index: C001-C005 eligible (H0), C009 excluded, C010 from another harness."""
    cells = {c: CellInfo(task_id=TASKS[c], run_id=f"h0-{TASKS[c]}-{c}", harness="H0", eligible=True) for c in TASKS}
    cells["C009"] = CellInfo(
        task_id="bat", run_id="h0-bat-C009", harness="H0", eligible=False, exclusion_reason="infra"
    )
    cells["C010"] = CellInfo(task_id="bat", run_id="h1-bat-C010", harness="H1", eligible=True)
    events = {}
    for c in [*TASKS, "C009", "C010"]:
        for seq in range(3):
            events[f"{c}-e{seq:04d}"] = (c, f"cells/{c}/sessions/01-review-reviewer.jsonl", seq + 1, seq + 1)
    groups = {"G-01": {"C001", "C002"}, "G-02": {"C003"}}
    return EvidenceIndex(cells=cells, events=events, groups=groups)


def draft(**over: Any) -> dict[str, Any]:
    """A valid weakness draft over the hand-built index (override any field)."""
    d: dict[str, Any] = {
        "weakness_id": "W-01",
        "statement": "A reviewer that finds an upstream blocker can only rewrite its own report; the controller "
        "has no route that hands the blocker back to a stage able to change the source.",
        "first_divergence": {
            "where": {"stage": "review", "actor": "reviewer", "what": "blocker found in design, report rewritten"},
            "cells": ["C001", "C002"],
            "event_refs": ["C001-e0001", "cells/C002/sessions/01-review-reviewer.jsonl#L2-L2"],
        },
        "harness_attribution": {"attributed": True, "why": "the controller offers no transition back"},
        "support": {"cells": ["C001", "C002", "C003"], "pattern_groups": ["G-01"], "event_refs": ["C003-e0002"]},
        "alternative_explanations": ["strict artifact ownership may be intended"],
        "counter_evidence": {
            "items": [
                {"cell": "C004", "refs": ["C004-e0001"], "note": "a re-check after a real source change completed"}
            ]
        },
        "counterfactual_prediction": "In a new run, after an out-of-scope blocker the next step re-runs the same "
        "check on an unchanged source digest; a source change or a stable stop refutes it.",
        "confidence": "medium",
    }
    d.update(over)
    return d
