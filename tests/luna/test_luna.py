"""Luna through the real model layer and the local OpenAI-compatible server (litellm -> HTTP -> 127.0.0.1).

Hand-made IRs; scripted answers per cell. Proves: invented ids are re-asked then fixed, or the cell is
failed (never dropped); cause/remedy wording is re-asked; outcomes never reach a request; big cells
are split by segment and merged; probes overrule a model's claim that state changed.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pytest

from pipeline.core.context import RunContext, RunOptions
from pipeline.core.settings import ModelSettings
from pipeline.luna import stage as luna_stage
from pipeline.luna.render import CONTEXT_ENV
from pipeline.probes import stage as probes_stage
from pipeline.probes.synthetic import write_ir
from pipeline.testing.openai_server import FakeOpenAI, Reply, completion_body

S1 = "sha256:" + "1" * 64
A1 = "sha256:" + "a" * 64


def call(tool: str, target: str, *, actor: str = "candidate", stage: str = "implementation") -> dict[str, Any]:
    return {
        "kind": "tool_call",
        "tool_name": tool,
        "args_digest": A1,
        "target": target,
        "state_digest": S1,
        "actor": actor,
        "stage": stage,
        "text": f'{tool} {{"path": "{target}"}}',
    }


def msg(text: str, actor: str = "candidate", stage: str = "implementation") -> dict[str, Any]:
    return {"kind": "message", "actor": actor, "text": text, "state_digest": S1, "stage": stage}


CELLS: dict[str, list[dict[str, Any]]] = {
    # C001: a repeated read with nothing in between -> one probe candidate (C001-H01)
    "C001": [msg("start"), call("read_file", "src/a.py"), msg("hmm"), call("read_file", "src/a.py")],
    # C002: nothing to find
    "C002": [msg("start"), call("read_file", "src/b.py"), msg("done")],
}
OUTCOMES = {"C001": "workflow_failed", "C002": "completed"}


def padded(word: str, stage: str, n: int = 6) -> list[dict[str, Any]]:
    """``n`` long messages (300 characters each), so a small context budget splits the cell."""
    return [msg(f"{word} {i} {'x' * 300}", stage=stage) for i in range(n)]


def pattern(evidence: list[str], **kw: Any) -> dict[str, Any]:
    base = {
        "type": "repeated_exploration",
        "concerns": "target:read_file:src/a.py",
        "observed": "src/a.py was read twice with the same arguments and nothing in between",
        "definition_fit": "controller state and source were unchanged between the two reads",
        "evidence": evidence,
        "state_changed": False,
        "candidates": ["C001-H01"],
        "confidence": "high",
    }
    base.update(kw)
    return base


GOOD_C001 = {"patterns": [pattern(["C001-e0001", "C001-e0003"])], "rejected_candidates": []}
EMPTY = {"patterns": [], "rejected_candidates": [], "none_reason": "no repeat, omission or zero-gain step in this log"}


def cell_of(request: dict[str, Any]) -> str:
    text = "\n".join(m.get("content") or "" for m in request["messages"])
    m = re.search(r"^Cell (\S+) · task .* · part (\d+)/(\d+)$", text, re.M)
    assert m, "every Luna request names its cell and part"
    cell, k, n = m.groups()
    return cell if n == "1" else f"{cell}.part{k}of{n}"


def scripted(answers: dict[str, list[dict[str, Any]]]) -> Callable[[dict[str, Any]], Reply]:
    """Per cell (or part) a queue of answers; the last one repeats."""
    lock = threading.Lock()
    queues = {k: list(v) for k, v in answers.items()}

    def handle(request: dict[str, Any]) -> Reply:
        name = cell_of(request)
        with lock:
            q = queues[name]
            data = q.pop(0) if len(q) > 1 else q[0]
        return Reply(body=completion_body(request, tool_arguments=json.dumps(data)))

    return handle


def make_ctx(tmp_path: Path, settings: ModelSettings, cells: dict[str, list[dict[str, Any]]] = CELLS) -> RunContext:
    run_dir = tmp_path / "runs" / "r1"
    write_ir(run_dir / "ir.duckdb", cells, outcomes=OUTCOMES)
    opts = RunOptions(bundle=tmp_path / "no-bundle", runs_dir=tmp_path / "runs", models=settings)
    return RunContext(options=opts, run_dir=run_dir, log=lambda _m: None)


def run_stages(ctx: RunContext) -> str:
    probes_stage(ctx)
    return luna_stage(ctx)


def table(ctx: RunContext, sql: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect(str(ctx.ir_path), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def read_patterns(ctx: RunContext) -> list[dict[str, Any]]:
    lines = (ctx.run_dir / "patterns.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def test_invented_id_is_reasked_then_fixed(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    invented = {"patterns": [pattern(["C001-e0001", "C001-e0999"])], "rejected_candidates": []}
    fake_llm.handler = scripted({"C001": [invented, GOOD_C001], "C002": [EMPTY]})
    ctx = make_ctx(tmp_path, model_settings())
    summary = run_stages(ctx)

    c001 = [r for r in fake_llm.requests if cell_of(r) == "C001"]
    assert len(c001) == 2  # first answer rejected, second accepted
    reask = c001[1]["messages"][-1]["content"]
    assert "C001-e0999 is not an event of cell C001" in reask
    pats = read_patterns(ctx)
    assert [p["pattern_id"] for p in pats] == ["C001-P01"]
    assert pats[0]["evidence"] == ["C001-e0001", "C001-e0003"]
    assert pats[0]["probe_hits"] == ["C001-H01"]
    assert table(ctx, "SELECT cell_id, status, patterns FROM luna_cells ORDER BY 1") == [
        ("C001", "ok", 1),
        ("C002", "ok", 0),
    ]
    assert "1 patterns from 2/2 cells" in summary


def test_cell_failing_every_reask_is_marked_failed_not_dropped(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    invented = {"patterns": [pattern(["C001-e0001", "C007-e0002"])], "rejected_candidates": []}
    fake_llm.handler = scripted({"C001": [invented], "C002": [EMPTY]})
    ctx = make_ctx(tmp_path, model_settings(max_reasks=1))
    summary = run_stages(ctx)

    assert len([r for r in fake_llm.requests if cell_of(r) == "C001"]) == 2
    rows = table(ctx, "SELECT cell_id, status, attempts, reason FROM luna_cells ORDER BY 1")
    assert rows[0][:3] == ("C001", "failed", 2)
    assert "C007-e0002 is not an event of cell C001" in rows[0][3]
    assert rows[1][:2] == ("C002", "ok")
    assert "1 FAILED (C001" in summary
    assert read_patterns(ctx) == []


def test_many_failed_cells_are_counted_not_all_listed(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    # At thousands of cells a summary that names every failed cell is no longer one line.
    cells = {f"C{i:03d}": CELLS["C001"] for i in range(1, 14)}
    ids = sorted(cells)

    def invent(request: dict[str, Any]) -> Reply:
        cell = cell_of(request)
        bad = {"patterns": [pattern([f"{cell}-e0001", "C999-e0002"])], "rejected_candidates": []}
        return Reply(body=completion_body(request, tool_arguments=json.dumps(bad)))

    fake_llm.handler = invent
    ctx = make_ctx(tmp_path, model_settings(max_reasks=0), cells)
    logs: list[str] = []
    ctx.log = logs.append
    summary = run_stages(ctx)

    assert table(ctx, "SELECT count(*) FROM luna_cells WHERE status = 'failed'") == [(13,)]
    assert f"13 FAILED ({', '.join(ids[:10])} and 3 more; see table luna_cells)" in summary
    assert ids[12] not in summary
    named = [line for line in logs if line.startswith("[luna] cell ") and "FAILED" in line]
    assert len(named) == 10
    assert "[luna] and 3 more failed cell(s), each with its reason in table luna_cells" in logs
    assert ctx.incomplete == [f"13 cell(s) failed ({', '.join(ids[:10])} and 3 more)"]


def test_cause_or_remedy_wording_is_reasked(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    why = {
        "patterns": [pattern(["C001-e0001", "C001-e0003"], observed="read twice because the harness should cache")],
        "rejected_candidates": [],
    }
    fake_llm.handler = scripted({"C001": [why, GOOD_C001], "C002": [EMPTY]})
    ctx = make_ctx(tmp_path, model_settings())
    run_stages(ctx)
    c001 = [r for r in fake_llm.requests if cell_of(r) == "C001"]
    assert len(c001) == 2
    assert "names a cause or a remedy (because, should)" in c001[1]["messages"][-1]["content"]


def test_unaddressed_probe_candidate_is_reasked(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.handler = scripted({"C001": [EMPTY, GOOD_C001], "C002": [EMPTY]})
    ctx = make_ctx(tmp_path, model_settings())
    run_stages(ctx)
    c001 = [r for r in fake_llm.requests if cell_of(r) == "C001"]
    assert "C001-H01 are neither confirmed" in c001[1]["messages"][-1]["content"]


def test_outcomes_never_reach_a_luna_request(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.handler = scripted({"C001": [GOOD_C001], "C002": [EMPTY]})
    ctx = make_ctx(tmp_path, model_settings())
    con = duckdb.connect(str(ctx.ir_path))
    con.execute('UPDATE outcomes SET quality = 0.123456, extra = \'{"judge":"blind-judge-verdict-xyz"}\'')
    con.close()
    run_stages(ctx)
    first = [json.dumps(r, ensure_ascii=False) for r in fake_llm.requests]
    assert len(first) == 2
    for body in first:
        for needle in ("workflow_failed", "0.123456", "blind-judge-verdict-xyz", "outcome"):
            assert needle not in body

    # Swap the labels and change every number: the requests are byte-identical.
    fake_llm.reset()
    fake_llm.handler = scripted({"C001": [GOOD_C001], "C002": [EMPTY]})
    ctx2 = make_ctx(tmp_path / "second", model_settings())
    con = duckdb.connect(str(ctx2.ir_path))
    con.execute("UPDATE outcomes SET label = CASE label WHEN 'completed' THEN 'workflow_failed' ELSE 'completed' END")
    con.execute("UPDATE outcomes SET quality = 0.99, completion = 1.0, cost = 7.0")
    con.close()
    run_stages(ctx2)
    second = [json.dumps(r, ensure_ascii=False) for r in fake_llm.requests]
    assert sorted(first) == sorted(second)


def test_big_cell_is_split_by_segment_and_merged(
    tmp_path: Path,
    fake_llm: FakeOpenAI,
    model_settings: Callable[..., ModelSettings],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events = padded("plan", "design")
    events += [call("read_file", "src/a.py", stage="review", actor="reviewer"), msg("look", actor="reviewer")]
    events += [call("read_file", "src/a.py", stage="review", actor="reviewer")]
    events += padded("wrap", "finalization")
    monkeypatch.setenv(CONTEXT_ENV, "400")  # ~1600 chars per part
    review = {
        "patterns": [pattern(["C001-e0006", "C001-e0008"], concerns="target:read_file:src/a.py")],
        "rejected_candidates": [],
    }
    answers: dict[str, list[dict[str, Any]]] = {}
    ctx = make_ctx(tmp_path, model_settings(), {"C001": events})

    def handle(request: dict[str, Any]) -> Reply:
        name = cell_of(request)
        text = request["messages"][-1]["content"]
        data = review if "C001-e0006" in text and "C001-H01" in text else EMPTY
        answers.setdefault(name, []).append(data)
        return Reply(body=completion_body(request, tool_arguments=json.dumps(data)))

    fake_llm.handler = handle
    summary = run_stages(ctx)
    assert len(answers) >= 3 and all(".part" in n for n in answers)
    shown = "\n".join(r["messages"][-1]["content"] for r in fake_llm.requests)
    for seq in range(len(events)):
        assert f"C001-e{seq:04d} " in shown  # every event went to some part: nothing truncated away
    [(status, parts, reason)] = table(ctx, "SELECT status, parts, reason FROM luna_cells")
    assert status == "split" and parts == len(answers)
    assert "split by segment" in reason
    pats = read_patterns(ctx)
    assert [p["evidence"] for p in pats] == [["C001-e0006", "C001-e0008"]]
    assert "1 split (C001)" in summary


def test_probe_overrules_a_rejection_that_claims_a_change(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    reject = {
        "patterns": [],
        "none_reason": "the only candidate is rejected below",
        "rejected_candidates": [
            {"candidate": "C001-H01", "observation": "the file was edited between the reads", "state_changed": True}
        ],
    }
    fake_llm.handler = scripted({"C001": [reject], "C002": [EMPTY]})
    ctx = make_ctx(tmp_path, model_settings())
    summary = run_stages(ctx)
    [p] = read_patterns(ctx)
    assert p["origin"] == "probe" and p["overruled"] and not p["state_changed"]
    assert p["evidence"] == ["C001-e0001", "C001-e0003"]
    conflicts = table(ctx, "SELECT hit_id, pattern_id, kind FROM probe_conflicts")
    assert conflicts == [("C001-H01", "C001-P01", "rejection_claims_change")]
    assert table(ctx, "SELECT verdict FROM probe_verdicts") == [("overruled",)]
    assert "1 model claims overruled by probes" in summary


def test_probe_overrules_a_pattern_claiming_a_change(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    claim = pattern(
        ["C001-e0001", "C001-e0003"],
        type="zero_information_gain",
        state_changed=True,
        observed="the second read of src/a.py came after the controller state changed",
    )
    fake_llm.handler = scripted({"C001": [{"patterns": [claim], "rejected_candidates": []}], "C002": [EMPTY]})
    ctx = make_ctx(tmp_path, model_settings())
    run_stages(ctx)
    [p] = read_patterns(ctx)
    assert p["origin"] == "luna" and p["overruled"] and p["state_changed"] is False
    assert table(ctx, "SELECT kind FROM probe_conflicts") == [("pattern_claims_change",)]


def test_a_rejection_without_a_change_claim_stands(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    reject = {
        "patterns": [],
        "none_reason": "the only candidate is rejected below",
        "rejected_candidates": [
            {
                "candidate": "C001-H01",
                "observation": "the second read was asked for by the operator",
                "state_changed": False,
            }
        ],
    }
    fake_llm.handler = scripted({"C001": [reject], "C002": [EMPTY]})
    ctx = make_ctx(tmp_path, model_settings())
    run_stages(ctx)
    assert read_patterns(ctx) == []
    assert table(ctx, "SELECT verdict FROM probe_verdicts") == [("rejected",)]
    assert table(ctx, "SELECT count(*) FROM probe_conflicts") == [(0,)]


def test_a_cell_without_events_is_covered_without_a_call(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.handler = scripted({"C001": [GOOD_C001]})
    ctx = make_ctx(tmp_path, model_settings(), {"C001": CELLS["C001"], "C003": []})
    run_stages(ctx)
    assert {cell_of(r) for r in fake_llm.requests} == {"C001"}
    rows = table(ctx, "SELECT cell_id, status, patterns, reason FROM luna_cells ORDER BY 1")
    assert rows[1][:3] == ("C003", "ok", 0) and "no events" in rows[1][3]


def test_a_split_cell_resumed_after_one_part_failed_asks_only_that_part(
    tmp_path: Path,
    fake_llm: FakeOpenAI,
    model_settings: Callable[..., ModelSettings],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events = padded("plan", "design")
    events += padded("wrap", "finalization")
    monkeypatch.setenv(CONTEXT_ENV, "400")
    ctx = make_ctx(tmp_path, model_settings(), {"C001": events})
    invented = {"patterns": [pattern(["C001-e9998", "C001-e9999"], candidates=[])], "rejected_candidates": []}
    broken = {"value": "C001.part2of"}  # the first run: every answer to part 2 cites invented events

    def handle(request: dict[str, Any]) -> Reply:
        data = invented if cell_of(request).startswith(broken["value"]) else EMPTY
        return Reply(body=completion_body(request, tool_arguments=json.dumps(data)))

    fake_llm.handler = handle
    run_stages(ctx)
    [(status, parts, reason)] = table(ctx, "SELECT status, parts, reason FROM luna_cells")
    assert status == "failed" and parts >= 3 and f"part 2/{parts}" in reason
    asked_first = {cell_of(r) for r in fake_llm.requests}
    assert len(asked_first) == parts  # every part was asked once at least

    fake_llm.reset()
    broken["value"] = "nothing"  # the server is fixed; the resume asks part 2 only
    fake_llm.handler = handle
    luna_stage(ctx)
    assert {cell_of(r) for r in fake_llm.requests} == {f"C001.part2of{parts}"}
    [(status, _parts, _reason)] = table(ctx, "SELECT status, parts, reason FROM luna_cells")
    assert status == "split"
