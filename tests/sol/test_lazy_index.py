"""Sol's evidence index reads cited events from the IR on demand: same answers as holding every event."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline.core import duck
from pipeline.sol.cards import WeaknessDraft
from pipeline.sol.checks import EvidenceIndex, check_answer, load_index
from tests.sol.sol_helpers import draft


def test_lazy_index_resolves_as_an_index_of_every_event(demo_gate1: Path) -> None:
    ir = demo_gate1 / "ir.duckdb"
    lazy = load_index(ir)
    assert lazy.events == {}  # nothing read until a ref is asked about
    con = duck.connect(ir, read_only=True)
    try:
        rows = con.execute("SELECT event_id, cell_id, source_path, line_start, line_end FROM events").fetchall()
    finally:
        con.close()
    eager = EvidenceIndex(cells=lazy.cells, events={r[0]: (r[1], r[2], int(r[3]), int(r[4])) for r in rows})
    sample = rows[::97]
    refs = (
        [r[0] for r in sample] + [f"{r[2]}#L{r[3]}" for r in sample] + [f"{r[2]}#L{r[3]}-L{r[4] + 5}" for r in sample]
    )
    refs += ["C001-e9999", "nowhere.jsonl#L1", f"{rows[0][2]}#L999999", f"{rows[0][2]}#L5-L2", "not a ref"]
    lazy.load(refs[:10])  # a prefetch, then single lookups: both paths agree with the eager index
    assert [lazy.resolve(r) for r in refs] == [eager.resolve(r) for r in refs]
    assert len(lazy.events) < len(rows)  # only the cited events and their files were read


def test_an_answer_is_checked_with_one_ir_query(demo_gate1: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """check_answer reads the events of every card at once (a query costs ~20 ms at any batch size)."""
    ir = demo_gate1 / "ir.duckdb"
    con = duck.connect(ir, read_only=True)
    try:
        rows = con.execute("SELECT event_id, cell_id, source_path, line_start, line_end FROM events").fetchall()
    finally:
        con.close()
    by_cell: dict[str, list[str]] = {}
    for event_id, cell, *_ in rows:
        by_cell.setdefault(cell, []).append(event_id)
    cells = sorted(by_cell)[:4]
    drafts = []
    for i, cell in enumerate(cells[:3]):
        d = draft(weakness_id=f"W-{i + 1:02d}")
        d["support"] = {"cells": [cell], "pattern_groups": [], "event_refs": by_cell[cell][:2]}
        d["first_divergence"] = {**d["first_divergence"], "cells": [cell], "event_refs": by_cell[cell][:1]}
        d["counter_evidence"] = {"items": [{"cell": cells[3], "refs": by_cell[cells[3]][-1:], "note": "done"}]}
        drafts.append(WeaknessDraft.model_validate(d))
    lazy = load_index(ir)
    eager = EvidenceIndex(cells=lazy.cells, events={r[0]: (r[1], r[2], int(r[3]), int(r[4])) for r in rows})
    opened: list[Path] = []
    connect = duck.connect

    def counting(path: Path, **kw: Any) -> Any:
        opened.append(path)
        return connect(path, **kw)

    monkeypatch.setattr(duck, "connect", counting)
    got = check_answer(drafts, lazy)
    assert len(opened) == 1
    assert got == check_answer(drafts, eager)
    assert got[0], "the cards pass: their refs resolved"
