"""lunasol diff: matching by content, not by id; exit codes; the diff of a run with itself is empty.

The run directories here are built synthetically: a small generated bundle (pipeline.bundle.synth)
exported to a real IR, plus small hand-written artifacts shaped like the producers' models.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from pipeline.artifacts.rundir import RunArtifacts, RunDir
from pipeline.cli.app import app
from pipeline.core.canonical import write_json, write_jsonl
from pipeline.diff import diff_run_dirs, render_markdown, render_text
from pipeline.diff.match import greedy_match, jaccard, text_similarity


def _events(run_dir: Path) -> dict[str, list[str]]:
    import duckdb

    con = duckdb.connect(str(run_dir / "ir.duckdb"), read_only=True)
    try:
        rows = con.execute("SELECT cell_id, event_id FROM events ORDER BY cell_id, seq").fetchall()
    finally:
        con.close()
    out: dict[str, list[str]] = {}
    for cell, ev in rows:
        out.setdefault(cell, []).append(ev)
    return out


HOSTILE = "</script><script>window.__pwned = 1; alert(1)</script><img src=x onerror=alert(2)> & done"
CONTROLLER_REF = "cells/C001/controller.jsonl#L1-L2"


def hostile_event(run_dir: Path) -> str:
    """The event id of the hostile reviewer line."""
    import duckdb

    con = duckdb.connect(str(run_dir / "ir.duckdb"), read_only=True)
    try:
        row = con.execute("SELECT event_id FROM events WHERE text LIKE '%__pwned%'").fetchone()
    finally:
        con.close()
    assert row is not None
    return str(row[0])


def weakness(wid: str, cells: list[str], refs: list[str], statement: str, confidence: str = "medium") -> dict[str, Any]:
    """A weakness card shaped like pipeline.sol.cards.WeaknessCard."""
    return {
        "weakness_id": wid,
        "statement": statement,
        "first_divergence": {
            "where": {"stage": "review", "actor": "reviewer", "what": "the reviewer re-ran the same check"},
            "cells": cells[:1],
            "event_refs": refs[:1],
        },
        "harness_attribution": {"attributed": True, "why": "the controller offers no route back"},
        "support": {
            "cells": cells,
            "tasks": sorted({f"task-{int(c[1:]) - 1}" for c in cells}),
            "runs": [f"h0-{c}" for c in cells],
            "pattern_groups": ["G-01"],
            "event_refs": refs,
            "counts": {"cells": len(cells), "tasks": len(cells), "runs": len(cells), "pattern_groups": 1},
        },
        "alternative_explanations": ["the task was under-specified"],
        "counter_evidence": {"items": [], "none_reason": "no successful cell re-checked the same target"},
        "counterfactual_prediction": "a cell where the checker can send work back would not repeat the check",
        "confidence": confidence,
    }


def proposal(pid: str, source: str, strategy: str) -> dict[str, Any]:
    """A proposal card with the seed's fixed schema (text shortened)."""
    return {
        "proposal_id": pid,
        "parent_harness": "H0",
        "source_weakness": source,
        "evidence": {
            "summary": "the reviewer found an upstream blocker it could not fix",
            "affected_tasks": ["task-0"],
            "affected_runs": ["h0-C001"],
            "observed_impact": {"quality": "q", "completion": "c", "cost": "k", "stability": "s"},
        },
        "root_cause": {"hypothesis": "no repair owner is reachable", "confidence": "medium"},
        "strategy_change": {
            "current_strategy": "the checker can only write a report",
            "proposed_strategy": strategy,
            "rationale": "one lever: who may act on a found blocker",
        },
        "expected_effect": {
            "behavioral_change": "the blocker is routed back instead of re-checked",
            "targeted_pattern_change": "repeated checks on unchanged sources disappear",
            "expected_metrics": {"quality": "q", "completion": "c", "cost": "k", "stability": "s"},
        },
        "rejection_conditions": ["the same check is still repeated"],
        "regression_risks": ["more back-and-forth between stages"],
    }


