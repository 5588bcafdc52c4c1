"""Sol reads a partition's occurrences from the run's DuckDB: each partition gets exactly its cells' occurrences."""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.core.canonical import read_json
from pipeline.sol.corpus import load_batch
from pipeline.sol.partition import Chunk, Renderer, map_context, partition

_HEAD = re.compile(r"(?m)^  (\S+) \S+ \(")  # an occurrence's head line in a request's groups text


def _truth(run_dir: Path) -> dict[str, set[tuple[str, str]]]:
    """Cell -> (group, occurrence) of every occurrence, from the Coordinator's document (not Sol's table)."""
    out: dict[str, set[tuple[str, str]]] = {}
    for g in read_json(run_dir / "pattern-groups.json")["groups"]:
        for o in g["occurrences"]:
            out.setdefault(o["cell_id"], set()).add((g["group_id"], o["occurrence_id"]))
    return out


def test_each_partition_reads_every_occurrence_of_its_cells_and_no_other(demo_gate1: Path) -> None:
    truth = _truth(demo_gate1)
    batch = load_batch(demo_gate1, demo_gate1 / "ir.duckdb")
    try:
        renderer = Renderer(batch)
        chunks = partition(renderer, 20_000)
        eligible = sorted(str(c["cell_id"]) for c in batch.eligible)
        assert len(chunks) >= 3 and sorted(c for ch in chunks for c in ch.cells) == eligible
        # cells far apart in the walk (their range of ranks holds every other cell): only theirs are read
        walk = renderer.walk
        apart = Chunk(call_id="M99", tasks=sorted({batch.by_cell[c]["task_id"] for c in walk[::7]}), cells=walk[::7])
        for chunk in [*chunks, apart]:
            read = renderer.occurrences(chunk.cells)
            got = {(g, str(o["occurrence_id"])) for c in chunk.cells for g, o in read.get(c, [])}
            want = {p for c in chunk.cells for p in truth.get(c, ())}
            assert set(read) <= set(chunk.cells) and got == want, chunk.call_id
            assert all(o["cell_id"] == c for c in read for _, o in read[c])
            text = map_context(renderer, chunk, 10_000)["groups_text"]
            assert set(_HEAD.findall(text)) == {oid for _, oid in want}, chunk.call_id  # shown: every one, no other
        # the whole batch's groups, a group at a time: every occurrence of an eligible cell, once
        streamed = {(g, str(o["occurrence_id"])) for g, occ in batch.group_stream() for o in occ}
        assert streamed == {p for c in eligible for p in truth.get(c, ())}
    finally:
        batch.close()
