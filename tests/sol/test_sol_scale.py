"""Sol at 10x the demo: a 300-cell synthetic batch, a small declared context, map/reduce through the local server.

The model is a scripted handler of the local OpenAI-compatible server that answers from the prompt's
content (deterministic): a map call drafts one weakness from the planted pattern group when its
partition shows failed cells of it; the reduce call merges every draft of that group into one
weakness and cites the first batch-wide counter-evidence sample it is shown. What is tested is the
plumbing around the model: every request fits, partitions and drafts, batch-wide counter-evidence,
the merged support and the plan. A context error is tested through the CLI: no retry, exit 3, and
an unblock naming ``--context-tokens``.
"""

from __future__ import annotations

import importlib
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from pipeline.bundle.synth import write_bundle
from pipeline.cli.app import app
from pipeline.coordinator.groups import run_coordinator
from pipeline.core.canonical import read_json
from pipeline.core.context import RunContext, RunOptions
from pipeline.ir.digests import fill_sql
from pipeline.ir.export import export
from pipeline.ir.refs import read_refs
from pipeline.models import read_calls
from pipeline.models.budget import request_tokens as request_tokens_of
from pipeline.models.budget import role_budget
from pipeline.sol import timeline as timeline_module
from pipeline.sol.cards import SolCall
from pipeline.sol.corpus import group_id, load_batch
from pipeline.sol.partition import Renderer, fitted_map_context
from pipeline.sol.plan import maps_digest, plan_maps, plan_sol
from pipeline.sol.reuse import CPT_STEADY, PlanInputs
from pipeline.sol.shortlist import SHORTLIST_FILE, Shortlist, read_shortlist
from pipeline.sol.stage import MAP_ROLE, mine, single_context
from pipeline.sol.timeline import read_timelines, timeline_sql
from pipeline.sol.timeline_cache import TABLE as TIMELINE_TABLE
from pipeline.testing.openai_server import FakeOpenAI, Reply, completion_body, request_tokens
from pipeline.testing.planted import PLANTED, write_patterns
from tests.sol.sol_helpers import make_bundle

CELLS = 300
CONTEXT = 20_000  # tokens: the whole batch is ~4x that, so Sol must map/reduce
FAILED_A, FAILED_B = "C005", "C250"  # planted in two task families (two partitions)


def _user(request: dict[str, Any]) -> str:
    return next(m["content"] for m in request["messages"] if m["role"] == "user")


def _card(wid: str, cells: list[str], refs: dict[str, str], groups: list[str]) -> dict[str, Any]:
    return {
        "weakness_id": wid,
        "statement": "A review gate obligation is left open when the reviewer finds a blocker upstream.",
        "first_divergence": {
            "where": {"stage": "review", "actor": "reviewer", "what": "the blocker is reported, the gate stays open"},
            "cells": cells[:1],
            "event_refs": [refs[cells[0]]],
        },
        "harness_attribution": {"attributed": True, "why": "only the controller can move work back upstream"},
        "support": {"cells": cells, "pattern_groups": groups, "event_refs": [refs[c] for c in cells]},
        "alternative_explanations": ["the task itself is ambiguous about the gate"],
        "counter_evidence": {"items": [], "none_reason": "none visible in this partition"},
        "counterfactual_prediction": "runs whose blocker goes back upstream close the gate; if not, this is wrong",
        "confidence": "medium",
    }


OCC = re.compile(
    r"^  (?P<occ>\S+-O\d+) (?P<cell>C\d+) \((?P<task>[^,]+), (?P<outcome>[^)]+)\) · patterns .* · "
    r"events (?P<ev>C\d+-e\d+)"
)


