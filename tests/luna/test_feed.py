"""Luna's cells loaded a chunk at a time (pipeline.luna.feed): the same cells as one whole load, bounded loads."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from pipeline.core import duck
from pipeline.luna.feed import CellFeed, Prepared, prepare


def _view(p: Prepared) -> tuple[object, ...]:
    cell, parts, size = p
    return (cell.cell_id, size, [(x.text, sorted(x.shown_ids), [h.hit_id for h in x.candidates]) for x in parts])


def test_chunks_give_every_cell_as_one_whole_load_does(demo_gate1: Path, tmp_path: Path) -> None:
    ir = tmp_path / "ir.duckdb"
    shutil.copy(demo_gate1 / "ir.duckdb", ir)
    con = duck.connect(ir)
    try:
        whole = {p[0].cell_id: _view(p) for p in prepare(con, 2_000)}  # a small budget: some cells split
    finally:
        con.close()
    ids = sorted(whole)
    assert len(ids) == 24 and any(len(v[2]) > 1 for v in whole.values())
    feed = CellFeed(ir, ids, 2_000, chunk=5)

    async def take_all() -> list[Prepared]:
        return await asyncio.gather(*[feed.take(c) for c in ids])  # concurrent, as Luna's calls are

    got = asyncio.run(take_all())
    assert {p[0].cell_id: _view(p) for p in got} == whole
    assert feed.loads == 5  # ceil(24 / 5): each chunk read once
    assert not feed._ready  # every cell handed out, nothing kept
