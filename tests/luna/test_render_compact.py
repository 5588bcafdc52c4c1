"""Luna's compact log: a text said once per request and named by event id after that, nothing dropped."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb

from pipeline.luna.render import OWN_KINDS, load_cells, render_cell, split_parts

SAME = re.compile(r"^(\S+) .*?: same text as (\S+)( \(in part (\d+)\))?$")


def test_a_repeated_text_is_named_by_the_event_that_holds_it_and_every_event_keeps_its_line(demo_copy: Path) -> None:
    con = duckdb.connect(str(demo_copy / "ir.duckdb"), read_only=True)
    try:
        cell = load_cells(con, ["C004"])[0]
        kinds = dict(con.execute("SELECT event_id, kind FROM events WHERE cell_id = 'C004'").fetchall())
    finally:
        con.close()
    full = {eid: line for seg in cell.segments for eid, line in zip(seg.event_ids, seg.lines, strict=True)}
    whole = render_cell(cell)
    assert len(whole) < 0.75 * sum(len(line) + 1 for line in full.values())  # re-reads were a third of the log
    parts = split_parts(cell, 3000, 2.0)
    assert len(parts) > 3
    where: dict[str, int] = {}
    named = in_other = 0
    for part in parts:
        lines = [ln for ln in part.text.splitlines() if ln and not ln.startswith("## ")]
        for ln in lines:
            eid = ln.split(" ", 1)[0]
            assert eid not in where, eid  # every event once, in one part
            where[eid] = part.index
            m = SAME.match(ln)
            if m is None:
                assert ln.endswith(full[eid][len(eid) :].split(": ", 1)[1]) or "(same text as" in ln
                continue
            first, other = m[2], m[4]
            assert kinds[eid] not in OWN_KINDS or other is None  # the agent's own words are in every request
            ref_text = full[first].split(": ", 1)[1]
            assert full[eid].split(": ", 1)[1] == ref_text  # the very same text
            if other is None:
                named += 1
                assert full[first] in part.text or any(f"{first} " in x and ref_text in x for x in lines)
            else:
                in_other += 1
                assert where[first] == int(other) != part.index
    assert set(where) == set(full) and named > 0 and in_other > 0
