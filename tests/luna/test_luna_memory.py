"""Luna's memory does not grow with the batch: each cell's result is written as it finishes, not held.

Through the local OpenAI-compatible server: every cell answers with a bulky pattern (~10 KB of text),
so a stage that kept each cell's result (merged patterns, cache row) until its end grows by more
than twice that per cell. tracemalloc's memory in use is read as each cell is handed over; from the
first quarter of the cells to the last, it may grow by far less than one result per cell.
"""

from __future__ import annotations

import asyncio
import gc
import json
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.settings import ModelSettings
from pipeline.luna import feed, outputs
from pipeline.models import progress
from pipeline.testing.openai_server import FakeOpenAI, Reply, completion_body
from tests.luna.test_luna import CELLS, cell_of, make_ctx, pattern, run_stages, table

BULK = 10_000  # characters of a pattern's observation: what holding a cell's result would cost, at least


def bulky_text(cell: str) -> str:
    return f"{cell}: src/a.py was read twice with the same arguments and nothing in between; " + "x" * BULK


def bulky(request: dict[str, Any]) -> Reply:
    cell = cell_of(request)
    evidence = [f"{cell}-e0001", f"{cell}-e0003"]
    answer = {"patterns": [pattern(evidence, candidates=[f"{cell}-H01"], observed=bulky_text(cell))],
              "rejected_candidates": []}  # fmt: skip
    return Reply(body=completion_body(request, tool_arguments=json.dumps(answer)))


def test_luna_memory_stays_flat_while_cells_finish(
    tmp_path: Path,
    fake_llm: FakeOpenAI,
    model_settings: Callable[..., ModelSettings],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    n, every = 48, 2
    cells = {f"C{i:03d}": CELLS["C001"] for i in range(1, n + 1)}
    monkeypatch.setattr(feed, "LOAD_CELLS", 4)  # cells loaded a few at a time, as at 10,000 cells
    monkeypatch.setattr(outputs, "FLUSH_CELLS", 4)  # staged a few at a time
    in_use: list[int] = []  # every 2nd cell from the 4th on: memory in use after it was handed over
    added = [0]
    real_add = outputs.LunaOutputs.add

    def add(self: outputs.LunaOutputs, *args: Any, **kw: Any) -> None:
        real_add(self, *args, **kw)
        added[0] += 1
        if added[0] % every:
            return
        with fake_llm.lock:  # the test server keeps every request it served: not the stage's memory
            fake_llm.requests.clear()
            fake_llm.headers.clear()
        gc.collect()  # what is still referenced, not garbage a later collection frees
        if not tracemalloc.is_tracing() and added[0] >= 4:  # the imports and the first calls' setup are done
            tracemalloc.start()
        if tracemalloc.is_tracing():
            in_use.append(tracemalloc.get_traced_memory()[0])

    monkeypatch.setattr(outputs.LunaOutputs, "add", add)
    fake_llm.handler = bulky
    ctx = make_ctx(tmp_path, model_settings(), cells)
    try:
        summary = run_stages(ctx)
    finally:
        tracemalloc.stop()

    assert summary == f"{n} patterns from {n}/{n} cells"
    assert table(ctx, "SELECT count(*), min(length(observed)) FROM patterns") == [(n, len(bulky_text("C001")))]
    third = len(in_use) // 3
    first, last = in_use[1 : 1 + third], in_use[-third:]  # in_use[0] is 0: tracing started there
    grown = sum(last) / len(last) - sum(first) / len(first)
    cells_between = (len(in_use) - third) * every  # from the first third's middle to the last third's
    # held results add > 2 x BULK bytes a cell (the pattern, its JSON line, its cache row): here > 600 KB;
    # what a cell still leaves is small and of fixed size (its answer file's record, its request key)
    assert grown < cells_between * BULK // 2, f"{grown:,.0f} bytes more over {cells_between} cells"


async def test_bounded_gather_makes_each_call_only_when_a_slot_is_free() -> None:
    # A batch of 100,000 cells must not hold 100,000 coroutines and tasks: with a generator and its
    # total, a call is made only when one of the ``limit`` workers takes it.
    made = finished = 0
    ahead: list[int] = []

    async def job(i: int) -> int:
        nonlocal finished
        await asyncio.sleep(0)
        finished += 1
        return i

    def calls() -> Any:
        nonlocal made
        for i in range(50):
            made += 1
            ahead.append(made - finished)
            yield job(i)

    assert await progress.gather_bounded(calls(), 3, total=50, progress=False) == list(range(50))
    assert max(ahead) <= 3 and made == 50
    assert await progress.gather_bounded((job(i) for i in range(5)), 2, total=5, keep=False, progress=False) == []


def test_patterns_are_sorted_a_range_of_ids_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # The stage's end sorts the staged patterns a range of ids at a time (the whole sort took DuckDB's
    # limit at 100,000 cells): the ranges cover every id once, in order, whatever the number of ids.
    import duckdb

    con = duckdb.connect()
    ids = [f"C{c:03d}-p{p}" for c in range(7) for p in (1, 2, 10)]  # "p10" sorts before "p2"
    con.execute(f"CREATE TABLE {outputs._STAGED}patterns (pattern_id VARCHAR)")
    con.executemany(f"INSERT INTO {outputs._STAGED}patterns VALUES (?)", [[i] for i in reversed(ids)])
    for size in (1, 2, 3, len(ids) - 1, len(ids), len(ids) + 1):
        seen: list[str] = []
        for where, params in outputs._id_ranges(con, "patterns", "pattern_id", size):
            seen += [r[0] for r in con.execute(
                f"SELECT pattern_id FROM {outputs._STAGED}patterns WHERE {where} ORDER BY pattern_id", params
            ).fetchall()]  # fmt: skip
        assert seen == sorted(ids), size


def test_ranged_outputs_are_the_whole_sorts_bytes(
    tmp_path: Path,
    fake_llm: FakeOpenAI,
    model_settings: Callable[..., ModelSettings],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # patterns.jsonl and the patterns table, made one range of two ids at a time, are those of one sort.
    cells = {f"C{i:03d}": CELLS["C001"] for i in range(1, 13)}
    fake_llm.handler = bulky
    made: dict[int, tuple[bytes, list[tuple[Any, ...]]]] = {}
    for size in (2, 1_000_000):
        monkeypatch.setattr(outputs, "RANGE_ROWS", size)
        monkeypatch.setattr(outputs, "RANGE_CELLS", size)
        ctx = make_ctx(tmp_path / str(size), model_settings(), cells)
        run_stages(ctx)
        made[size] = ((ctx.run_dir / "patterns.jsonl").read_bytes(), table(ctx, "SELECT * FROM patterns"))
    assert made[2] == made[1_000_000] and len(made[2][1]) == 12
