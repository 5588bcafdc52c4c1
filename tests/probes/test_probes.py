"""Deterministic probes on hand-made event sequences: each probe fires on a true case and stays quiet on
a near-miss false case."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import duckdb
import pytest

from pipeline.probes import ProbeHit, normalise_key, read_probe_hits, run_probes, write_probe_hits
from pipeline.probes.synthetic import write_cells

S1 = "sha256:" + "1" * 64
S2 = "sha256:" + "2" * 64
A1 = "sha256:" + "a" * 64
A2 = "sha256:" + "b" * 64
R1 = "sha256:" + "c" * 64
R2 = "sha256:" + "d" * 64


def call(tool: str, args: str = A1, target: str | None = None, state: str = S1, call_id: str = "") -> dict[str, Any]:
    return {
        "kind": "tool_call",
        "tool_name": tool,
        "args_digest": args,
        "target": target,
        "state_digest": state,
        "call_id": call_id or None,
        "text": f"{tool} {target}",
    }


def result(call_id: str, digest: str, state: str = S1) -> dict[str, Any]:
    return {"kind": "tool_result", "call_id": call_id, "result_digest": digest, "state_digest": state, "text": "out"}


def msg(actor: str = "candidate", text: str = "thinking", state: str = S1) -> dict[str, Any]:
    return {"kind": "message", "actor": actor, "text": text, "state_digest": state}


def ctl(kind: str, detail: str, **kw: Any) -> dict[str, Any]:
    base = {"kind": kind, "detail": detail, "actor": "controller", "session_id": None, "text": f"{detail}"}
    base.update(kw)
    return base


def hits_for(cells: dict[str, list[dict[str, Any]]]) -> list[ProbeHit]:
    con = duckdb.connect()
    write_cells(con, cells)
    return run_probes(con)


def of(hits: list[ProbeHit], probe_id: str) -> list[ProbeHit]:
    return [h for h in hits if h.probe_id == probe_id]


# --- repeat_call_same_state -------------------------------------------------------------------------


def test_repeat_read_unchanged_state_is_a_hit() -> None:
    hits = hits_for(
        {"C001": [msg(), call("read_file", target="src/a.py"), msg(), call("read_file", target="src/a.py")]}
    )
    [hit] = of(hits, "repeat_call_same_state")
    assert hit.type == "repeated_exploration"
    assert hit.evidence == ["C001-e0001", "C001-e0003"]
    assert hit.proves_unchanged
    assert hit.key == "target:read_file:src/a.py"


def test_three_repeats_form_one_chain() -> None:
    cells = {"C001": [call("grep", target="x"), call("grep", target="x"), msg(), call("grep", target="x")]}
    [hit] = of(hits_for(cells), "repeat_call_same_state")
    assert hit.evidence == ["C001-e0000", "C001-e0001", "C001-e0003"]


@pytest.mark.parametrize(
    "between",
    [
        call("write_file", args=A2, target="src/a.py"),  # the source changed
        call("bash", args=A2, target=None),  # an unknown tool might have changed it
        msg(actor="operator", text="new information"),  # new decision input
        {"kind": "artifact", "detail": "artifact_written", "actor": "controller", "target": "design.md"},
        ctl("state_change", "state", state_digest=S2),  # controller state moved
    ],
)
def test_repeat_read_after_a_change_is_not_a_hit(between: dict[str, Any]) -> None:
    cells = {"C001": [call("read_file", target="src/a.py"), between, call("read_file", target="src/a.py")]}
    assert of(hits_for(cells), "repeat_call_same_state") == []


def test_a_denied_permission_request_is_not_a_change() -> None:
    cells = {
        "C015": [
            call("read_file", target="design.md"),
            call("request_permission", args=A2, target=None),
            {"kind": "tool_result", "text": "denied: design.md belongs to a confirmed stage", "state_digest": S1},
            call("read_file", target="design.md"),
        ]
    }
    assert len(of(hits_for(cells), "repeat_call_same_state")) == 1


def test_repeat_read_with_other_args_or_other_state_is_not_a_hit() -> None:
    cells = {
        "C001": [call("read_file", args=A1), call("read_file", args=A2)],
        "C002": [call("read_file", state=S1), call("read_file", state=S2)],
    }
    assert of(hits_for(cells), "repeat_call_same_state") == []


def test_writing_only_the_report_does_not_count_as_a_change() -> None:
    cells = {
        "C001": [
            call("read_file", target="src/a.py"),
            call("write_file", args=A2, target="review.md"),
            call("read_file", target="src/a.py"),
        ]
    }
    assert len(of(hits_for(cells), "repeat_call_same_state")) == 1


def test_repeats_in_different_cells_do_not_pair() -> None:
    cells = {"C001": [call("read_file")], "C002": [call("read_file")]}
    assert of(hits_for(cells), "repeat_call_same_state") == []


# --- check_rerun_unchanged_source ---------------------------------------------------------------


def test_check_rerun_on_unchanged_source_is_a_hit() -> None:
    cells = {"C004": [call("run_tests", target="/ws/x"), msg(), call("run_tests", target="/ws/x")]}
    [hit] = of(hits_for(cells), "check_rerun_unchanged_source")
    assert hit.type == "repeated_exploration"
    assert hit.evidence == ["C004-e0000", "C004-e0002"]
    assert hit.key == "target:run_tests:" + A1[:19]
    assert "in /ws/x" in hit.explanation


def test_a_different_check_command_is_not_a_rerun() -> None:
    cells = {"C004": [call("run_tests", args=A1, target="/ws/x"), call("run_tests", args=A2, target="/ws/x")]}
    assert of(hits_for(cells), "check_rerun_unchanged_source") == []


def test_check_rerun_after_an_edit_is_not_a_hit() -> None:
    cells = {
        "C013": [
            call("run_tests", target="tests/x"),
            call("apply_patch", args=A2, target="src/x.py"),
            call("run_tests", target="tests/x"),
        ]
    }
    assert of(hits_for(cells), "check_rerun_unchanged_source") == []


def test_git_checkout_is_not_a_check() -> None:
    cells = {"C001": [call("git_checkout", target="main"), call("git_checkout", target="main")]}
    assert of(hits_for(cells), "check_rerun_unchanged_source") == []


# --- identical_result ---------------------------------------------------------------------------------


def test_identical_results_are_a_hit() -> None:
    cells = {
        "C002": [
            call("run_tests", call_id="k1"),
            result("k1", R1),
            msg(),
            call("run_tests", call_id="k3"),
            result("k3", R1),
        ]
    }
    [hit] = of(hits_for(cells), "identical_result")
    assert hit.type == "zero_information_gain"
    assert hit.evidence == ["C002-e0000", "C002-e0001", "C002-e0003", "C002-e0004"]
    assert hit.proves_unchanged


def test_different_results_are_not_a_hit() -> None:
    cells = {
        "C002": [call("run_tests", call_id="k1"), result("k1", R1), call("run_tests", call_id="k2"), result("k2", R2)]
    }
    assert of(hits_for(cells), "identical_result") == []


def test_identical_result_after_a_change_or_in_another_stage_is_not_a_hit() -> None:
    cells = {
        "C013": [
            call("run_tests", call_id="k1"),
            result("k1", R1),
            call("apply_patch", args=A2, call_id="k2"),
            result("k2", R2),
            call("run_tests", call_id="k3"),
            result("k3", R1),
        ],
        "C014": [
            call("read_file", call_id="k1"),
            result("k1", R1),
            call("read_file", call_id="k2") | {"stage": "review", "actor": "reviewer"},
            result("k2", R1) | {"stage": "review", "actor": "reviewer"},
        ],
    }
    assert of(hits_for(cells), "identical_result") == []


# --- obligation_unclosed -------------------------------------------------------------------------------


def test_unclosed_obligation_with_a_later_stage_is_a_hit() -> None:
    cells = {
        "C006": [
            ctl("obligation", "obligation_opened", target="O-2", stage="tasks"),
            ctl("stage", "stage_accepted", stage="tasks"),
            ctl("stage", "stage_started", stage="implementation"),
            msg(),
            ctl("stage", "stage_started", stage="review"),
        ]
    }
    [hit] = of(hits_for(cells), "obligation_unclosed")
    assert hit.type == "omission"
    assert hit.key == "obligation:o-2"
    assert hit.evidence == ["C006-e0000", "C006-e0002", "C006-e0004"]
    assert "implementation, review" in hit.explanation


def test_closed_obligation_or_no_later_stage_is_not_a_hit() -> None:
    cells = {
        "C001": [
            ctl("obligation", "obligation_opened", target="O-1", stage="tasks"),
            ctl("stage", "stage_started", stage="implementation"),
            ctl("obligation", "obligation_closed", target="O-1", stage="implementation"),
        ],
        "C002": [
            ctl("stage", "stage_started", stage="tasks"),
            ctl("obligation", "obligation_opened", target="O-2", stage="tasks"),
            msg(),
        ],
    }
    assert of(hits_for(cells), "obligation_unclosed") == []


def test_duplicate_opening_lines_make_one_hit() -> None:
    line = ctl("obligation", "obligation_opened", target="O-1", stage="tasks", ts="2026-08-09T10:00:00Z")
    cells = {"C009": [line, dict(line), ctl("stage", "stage_started", stage="implementation")]}
    [hit] = of(hits_for(cells), "obligation_unclosed")
    assert hit.evidence == ["C009-e0000", "C009-e0001", "C009-e0002"]


# --- report_only_rewrite -------------------------------------------------------------------------------


def report(digest: str, target: str = "review.md") -> dict[str, Any]:
    return ctl("artifact", "artifact_written", target=target, stage="review", result_digest=digest, state_digest=S1)


def test_report_rewritten_with_nothing_else_changing_is_a_hit() -> None:
    cells = {"C015": [report(R1), msg(actor="reviewer"), call("read_file", target="src/a.py"), report(R2)]}
    [hit] = of(hits_for(cells), "report_only_rewrite")
    assert hit.type == "zero_information_gain"
    assert hit.evidence == ["C015-e0000", "C015-e0003"]
    assert hit.key == "target:review.md"
    assert hit.proves_unchanged


def test_report_rewritten_after_a_source_change_is_not_a_hit() -> None:
    design = ctl("artifact", "artifact_written", target="design.md", stage="design", result_digest=R2)
    cells = {
        "C013": [report(R1), design, report(R2)],
        "C014": [report(R1), call("edit_file", args=A2, target="src/a.py"), report(R2)],
        "C017": [report(R1), msg(actor="operator", text="use the v2 header"), report(R2)],
    }
    assert of(hits_for(cells), "report_only_rewrite") == []


def test_duplicate_controller_line_is_not_a_rewrite() -> None:
    line = report(R1) | {"ts": "2026-08-09T11:00:00Z"}
    cells = {"C010": [line, dict(line)]}
    assert of(hits_for(cells), "report_only_rewrite") == []


# --- storage and keys ---------------------------------------------------------------------------------


def test_hits_roundtrip_through_the_table_with_stable_ids() -> None:
    con = duckdb.connect()
    write_cells(
        con,
        {
            "C001": [
                call("read_file"),
                call("read_file"),
                call("run_tests", target="t"),
                call("run_tests", target="t"),
            ],
        },
    )
    hits = run_probes(con)
    write_probe_hits(con, hits)
    assert [h.hit_id for h in hits] == ["C001-H01", "C001-H02"]
    assert read_probe_hits(con, "C001") == hits
    assert run_probes(con) == hits  # deterministic


@pytest.mark.parametrize(
    ("raw", "norm"),
    [
        ("Target: Review.md", "target:review.md"),
        ("review.md", "target:review.md"),
        ("transition: review → review", "transition:review->review"),
        ("obligation:OB-3  ", "obligation:ob-3"),
        ("target:run_tests:python  -m pytest -q", "target:run_tests:python -m pytest -q"),
    ],
)
def test_normalise_key(raw: str, norm: str) -> None:
    assert normalise_key(raw) == norm


def test_probing_in_chunks_of_cells_finds_the_hits_of_one_whole_run(
    demo_gate1: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cell's hits depend on that cell only, so probing a few cells at a time (bounded memory) changes nothing.
    from pipeline.probes import cells

    def hits(chunk_events: int) -> tuple[list[ProbeHit], int]:
        ir = tmp_path / f"ir-{chunk_events}.duckdb"
        shutil.copy(demo_gate1 / "ir.duckdb", ir)
        monkeypatch.setattr(cells, "PROBE_EVENTS", chunk_events)
        con = duckdb.connect(str(ir))
        try:
            con.execute(f"DROP TABLE IF EXISTS {cells.CACHE_TABLE}")  # nothing cached: every cell is probed
            cells.update_probe_hits(con)
            found = read_probe_hits(con)
            return found, len(cells._chunks(con, [r[0] for r in con.execute("SELECT cell_id FROM cells").fetchall()]))
        finally:
            con.close()

    whole, one = hits(10**9)
    chunked, many = hits(500)
    assert one == 1 and many > 5
    assert whole and [h.model_dump() for h in chunked] == [h.model_dump() for h in whole]


def test_a_rerun_keeps_valid_cache_rows_and_makes_the_cache_a_fresh_probing_makes(
    demo_gate1: Path, tmp_path: Path
) -> None:
    # The cache is updated in place (stale rows out, changed cells in), never rewritten whole:
    # it must still hold exactly what probing every cell from scratch writes.
    from pipeline.probes import cells

    ir = tmp_path / "ir.duckdb"
    shutil.copy(demo_gate1 / "ir.duckdb", ir)
    con = duckdb.connect(str(ir))
    try:
        con.execute(f"DROP TABLE IF EXISTS {cells.CACHE_TABLE}")
        cells.update_probe_hits(con)
        ids = [r[0] for r in con.execute("SELECT cell_id FROM cells ORDER BY cell_id").fetchall()]
        eligible = con.execute("SELECT count(*) FROM cells WHERE eligibility = 'valid_behavior'").fetchall()[0][0]
        changed, stale = ids[0], ids[1]
        con.execute("UPDATE cell_digests SET content_digest = 'sha256:changed' WHERE cell_id = ?", [changed])
        con.execute(f"UPDATE {cells.CACHE_TABLE} SET made_with = 'older probes' WHERE cell_id = ?", [stale])
        con.execute(f"INSERT INTO {cells.CACHE_TABLE} VALUES ('C999', 'sha256:x', 'older probes', '[]')")  # gone cell
        counts = cells.update_probe_hits(con)
        hits = read_probe_hits(con)
        assert (counts.probed, counts.eligible) == (2, eligible) and eligible < len(ids)  # counts of eligible cells
        assert counts.hits == len(hits) and counts.cells_with_hits == len({h.cell_id for h in hits})
        kept = sorted(con.execute(f"SELECT * FROM {cells.CACHE_TABLE}").fetchall())
        con.execute(f"DROP TABLE {cells.CACHE_TABLE}")
        assert cells.update_probe_hits(con).probed == eligible
        again = read_probe_hits(con)
        assert kept == sorted(con.execute(f"SELECT * FROM {cells.CACHE_TABLE}").fetchall())
        assert [h.model_dump() for h in hits] == [h.model_dump() for h in again]
        assert {r[0] for r in kept} == set(ids) and all(r[2] != "older probes" for r in kept)
    finally:
        con.close()
