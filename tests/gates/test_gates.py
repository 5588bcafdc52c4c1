"""Gate 1 as a compare-and-set receipt: stale digest, stale revision, idempotent replay, racing confirmers."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.core.errors import BadInput, Blocked, NeedsRebase
from pipeline.gates import gate1 as gates
from pipeline.sol.cards import WeaknessDraft
from pipeline.sol.shortlist import SHORTLIST_FILE, read_shortlist, write_shortlist
from pipeline.sol.stage import make_shortlist
from pipeline.state import handoff
from pipeline.state.ledger import Ledger
from tests.sol.sol_helpers import draft, index


def open_gate(run_dir: Path, statement_suffix: str = "") -> str:
    """A run stopped at gate 1 with a two-weakness shortlist; return the shortlist digest."""
    drafts = [
        WeaknessDraft.model_validate(draft(statement=draft()["statement"] + statement_suffix)),
        WeaknessDraft.model_validate(draft(weakness_id="W-02", confidence="low")),
    ]
    sl = make_shortlist(run_dir.name, index(), drafts, made_from={}, call={})
    write_shortlist(run_dir / SHORTLIST_FILE, sl)
    (run_dir / "run.json").write_text("{}", encoding="utf-8")
    handoff.update(
        run_dir,
        {"phase": "rootCausesMined", "shortlist_digest": sl.digest, "userRootCauseConfirmation": "pending"},
        "root causes mined",
    )
    return sl.digest


@pytest.fixture
def run_dir(runs_dir: Path) -> Path:
    d = runs_dir / "r1"
    d.mkdir()
    open_gate(d)
    return d


def test_confirm_writes_receipt_and_moves_state(run_dir: Path) -> None:
    base = handoff.load(run_dir)
    receipt, replayed = gates.confirm(
        run_dir,
        {"W-01": "confirm", "W-02": "reject"},
        by="ana",
        notes={"W-02": "too thin"},
        expected_digest=base.shortlist_digest,
        expected_revision=base.revision,
    )
    assert not replayed
    h = handoff.load(run_dir)
    assert h.revision == base.revision + 1
    assert h.userRootCauseConfirmation == "partially_confirmed"
    assert receipt.subject.digest == read_shortlist(run_dir / SHORTLIST_FILE).digest
    path = run_dir / h.receipts["gate1"]
    assert path.is_file() and path.parent.name == "gates"
    assert Ledger(run_dir).get("gate1").state == "verified"  # type: ignore[union-attr]
    assert gates.confirmed_weaknesses(run_dir) == {"W-01": {"decision": "confirm", "note": None}}


@pytest.mark.parametrize(
    ("decisions", "state"),
    [
        ({"W-01": "confirm", "W-02": "amend"}, "confirmed"),
        ({"W-01": "reject", "W-02": "reject"}, "rejected"),
        ({"W-01": "unresolved", "W-02": "reject"}, "pending"),
    ],
)
def test_outcomes(run_dir: Path, decisions: dict[str, str], state: str) -> None:
    gates.confirm(
        run_dir,
        decisions,
        by="ana",
        notes={"W-02": "narrower: review only"},
        expected_digest=None,
        expected_revision=None,
    )
    assert handoff.load(run_dir).userRootCauseConfirmation == state


def test_stale_digest_needs_rebase(run_dir: Path) -> None:
    old = handoff.load(run_dir)
    open_gate(run_dir, statement_suffix=" (re-mined)")  # the shortlist changed after the user looked
    with pytest.raises(NeedsRebase, match=r"weakness-shortlist\.json changed"):
        gates.confirm(
            run_dir,
            {"W-01": "confirm", "W-02": "confirm"},
            by="ana",
            expected_digest=old.shortlist_digest,
            expected_revision=None,
        )
    assert not list((run_dir / "gates").glob("*.json")) if (run_dir / "gates").exists() else True


def test_stale_revision_needs_rebase_and_names_what_changed(run_dir: Path) -> None:
    base = handoff.load(run_dir)
    handoff.update(run_dir, {"proposals_digest": "sha256:x"}, "something else happened")
    with pytest.raises(NeedsRebase, match=r"revision .* something else happened"):
        gates.confirm(
            run_dir,
            {"W-01": "confirm", "W-02": "confirm"},
            by="ana",
            expected_digest=base.shortlist_digest,
            expected_revision=base.revision,
        )
    assert handoff.load(run_dir).userRootCauseConfirmation == "pending"


def test_same_operation_id_replays_the_same_receipt(run_dir: Path) -> None:
    base = handoff.load(run_dir)
    kw: dict[str, Any] = {
        "by": "ana",
        "expected_digest": base.shortlist_digest,
        "expected_revision": base.revision,
        "operation_id": "op-1",
    }
    first, r1 = gates.confirm(run_dir, {"W-01": "confirm", "W-02": "reject"}, **kw)
    after = handoff.load(run_dir)
    second, r2 = gates.confirm(run_dir, {"W-01": "confirm", "W-02": "reject"}, **kw)  # stale revision, but a replay
    assert (r1, r2) == (False, True)
    assert second == first
    assert handoff.load(run_dir).revision == after.revision  # nothing changed
    with pytest.raises(NeedsRebase, match="already used for a different decision"):
        gates.confirm(run_dir, {"W-01": "reject", "W-02": "reject"}, **kw)


def test_repeating_the_same_command_without_an_id_is_a_replay(run_dir: Path) -> None:
    a, _ = gates.confirm(
        run_dir, {"W-01": "confirm", "W-02": "reject"}, by="ana", expected_digest=None, expected_revision=None
    )
    b, replayed = gates.confirm(
        run_dir, {"W-01": "confirm", "W-02": "reject"}, by="ana", expected_digest=None, expected_revision=None
    )
    assert replayed and a.operation_id == b.operation_id


def test_silence_is_never_approval(run_dir: Path) -> None:
    with pytest.raises(BadInput, match="no decision for W-02"):
        gates.confirm(run_dir, {"W-01": "confirm"}, by="ana", expected_digest=None, expected_revision=None)
    with pytest.raises(BadInput, match="amending W-01 needs --note"):
        gates.confirm(
            run_dir, {"W-01": "amend", "W-02": "confirm"}, by="ana", expected_digest=None, expected_revision=None
        )
    with pytest.raises(BadInput, match="W-07"):
        gates.confirm(
            run_dir,
            {"W-01": "confirm", "W-02": "confirm", "W-07": "confirm"},
            by="ana",
            expected_digest=None,
            expected_revision=None,
        )
    with pytest.raises(Blocked, match="gate 1 has no valid confirmation"):
        gates.confirmed_weaknesses(run_dir)  # proposals before the gate: blocked, with the confirm command


def _racer(run_dir: str, decision: str, revision: int, digest: str, barrier: Any, q: Any) -> None:
    barrier.wait()
    try:
        r, _ = gates.confirm(
            Path(run_dir),
            {"W-01": decision, "W-02": "confirm"},
            by=f"user-{decision}",
            expected_digest=digest,
            expected_revision=revision,
        )
        q.put(("won", r.operation_id))
    except NeedsRebase as exc:
        q.put(("needs_rebase", exc.one_line()))


def test_two_racing_confirmers_exactly_one_wins(run_dir: Path) -> None:
    base = handoff.load(run_dir)
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(2)
    q = ctx.Queue()
    procs = [
        ctx.Process(target=_racer, args=(str(run_dir), d, base.revision, base.shortlist_digest, barrier, q))
        for d in ("confirm", "reject")
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(20)
    results = sorted(q.get(timeout=5)[0] for _ in procs)
    assert results == ["needs_rebase", "won"]
    assert len(list((run_dir / "gates").glob("gate1-*.json"))) == 1
    assert handoff.load(run_dir).revision == base.revision + 1


def test_crash_between_receipt_and_handoff_is_finished_by_replay(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = handoff.load(run_dir)

    def boom(*a: Any, **k: Any) -> None:
        raise OSError("disk vanished")

    monkeypatch.setattr(gates, "_apply_receipt", boom)
    with pytest.raises(OSError):
        gates.confirm(
            run_dir,
            {"W-01": "confirm", "W-02": "confirm"},
            by="ana",
            expected_digest=None,
            expected_revision=base.revision,
            operation_id="op-crash",
        )
    assert handoff.load(run_dir).revision == base.revision  # receipt written, state not yet applied
    monkeypatch.undo()
    _, replayed = gates.confirm(
        run_dir,
        {"W-01": "confirm", "W-02": "confirm"},
        by="ana",
        expected_digest=None,
        expected_revision=base.revision,
        operation_id="op-crash",
    )
    assert replayed
    assert handoff.load(run_dir).userRootCauseConfirmation == "confirmed"


# -- through the CLI ------------------------------------------------------------------------------

runner = CliRunner()


def _confirm(run_dir: Path, digest: str | None, *decisions: str, extra: tuple[str, ...] = ()) -> Any:
    """``lunasol confirm RUN --decision D ... --by ana --digest DIGEST [extra]``."""
    args = ["confirm", str(run_dir)]
    for d in decisions:
        args += ["--decision", d]
    return runner.invoke(app, [*args, "--by", "ana", "--digest", str(digest), *extra])


def test_cli_confirm_and_status(run_dir: Path) -> None:
    digest = handoff.load(run_dir).shortlist_digest
    res = _confirm(run_dir, digest, "W-01=confirm", "W-02=amend", extra=("--note", "W-02=only review", "--json"))
    assert res.exit_code == 0, res.output
    assert '"userRootCauseConfirmation": "confirmed"' in res.output
    st = runner.invoke(app, ["status", str(run_dir)])
    assert st.exit_code == 0
    assert "userRootCauseConfirmation: confirmed" in st.output
    assert "next: lunasol propose" in st.output


def test_cli_stale_digest_exits_4(run_dir: Path) -> None:
    res = _confirm(run_dir, "sha256:" + "0" * 64, "W-01=confirm", "W-02=confirm")
    assert res.exit_code == 4
    assert "needs_rebase" in res.output


def test_cli_no_decision_off_a_terminal_is_bad_input(run_dir: Path) -> None:
    res = runner.invoke(app, ["confirm", str(run_dir), "--by", "ana"])
    assert res.exit_code == 2
    assert "silence is never approval" in res.output
    st = runner.invoke(app, ["status", str(run_dir), "--json"])
    assert st.exit_code == 0 and '"userRootCauseConfirmation": "pending"' in st.output


def test_cli_interactive_confirm_on_a_terminal(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pipeline.cli.gates as cli_gates

    monkeypatch.setattr(cli_gates, "on_terminal", lambda: True)
    # W-01: an invalid answer is asked again, then confirm without a note; W-02: amend (a note is required)
    res = runner.invoke(app, ["confirm", str(run_dir)], input="maybe\nconfirm\nn\namend\nreview only\nana\n")
    assert res.exit_code == 0, res.output
    assert "W-01" in res.output and "gate 1 recorded: confirmed" in res.output
    receipt = json.loads((run_dir / handoff.load(run_dir).receipts["gate1"]).read_text(encoding="utf-8"))
    assert receipt["by"] == "ana"
    assert receipt["request"]["decisions"]["W-02"] == {"decision": "amend", "note": "review only"}