def map_answer(text: str) -> dict[str, Any]:
    """Draft the planted weakness when this partition shows failed cells of the planted group."""
    lines = text.splitlines()
    out: list[dict[str, Any]] = []
    for i, line in enumerate(lines):
        if f"concerns={PLANTED!r}" not in line:
            continue
        gid = line.split()[0]
        refs: dict[str, str] = {}
        for occ in lines[i + 1 :]:
            if occ.startswith("    "):
                continue  # the occurrence's evidence: Luna's words and its events' text
            m = OCC.match(occ)
            if not m:
                break
            if m["outcome"] != "completed":
                refs[m["cell"]] = m["ev"]
        if refs:
            out.append(_card("W-01", sorted(refs), refs, [gid]))
    return {"weaknesses": out} if out else {"weaknesses": [], "none_reason": "no failed cell of the planted group here"}


SAMPLE = re.compile(r"^  \S+-O\d+ (?P<cell>C\d+) \([^)]+\): events (?P<ev>C\d+-e\d+)")


def reduce_answer(text: str) -> dict[str, Any]:
    """Merge every draft into W-01 and cite the first batch-wide counter-evidence sample shown."""
    drafts = re.findall(r"^### (M\d+\S*/W-\d+) ", text, re.M)
    if not drafts:
        return {"weaknesses": [], "none_reason": "no draft was shown to this reduce call"}
    sample = next((m for line in text.splitlines() if (m := SAMPLE.match(line))), None)
    assert sample is not None, "the reduce prompt shows no batch-wide counter-evidence sample"
    div = re.search(r"first divergence: .* - cells (C\d+)[^;]*; refs (C\d+-e\d+)", text)
    assert div is not None
    card = _card("W-01", [div[1]], {div[1]: div[2]}, [])
    del card["support"]
    card["merges"] = drafts
    card["counter_evidence"] = {
        "items": [{"cell": sample["cell"], "refs": [sample["ev"]], "note": "same open gate, yet the run completed"}],
        "none_reason": None,
    }
    return {"weaknesses": [card]}


def handler(request: dict[str, Any]) -> Reply:
    text = _user(request)
    # a reduce prompt lists the map calls; a map prompt names its partition ("This call (M01) sees")
    data = reduce_answer(text) if re.search(r"^## Map calls", text, re.M) else map_answer(text)
    return Reply(body=completion_body(request, tool_arguments=json.dumps(data)))


def again_lines(run_dir: Path, cell: str) -> list[tuple[str, str]]:
    """The timeline lines of ``cell`` kept for the next run."""
    con = duckdb.connect(str(run_dir / "ir.duckdb"), read_only=True)
    try:
        sql = f"SELECT details, lines FROM {TIMELINE_TABLE} WHERE cell_id = ?"
        details, lines = con.execute(sql, [cell]).fetchone()
    finally:
        con.close()
    return list(zip(details, lines, strict=True))


def refresh_cell_digest(con: Any, cell: str) -> None:
    """Recompute one cell's stored content digest after its events were edited in place (what the export does)."""
    source = con.execute("SELECT source_digest FROM cell_digests WHERE cell_id = ?", [cell]).fetchone()[0]
    con.execute("DELETE FROM cell_digests WHERE cell_id = ?", [cell])
    con.register("_lunasol_sources", pa.table({"cell_id": [cell], "source_digest": [source]}))
    macros, fill = fill_sql()
    con.execute(macros)
    con.execute(fill, {"lo": cell, "hi": cell})
    con.unregister("_lunasol_sources")


def _outcomes(bundle: Path) -> dict[str, str]:
    rows = [json.loads(x) for x in (bundle / "sidecar" / "outcomes.jsonl").read_text().splitlines()]
    return {r["cell_id"]: r["label"] for r in rows}


def _plant(bundle: Path, ir: Path) -> str:
    """Luna's output, written directly (300 Luna calls would only slow the test): noise plus the planted group."""
    outcomes = _outcomes(bundle)
    success = next(c for c in sorted(outcomes) if outcomes[c] == "completed" and c > "C100" and c < "C200")
    for c in (FAILED_A, FAILED_B):
        outcomes[c] = "workflow_failed"
    con = duckdb.connect(str(ir))
    try:
        for c in (FAILED_A, FAILED_B):
            con.execute("UPDATE outcomes SET label = 'workflow_failed' WHERE cell_id = ?", [c])
        write_patterns(con, lambda cell, _rng: cell in (FAILED_A, FAILED_B, success))
    finally:
        con.close()
    return success