def build_run(root: Path, name: str = "run-a") -> Path:
    """A small but complete run: real IR from a generated bundle, then every downstream artifact."""
    from pipeline.bundle.manifest import freeze
    from pipeline.bundle.synth import write_bundle
    from pipeline.ir.export import export

    bundle = root / "bundle"
    if not bundle.exists():
        write_bundle(bundle, cells=3, events_per_cell=12, excluded=1, seed=3, freeze_it=False)
        # Log text is untrusted: one reviewer line tries to break out of the report's HTML.
        with (bundle / "cells/C003/sessions/04-review-reviewer.jsonl").open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"content": HOSTILE, "role": "reviewer", "session": "C003-04",
                                 "ts": "2026-08-09T23:59:59Z", "type": "message"}) + "\n")  # fmt: skip
        freeze(bundle)
    run_dir = root / "runs" / name
    export(bundle, run_dir)
    ev = _events(run_dir)
    hostile = hostile_event(run_dir)
    run = json.loads((run_dir / "run.json").read_text())
    run["models"] = {"luna": "openai/test-model", "sol": "openai/test-model"}
    run["templates"] = {"luna": "sha256:" + "1" * 64, "sol": "sha256:" + "2" * 64}
    run["settings"] = {"temperature": 0.0, "concurrency": 8, "mode": "replay"}
    run["started_at"] = "2026-11-30T10:00:00Z"
    write_json(run_dir / "run.json", run)
    patterns = [
        {"pattern_id": "C001-P01", "cell_id": "C001", "type": "repeated_exploration", "concerns": "target:src/a.py",
         "observed": f"read src/a.py twice ({ev['C001'][2]}, {ev['C001'][5]}) with no change between",
         "definition_fit": "external state did not change in between", "evidence": [ev["C001"][2], ev["C001"][5]],
         "confidence": "high"},
        {"pattern_id": "C001-P02", "cell_id": "C001", "type": "omission", "concerns": "obligation:OB-1",
         "observed": "obligation OB-1 was opened and never closed", "definition_fit": "public obligation, had a chance",
         "evidence": [ev["C001"][1]], "confidence": "medium"},
        {"pattern_id": "C002-P01", "cell_id": "C002", "type": "zero_information_gain", "concerns": "target:grep",
         "observed": "a grep returned what an earlier one did", "definition_fit": "nothing changed",
         "evidence": [ev["C002"][3], ev["C002"][4]], "confidence": "low"},
    ]  # fmt: skip
    write_jsonl(run_dir / "patterns.jsonl", patterns)
    write_json(
        run_dir / "pattern-groups.json",
        {"schema_version": 1, "groups": [
            {"group_id": "G-01", "type": "repeated_exploration", "key": "target:src/a.py", "cells": ["C001"],
             "occurrences": [{"cell_id": "C001", "pattern_id": "C001-P01", "evidence": patterns[0]["evidence"]}]},
            {"group_id": "G-02", "type": "zero_information_gain", "key": "target:grep", "cells": ["C002"],
             "occurrences": [{"cell_id": "C002", "pattern_id": "C002-P01", "evidence": patterns[2]["evidence"]}]},
        ]},
    )  # fmt: skip
    cards = [
        weakness("W-01", ["C001", "C002"], [ev["C001"][2], ev["C002"][3]], "checkers re-check unchanged sources"),
        weakness("W-02", ["C003"], [hostile, CONTROLLER_REF], "obligations stay open at hand-off <b>bold?</b>", "low"),
    ]
    write_json(run_dir / "weakness-shortlist.json", {"schema_version": 1, "digest": "sha256:" + "a" * 64,
                                                      "weaknesses": cards, "dropped": []})  # fmt: skip
    (run_dir / "proposals.yaml").write_text(
        yaml.safe_dump({"proposals": [proposal("P-01", "W-01", "let the checker send work back to its owner")]})
    )
    write_json(run_dir / "validation.json", {"results": [{"proposal_id": "P-01", "valid": True, "errors": []}]})
    write_json(
        run_dir / "gates" / "gate1-op1.json",
        {"gate": "gate1", "operation_id": "op1", "run_id": name, "by": "ana", "decided_at": "2026-11-30T10:05:00Z",
         "base_revision": 5, "new_revision": 6, "subject": {"artifact": "weakness-shortlist.json", "digest": "x"},
         "request": {"decisions": {"W-01": {"decision": "confirm", "note": None},
                                   "W-02": {"decision": "reject", "note": None}}},
         "request_digest": "y", "result": {"userRootCauseConfirmation": "partially_confirmed"}, "receipt_digest": "z"},
    )  # fmt: skip
    write_jsonl(
        run_dir / "calls.jsonl",
        [{"role": "luna", "cell": c, "prompt_tokens": 1000, "completion_tokens": 200, "cost_usd": 0.001,
          "latency_ms": 12.5 + i, "attempts": 1, "outcome": "ok", "mode": "replay"} for i, c in enumerate(ev)]
        + [{"role": "sol", "cell": None, "prompt_tokens": 5000, "completion_tokens": 900, "cost_usd": 0.01,
            "latency_ms": 40.0, "attempts": 1, "outcome": "ok", "mode": "replay"}],
    )  # fmt: skip
    write_json(
        run_dir / "handoff.json",
        {"schema_version": 1, "run_id": name, "revision": 6, "phase": "rootCausesMined",
         "userRootCauseConfirmation": "partially_confirmed", "proposalGeneration": "done",
         "proposalSelection": "pending", "shortlist_digest": "sha256:" + "a" * 64, "proposals_digest": None,
         "receipts": {"gate1": "gates/gate1-op1.json"}, "history": []},
    )  # fmt: skip
    return run_dir


