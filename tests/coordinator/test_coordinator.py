"""Coordinator SQL on hand-made IRs and patterns: grouping, incident dedup with every ref kept,
negatives from outcomes, and coverage including cells with zero patterns."""

from __future__ import annotations

import json
import random
import shutil
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb
import pytest

from pipeline.coordinator import GROUPS_FILE, incidents, run_coordinator, sql_files
from pipeline.coordinator.incidents import CACHE_TABLE, update_incidents
from pipeline.core.canonical import read_json
from pipeline.luna.stage import TABLES_DDL
from pipeline.probes.synthetic import write_ir

TS = "2026-08-09T11:00:00Z"


def sent_back(line: int) -> dict[str, Any]:
    # One controller incident writing the same line three times (same ts, same content).
    return {
        "kind": "stage",
        "detail": "stage_sent_back",
        "actor": "controller",
        "stage": "review",
        "session_id": None,
        "ts": TS,
        "text": "stage review sent back to reviewer: blocker in design.md",
        "target": "review",
        "source_path": "cells/C003/controller.jsonl",
        "line_start": line,
    }


def msg(text: str = "x") -> dict[str, Any]:
    return {"kind": "message", "text": text}


CELLS = {
    "C001": [msg(), msg(), msg(), msg()],
    "C002": [msg(), msg(), msg()],
    "C003": [msg(), sent_back(7), sent_back(8), sent_back(9), msg()],
    "C004": [msg()],  # no patterns at all
    "C005": [msg()],  # Luna failed on it
}
OUTCOMES = {"C001": "workflow_failed", "C002": "completed", "C003": "workflow_failed", "C004": "completed"}
TASKS = {"C001": "bat", "C002": "prom", "C003": "bat", "C004": "pytest", "C005": "pytest"}


def pat(pid: str, cell: str, typ: str, concerns: str, evidence: list[str]) -> list[Any]:
    return [pid, cell, typ, concerns, "observed", "fits", evidence, "medium", False, [], "luna", False]


PATTERNS = [
    pat("C001-P01", "C001", "repeated_exploration", "target:review.md", ["C001-e0001", "C001-e0003"]),
    pat("C001-P02", "C001", "omission", "obligation:ob-1", ["C001-e0002"]),
    pat("C002-P01", "C002", "repeated_exploration", "target:review.md", ["C002-e0000", "C002-e0002"]),
    # C003: two patterns citing different duplicate lines of one incident -> one occurrence
    pat("C003-P01", "C003", "zero_information_gain", "transition:review->review", ["C003-e0001"]),
    pat("C003-P02", "C003", "zero_information_gain", "transition:review->review", ["C003-e0002", "C003-e0003"]),
    # ... and a "repeat" that is only the duplicate lines of that incident
    pat("C003-P03", "C003", "repeated_exploration", "transition:review->review", ["C003-e0001", "C003-e0003"]),
]


def build(tmp_path: Path) -> Path:
    ir = write_ir(tmp_path / "run" / "ir.duckdb", CELLS, outcomes=OUTCOMES, task_of=TASKS)
    con = duckdb.connect(str(ir))
    con.execute(TABLES_DDL)
    con.executemany("INSERT INTO patterns VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", PATTERNS)
    for cell, status, n in [("C001", "ok", 2), ("C002", "ok", 1), ("C003", "ok", 3), ("C004", "ok", 0)]:
        con.execute("INSERT INTO luna_cells VALUES (?, ?, 1, 10, 1, ?, NULL, FALSE)", [cell, status, n])
    con.execute("INSERT INTO luna_cells VALUES ('C005', 'failed', 1, 10, 3, 0, 'part 1/1: invented ids', FALSE)")
    con.close()
    return ir