@pytest.fixture(scope="module")
def scaled(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunContext, str]:
    root = tmp_path_factory.mktemp("scale")
    bundle = root / "bundle"
    write_bundle(bundle, cells=CELLS, events_per_cell=16, excluded=2, seed=11, output_chars=40)
    opts = RunOptions(bundle=bundle, run_id="big", runs_dir=root / "runs")
    ctx = RunContext(options=opts, run_dir=root / "runs" / "big", log=lambda _m: None)
    ctx.run_dir.mkdir(parents=True)
    export(bundle, ctx.run_dir)
    success = _plant(bundle, ctx.ir_path)
    run_coordinator(ctx.ir_path, ctx.run_dir)
    return ctx, success


def mine_map_reduce(
    ctx: RunContext, fake_llm: FakeOpenAI, model_settings: Any, context: int
) -> tuple[Shortlist, list[SolCall], list[SolCall]]:
    """Mine ``ctx`` against the local server declaring ``context``; check every request fit and Sol mapped.

    Returns the shortlist, its map calls (at least 3) and its reduce calls (at least 1).
    """
    fake_llm.handler = handler
    fake_llm.context_tokens = context
    ctx.options.models = model_settings(context_tokens=context)
    sl = mine(ctx)
    # every request fit the declared context: the server refused none
    assert fake_llm.refused_for_size == 0 and fake_llm.requests
    assert max(request_tokens(r) for r in fake_llm.requests) <= context
    assert sl.plan is not None and sl.plan.mode == "map_reduce"
    maps = [c for c in sl.plan.calls if c.role == "sol_map"]
    reduces = [c for c in sl.plan.calls if c.role == "sol_reduce"]
    assert len(maps) >= 3 and reduces
    return sl, maps, reduces


def test_300_cells_map_reduce_under_a_small_context(
    scaled: tuple[RunContext, str], fake_llm: FakeOpenAI, model_settings: Any
) -> None:
    ctx, success = scaled
    sl, maps, reduces = mine_map_reduce(ctx, fake_llm, model_settings, CONTEXT)
    assert len(reduces) == 1
    # which call saw which cells: the map partitions cover the denominator exactly once
    seen = [c for m in maps for c in m.cells]
    assert sorted(seen) == sl.denominator.cells and len(sl.denominator.cells) == CELLS
    part = {c: m.call_id for m in maps for c in m.cells}
    assert part[FAILED_A] != part[FAILED_B] != part[success] != part[FAILED_A]
    # the weakness seen in two partitions is found once, with the support of both
    assert [w.weakness_id for w in sl.weaknesses] == ["W-01"]
    w = sl.weaknesses[0]
    assert {FAILED_A, FAILED_B} <= set(w.support.cells)
    assert sorted(reduces[0].inputs) == sorted(d for m in maps for d in m.outputs) and len(reduces[0].inputs) >= 2
    # counter-evidence from a successful cell of another partition, found by the batch-wide query
    cited = [i.cell for i in w.counter_evidence.items]
    assert cited == [success]
    assert part[success] not in {part[c] for c in w.support.cells}
    # every ref of the shortlist resolves to the frozen bytes
    refs = [
        *w.support.event_refs,
        *w.first_divergence.event_refs,
        *(r for i in w.counter_evidence.items for r in i.refs),
    ]
    con = duckdb.connect(str(ctx.ir_path), read_only=True)
    try:
        spans = dict(
            (r[0], f"{r[1]}#L{r[2]}-L{r[3]}")
            for r in con.execute("SELECT event_id, source_path, line_start, line_end FROM events").fetchall()
        )
    finally:
        con.close()
    resolved = read_refs(ctx.run_dir, [spans[r] for r in refs])
    assert len(resolved) == len(set(spans[r] for r in refs))
    assert read_shortlist(ctx.run_dir / SHORTLIST_FILE).digest == sl.digest
    assert {c["role"] for c in read_calls(ctx.run_dir)} == {"sol_map", "sol_reduce"}