@pytest.fixture(scope="module")
def base_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_run(tmp_path_factory.mktemp("review"))


def copy_run(base: Path, name: str) -> Path:
    """A sibling copy (same depth, so run.json's relative bundle path still resolves)."""
    dest = base.parent / name
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(base, dest)
    return dest


def rewrite_jsonl(path: Path, fn: Any) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    write_jsonl(path, fn(rows))


def rewrite_json(path: Path, fn: Any) -> None:
    write_json(path, fn(json.loads(path.read_text())))


# ------------------------------------------------------------------ matching primitives
def test_jaccard_and_similarity() -> None:
    assert jaccard({"a", "b"}, {"b", "c"}) == pytest.approx(1 / 3)
    assert jaccard([], []) == 1.0
    assert text_similarity("Let the checker send work back", "let the  checker send work back") == 1.0
    assert text_similarity("移除独立的验证阶段", "移除独立验证阶段") > 0.5
    assert text_similarity("移除独立的验证阶段", "增加回退路径") < 0.2


def test_greedy_match_prefers_best_pairs() -> None:
    pairs, only_a, only_b = greedy_match([1, 2, 3], [3, 2], lambda x, y: 1.0 if x == y else None, 0.5)
    assert pairs == [(1, 1, 1.0), (2, 0, 1.0)]
    assert only_a == [0] and only_b == []


# ------------------------------------------------------------------ self diff
def test_diff_with_itself_is_empty(base_run: Path) -> None:
    d = diff_run_dirs(base_run, base_run)
    assert d.identical
    assert not d.inputs and not d.cells and not d.gates and not d.state and not d.calls
    assert d.patterns.unchanged == 3 and d.weaknesses.unchanged == 2 and d.proposals.unchanged == 1
    result = CliRunner().invoke(app, ["diff", str(base_run), str(base_run)])
    assert result.exit_code == 0, result.output
    assert "identical outputs" in result.output


def test_copy_with_other_times_and_latencies_is_identical(base_run: Path) -> None:
    b = copy_run(base_run, "volatile")
    rewrite_jsonl(b / "calls.jsonl", lambda rows: [{**r, "latency_ms": r["latency_ms"] * 3} for r in rows])
    rewrite_json(b / "run.json", lambda r: {**r, "started_at": "2027-01-01T00:00:00Z", "run_id": "volatile"})
    rewrite_json(b / "gates" / "gate1-op1.json", lambda r: {**r, "decided_at": "2027-01-01T00:00:00Z"})
    d = diff_run_dirs(base_run, b)
    assert d.identical, render_text(d)


