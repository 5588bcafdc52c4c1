"""Sol at task diversity: 300 cells of 300 distinct tasks (one run per task), a 16K context, the local server.

The batch of :mod:`tests.sol.test_sol_scale` with its task ids rewritten to 300 names in 17 families
(``repoK__repoK-I``), as an RL generation or a sweep with one run per task looks. The scripted model
is that test's (it answers from the prompt's content). What is tested: planning succeeds, every
request fits, a map request names only its partition's tasks and a reduce request a bounded few
(batch-wide facts are aggregates), map/reduce converges, the planted weakness whose cells fall in two
partitions is found once, its counter-evidence comes from a partition its cells are not in, and
every ref of the shortlist resolves.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from typing import Any

import duckdb
import pytest

from pipeline.bundle.synth import write_bundle
from pipeline.coordinator.groups import run_coordinator
from pipeline.core.context import RunContext, RunOptions
from pipeline.ir.export import export
from pipeline.ir.refs import read_refs
from pipeline.sol.cards import WeaknessCard
from pipeline.sol.corpus import load_batch
from pipeline.sol.families import TOP_K, TaskCounts, bounded_by_task, families_of, task_family
from pipeline.sol.merge import premerge
from pipeline.sol.reduce import Draft
from pipeline.sol.stage import STALLED_ROUNDS, mine
from pipeline.testing.openai_server import FakeOpenAI, Reply, completion_body, request_tokens
from tests.sol.test_sol_scale import FAILED_A, FAILED_B, OCC, _plant, _user, mine_map_reduce

CELLS = 300
FAMILIES = 17
CONTEXT = 16_000
TASK = re.compile(r"repo\d+__repo\d+-\d+")


def _task(i: int) -> str:
    return f"repo{i % FAMILIES}__repo{i % FAMILIES}-{1000 + i}"


@pytest.fixture(scope="module")
def diverse(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunContext, str]:
    root = tmp_path_factory.mktemp("tasks")
    bundle = root / "bundle"
    write_bundle(bundle, cells=CELLS, events_per_cell=16, excluded=2, seed=11, output_chars=40)
    opts = RunOptions(bundle=bundle, run_id="wide", runs_dir=root / "runs")
    ctx = RunContext(options=opts, run_dir=root / "runs" / "wide", log=lambda _m: None)
    ctx.run_dir.mkdir(parents=True)
    export(bundle, ctx.run_dir)
    success = _plant(bundle, ctx.ir_path)
    con = duckdb.connect(str(ctx.ir_path))
    try:  # one task per cell (cells in id order), in 17 families
        cells = [c for (c,) in con.execute("SELECT cell_id FROM cells ORDER BY cell_id").fetchall()]
        con.executemany("UPDATE cells SET task_id = ? WHERE cell_id = ?", [[_task(i), c] for i, c in enumerate(cells)])
    finally:
        con.close()
    run_coordinator(ctx.ir_path, ctx.run_dir)
    return ctx, success


def test_task_families_come_from_name_structure_or_pattern_groups() -> None:
    assert task_family("django__django-11099") == "django__django"
    assert task_family("task-7") == "task" and task_family("bat") == "bat"
    assert task_family("astropy__astropy-v1.2.3") == "astropy__astropy"
    # names without structure: tasks whose cells share pattern groups form a family
    names = [f"{chr(97 + i)}{chr(98 + i)}x" for i in range(TOP_K + 2)]
    fam = families_of(names, {t: ("G01", "G02") if i % 2 else ("G03",) for i, t in enumerate(names)})
    assert set(fam.values()) == {"groups:G01+G02", "groups:G03"}


def test_a_batch_wide_aggregate_is_bounded_however_many_tasks() -> None:
    few = [{"task_id": f"t-{i}", "outcome": "completed"} for i in range(3)]
    assert bounded_by_task(few) == "t-0: completed 1; t-1: completed 1; t-2: completed 1"
    many = [{"task_id": _task(i), "outcome": "completed" if i % 3 else "workflow_failed"} for i in range(2500)]
    text = bounded_by_task(many)
    assert len(text) < 1500 and not TASK.search(text)  # families with counts, never a task table
    assert "2500 cell(s) of 2500 tasks in 17 famil(ies): completed 1666, workflow_failed 834" in text
    assert "7 more famil(ies)" in text  # the top 10 families named, the rest summarised


def test_counts_aggregated_once_say_what_bounded_by_task_says_of_any_partition() -> None:
    # A map request's group header is made per (partition, group) from counts made once per group:
    # the text must be bounded_by_task's over the group's rows, whatever the partition's tasks.
    import random

    rng = random.Random(7)
    outcomes = ["completed", "workflow_failed", "harness_failed", "no outcome"]
    for n_tasks in (3, TOP_K, 40, 400):
        tasks = [_task(i) for i in range(n_tasks)] + [f"odd{i}" for i in range(n_tasks // 10)]
        rows = [{"task_id": rng.choice(tasks), "outcome": rng.choice(outcomes)} for _ in range(n_tasks * 3)]
        counts = TaskCounts(rows)
        present = sorted({r["task_id"] for r in rows})
        assert counts.bounded() == bounded_by_task(rows)
        assert counts.bounded(3) == bounded_by_task(rows, 3)
        for size in (0, 1, 5, len(present) // 2, len(present)):
            only = set(rng.sample(present, min(size, len(present)))) | {"not-a-task-here"}
            for k in (3, TOP_K):
                assert counts.bounded(k, only) == bounded_by_task(rows, k, only)


def test_a_map_reduce_plan_holds_no_whole_batch_prompt_and_no_map_context(
    diverse: tuple[RunContext, str], model_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Flat memory: when even a lower bound of the single request is far over the budget, the
    # whole-batch context is never made; a planned map call keeps what renders its context, and
    # the context it renders when the call runs is the request that was counted.
    import importlib

    from pipeline.core.canonical import digest
    from pipeline.models import render
    from pipeline.models.budget import role_budget
    from pipeline.sol.cards import SolAnswer
    from pipeline.sol.plan import MAP_ROLE, maps_digest, plan_sol, request_digest

    stage_mod = importlib.import_module("pipeline.sol.stage")  # the package exports a function of that name

    ctx, _ = diverse
    settings = model_settings(context_tokens=CONTEXT)
    batch = load_batch(ctx.run_dir, ctx.ir_path)
    made: list[int] = []
    whole = stage_mod.single_context

    def spy(b: Any) -> dict[str, Any]:
        made.append(1)
        return dict(whole(b))

    monkeypatch.setattr(stage_mod, "single_context", spy)
    decision = plan_sol(batch, settings, lambda: stage_mod.single_context(batch))
    assert decision.mode == "map_reduce" and decision.single_estimated and not made
    assert len(decision.maps) >= 3 and all(m._held is None for m in decision.maps)
    contexts = [m.context for m in decision.maps]
    assert maps_digest(decision.maps) == digest({"maps": [digest(c) for c in contexts]})
    budget = role_budget(settings, MAP_ROLE)
    for m, c in zip(decision.maps, contexts, strict=True):
        assert c["call_id"] == m.chunk.call_id and m.canonical_sha == digest(c)
        messages = render(MAP_ROLE, c, response_model=SolAnswer).messages
        assert request_digest(budget, messages, SolAnswer) == m.request_digest
    # a batch that may fit is planned from its whole context, made once
    small = plan_sol(batch, model_settings(context_tokens=2_000_000), lambda: stage_mod.single_context(batch))
    assert small.mode == "single" and made == [1]


def test_300_tasks_one_per_cell_map_reduce_at_16k(
    diverse: tuple[RunContext, str], fake_llm: FakeOpenAI, model_settings: Any
) -> None:
    ctx, success = diverse
    sl, maps, _reduces = mine_map_reduce(ctx, fake_llm, model_settings, CONTEXT)
    assert sorted(c for m in maps for c in m.cells) == sl.denominator.cells and len(sl.denominator.cells) == CELLS
    # a request names only the tasks of its partition (map) or a bounded few (reduce): no batch-wide task table
    by_call = {m.call_id: set(m.tasks) for m in maps}
    for r in fake_llm.requests:
        text = _user(r)
        named = set(TASK.findall(text))
        m = re.search(r"^This call \((M\d+)\) sees", text, re.M)
        if m:
            assert named <= by_call[m[1]], sorted(named - by_call[m[1]])[:5]
        else:
            assert len(named) <= 3 * TOP_K
    # families: a map partition holds whole families unless one is cut across partitions
    fams = [{task_family(t) for t in m.tasks} for m in maps]
    assert sum(len(f) for f in fams) < len(maps) + FAMILIES
    # the weakness seen in two partitions is found once, with the support of both
    part = {c: m.call_id for m in maps for c in m.cells}
    assert part[FAILED_A] != part[FAILED_B]
    assert [w.weakness_id for w in sl.weaknesses] == ["W-01"]
    w = sl.weaknesses[0]
    assert {FAILED_A, FAILED_B} <= set(w.support.cells)
    # counter-evidence from a successful cell of a partition none of its cells are in
    assert [i.cell for i in w.counter_evidence.items] == [success]
    assert part[success] not in {part[c] for c in w.support.cells}
    # every ref of the shortlist resolves to the frozen bytes
    refs = [
        *w.support.event_refs,
        *w.first_divergence.event_refs,
        *(r for i in w.counter_evidence.items for r in i.refs),
    ]
    con = duckdb.connect(str(ctx.ir_path), read_only=True)
    try:
        spans = {
            r[0]: f"{r[1]}#L{r[2]}-L{r[3]}"
            for r in con.execute("SELECT event_id, source_path, line_start, line_end FROM events").fetchall()
        }
    finally:
        con.close()
    assert all(r in spans for r in refs)
    assert len(read_refs(ctx.run_dir, [spans[r] for r in refs])) == len({spans[r] for r in refs})


FAILED_ROW = re.compile(r"^(C\d+)\|[^|]+\|[^|]+\|(?!completed\|)[^|]+\|", re.M)
DRAFT = re.compile(r"^### (\S+/W-\d+) .*\n.*\nfirst divergence: .* - cells (C\d+)[^;]*; refs (C\d+-e\d+)", re.M)


def _own_card(wid: str, cell: str, ev: str) -> dict[str, Any]:
    """A weakness of one cell whose first divergence is its own (nothing to pre-merge it with)."""
    return {
        "weakness_id": wid,
        "statement": f"In {cell} the controller lets a stage end with its own obligation open.",
        "first_divergence": {
            "where": {"stage": f"stage-{cell}", "actor": "controller", "what": "the stage ends with work open"},
            "cells": [cell],
            "event_refs": [ev],
        },
        "harness_attribution": {"attributed": True, "why": "the controller decides when a stage ends"},
        "support": {"cells": [cell], "pattern_groups": [], "event_refs": [ev]},
        "alternative_explanations": ["the model stopped early on its own"],
        "counter_evidence": {"items": [], "none_reason": "no successful cell shows this stage ending early"},
        "counterfactual_prediction": "a run that keeps the stage open until its work is done succeeds; if not, wrong",
        "confidence": "low",
    }


def _tree_handler(merge: bool) -> Any:
    """Map: one draft per failed cell shown. Reduce: merge every draft shown (``merge``) or keep each apart."""

    def answer(request: dict[str, Any]) -> Reply:
        text = _user(request)
        if re.search(r"^## Map calls", text, re.M):
            drafts = DRAFT.findall(text)
            assert drafts, "a reduce request without drafts"
            if merge:
                card = _own_card("W-01", drafts[0][1], drafts[0][2])
                del card["support"]
                card["merges"] = [d for d, _, _ in drafts]
                data: dict[str, Any] = {"weaknesses": [card]}
            else:
                cards = []
                for i, (did, cell, ev) in enumerate(drafts, 1):
                    card = _own_card(f"W-{i:02d}", cell, ev)
                    del card["support"]
                    card["merges"] = [did]
                    cards.append(card)
                data = {"weaknesses": cards}
        else:
            first = {}
            for line in text.splitlines():
                m = OCC.match(line)
                if m and m["cell"] not in first:
                    first[m["cell"]] = m["ev"]
            failed = [c for c in FAILED_ROW.findall(text) if c in first]
            cards = [_own_card(f"W-{i:02d}", c, first[c]) for i, c in enumerate(failed[:2], 1)]
            data = {"weaknesses": cards} if cards else {"weaknesses": [], "none_reason": "no failed cell shown here"}
        return Reply(body=completion_body(request, tool_arguments=json.dumps(data)))

    return answer


@pytest.mark.parametrize("merge", [True, False])
def test_the_reduce_tree_converges_whether_or_not_the_model_merges(
    diverse: tuple[RunContext, str], fake_llm: FakeOpenAI, model_settings: Any, tmp_path: Any, merge: bool
) -> None:
    base, _ = diverse
    run_dir = tmp_path / "wide"
    run_dir.mkdir()
    for name in ("ir.duckdb", "run.json", "pattern-groups.json"):
        shutil.copy2(base.run_dir / name, run_dir / name)
    ctx = RunContext(options=base.options, run_dir=run_dir, log=lambda _m: None)
    fake_llm.handler = _tree_handler(merge)
    fake_llm.context_tokens = CONTEXT
    ctx.options.models = model_settings(context_tokens=CONTEXT)
    sl = mine(ctx)
    assert fake_llm.refused_for_size == 0
    assert max(request_tokens(r) for r in fake_llm.requests) <= CONTEXT
    assert sl.plan is not None
    maps = [c for c in sl.plan.calls if c.role == "sol_map"]
    reduces = [c for c in sl.plan.calls if c.role == "sol_reduce"]
    drafts = [d for m in maps for d in m.outputs]
    rounds = sorted({c.call_id.split("-")[0] for c in reduces})
    assert len(drafts) > 40 and len(rounds) >= 2  # too many drafts for one reduce request: a tree
    first = [c for c in reduces if c.call_id.startswith("R1-")]
    assert all(len(c.inputs) >= 2 for c in first)  # every request merges: depth ~ log(drafts)
    if merge:
        assert [w.weakness_id for w in sl.weaknesses] == ["W-01"]
        assert len(rounds) <= 1 + math.ceil(math.log2(len(drafts)))
    else:
        # nothing merges however the drafts are packed: the calls judged them distinct, and they all stand
        assert len(sl.weaknesses) == len(drafts) and len(rounds) == STALLED_ROUNDS
        assert len({w.support.cells[0] for w in sl.weaknesses}) == len(drafts)  # each draft's cell, once


def _checked(wid: str, cell: str, ev: str, stage: str, groups: list[str]) -> WeaknessCard:
    card = _own_card(wid, cell, ev)
    card["first_divergence"]["where"]["stage"] = stage
    s = {"cells": [cell], "tasks": [_task(0)], "runs": ["r"], "pattern_groups": groups, "event_refs": [ev]}
    card["support"] = {**s, "counts": {"cells": 1, "tasks": 1, "runs": 1, "pattern_groups": len(groups)}}
    return WeaknessCard.model_validate(card)


def test_drafts_of_the_same_groups_or_the_same_first_divergence_are_merged_before_any_call(
    diverse: tuple[RunContext, str],
) -> None:
    ctx, _ = diverse
    batch = load_batch(ctx.run_dir, ctx.ir_path)
    con = duckdb.connect(str(ctx.ir_path), read_only=True)
    try:  # three cells' events of one kind and detail (the same place to diverge)
        rows = con.execute(
            "SELECT kind, detail, list(event_id ORDER BY event_id) FROM "
            "(SELECT kind, detail, min(event_id) AS event_id FROM events GROUP BY cell_id, kind, detail) "
            "GROUP BY kind, detail HAVING count(*) >= 3 ORDER BY kind, detail LIMIT 1"
        ).fetchall()
    finally:
        con.close()
    ev = rows[0][2][:3]
    cells = [e.split("-")[0] for e in ev]
    drafts = [
        Draft("M01/W-01", "M01", _checked("W-01", cells[0], ev[0], "review", ["G001"]), [cells[0]]),
        Draft("M02/W-01", "M02", _checked("W-01", cells[1], ev[1], "Review", ["G002"]), [cells[1]]),
        Draft("M03/W-01", "M03", _checked("W-01", cells[2], ev[2], "design", ["G003"]), [cells[2]]),
        Draft("M04/W-02", "M04", _checked("W-02", cells[2], ev[2], "other", ["G003"]), [cells[2]]),
    ]
    merged = premerge(batch, drafts)
    # M01 and M02 diverge at the same place (stage compared case-insensitively, same event kind and detail);
    # M03 and M04 cite the same pattern groups
    assert [(d.draft_id, d.absorbed) for d in merged] == [("M01/W-01", ["M02/W-01"]), ("M03/W-01", ["M04/W-02"])]
    first = merged[0]
    assert first.card.support.cells == sorted(cells[:2]) and first.card.support.counts.cells == 2
    assert first.card.support.pattern_groups == ["G001", "G002"] and first.map_calls == ["M01", "M02"]
    assert sorted(first.seen_cells) == sorted(cells[:2])