def test_a_context_error_is_not_retried_and_names_the_budget_flag(
    tmp_path: Path, fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = make_bundle(tmp_path)

    def answer(request: dict[str, Any]) -> Reply:
        sol = request["tools"][0]["function"]["name"] == "SolAnswer"
        data = (
            {"weaknesses": [], "none_reason": "nothing in these cells is a harness weakness"}
            if sol
            else {"patterns": [], "rejected_candidates": [], "none_reason": "no step repeats on unchanged state"}
        )
        return Reply(body=completion_body(request, tool_arguments=json.dumps(data)))

    fake_llm.handler = answer
    fake_llm.context_tokens = 2_800  # Luna's small cells fit (~2,480 tokens); Sol's batch request (~3,140) not
    monkeypatch.delenv("LUNASOL_CONTEXT_TOKENS", raising=False)
    runs = tmp_path / "runs"
    args = ["run", str(bundle), "--runs-dir", str(runs), "--run-id", "r1", "--model", "openai/test-model"]
    result = CliRunner().invoke(app, [*args, "--api-base", fake_llm.base_url, "--mode", "tools"])
    assert result.exit_code == 3, result.output
    sol = [r for r in fake_llm.requests if re.search(r"^Analysis run \S+; harness\(es\)", _user(r), re.M)]
    assert len(sol) == 1 and fake_llm.refused_for_size == 1  # refused once, never retried
    receipt = read_json(runs / "r1" / "block-receipt.json")
    unblock = receipt["requested_unblock"]
    assert "--context-tokens" in unblock and "--context-tokens 2800" in unblock
    assert unblock.startswith("lunasol run ") and unblock.count("--context-tokens") == 1
    assert "--context-tokens" in result.output
    calls = [c for c in read_calls(runs / "r1") if c["role"] == "sol"]
    assert calls[-1]["outcome"] == "context_exceeded" and calls[-1]["transport_retries"] == 0


def _limits(ctx: RunContext) -> str:
    return role_budget(ctx.options.models, MAP_ROLE).limits.describe()


def _map_ids(fake_llm: FakeOpenAI) -> list[str]:
    """The partitions (M01, ...) whose map request reached the server, in order."""
    out = []
    for r in fake_llm.requests:
        m = re.search(r"^This call \((M\d+)\) sees", _user(r), re.M)
        if m:
            out.append(m[1])
    return out


def test_a_rerun_asks_again_only_the_map_calls_whose_partition_changed(
    scaled: tuple[RunContext, str],
    fake_llm: FakeOpenAI,
    model_settings: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counted: list[str] = []  # map requests counted with the tokenizer, by partition

    def spy(budget: Any, messages: list[dict[str, Any]], response_model: Any, **kw: Any) -> int:
        m = re.search(r"^This call \((M\d+)\) sees", str(messages[-1]["content"]), re.M)
        if m and m[1] != "M00":  # a partition's request, not the empty one that measures the fixed part
            counted.append(m[1])
        return request_tokens_of(budget, messages, response_model, **kw)

    # the module, not pipeline.sol's ``plan`` function of the same name
    plan_module = sys.modules[plan_maps.__module__]
    monkeypatch.setattr(plan_module, "request_tokens", spy)
    rendered: list[str] = []  # map contexts made (a partition whose inputs are the last plan's is not made again)

    def render_spy(renderer: Any, chunk: Any, room_chars: int) -> dict[str, Any]:
        rendered.append(chunk.call_id)
        return fitted_map_context(renderer, chunk, room_chars)

    monkeypatch.setattr(plan_module, "fitted_map_context", render_spy)
    read: list[str] = []  # which cells' timelines were read from the IR (the rest came from the last run)

    iter_timelines = timeline_module.iter_timelines

    def read_spy(con: Any, where_cells: str = "TRUE") -> Any:
        read.append(where_cells)
        return iter_timelines(con, where_cells)

    monkeypatch.setattr(timeline_module, "iter_timelines", read_spy)
    base, _ = scaled
    run_dir = tmp_path / "big"
    run_dir.mkdir()
    for name in ("ir.duckdb", "run.json", "pattern-groups.json"):
        shutil.copy2(base.run_dir / name, run_dir / name)
    con = duckdb.connect(str(run_dir / "ir.duckdb"))
    try:
        con.execute(f"DROP TABLE IF EXISTS {TIMELINE_TABLE}")  # the base run's Sol made them: a first run here
    finally:
        con.close()
    ctx = RunContext(options=base.options, run_dir=run_dir, log=lambda _m: None)
    fake_llm.handler = handler
    fake_llm.context_tokens = CONTEXT
    ctx.options.models = model_settings(context_tokens=CONTEXT)

    first = mine(ctx)
    assert first.plan is not None
    maps = [c for c in first.plan.calls if c.role == "sol_map"]
    assert len(maps) >= 3 and not any(c.reused for c in first.plan.calls)
    assert read == ["TRUE"] and len(again_lines(run_dir, maps[0].cells[0])) > 0  # kept in the run's IR
    assert sorted(_map_ids(fake_llm)) == sorted(c.call_id for c in maps)

    assert set(counted) >= {c.call_id for c in maps}
    # nothing changed: every map answer is taken again and the reduce's answer, the same request, is served from
    # the run's exchanges (never bought twice); no map request is counted again
    assert sorted(set(rendered)) == sorted(c.call_id for c in maps)
    fake_llm.requests.clear()
    counted.clear()
    read.clear()
    rendered.clear()
    again = mine(ctx)
    assert counted == [] and read == []  # every timeline from the last run: no cell changed
    assert rendered == []  # every partition's inputs are the last plan's: no map context is made again
    assert [c.request_tokens for c in again.plan.calls if c.role == "sol_map"] == [c.request_tokens for c in maps]
    assert again.plan is not None and _map_ids(fake_llm) == []
    assert [c.reused for c in again.plan.calls if c.role == "sol_map"] == [True] * len(maps)
    assert len(fake_llm.requests) == 0  # the reduce call's answer is already held
    assert again.weaknesses == first.weaknesses
    # reused map answers are call metadata: gate 1's digest is the first run's (as after a kill in the reduce)
    assert again.content_digest() == first.content_digest()
    for old, new in zip(maps, again.plan.calls, strict=False):
        assert (new.call_id, new.cells, new.outputs, new.key) == (old.call_id, old.cells, old.outputs, old.key)

    # one cell's timeline changes (same length, so the partitions keep their cells): its map call alone is asked
    part = {c: m.call_id for m in maps for c in m.cells}
    changed = FAILED_B
    before = again_lines(run_dir, changed)
    con = duckdb.connect(str(ctx.ir_path))
    try:
        n = con.execute(
            # 'o' -> 'O': every line keeps its length, digests (lower-case hex) stay digests
            "UPDATE events SET text = replace(text, 'o', 'O') WHERE cell_id = ? AND text LIKE '%o%' "
            f"AND event_id IN (SELECT event_id FROM ({timeline_sql()}) WHERE cell_id = ?)",
            [changed, changed],
        ).fetchall()
        refresh_cell_digest(con, changed)  # as the export of a changed cell leaves the IR
    finally:
        con.close()
    assert n and n[0][0] > 0
    fake_llm.requests.clear()
    counted.clear()
    read.clear()
    rendered.clear()
    third = mine(ctx)
    assert third.plan is not None
    assert read == [f"e.cell_id IN ('{changed}')"]  # the changed cell's timeline alone is read again
    con = duckdb.connect(str(ctx.ir_path), read_only=True)
    try:
        now = read_timelines(con)[changed]
    finally:
        con.close()
    assert again_lines(run_dir, changed) == now != before  # the store learned the changed lines
    # a cell too large for one request is read in several (whole groups each): every map call holding the changed
    # cell is asked again, no other (planning may count another request again while it sizes the split cell; that
    # request's key is unchanged, so its stored answer is taken: asserted below through `reused`)
    holding = sorted(m.call_id for m in maps if changed in m.cells)
    assert part[changed] in holding
    assert sorted(_map_ids(fake_llm)) == holding and part[changed] in counted
    assert {c.call_id for c in third.plan.calls if c.role == "sol_map" and not c.reused} == set(holding)
    # only the partitions that show the changed cell are rendered again (a group header counts cells, not their
    # logs: the others' inputs are unchanged); what the others took from the last plan is what rendering gives
    assert set(rendered) == set(holding)
    batch = load_batch(run_dir, ctx.ir_path)
    taken = plan_sol(batch, ctx.options.models, single_context(batch), prior=PlanInputs(run_dir, _limits(ctx)))
    fresh = plan_sol(batch, ctx.options.models, single_context(batch))
    assert sum(m.lazy for m in taken.maps) == len(maps) and maps_digest(taken.maps) == maps_digest(fresh.maps)
    assert [(m.chunk.call_id, m.tokens, m.request_digest) for m in taken.maps] == [
        (m.chunk.call_id, m.tokens, m.request_digest) for m in fresh.maps
    ]
    asked = next(_user(r) for r in fake_llm.requests if f"This call ({part[changed]})" in _user(r))
    assert changed in asked
    # the partitions, which call saw which cells, are recorded as before
    assert [(c.call_id, c.cells) for c in third.plan.calls if c.role == "sol_map"] == [
        (c.call_id, c.cells) for c in maps
    ]
    assert [w.weakness_id for w in third.weaknesses] == ["W-01"]

    # a stored map answer that no longer passes today's checks is never taken: the call is made again, and the
    # provider's own answer, still held in the run's exchanges (and passing), is served without a request
    other = next(c.call_id for c in maps if c.call_id != part[changed] and c.outputs)
    path = run_dir / "sol_map" / f"{other}.json"
    stored = read_json(path)
    stored["value"]["answer"]["weaknesses"][0]["support"]["event_refs"] = ["C999-e9999"]
    path.write_text(json.dumps(stored), encoding="utf-8")
    fake_llm.requests.clear()
    fourth = mine(ctx)
    assert fourth.plan is not None and _map_ids(fake_llm) == []
    assert "C999-e9999" not in path.read_text(encoding="utf-8")  # the edited answer was replaced, not taken
    assert [c.reused for c in fourth.plan.calls if c.call_id == other] == [False]
    assert read_shortlist(run_dir / SHORTLIST_FILE).digest == fourth.digest
    # without the held answer (exchanges/ removed) the call is bought again
    shutil.rmtree(run_dir / "exchanges")
    stored["value"]["answer"]["weaknesses"][0]["support"]["event_refs"] = ["C999-e9999"]
    path.write_text(json.dumps(stored), encoding="utf-8")
    fifth = mine(ctx)
    assert fifth.plan is not None and _map_ids(fake_llm) == [other]


def test_a_partition_is_made_again_when_what_it_shows_changed_and_only_then(
    scaled: tuple[RunContext, str], model_settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A changed group header re-renders the partitions showing the group; a changed outcome every partition.

    Whatever is taken from the last plan has the digest rendering gives today (the plan without it).
    """
    rates: list[float] = []  # characters per token, from a sample of the whole-batch prompt that edits move
    measure = sys.modules[plan_maps.__module__].chars_per_token

    def spy(limits: Any, sample: str) -> float:
        rates.append(measure(limits, sample))
        return rates[-1]

    monkeypatch.setattr(sys.modules[plan_maps.__module__], "chars_per_token", spy)
    base, _ = scaled
    run_dir = tmp_path / "plan"
    run_dir.mkdir()
    for name in ("ir.duckdb", "run.json", "pattern-groups.json"):
        shutil.copy2(base.run_dir / name, run_dir / name)
    settings = model_settings(context_tokens=CONTEXT)
    limits = role_budget(settings, MAP_ROLE).limits.describe()

    def plan(change: Any = None, prior: bool = True) -> Any:
        batch = load_batch(run_dir, run_dir / "ir.duckdb")
        if change is not None:  # before anything reads the batch
            change(batch)
        inputs = PlanInputs(run_dir, limits) if prior else None
        decision = plan_sol(batch, settings, single_context(batch), prior=inputs)
        if inputs is not None:
            inputs.save()
        return decision

    first = plan()
    assert first.mode == "map_reduce" and len(first.maps) >= 3 and not any(m.lazy for m in first.maps)
    again = plan()
    assert all(m.lazy for m in again.maps) and maps_digest(again.maps) == maps_digest(first.maps)

    # a group shown by some partitions but not all: its header changes (the Coordinator named it otherwise)
    renderer = Renderer(load_batch(run_dir, run_dir / "ir.duckdb"))
    shows = {
        g: {m.chunk.call_id for m in first.maps if g in renderer.group_ids(m.chunk.cells)} for g in renderer.groups
    }
    gid = min((g for g in shows if 0 < len(shows[g]) < len(first.maps)), key=lambda g: (len(shows[g]), g))

    def rename(batch: Any) -> None:
        next(g for g in batch.groups if group_id(g) == gid)["concerns"] += "-renamed"

    taken = plan(rename)
    # the rename moved the sample's rate by a little: the last plan's rate is kept, so are the partitions' rooms
    assert rates[-1] != rates[0] and abs(rates[-1] - rates[0]) <= CPT_STEADY * rates[0]
    assert taken.chars_per_token == first.chars_per_token
    assert [m.chunk.call_id for m in taken.maps] == [m.chunk.call_id for m in first.maps]  # the same partitions
    assert {m.chunk.call_id for m in taken.maps if not m.lazy} == shows[gid]
    assert [m.canonical_sha for m in taken.maps] != [m.canonical_sha for m in first.maps]
    # what was taken is what rendering gives at that rate
    monkeypatch.setattr(sys.modules[plan_maps.__module__], "chars_per_token", lambda _l, _s: first.chars_per_token)
    fresh = plan(rename, prior=False)
    assert [m.canonical_sha for m in taken.maps] == [m.canonical_sha for m in fresh.maps]

    # an outcome changes the batch-wide counts every request carries: every partition is made again
    def flip(batch: Any) -> None:
        row = next(c for c in batch.cells if c["cell_id"] == FAILED_B)
        row["outcome"] = "completed"

    taken, fresh = plan(flip), plan(flip, prior=False)
    assert not any(m.lazy for m in taken.maps)
    assert [m.canonical_sha for m in taken.maps] == [m.canonical_sha for m in fresh.maps]


def test_the_dry_runs_sol_plan_renders_a_map_request_when_it_is_counted(
    scaled: tuple[RunContext, str], model_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never every map request's context at once: held as a list they were 3.0 GiB at 100,000 cells."""
    # the modules, not the functions pipeline.sol exports under the same names
    sol_plan_module = importlib.import_module("pipeline.sol.plan")
    sol_stage_module = importlib.import_module("pipeline.sol.stage")

    ctx, _ = scaled
    ctx.options.models = model_settings(context_tokens=CONTEXT)
    rendered = [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        rendered[0] += 1
        return fitted_map_context(*args, **kwargs)

    monkeypatch.setattr(sol_plan_module, "fitted_map_context", counted)
    calls = iter(sol_stage_module.plan(ctx))
    first = next(calls)
    assert first.role == MAP_ROLE
    before = rendered[0]  # planning may render each partition to size it; the calls are made after
    second = next(calls)
    assert second.role == MAP_ROLE and rendered[0] == before + 1  # this call's context, made now
    rest = list(calls)
    maps = 2 + sum(1 for c in rest if c.role == MAP_ROLE)
    assert maps >= 3 and rest[-1].role == "sol_reduce" and rendered[0] >= before + maps - 1


def test_the_whole_batchs_group_text_is_counted_only_until_it_is_past_the_decision(
    scaled: tuple[RunContext, str],
) -> None:
    """A lower bound, walked only as far as needed: to its end at 100,000 cells the dedup set held ~300 MiB."""
    ctx, _ = scaled
    batch = load_batch(ctx.run_dir, ctx.ir_path)
    try:
        eligible = [str(c["cell_id"]) for c in batch.eligible]
        full = Renderer(batch).groups_text_chars(eligible)
        lines = [0]
        early = Renderer(batch)
        walked = early._text_lines

        def counted(cells: list[str], whole: bool) -> Any:
            for line in walked(cells, whole):
                lines[0] += 1
                yield line

        early._text_lines = counted  # type: ignore[method-assign]
        part = early.groups_text_chars(eligible, stop_at=full // 10)
        assert full // 10 < part < full // 5  # past the bound, and not much further
        every = sum(1 for _ in Renderer(batch)._text_lines(eligible, True))
        assert lines[0] < every // 4  # the rest of the text was never made
        assert early.groups_text_chars(eligible) == part  # kept: the sample is of the part counted
        sample = early.sample_text(eligible, 2_000)
        assert len(sample) == 2_000
    finally:
        batch.close()


def test_counter_evidence_samples_read_their_details_and_nothing_else(
    scaled: tuple[RunContext, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch-wide occurrence query holds ids only (~270,000 rows at 100,000 cells took ~180 MiB as dicts, the
    reduce's peak); the task and events of the few occurrences shown as samples are read afterwards: they are the
    IR's, and no other occurrence's details are read."""
    from pipeline.sol import reduce as reduce_mod
    from pipeline.sol.cards import WeaknessCard
    from pipeline.sol.reduce import COUNTER_SAMPLES, Draft, draft_blocks

    ctx, success = scaled
    batch = load_batch(ctx.run_dir, ctx.ir_path)
    try:
        gid = next(str(g["group_id"]) for g in batch.groups if g.get("concerns") == PLANTED)
        con = duckdb.connect(str(ctx.ir_path), read_only=True)
        try:
            planted = {
                r[0]: (r[1], r[2], list(r[3]))
                for r in con.execute(
                    "SELECT occurrence_id, cell_id, task_id, events FROM pattern_occurrences WHERE concerns = ?",
                    [PLANTED],
                ).fetchall()
            }
            refs = dict(con.execute("SELECT cell_id, min(event_id) FROM events GROUP BY cell_id").fetchall())
        finally:
            con.close()
        data = _card("W-01", [FAILED_A], refs, [gid])
        task = next(c["task_id"] for c in batch.eligible if c["cell_id"] == FAILED_A)
        counts = {"cells": 1, "tasks": 1, "runs": 1, "pattern_groups": 1}
        data["support"] |= {"tasks": [task], "runs": ["r"], "counts": counts}
        card = WeaknessCard.model_validate(data)
        drafts = [Draft("M01/W-01", "M01", card, [FAILED_A]), Draft("M02/W-01", "M02", card, [success])]
        asked: list[list[str]] = []
        details = reduce_mod._details
        monkeypatch.setattr(reduce_mod, "_details", lambda con, oids: asked.append(oids) or details(con, oids))
        blocks = draft_blocks(batch, drafts)
    finally:
        batch.close()
    shown = {
        m["occ"]: (m["cell"], m["task"], m["ev"])
        for text in blocks.values()
        for m in re.finditer(r"^  (?P<occ>\S+-O\d+) (?P<cell>C\d+) \((?P<task>[^)]+)\): events (?P<ev>.+)$", text, re.M)
    }
    assert success in {cell for cell, _, _ in shown.values()}  # the successful cell of the planted group, sampled
    for oid, (cell, task, events) in shown.items():
        assert planted[oid][:2] == (cell, task) and events == ", ".join(planted[oid][2][:3])
    assert len(asked) == 1 and sorted(asked[0]) == sorted(shown) and len(shown) <= COUNTER_SAMPLES * len(drafts)