# ------------------------------------------------------------------ one changed cell
def test_one_changed_pattern_shows_exactly_that_cell(base_run: Path) -> None:
    b = copy_run(base_run, "one-cell")

    def change(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for r in rows:
            if r["pattern_id"] == "C002-P01":
                r["confidence"] = "high"
                r["evidence"] = [*r["evidence"], r["evidence"][0].replace("e0003", "e0007")]
        return rows

    rewrite_jsonl(b / "patterns.jsonl", change)
    d = diff_run_dirs(base_run, b)
    assert not d.identical
    assert [c.cell_id for c in d.cells] == ["C002"]
    (item,) = d.cells[0].items
    assert item.status == "changed" and item.a_id == item.b_id == "C002-P01"
    assert item.score == pytest.approx(2 / 3, abs=1e-4)
    paths = {c.path: c for c in item.changes}
    assert set(paths) == {"confidence", "evidence"}
    assert paths["confidence"].a == "low" and paths["confidence"].b == "high"
    assert paths["evidence"].added and not paths["evidence"].removed
    result = CliRunner().invoke(app, ["diff", str(base_run), str(b)])
    assert result.exit_code == 1
    assert "cell C002" in result.output and "cell C001" not in result.output


def test_patterns_matched_by_evidence_not_by_id(base_run: Path) -> None:
    b = copy_run(base_run, "renumbered-patterns")

    def renumber(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        ids = {"C001-P01": "C001-P02", "C001-P02": "C001-P01"}
        return [{**r, "pattern_id": ids.get(r["pattern_id"], r["pattern_id"])} for r in reversed(rows)]

    rewrite_jsonl(b / "patterns.jsonl", renumber)
    assert diff_run_dirs(base_run, b).identical


def test_added_and_removed_patterns(base_run: Path) -> None:
    b = copy_run(base_run, "added-removed")

    def change(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        kept = [r for r in rows if r["pattern_id"] != "C001-P02"]
        new = {**rows[0], "pattern_id": "C003-P01", "cell_id": "C003", "evidence": ["C003-e0001", "C003-e0002"]}
        return [*kept, new]

    rewrite_jsonl(b / "patterns.jsonl", change)
    d = diff_run_dirs(base_run, b)
    by_cell = {c.cell_id: [(i.status, i.a_id, i.b_id) for i in c.items] for c in d.cells}
    assert by_cell == {"C001": [("removed", "C001-P02", None)], "C003": [("added", None, "C003-P01")]}


def test_same_type_without_shared_evidence_is_not_a_match(base_run: Path) -> None:
    b = copy_run(base_run, "moved-evidence")

    def move(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for r in rows:
            if r["pattern_id"] == "C002-P01":
                r["evidence"] = ["C002-e0009", "C002-e0010"]
                r["concerns"] = "target:other"
        return rows

    rewrite_jsonl(b / "patterns.jsonl", move)
    statuses = sorted(i.status for c in diff_run_dirs(base_run, b).cells for i in c.items)
    assert statuses == ["added", "removed"]


# ------------------------------------------------------------------ weaknesses
def test_weakness_matching_survives_renumbered_ids(base_run: Path) -> None:
    b = copy_run(base_run, "renumbered-weaknesses")

    def renumber(doc: dict[str, Any]) -> dict[str, Any]:
        w1, w2 = doc["weaknesses"]
        w1["weakness_id"], w2["weakness_id"] = "W-02", "W-01"
        doc["weaknesses"] = [w2, w1]
        return doc

    rewrite_json(b / "weakness-shortlist.json", renumber)
    # Downstream ids follow the renumbering: the proposal and the gate decisions name the new ids.
    doc = yaml.safe_load((b / "proposals.yaml").read_text())
    doc["proposals"][0]["source_weakness"] = "W-02"
    (b / "proposals.yaml").write_text(yaml.safe_dump(doc))
    rewrite_json(
        b / "gates" / "gate1-op1.json",
        lambda r: {**r, "request": {"decisions": {"W-02": {"decision": "confirm", "note": None},
                                                  "W-01": {"decision": "reject", "note": None}}}},
    )  # fmt: skip
    d = diff_run_dirs(base_run, b)
    assert d.weakness_map == {"W-01": "W-02", "W-02": "W-01"}
    assert d.identical, render_text(d)
    assert "renumbered W-01 -> W-02" in render_text(d)


def test_weakness_field_changes_are_listed(base_run: Path) -> None:
    b = copy_run(base_run, "weakness-changed")

    def change(doc: dict[str, Any]) -> dict[str, Any]:
        w = doc["weaknesses"][0]
        w["weakness_id"] = "W-07"
        w["confidence"] = "high"
        w["support"]["cells"] = [*w["support"]["cells"], "C003"]
        return doc

    rewrite_json(b / "weakness-shortlist.json", change)
    d = diff_run_dirs(base_run, b)
    (item,) = d.weaknesses.items
    assert (item.status, item.a_id, item.b_id) == ("changed", "W-01", "W-07")
    assert {c.path for c in item.changes} == {"confidence", "support.cells"}
    # The proposal still cites W-01, which in B is a different id: its source no longer matches.
    assert {i.status for i in d.proposals.items} == {"added", "removed"}


# ------------------------------------------------------------------ proposals, gates, calls, presence
def test_proposal_strategy_change_and_validation(base_run: Path) -> None:
    b = copy_run(base_run, "proposal-changed")
    doc = yaml.safe_load((b / "proposals.yaml").read_text())
    doc["proposals"][0]["proposal_id"] = "P-09"
    doc["proposals"][0]["strategy_change"]["proposed_strategy"] = "let the checker send the work back to its owner"
    (b / "proposals.yaml").write_text(yaml.safe_dump(doc))
    errors = [{"rule": "R-LEVER", "path": "strategy_change"}]
    write_json(b / "validation.json", {"results": [{"proposal_id": "P-09", "valid": False, "errors": errors}]})
    d = diff_run_dirs(base_run, b)
    (item,) = d.proposals.items
    assert (item.status, item.a_id, item.b_id) == ("changed", "P-01", "P-09")
    paths = {c.path for c in item.changes}
    assert paths == {"strategy_change.proposed_strategy", "validation.rules", "validation.verdict"}


def test_gate_decision_and_state_changes(base_run: Path) -> None:
    b = copy_run(base_run, "gate-changed")
    rewrite_json(
        b / "gates" / "gate1-op1.json",
        lambda r: {**r, "request": {"decisions": {"W-01": {"decision": "confirm", "note": None},
                                                  "W-02": {"decision": "confirm", "note": None}}},
                   "result": {"userRootCauseConfirmation": "confirmed"}},
    )  # fmt: skip
    rewrite_json(b / "handoff.json", lambda h: {**h, "userRootCauseConfirmation": "confirmed", "revision": 9})
    d = diff_run_dirs(base_run, b)
    assert {c.path for c in d.gates} == {
        "gate1.decisions.W-02.decision",
        "gate1.result.userRootCauseConfirmation",
    }
    assert [c.path for c in d.state] == ["handoff.userRootCauseConfirmation"]


def test_stopped_at_gate_1_has_no_proposals(base_run: Path) -> None:
    b = copy_run(base_run, "stopped")
    for name in ("proposals.yaml", "validation.json"):
        (b / name).unlink()
    shutil.rmtree(b / "gates")
    d = diff_run_dirs(base_run, b)
    assert d.proposals.present_a and not d.proposals.present_b
    assert not d.identical
    text = render_text(d)
    assert "proposals: only in A" in text


def test_inputs_and_calls_differences(base_run: Path) -> None:
    b = copy_run(base_run, "other-model")
    rewrite_json(b / "run.json", lambda r: {**r, "models": {**r["models"], "luna": "ollama/qwen3"}})
    rewrite_jsonl(b / "calls.jsonl", lambda rs: [{**r, "completion_tokens": 1 + r["completion_tokens"]} for r in rs])
    d = diff_run_dirs(base_run, b)
    assert [(c.path, c.a, c.b) for c in d.inputs] == [("models.luna", "openai/test-model", "ollama/qwen3")]
    assert d.calls_b.completion_tokens == d.calls_a.completion_tokens + 4
    assert "completion_tokens" in {c.path for c in d.calls}


def test_json_and_markdown_outputs(base_run: Path) -> None:
    b = copy_run(base_run, "md")
    rewrite_json(b / "run.json", lambda r: {**r, "templates": {**r["templates"], "sol": "sha256:" + "3" * 64}})
    runner = CliRunner()
    res = runner.invoke(app, ["diff", str(base_run), str(b), "--json"])
    assert res.exit_code == 0  # only the inputs differ: outputs identical
    data = json.loads(res.output)
    assert data["identical"] is True and data["inputs"][0]["path"] == "templates.sol"
    res = runner.invoke(app, ["diff", str(base_run), str(b), "--markdown"])
    assert res.exit_code == 0 and res.output.startswith("# lunasol diff")
    assert "## inputs (run.json)" in res.output
    assert render_markdown(diff_run_dirs(base_run, b)) == res.output


def test_bad_inputs_are_one_line_exit_2(base_run: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["diff", str(base_run), str(tmp_path / "missing")])
    assert res.exit_code == 2 and "run directory not found" in res.output
    broken = copy_run(base_run, "broken")
    (broken / "patterns.jsonl").write_text('{"pattern_id": "x"}\nnot json\n')
    res = runner.invoke(app, ["diff", str(base_run), str(broken)])
    assert res.exit_code == 2 and "patterns.jsonl:2: not valid JSON" in res.output
    assert "Traceback" not in res.output
    res = runner.invoke(app, ["diff", str(base_run), str(base_run), "--json", "--markdown"])
    assert res.exit_code == 2


def test_load_run_reads_partial_runs(base_run: Path) -> None:
    b = copy_run(base_run, "partial")
    for name in ("patterns.jsonl", "pattern-groups.json", "weakness-shortlist.json", "calls.jsonl"):
        (b / name).unlink()
    arts = RunDir(b).read()
    assert arts.patterns is None and arts.weaknesses is None and arts.calls is None
    assert arts.proposals is not None


def test_renumbered_proposal_keeps_its_gate_2_selection(base_run: Path) -> None:
    def gate2(run: Path, pid: str) -> None:
        write_json(
            run / "gates" / "gate2-op9.json",
            {"gate": "gate2", "operation_id": "op9", "by": "ana", "decided_at": "2026-11-30T11:00:00Z",
             "base_revision": 7, "new_revision": 8, "request": {"choice": "proposal", "proposal_id": pid},
             "result": {"proposalSelection": "selected"}},
        )  # fmt: skip

    a = copy_run(base_run, "sel-a")
    gate2(a, "P-01")
    b = copy_run(a, "sel-b")
    doc = yaml.safe_load((b / "proposals.yaml").read_text())
    doc["proposals"][0]["proposal_id"] = "P-04"
    (b / "proposals.yaml").write_text(yaml.safe_dump(doc))
    rewrite_json(b / "validation.json", lambda v: {"results": [{**v["results"][0], "proposal_id": "P-04"}]})
    gate2(b, "P-04")
    assert diff_run_dirs(a, b).identical
    gate2(b, "P-05")  # another selection: now the gate differs
    d = diff_run_dirs(a, b)
    assert [(c.path, c.a, c.b) for c in d.gates] == [("gate2.proposal_id", "P-04", "P-05")]


def test_two_export_only_runs_are_identical(base_run: Path) -> None:
    runs = []
    for name in ("export-only-a", "export-only-b"):
        r = copy_run(base_run, name)
        for p in r.iterdir():
            if p.name not in ("run.json", "ir.duckdb"):
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        runs.append(r)
    d = diff_run_dirs(*runs)
    assert d.identical
    assert "weaknesses: in neither run" in render_text(d)


def test_group_matching_reads_each_group_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Every pair of same-type groups is scored; at 1,000 cells a group cites thousands of events, and
    # reading both sides' citations per pair made a diff take 19 s (269 s at 10,000 cells).
    from pipeline.diff import compare

    def groups(offset: int) -> list[dict[str, Any]]:
        return [
            {"group_id": f"G{i:03d}", "type": "repeated_exploration",
             "occurrences": [{"events": [f"C{i:03d}-e{offset + k:04d}" for k in range(3)]}]}
            for i in range(30)
        ]  # fmt: skip

    calls: list[int] = []
    real = compare.cited_ids
    monkeypatch.setattr(compare, "cited_ids", lambda obj: calls.append(1) or real(obj))
    a = RunArtifacts(path=tmp_path / "a", groups=groups(0))
    b = RunArtifacts(path=tmp_path / "b", groups=groups(1))  # each group shares 2 of its 3 events with its twin
    section = compare.diff_groups(a, b)
    assert len(calls) == 60  # each group's citations read once, not once per pair (1,800)
    assert section.unchanged == 0 and len(section.items) == 30  # every group paired with its twin, changed
    assert all(it.a is not None and it.b is not None and it.a["group_id"] == it.b["group_id"] for it in section.items)


def test_cited_ids_finds_what_both_patterns_find_in_every_string() -> None:
    # cited_ids skips the regexes for strings that cannot hold an id ("-e") or a ref ("#L")
    from pipeline.core.refs import REF_IN_TEXT
    from pipeline.diff.match import EVENT_ID_RE, cited_ids

    texts = [
        "C001-e0001", "see C0042-e00012, then cells/C1/a.jsonl#L3-L4 and raw/m.json#L1-L1/0/trace#L5-L9",
        "raw/x.eval#L1-L1/samples/0_epoch_1.json!/messages/2", "sessions/01-exploration.jsonl", "no ids here",
        "weird C001-e12 and Ü-e0001 and x#L", "C001-P01 G003 W-01",
    ]  # fmt: skip
    card = {"statement": texts[1], "support": {"event_refs": texts, "runs": ["r#L2"]}, "note": {"deep": [texts[2]]}}
    expected = {m.group(0) for t in texts for rx in (EVENT_ID_RE, REF_IN_TEXT) for m in rx.finditer(t)}
    assert cited_ids(card) == expected and "r#L2" not in expected