def group(doc: dict[str, Any], typ: str, concerns: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [g for g in doc["groups"] if g["type"] == typ and g["concerns"] == concerns]
    [g] = found
    return g


def test_groups_across_cells_with_support_and_negatives(tmp_path: Path) -> None:
    ir = build(tmp_path)
    run_coordinator(ir, tmp_path / "run")
    doc = read_json(tmp_path / "run" / GROUPS_FILE)
    g = group(doc, "repeated_exploration", "target:review.md")
    assert g["support"]["cells"] == ["C001", "C002"]
    assert g["support"]["tasks"] == ["bat", "prom"]
    assert g["support"]["n_runs"] == 2
    assert g["support"]["occurrences"] == 2
    assert g["negatives"] == {"occurrences": 1, "cells": ["C002"]}  # C002 completed
    refs = {o["cell_id"]: o["refs"] for o in g["occurrences"]}
    assert refs["C001"] == ["cells/C001/sessions/01.jsonl#L2-L2", "cells/C001/sessions/01.jsonl#L4-L4"]
    assert [g["group_id"] for g in doc["groups"]] == sorted(g["group_id"] for g in doc["groups"])


def test_duplicate_controller_lines_collapse_into_one_occurrence_keeping_every_ref(tmp_path: Path) -> None:
    run_coordinator(build(tmp_path), tmp_path / "run")
    doc = read_json(tmp_path / "run" / GROUPS_FILE)
    g = group(doc, "zero_information_gain", "transition:review->review")
    [occ] = g["occurrences"]
    assert occ["pattern_ids"] == ["C003-P01", "C003-P02"]
    assert occ["events"] == ["C003-e0001", "C003-e0002", "C003-e0003"]
    assert occ["refs"] == [
        "cells/C003/controller.jsonl#L7-L7",
        "cells/C003/controller.jsonl#L8-L8",
        "cells/C003/controller.jsonl#L9-L9",
    ]
    assert occ["incidents"] == 1 and occ["collapsed_lines"] == 2
    assert g["support"]["occurrences"] == 1 and g["support"]["patterns"] == 2
    rep = group(doc, "repeated_exploration", "transition:review->review")
    assert rep["occurrences"][0]["duplicate_lines_only"] is True


def test_non_identical_controller_lines_stay_separate(tmp_path: Path) -> None:
    cells = {"C001": [sent_back(1), sent_back(2) | {"ts": "2026-08-09T11:05:00Z"}]}
    ir = write_ir(tmp_path / "run" / "ir.duckdb", cells)
    con = duckdb.connect(str(ir))
    con.execute(TABLES_DDL)
    con.executemany(
        "INSERT INTO patterns VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            pat("C001-P01", "C001", "zero_information_gain", "transition:review->review", ["C001-e0000"]),
            pat("C001-P02", "C001", "zero_information_gain", "transition:review->review", ["C001-e0001"]),
        ],
    )
    con.close()
    run_coordinator(ir, tmp_path / "run")
    doc = read_json(tmp_path / "run" / GROUPS_FILE)
    assert doc["groups"][0]["support"]["occurrences"] == 2
    assert doc["totals"]["collapsed_lines"] == 0


def test_every_eligible_cell_is_in_coverage_zero_patterns_counted(tmp_path: Path) -> None:
    run_coordinator(build(tmp_path), tmp_path / "run")
    doc = read_json(tmp_path / "run" / GROUPS_FILE)
    cov = {c["cell_id"]: c for c in doc["coverage"]}
    assert sorted(cov) == ["C001", "C002", "C003", "C004", "C005"]
    assert cov["C004"]["patterns"] == 0 and cov["C004"]["luna_status"] == "ok"
    assert cov["C005"]["luna_status"] == "failed" and cov["C005"]["patterns"] == 0
    assert cov["C003"]["patterns"] == 3 and cov["C003"]["occurrences"] == 2
    t = doc["totals"]
    assert t["eligible_cells"] == 5 and t["cells_without_patterns"] == 2
    assert t["cells_not_analysed"] == ["C005"]
    assert t["patterns"] == len(PATTERNS)


def test_output_file_is_canonical_and_rerun_identical(tmp_path: Path) -> None:
    ir = build(tmp_path)
    run_coordinator(ir, tmp_path / "run")
    first = (tmp_path / "run" / GROUPS_FILE).read_bytes()
    run_coordinator(ir, tmp_path / "run")
    assert (tmp_path / "run" / GROUPS_FILE).read_bytes() == first
    assert json.loads(first)["schema_version"] == 1


def test_sql_files_ship_with_the_package() -> None:
    assert sql_files()[0] == "00_macros.sql" and len(sql_files()) >= 4


