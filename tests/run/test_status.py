"""``lunasol status``: state machine, ledger, shortlist table and next command, as text and JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.run.status import BATCH_LINES, format_batches, gate_report, status
from pipeline.state import handoff
from pipeline.state.ledger import Ledger
from tests.gates.test_gates import open_gate


def test_status_shows_state_ledger_and_confirm_command(runs_dir: Path) -> None:
    d = runs_dir / "r1"
    d.mkdir()
    digest = open_gate(d)
    Ledger(d).mark_verified("sol", "sol", {"x": "1"})
    Ledger(d).invalidate("sol", "upstream export recomputed")
    s = status(d)
    assert s["handoff"]["userRootCauseConfirmation"] == "pending"
    assert s["ledger"][0]["state"] == "invalidated"
    assert s["next_command"].startswith(f"lunasol confirm {d} --decision 'W-01=confirm|reject|unresolved|amend'")
    assert f"--digest {digest}" in s["next_command"]
    report = gate_report(d)
    assert "W-01" in report and "W-02" in report and "silence is never approval" in report
    res = CliRunner().invoke(app, ["status", str(d)])
    assert res.exit_code == 0
    assert re.search(r"\n  sol\s+invalidated\s+\(upstream export recomputed\)\n", res.output)
    js = CliRunner().invoke(app, ["status", str(d), "--json"])
    data = json.loads(js.output)
    assert data["shortlist"]["digest"] == digest == handoff.load(d).shortlist_digest
    assert [w["weakness_id"] for w in data["shortlist"]["weaknesses"]] == ["W-01", "W-02"]


def test_status_of_a_non_run_is_bad_input(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["status", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "not a lunasol run directory" in res.output


def _batches(done: int, still_open: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = [
        {"id": f"batch_{i:03d}", "requests": 90, "status": "completed"} for i in range(done)
    ]
    rows += [{"id": f"batch_o{i:02d}", "requests": 10, "status": "in_progress"} for i in range(still_open)]
    rows.append({"id": "batch_f", "requests": 5, "status": "failed"})
    return rows


def test_a_few_batches_get_a_line_each() -> None:
    rows = _batches(3, 1)
    lines = format_batches(rows)
    assert lines == [f"batch {r['id']}: {r['requests']} requests, {r['status']} when last seen" for r in rows]


def test_the_batches_of_a_large_run_are_summed_by_status_and_the_open_ones_listed() -> None:
    # a 10,000-cell run against a 2M-token queue submits ~100 batches: one line per status, not per batch
    rows = _batches(110, BATCH_LINES + 3)
    lines = format_batches(rows)
    assert lines[0] == (
        f"batches: {len(rows)} when last seen: completed 110 (9,900 requests), failed 1 (5 requests), "
        f"in_progress {BATCH_LINES + 3} ({(BATCH_LINES + 3) * 10} requests)"
    )
    assert [ln.split(":")[0].strip() for ln in lines[1:-1]] == [f"batch batch_o{i:02d}" for i in range(BATCH_LINES)]
    assert lines[-1] == "  ... and 3 more open (lunasol status RUN --json lists every batch)"
    assert not any("batch_000" in ln or "batch_f" in ln for ln in lines)  # finished batches are counted only


def _one_error_line(output: str) -> str:
    lines = [ln for ln in output.splitlines() if ln.strip()]
    assert len(lines) == 1, output
    return lines[0]


def test_status_of_a_truncated_run_json_is_one_line_naming_it(demo_copy: Path) -> None:
    text = (demo_copy / "run.json").read_text(encoding="utf-8")
    (demo_copy / "run.json").write_text(text[: len(text) // 2], encoding="utf-8")
    res = CliRunner().invoke(app, ["status", str(demo_copy)])
    assert res.exit_code == 2, res.output
    line = _one_error_line(res.output)
    assert str(demo_copy / "run.json") in line and "not valid JSON" in line and "Traceback" not in res.output


def test_status_of_an_empty_shortlist_is_one_line_naming_it(demo_copy: Path) -> None:
    (demo_copy / "weakness-shortlist.json").write_bytes(b"")
    res = CliRunner().invoke(app, ["status", str(demo_copy)])
    assert res.exit_code == 2, res.output
    line = _one_error_line(res.output)
    assert str(demo_copy / "weakness-shortlist.json") in line and "is empty" in line
