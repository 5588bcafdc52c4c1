"""Sol's evidence index reads cited events from the IR on demand: same answers as holding every event."""

from __future__ import annotations

from pathlib import Path

from pipeline.core import duck
from pipeline.sol.checks import EvidenceIndex, load_index


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