_WINDOW_INCIDENTS = """
SELECT cell_id, event_id, seq,
    CASE WHEN actor = 'controller'
        THEN first_value(event_id) OVER (PARTITION BY cell_id, ts, kind, detail, text, target ORDER BY seq)
        ELSE event_id
    END AS incident_id
FROM events
"""


@pytest.mark.parametrize("per_range", [None, 1, 800])  # the whole batch at once; a cell a range; 2 cells, then 1
def test_incidents_are_the_first_line_of_each_controller_key_as_a_window_defines_them(
    per_range: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """01_incidents.sql (hash aggregates, links only) gives what a window over every event gives (NULLs, actors).

    Run on ranges of cells (bounded hash tables at 100,000 cells), the links are those of one run on every cell.
    """
    if per_range is not None:
        monkeypatch.setattr(incidents, "RULE_EVENTS", per_range)
    rng = random.Random(7)
    rows = []
    for cell in ("C001", "C002", "C003"):
        for seq in range(400):  # few distinct values: many duplicate keys, across actors, with NULLs
            rows.append(
                (
                    cell,
                    f"{cell}-e{seq:04d}",
                    seq,
                    rng.choice([None, "t1", "t2"]),
                    rng.choice(["message", "tool_call"]),
                    rng.choice([None, "d"]),
                    rng.choice([None, "same line", "other line"]),
                    rng.choice([None, "x"]),
                    rng.choice([None, "controller", "controller", "reviewer"]),
                )
            )
    rng.shuffle(rows)
    con = duckdb.connect(":memory:")
    con.execute(
        "CREATE TABLE events (cell_id VARCHAR, event_id VARCHAR, seq INTEGER, ts VARCHAR, kind VARCHAR, "
        "detail VARCHAR, text VARCHAR, target VARCHAR, actor VARCHAR)"
    )
    con.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    sql = (resources.files("pipeline.coordinator") / "sql" / "01_incidents.sql").read_text(encoding="utf-8")
    assert update_incidents(con, sql) == (3, 3)  # no cell_digests: every cell looked at, nothing cached
    got = sorted(con.execute("SELECT * FROM event_incidents").fetchall())
    want = sorted(con.execute(_WINDOW_INCIDENTS).fetchall())
    assert got == want
    assert sum(1 for r in want if r[1] != r[3]) > 50  # the case is exercised: many lines share an incident


# The occurrences as first written: every cited event joined row by row, then grouped twice. The
# shipped 02_occurrences.sql aggregates per pattern first; both must give the same table.
_ROW_BY_ROW_OCCURRENCES = """
WITH mapped AS (
    SELECT p.pattern_id, p.cell_id, p.type, p.concerns, ev.event_id, i.incident_id, e.seq,
           e.source_path || '#L' || e.line_start || '-L' || e.line_end AS ref
    FROM patterns p, unnest(p.evidence) AS ev(event_id)
    JOIN event_incidents i ON i.event_id = ev.event_id
    JOIN events e ON e.event_id = ev.event_id
),
per_pattern AS (
    SELECT pattern_id, list_sort(list_distinct(list(incident_id))) AS signature FROM mapped GROUP BY pattern_id
),
tagged AS (SELECT m.*, pp.signature FROM mapped m JOIN per_pattern pp USING (pattern_id)),
occ AS (
    SELECT type, concerns, cell_id, signature, list_sort(list(DISTINCT pattern_id)) AS pattern_ids
    FROM tagged GROUP BY type, concerns, cell_id, signature
),
occ_events AS (
    SELECT type, concerns, cell_id, signature, list(event_id ORDER BY seq) AS events,
           list(ref ORDER BY seq) AS refs, min(seq) AS first_seq
    FROM (SELECT DISTINCT type, concerns, cell_id, signature, event_id, seq, ref FROM tagged)
    GROUP BY type, concerns, cell_id, signature
),
o AS (
    SELECT o.type, o.concerns, o.cell_id, c.task_id, c.run_id, o.pattern_ids, oe.events, oe.refs,
           o.signature AS incidents, len(oe.events) - len(o.signature) AS collapsed_lines,
           (o.type = 'repeated_exploration' AND len(o.signature) < 2) AS duplicate_lines_only, oe.first_seq,
           coalesce(lunasol_successful(oc.label), FALSE) AS successful_cell
    FROM occ o JOIN occ_events oe USING (type, concerns, cell_id, signature)
    JOIN cells c ON c.cell_id = o.cell_id LEFT JOIN outcomes oc ON oc.cell_id = o.cell_id
)
SELECT g.group_id
       || printf('-O%02d', row_number() OVER (PARTITION BY g.group_id ORDER BY o.cell_id, o.first_seq, o.events)),
       g.group_id, o.*
FROM o JOIN pattern_groups g USING (type, concerns)
"""


def test_occurrences_are_those_of_the_row_by_row_join(tmp_path: Path) -> None:
    """02_occurrences.sql (per-pattern aggregates) gives the table a join of every cited event gives."""
    rng = random.Random(11)
    cells: dict[str, list[dict[str, Any]]] = {}
    for c in range(12):
        evs: list[dict[str, Any]] = []
        for _ in range(40):  # repeated controller lines (one incident, several lines) among other events
            evs.append(sent_back(len(evs) + 1) if rng.random() < 0.3 else msg(rng.choice(["a", "b", "c"])))
        cells[f"C{c:03d}"] = evs
    outcomes = {cell: rng.choice(["completed", "workflow_failed"]) for cell in cells}
    ir = write_ir(tmp_path / "run" / "ir.duckdb", cells, outcomes=outcomes, task_of={c: "t" for c in cells})
    rows = []
    for cell, evs in cells.items():
        for n in range(1, rng.randint(2, 9)):
            ids = [f"{cell}-e{rng.randrange(len(evs)):04d}" for _ in range(rng.randint(1, 4))]
            if rng.random() < 0.1:
                ids.append(f"{cell}-e9999")  # not an event of the IR: dropped, as by the join
            typ = rng.choice(["repeated_exploration", "omission"])
            rows.append(pat(f"{cell}-P{n:02d}", cell, typ, rng.choice(["target:a", "target:b"]), sorted(set(ids))))
    con = duckdb.connect(str(ir))
    con.execute(TABLES_DDL)
    con.executemany("INSERT INTO patterns VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    con.close()
    run_coordinator(ir, tmp_path / "run")
    con = duckdb.connect(str(ir))
    try:
        con.execute((resources.files("pipeline.coordinator") / "sql" / "00_macros.sql").read_text(encoding="utf-8"))
        got = sorted(con.execute("SELECT * FROM pattern_occurrences").fetchall())
        want = sorted(con.execute(_ROW_BY_ROW_OCCURRENCES).fetchall())
    finally:
        con.close()
    assert got == want
    assert any(r[11] > 0 for r in want) and any(len(r[7]) > 1 for r in want)  # collapsed lines, merged patterns


def test_a_rerun_looks_again_only_at_changed_cells_and_gives_every_incident_a_fresh_run_gives(
    demo_gate1: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Incidents of unchanged cells come from the cache; the view holds what computing every cell gives."""
    monkeypatch.setattr(incidents, "RULE_EVENTS", 200)  # ranges of a few cells: the cache rows are the whole run's
    rule = (resources.files("pipeline.coordinator") / "sql" / "01_incidents.sql").read_text(encoding="utf-8")
    ir = tmp_path / "ir.duckdb"
    shutil.copy(demo_gate1 / "ir.duckdb", ir)
    con = duckdb.connect(str(ir))
    try:
        con.execute(f"DROP TABLE IF EXISTS {CACHE_TABLE}")
        cells = [r[0] for r in con.execute("SELECT DISTINCT cell_id FROM events ORDER BY 1").fetchall()]
        assert update_incidents(con, rule) == (len(cells), len(cells))
        fresh = sorted(con.execute("SELECT * FROM event_incidents").fetchall())
        assert sum(1 for r in fresh if r[1] != r[3]) > 0  # the demo has repeated controller lines
        assert update_incidents(con, rule) == (0, len(cells))  # nothing changed: nothing looked at
        assert sorted(con.execute("SELECT * FROM event_incidents").fetchall()) == fresh
        # a cell whose content changed is looked at again; one cached by another rule too
        con.execute("UPDATE cell_digests SET content_digest = 'sha256:changed' WHERE cell_id = ?", [cells[0]])
        con.execute(f"UPDATE {CACHE_TABLE} SET made_with = 'older rule' WHERE cell_id = ?", [cells[1]])
        assert update_incidents(con, rule) == (2, len(cells))
        assert sorted(con.execute("SELECT * FROM event_incidents").fetchall()) == fresh
        cached = con.execute(f"SELECT cell_id, content_digest, made_with FROM {CACHE_TABLE} ORDER BY 1").fetchall()
        assert [r[0] for r in cached] == cells and len({r[2] for r in cached}) == 1
        assert dict((r[0], r[1]) for r in cached)[cells[0]] == "sha256:changed"
    finally:
        con.close()


def test_the_streamed_file_is_the_whole_documents_bytes(tmp_path: Path) -> None:
    """run_coordinator streams the file from DuckDB a batch at a time: the bytes of the document built whole."""
    from pipeline.coordinator import groups as core
    from pipeline.core import duck
    from pipeline.core.canonical import pretty_json_plain

    ir = build(tmp_path)
    head = run_coordinator(ir, tmp_path / "run")
    con = duck.connect(ir)
    try:
        whole = core.coordinate(con)
    finally:
        con.close()
    assert (tmp_path / "run" / GROUPS_FILE).read_bytes() == pretty_json_plain(whole)
    assert head == {"schema_version": whole["schema_version"], "totals": whole["totals"]}
    assert whole["totals"]["groups"] == len(whole["groups"]) > 1 and whole["coverage"]


def test_a_groups_occurrences_are_streamed_a_batch_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No batch of rows in Python holds more than its size: a group with an occurrence per cell is never whole."""
    from pipeline.coordinator import groups as core
    from pipeline.core import duck
    from pipeline.core.canonical import pretty_json_plain

    ir = build(tmp_path)
    seen: list[int] = []

    def spy(con: Any, sql: str, size: int) -> Any:
        for batch in con.sql(sql).fetch_record_batch(size):
            seen.append(batch.num_rows)
            yield from batch.to_pylist()

    monkeypatch.setattr(core, "GROUPS_PER_BATCH", 1)
    monkeypatch.setattr(core, "OCCURRENCES_PER_BATCH", 1)
    monkeypatch.setattr(core, "COVERAGE_PER_BATCH", 1)
    monkeypatch.setattr(core, "_batches", spy)
    run_coordinator(ir, tmp_path / "run")
    con = duck.connect(ir)
    try:
        whole = core.coordinate(con)
    finally:
        con.close()
    assert (tmp_path / "run" / GROUPS_FILE).read_bytes() == pretty_json_plain(whole)
    occurrences = sum(len(g["occurrences"]) for g in whole["groups"])
    assert max(len(g["occurrences"]) for g in whole["groups"]) > 1  # a group larger than a batch
    assert max(seen) == 1 and sum(seen) == len(whole["groups"]) + occurrences + len(whole["coverage"])


def test_an_empty_batch_streams_empty_lists(tmp_path: Path) -> None:
    from pipeline.core.canonical import pretty_json_plain
    from pipeline.core.jsonstream import Items, pretty_object

    doc = {"coverage": [], "groups": [{"a": [1, {"b": "x\ny"}], "c": {}}], "schema_version": 1, "totals": {"n": None}}
    fields = {k: Items(iter(v)) if isinstance(v, list) else v for k, v in doc.items()}
    assert b"".join(pretty_object(fields)) == pretty_json_plain(doc)


def test_occurrences_drafted_by_ranges_of_cells_are_those_drafted_at_once(
    demo_gate1: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """02_occurrences.sql on ranges of a few cited events (a cell whole) gives the same groups file, byte for byte."""
    from pipeline.coordinator import groups as core

    files = []
    for per_range in (core.OCCURRENCE_EVENTS, 1, 7):
        monkeypatch.setattr(core, "OCCURRENCE_EVENTS", per_range)
        run = tmp_path / f"run-{per_range}"
        run.mkdir()
        shutil.copy(demo_gate1 / "ir.duckdb", run / "ir.duckdb")
        run_coordinator(run / "ir.duckdb", run)
        files.append((run / GROUPS_FILE).read_bytes())
    assert files[0] == files[1] == files[2]
    assert json.loads(files[0])["totals"]["occurrences"] > 3  # several occurrences, so several ranges
