"""``lunasol status``: state machine, ledger, shortlist table and next command, as text and JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.run.status import gate_report, status
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
