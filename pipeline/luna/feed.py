"""Cells for Luna's calls, loaded from the IR a chunk at a time as the calls reach them.

Loading every cell before the first call held the whole batch's events as Python rows and
rendered text at once (1.2 GiB of the 1,000-cell run's peak; ten times that at 10,000 cells).
The calls start in cell order, bounded by the client's concurrency, so the feed loads the next
``LOAD_CELLS`` cells when the first of them is asked for and hands each cell out once: only one
chunk and the calls in flight are in memory, whatever the batch size.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb

from pipeline.core import duck
from pipeline.luna.render import (
    JSON_CHARS_PER_TOKEN,
    CellIR,
    Part,
    context_budget,
    estimate_tokens,
    load_cells,
    render_cell,
    split_parts,
)

LOAD_CELLS = 100  # cells per load: a few times the calls in flight (2 x concurrency), ~0.2 s of DuckDB each

Prepared = tuple[CellIR, list[Part], int]
"""A cell, its parts (split only when over the budget) and its rendered size in tokens."""


def prepare(
    con: duckdb.DuckDBPyConnection,
    budget: int | None = None,
    only: list[str] | None = None,
    chars_per_token: float = JSON_CHARS_PER_TOKEN,
    count: Callable[[str], int] | None = None,
) -> list[Prepared]:
    """Every eligible cell (or those in ``only``) with its parts and its size in tokens.

    ``budget``: tokens per call for the log AND the probe candidates it carries; split only when over it.
    ``count``: the request's token count, to check the parts planned in characters (:func:`split_parts`).
    """
    budget = budget or context_budget()
    return [
        (cell, split_parts(cell, budget, chars_per_token, count), estimate_tokens(render_cell(cell), chars_per_token))
        for cell in load_cells(con, only)
    ]


def prepare_in_chunks(
    con: duckdb.DuckDBPyConnection,
    budget: int,
    ids: list[str],
    chars_per_token: float = JSON_CHARS_PER_TOKEN,
    count: Callable[[str], int] | None = None,
) -> Iterator[Prepared]:
    """:func:`prepare` of ``ids`` in order, ``LOAD_CELLS`` at a time: one chunk of cells in memory, never all."""
    for start in range(0, len(ids), LOAD_CELLS):
        yield from prepare(
            con, budget, only=ids[start : start + LOAD_CELLS], chars_per_token=chars_per_token, count=count
        )


class CellFeed:
    """Hands out each of ``cell_ids`` once (:meth:`take`), loading ``chunk`` cells at a time in the given order."""

    def __init__(
        self,
        ir_path: Path,
        cell_ids: list[str],
        budget: int,
        chunk: int | None = None,
        chars_per_token: float = JSON_CHARS_PER_TOKEN,
        count: Callable[[str], int] | None = None,
    ) -> None:
        self.ir_path = ir_path
        self.count = count
        self.cell_ids = cell_ids
        self.budget = budget
        self.chars_per_token = chars_per_token
        self.chunk = max(1, chunk or LOAD_CELLS)
        self.loads = 0  # how many chunks were read (tests)
        self._pos = {c: i for i, c in enumerate(cell_ids)}
        self._ready: dict[str, Prepared] = {}
        self._lock = asyncio.Lock()

    def _load(self, ids: list[str]) -> list[Prepared]:
        con = duck.connect(self.ir_path)
        try:
            return prepare(con, self.budget, only=ids, chars_per_token=self.chars_per_token, count=self.count)
        finally:
            con.close()

    async def take(self, cell_id: str) -> Prepared:
        """The cell prepared for its calls; a cell not loaded yet brings its whole chunk in (off the event loop)."""
        async with self._lock:  # one load at a time; a call waiting for the same chunk finds it loaded
            if cell_id not in self._ready:
                start = self._pos[cell_id] // self.chunk * self.chunk
                ids = [c for c in self.cell_ids[start : start + self.chunk] if c not in self._ready]
                # DuckDB releases the GIL: calls already in flight go on while the chunk loads
                self.loads += 1
                for item in await asyncio.to_thread(self._load, ids):
                    self._ready[item[0].cell_id] = item
            return self._ready.pop(cell_id)
