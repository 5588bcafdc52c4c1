"""Two generations as real bundles, analysed through the real pipeline against the local test server.

A *planted* cell really contains the W-01 shape in its logs: the reviewer reports a blocker in an
upstream artifact, the controller sends review back and re-dispatches it with the controller state
digest unchanged, the reviewer re-runs the same check, and the run stops. An unplanted cell passes
review once and finishes. The scripted model (labelled fixture answers, not a model's output) only
reports what is in the logs: Luna reports the review->review repeat in planted cells, citing their
event ids; Sol names one weakness over the resulting group (parent) or none (child); the proposer
returns one card for it.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pipeline.core.canonical import read_json
from pipeline.testing.openai_server import Reply, completion_body

S_STATE = "sha256:" + "5" * 64
S_DONE = "sha256:" + "6" * 64


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows), encoding="utf-8")


def _ts(i: int) -> str:
    return f"2026-09-01T10:{i // 60:02d}:{i % 60:02d}.000Z"


def _cell(d: Path, cell: str, task: str, run_id: str, harness: str, planted: bool) -> None:
    sid = f"{run_id}/s"
    ctrl: list[dict[str, Any]] = [
        {"ts": _ts(0), "event": "stage_started", "stage": "review", "actor": "reviewer"},
        {"ts": _ts(1), "event": "state", "state_digest": S_STATE, "current_stage": "review",
         "confirmed": ["design", "implementation"]},
    ]  # fmt: skip
    s1 = [
        {"ts": _ts(2), "session": sid + "1", "type": "message", "role": "operator", "content": f"Review {task}."},
        {"ts": _ts(3), "session": sid + "1", "type": "tool_call", "call_id": "k1", "tool": "run_tests",
         "args": {"command": "pytest -q", "cwd": "."}},
        {"ts": _ts(4), "session": sid + "1", "type": "tool_result", "call_id": "k1", "tool": "run_tests",
         "output": "3 passed", "exit_code": 0},
    ]  # fmt: skip
    if planted:
        s1.append({"ts": _ts(5), "session": sid + "1", "type": "message", "role": "reviewer",
                   "content": "Blocker: design.md contradicts tasks.md; only its owner can change it."})  # fmt: skip
        ctrl += [
            {"ts": _ts(6), "event": "stage_sent_back", "stage": "review", "to": "reviewer", "reason": "re-review"},
            {"ts": _ts(7), "event": "stage_started", "stage": "review", "actor": "reviewer"},
            {"ts": _ts(8), "event": "state", "state_digest": S_STATE, "current_stage": "review",
             "confirmed": ["design", "implementation"]},
            {"ts": _ts(12), "event": "workflow_finished", "status": "stopped", "note": "review did not pass"},
        ]  # fmt: skip
        s2 = [
            {"ts": _ts(9), "session": sid + "2", "type": "tool_call", "call_id": "k2", "tool": "run_tests",
             "args": {"command": "pytest -q", "cwd": "."}},
            {"ts": _ts(10), "session": sid + "2", "type": "tool_result", "call_id": "k2", "tool": "run_tests",
             "output": "3 passed", "exit_code": 0},
            {"ts": _ts(11), "session": sid + "2", "type": "message", "role": "reviewer",
             "content": "Blocker unchanged: design.md still contradicts tasks.md."},
        ]  # fmt: skip
        _jsonl(d / "sessions" / "02-review-reviewer.jsonl", s2)
    else:
        s1.append({"ts": _ts(5), "session": sid + "1", "type": "message", "role": "reviewer",
                   "content": "Review passed."})  # fmt: skip
        ctrl += [
            {"ts": _ts(6), "event": "stage_accepted", "stage": "review", "by": "reviewer"},
            {"ts": _ts(7), "event": "state", "state_digest": S_DONE, "current_stage": "done",
             "confirmed": ["design", "implementation", "review"]},
            {"ts": _ts(8), "event": "workflow_finished", "status": "done", "note": "all stages accepted"},
        ]  # fmt: skip
    _jsonl(d / "sessions" / "01-review-reviewer.jsonl", s1)
    _jsonl(d / "controller.jsonl", ctrl)
    (d / "cell.json").write_text(json.dumps({"cell_id": cell, "task_id": task, "run_id": run_id,
                                             "harness": harness, "workflow": ["design", "implementation", "review"],
                                             "started_at": "2026-09-01T10:00:00Z"}), encoding="utf-8")  # fmt: skip


def write_generation(
    root: Path,
    *,
    run_id: str,
    families: Iterable[str],
    runs: int,
    planted: Callable[[int, int], bool],
    harness: str = "H0",
    generation: int = 0,
    implements: dict[str, Any] | None = None,
) -> Path:
    """A frozen native bundle: ``runs`` cells per family; ``planted(family_index, run)`` plants the shape.

    Sidecar: a planted cell fails (completion 0, cost 2.0), an unplanted one completes (completion 1, cost 1.0).
    """
    from pipeline.bundle.manifest import freeze

    fams = list(families)
    root.mkdir(parents=True)
    cells, outcomes = [], []
    n = 0
    for fi, task in enumerate(fams):
        for r in range(1, runs + 1):
            n += 1
            cell, rid = f"C{n:03d}", f"{harness.lower()}-{task}-r{r}"
            p = planted(fi, r)
            _cell(root / "cells" / cell, cell, task, rid, harness, p)
            cells.append({"cell_id": cell, "task_id": task, "run_id": rid, "eligibility": "valid_behavior",
                          "path": f"cells/{cell}"})  # fmt: skip
            outcomes.append({"cell_id": cell, "label": "workflow_failed" if p else "completed",
                             "quality": 0.5 if p else 0.8, "completion": 0.0 if p else 1.0,
                             "cost": 2.0 if p else 1.0, "stability": 0.5})  # fmt: skip
    req: dict[str, Any] = {
        "schema_version": 1, "parent_harness": harness, "generation": generation, "analysis_run_id": run_id,
        "tasks": [{"task_id": t, "summary": f"make {t} work"} for t in fams], "cells": cells, "exclusions": [],
    }  # fmt: skip
    if implements is not None:
        req["implements"] = implements
    (root / "analysis-request.json").write_text(json.dumps(req, indent=1), encoding="utf-8")
    _jsonl(root / "sidecar" / "outcomes.jsonl", outcomes)
    freeze(root)
    return root


# ----------------------------------------------------------------------------- the scripted model

KEY = "transition:review->review"


def _ids(text: str, cell: str, kind: str) -> list[str]:
    return sorted(set(re.findall(rf"\b{re.escape(cell)}-{kind}\d+\b", text)))


class Script:
    """A handler for FakeOpenAI that answers Luna, Sol and the proposer from the run on disk."""

    def __init__(self, runs_dir: Path) -> None:
        self.runs_dir = runs_dir
        self.run_id = ""
        self.planted_cells: set[str] = set()
        self.lock = threading.Lock()

    def __call__(self, request: dict[str, Any]) -> Reply:
        name = request["tools"][0]["function"]["name"] if request.get("tools") else ""
        text = "\n".join(m.get("content") or "" for m in request["messages"])
        if name == "SolAnswer":
            data = self.sol()
        elif name == "ProposalList":
            data = self.proposer()
        elif name == "JudgeAnswer":
            data = self.judge(text)
        else:
            m = re.search(r"^Cell (\S+) · task ", text, re.M)  # the cell the Luna prompt names
            assert m, name
            data = self.luna(m.group(1), text)
        return Reply(body=completion_body(request, tool_arguments=json.dumps(data)))

    def luna(self, cell: str, text: str) -> dict[str, Any]:
        candidates = _ids(text, cell, "H")
        events = _ids(text, cell, "e")
        if cell not in self.planted_cells:
            return {"patterns": [], "none_reason": "no step repeats on the same state", "rejected_candidates": [
                {"candidate": c, "observation": "the step is not repeated", "state_changed": False}
                for c in candidates]}  # fmt: skip
        # The restart of review: sent back, started again, same state digest (events 5..7 by seq).
        evidence = [e for e in events if 5 <= int(e.rsplit("-e", 1)[1]) <= 8]
        return {"patterns": [{
            "type": "repeated_exploration", "concerns": KEY,
            "observed": f"review was sent back and started again ({', '.join(evidence)}) with the same state digest",
            "definition_fit": "the controller state digest did not change between the two review sessions",
            "evidence": evidence, "state_changed": False, "candidates": candidates, "confidence": "high",
        }], "rejected_candidates": []}  # fmt: skip

    def _groups(self) -> list[dict[str, Any]]:
        doc = read_json(self.runs_dir / self.run_id / "pattern-groups.json")
        return [g for g in doc["groups"] if g["type"] == "repeated_exploration" and g["concerns"] == KEY]

    def sol(self) -> dict[str, Any]:
        groups = self._groups()
        if not groups or self.run_id.startswith("child"):
            return {"weaknesses": [], "none_reason": "the child's cells show no repeat of the targeted pattern group"}
        g = groups[0]
        cells = g["support"]["cells"]
        refs = [e for o in g["occurrences"] for e in o["events"]]
        clean = next(c for c in sorted(read_json(self.runs_dir / self.run_id / "pattern-groups.json")["coverage"],
                                       key=lambda r: r["cell_id"]) if c["cell_id"] not in cells)["cell_id"]  # fmt: skip
        return {"weaknesses": [{
            "weakness_id": "W-01",
            "statement": "After a reviewer reports a blocker in an upstream artifact, the controller re-dispatches "
                         "review with its state unchanged and the run stops without a change of the source.",
            "first_divergence": {"where": {"stage": "review", "actor": "reviewer, then controller",
                                           "what": "review sent back with the state digest unchanged"},
                                 "cells": cells[:2], "event_refs": [e for e in refs if e.split("-e")[0] in cells[:2]]},
            "harness_attribution": {"attributed": True, "why": "the controller offers no route back to the owner"},
            "support": {"cells": cells, "pattern_groups": [g["group_id"]], "event_refs": refs[:6]},
            "alternative_explanations": ["the reviewer may raise spurious blockers"],
            "counter_evidence": {"items": [{"cell": clean, "refs": [f"{clean}-e0001"],
                                            "note": "review passed once and the run finished"}]},
            "counterfactual_prediction": "In a new run, after a blocker in design the next review runs on an "
                                         "unchanged state digest; a change of the source before it refutes this.",
            "confidence": "medium",
        }]}  # fmt: skip

    def judge(self, text: str) -> dict[str, Any]:
        """Condition 1 (the unchanged re-review): always "not triggered", so a count that sees it disagrees;
        condition 2: not triggered, citing a review acceptance; condition 3: undetermined. Refs are the
        controller lines the prompt shows (planted cells' send-backs when there are any)."""
        shown = re.findall(r"^(C\d{3}-e\d{4}) (\S+)", text, re.M)
        accepted = [e for e, word in shown if word == "stage"] or [e for e, _ in shown]
        return {
            "behavioral_change": {"status": "observed", "refs": accepted[:1],
                                  "reason": "review is accepted or the run stops; no re-dispatch on the same state"},
            "conditions": [
                {"index": 1, "status": "not_triggered", "refs": accepted[:1],
                 "reason": "the controller lines shown move on after review"},
                {"index": 2, "status": "not_triggered", "refs": accepted[:1],
                 "reason": "no blocker is declared gone on a report change alone"},
                {"index": 3, "status": "undetermined", "refs": [],
                 "reason": "completion is not in the logs"},
            ],
        }  # fmt: skip

    def proposer(self) -> dict[str, Any]:
        sl = read_json(self.runs_dir / self.run_id / "weakness-shortlist.json")
        w = sl["weaknesses"][0]
        return {"note": None, "proposals": [{
            "proposal_id": "P-01", "parent_harness": "H0", "source_weakness": "W-01",
            "evidence": {"summary": "Reviews re-dispatched on an unchanged state stop the runs of the support.",
                         "affected_tasks": w["support"]["tasks"], "affected_runs": w["support"]["runs"],
                         "observed_impact": {"quality": "checks passed but the blocker stayed open",
                                             "completion": "the affected runs stopped in review",
                                             "cost": "a second review session on an unchanged state",
                                             "stability": "the same shape across task families"}},
            "root_cause": {"hypothesis": "A reviewer's blocker in an upstream artifact has no route back to its "
                                         "owner.", "confidence": "medium"},
            "strategy_change": {"current_strategy": "The controller re-dispatches review after a blocker.",
                                "proposed_strategy": "After a blocker in an upstream artifact the controller moves "
                                                     "the run back to that artifact's owner, or stops it as blocked.",
                                "rationale": "The single lever is the controller's disposition of a blocker."},
            "expected_effect": {
                "behavioral_change": "After a blocker the next controller event moves the run back or stops it.",
                "targeted_pattern_change": "Review re-dispatched on an unchanged state disappears.",
                "expected_metrics": {"quality": "No judge gain is presumed.",
                                     "completion": "Completion should improve where the owner repairs the artifact.",
                                     "cost": "No saving is presumed.",
                                     "stability": "The same blocker should lead to the same route."}},
            "rejection_conditions": [
                "The same review is re-run while the source and the controller state are unchanged.",
                "A blocker is declared gone after only the reviewer's report changed.",
                "Completion regresses because runs are stopped too early.",
            ],
            "regression_risks": ["The run is sent back to the wrong owner."],
        }]}  # fmt: skip


def analyse(bundle: Path, runs_dir: Path, run_id: str, script: Script, settings: Any, planted: set[str]) -> Path:
    """Run the real pipeline on ``bundle`` up to gate 1 with the scripted model; return the run dir."""
    from pipeline.run.runner import RunOptions, run

    script.run_id, script.planted_cells = run_id, planted
    run(RunOptions(bundle=bundle, run_id=run_id, runs_dir=runs_dir, models=settings), log=lambda _m: None)
    return runs_dir / run_id


def through_both_gates(run_dir: Path, settings: Any, proposal_id: str = "P-01") -> None:
    """Gate 1 (confirm every weakness), propose with the scripted proposer, gate 2 (select ``proposal_id``)."""
    from pipeline.gates import gate1 as gates
    from pipeline.gates.gate2 import select
    from pipeline.proposals.proposer import propose
    from pipeline.state import handoff as hf

    h = hf.load(run_dir)
    ids = [w["weakness_id"] for w in read_json(run_dir / "weakness-shortlist.json")["weaknesses"]]
    gates.confirm(run_dir, dict.fromkeys(ids, "confirm"), by="tester", expected_digest=h.shortlist_digest)
    propose(run_dir, settings, log=lambda _m: None)
    select(run_dir, choice="proposal", by="tester", proposal_id=proposal_id,
           expected_digest=hf.load(run_dir).proposals_digest)  # fmt: skip
