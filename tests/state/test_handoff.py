"""handoff.json: the run's state machine with a revision number, and the exact next command per state."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core.canonical import write_json
from pipeline.core.errors import BadInput, NeedsRebase
from pipeline.state import handoff


def test_revision_moves_only_on_change(tmp_path: Path) -> None:
    h = handoff.update(tmp_path, {"phase": "exported"}, "export done")
    assert h.revision == 1
    assert handoff.update(tmp_path, {"phase": "exported"}, "again").revision == 1  # nothing changed
    h = handoff.update(tmp_path, {"phase": "patterns"}, "luna done")
    assert h.revision == 2 and [e.event for e in h.history] == ["export done", "luna done"]
    assert handoff.load(tmp_path).phase == "patterns"


def test_compare_and_set(tmp_path: Path) -> None:
    handoff.update(tmp_path, {"phase": "exported"}, "export done")
    with pytest.raises(NeedsRebase, match="since then: r1 export done"):
        handoff.update(tmp_path, {"phase": "patterns"}, "late", expected_revision=0)
    assert handoff.update(tmp_path, {"phase": "patterns"}, "ok", expected_revision=1).revision == 2


def test_invalid_values_and_newer_schema_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        handoff.update(tmp_path, {"userRootCauseConfirmation": "maybe"}, "bad")
    write_json(tmp_path / handoff.HANDOFF_FILE, {"schema_version": 99, "run_id": "x"})
    with pytest.raises(BadInput, match="newer"):
        handoff.load(tmp_path)


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ({"phase": "patterns"}, "lunasol run"),
        ({"phase": "rootCausesMined", "userRootCauseConfirmation": "pending"}, "lunasol confirm"),
        ({"phase": "rootCausesMined", "userRootCauseConfirmation": "confirmed"}, "lunasol propose"),
        ({"phase": "rootCausesMined", "userRootCauseConfirmation": "rejected"}, "every weakness was rejected"),
        (
            {
                "phase": "rootCausesMined",
                "userRootCauseConfirmation": "confirmed",
                "proposalGeneration": "done",
                "proposalSelection": "pending",
            },
            "lunasol select",
        ),
        (
            {
                "phase": "rootCausesMined",
                "userRootCauseConfirmation": "confirmed",
                "proposalGeneration": "done",
                "proposalSelection": "redo",
            },
            "lunasol propose",
        ),
        (
            {
                "phase": "rootCausesMined",
                "userRootCauseConfirmation": "confirmed",
                "proposalGeneration": "done",
                "proposalSelection": "selected",
            },
            "lunasol report",
        ),
    ],
)
def test_next_command(tmp_path: Path, state: dict[str, str], expected: str) -> None:
    run_dir = tmp_path / "r1"
    write_json(
        run_dir / "run.json",
        {"inputs": {"bundle_path": "fixtures/bundles/h0-demo", "models": {"mode": "replay", "store": "rec"}}},
    )
    h = handoff.update(run_dir, state, "set")
    cmd = handoff.next_command(run_dir, h)
    assert expected in cmd
    if expected == "lunasol run":
        assert cmd == f"lunasol run fixtures/bundles/h0-demo --run-id r1 --runs-dir {tmp_path} --replay rec --resume"
