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

import re
from typing import Any

import duckdb
import pytest

from pipeline.bundle.synth import write_bundle
from pipeline.coordinator.core import run_coordinator
from pipeline.core.context import RunContext, RunOptions
from pipeline.ir.export import export
from pipeline.ir.refs import read_refs
from pipeline.sol.families import TOP_K, bounded_by_task, families_of, task_family
from pipeline.sol.stage import mine
from pipeline.testing.openai_server import FakeOpenAI, request_tokens
from tests.sol.test_sol_scale import FAILED_A, FAILED_B, _plant, _user, handler

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


def test_300_tasks_one_per_cell_map_reduce_at_16k(
    diverse: tuple[RunContext, str], fake_llm: FakeOpenAI, model_settings: Any
) -> None:
    ctx, success = diverse
    fake_llm.handler = handler
    fake_llm.context_tokens = CONTEXT
    ctx.options.models = model_settings(context_tokens=CONTEXT)
    sl = mine(ctx)
    assert fake_llm.refused_for_size == 0 and fake_llm.requests
    assert max(request_tokens(r) for r in fake_llm.requests) <= CONTEXT
    assert sl.plan is not None and sl.plan.mode == "map_reduce"
    maps = [c for c in sl.plan.calls if c.role == "sol_map"]
    reduces = [c for c in sl.plan.calls if c.role == "sol_reduce"]
    assert len(maps) >= 3 and reduces
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
