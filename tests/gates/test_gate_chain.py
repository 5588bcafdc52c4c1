"""Gates bound to the decision chain the decider read: racing deciders, a change of mind, supersede, replay.

A decision binds to the subject's digest and to the gate's standing decision (``--base``: its
operation id, or ``none``). These tests race real processes (forked library calls and ``lunasol``
subprocesses) and walk the CLI as a person would, copying the commands lunasol prints.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.core.canonical import sha256_file
from pipeline.core.errors import NeedsRebase
from pipeline.gates import gate1 as gates
from pipeline.gates.gate2 import select
from pipeline.state import handoff
from pipeline.state.ledger import Ledger
from tests.gates.test_gates import open_gate

runner = CliRunner()
N = 20
ROOT = Path(__file__).resolve().parents[2]  # the subprocesses import this checkout's lunasol (sys.path[0] = cwd)


@pytest.fixture
def run_dir(runs_dir: Path) -> Path:
    d = runs_dir / "r1"
    d.mkdir()
    open_gate(d)
    return d


def _proposals(run_dir: Path) -> str:
    """Gate 1 confirmed and two proposals written: gate 2 open; return the proposals digest."""
    digest = handoff.load(run_dir).shortlist_digest
    gates.confirm(run_dir, {"W-01": "confirm", "W-02": "confirm"}, by="ana", expected_digest=digest)
    path = run_dir / "proposals.yaml"
    path.write_text("proposals:\n- proposal_id: P-01\n- proposal_id: P-02\n", encoding="utf-8")
    pdigest = sha256_file(path)
    handoff.update(
        run_dir,
        {"proposalGeneration": "done", "proposalSelection": "pending", "proposals_digest": pdigest},
        "proposals generated (test)",
    )
    return pdigest


# -- racing deciders ------------------------------------------------------------------------------


def _confirm_racer(run_dir: str, i: int, digest: str, barrier: Any, q: Any) -> None:
    barrier.wait()
    # Half of them under the same name (the name does not decide who wins); every decision differs.
    decision = {"W-01": "confirm" if i % 2 else "reject", "W-02": "confirm" if i % 3 else "unresolved"}
    try:
        r, replayed = gates.confirm(
            Path(run_dir),
            decision,
            by="same" if i < N // 2 else f"user-{i}",
            expected_digest=digest,
            notes={"W-01": f"racer {i}"},
        )
        q.put(("replayed" if replayed else "won", r.operation_id))
    except NeedsRebase as exc:
        q.put(("needs_rebase", exc.one_line()))


def _select_racer(run_dir: str, i: int, digest: str, barrier: Any, q: Any) -> None:
    barrier.wait()
    try:
        r, replayed = select(
            Path(run_dir),
            choice="proposal",
            proposal_id=f"P-0{1 + i % 2}",
            note=f"racer {i}",
            by=f"user-{i}",
            expected_digest=digest,
        )
        q.put(("replayed" if replayed else "won", r.operation_id))
    except NeedsRebase as exc:
        q.put(("needs_rebase", exc.one_line()))


def _race(target: Any, run_dir: Path, digest: str) -> list[tuple[str, str]]:
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(N)
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(str(run_dir), i, digest, barrier, q)) for i in range(N)]
    for p in procs:
        p.start()
    results = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    return results


def test_twenty_racing_confirmers_exactly_one_wins(run_dir: Path) -> None:
    base = handoff.load(run_dir)
    results = _race(_confirm_racer, run_dir, str(base.shortlist_digest))
    won = [op for kind, op in results if kind == "won"]
    refused = [line for kind, line in results if kind == "needs_rebase"]
    assert len(won) == 1 and len(refused) == N - 1, results
    winner = gates.standing(run_dir, "gate1")
    assert winner is not None and winner.operation_id == won[0]
    # every loser is told who decided what, and how to replace it
    assert all(
        f"already decided: {winner.by} recorded" in line and f"--base {won[0]} --supersede" in line for line in refused
    )
    assert len(list((run_dir / "gates").glob("gate1-*.json"))) == 1
    assert handoff.load(run_dir).revision == base.revision + 1


def test_twenty_racing_selectors_exactly_one_wins(run_dir: Path) -> None:
    pdigest = _proposals(run_dir)
    before = handoff.load(run_dir).revision
    results = _race(_select_racer, run_dir, pdigest)
    won = [op for kind, op in results if kind == "won"]
    assert len(won) == 1 and sum(kind == "needs_rebase" for kind, _ in results) == N - 1, results
    assert len(list((run_dir / "gates").glob("gate2-*.json"))) == 1
    h = handoff.load(run_dir)
    assert h.revision == before + 1 and h.proposalSelection == "selected"


@pytest.mark.slow
@pytest.mark.parametrize("gate", ["confirm", "select"])
def test_twenty_lunasol_processes_at_once_exactly_one_exit_0(run_dir: Path, gate: str) -> None:
    if gate == "confirm":
        digest = str(handoff.load(run_dir).shortlist_digest)
        argvs = [
            [
                "confirm",
                str(run_dir),
                "--decision",
                f"W-01={'confirm' if i % 2 else 'reject'}",
                "--decision",
                "W-02=confirm",
                "--by",
                f"user-{i}",
                "--digest",
                digest,
            ]
            for i in range(N)
        ]
    else:
        digest = _proposals(run_dir)
        argvs = [
            ["select", str(run_dir), "--proposal", f"P-0{1 + i % 2}", "--by", f"user-{i}", "--digest", digest]
            for i in range(N)
        ]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", "from pipeline.cli.app import main; main()", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for argv in argvs
    ]
    outs = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    codes = sorted(code for code, _, _ in outs)
    assert codes == [0] + [4] * (N - 1), outs
    for code, _out, err in outs:
        if code == 4:
            assert err.strip().count("\n") == 0 and "needs_rebase" in err and "already decided" in err


# -- a person at the CLI ------------------------------------------------------------------------------


def _next(output: str) -> str:
    line = next(ln for ln in output.splitlines() if ln.startswith("next: "))
    return line.removeprefix("next: ")


def test_printed_commands_carry_the_chain_base(run_dir: Path) -> None:
    st = runner.invoke(app, ["status", str(run_dir)])
    assert "--base none" in _next(st.output) and "--supersede" not in _next(st.output)
    # an all-unresolved decision keeps gate 1 pending: the next command replaces it, by its id
    digest = str(handoff.load(run_dir).shortlist_digest)
    r, _ = gates.confirm(run_dir, {"W-01": "unresolved", "W-02": "unresolved"}, by="ana", expected_digest=digest)
    st = runner.invoke(app, ["status", str(run_dir)])
    assert f"--base {r.operation_id} --supersede" in _next(st.output)


def _cli_confirm(run_dir: Path, by: str, w01: str, *extra: str) -> Any:
    digest = str(handoff.load(run_dir).shortlist_digest)
    args = ["confirm", str(run_dir), "--decision", f"W-01={w01}", "--decision", "W-02=confirm"]
    return runner.invoke(app, [*args, "--by", by, "--digest", digest, *extra])


def _base_in(line: str) -> str:
    m = re.search(r"--base (\S+) --supersede", line)
    assert m, line
    return m.group(1)


def test_alice_then_bob_without_supersede_is_refused_naming_alice(run_dir: Path) -> None:
    alice = _cli_confirm(run_dir, "alice", "confirm")
    assert alice.exit_code == 0, alice.output
    receipt_a = gates.standing(run_dir, "gate1")
    assert receipt_a is not None
    bob = _cli_confirm(run_dir, "bob", "reject")
    assert bob.exit_code == 4
    err = bob.stderr.strip()
    assert err.count("\n") == 0 and "needs_rebase" in err
    assert f"alice recorded confirmed (W-01=confirm, W-02=confirm) at {receipt_a.decided_at}" in err
    # the command it prints is bob's own decision on alice's: it replaces hers, saying so
    assert "--by bob" in err and f"--base {receipt_a.operation_id} --supersede" in err
    assert handoff.load(run_dir).userRootCauseConfirmation == "confirmed"  # nothing moved
    # --supersede alone is not enough: the base is what bob read (none), and alice's decision stands
    blind = _cli_confirm(run_dir, "bob", "reject", "--supersede")
    assert blind.exit_code == 4 and "alice recorded" in blind.stderr
    ok = _cli_confirm(run_dir, "bob", "reject", "--base", _base_in(err), "--supersede")
    assert ok.exit_code == 0, ok.output
    assert f"supersedes alice's confirmed ({receipt_a.operation_id}" in ok.output
    receipt_b = gates.standing(run_dir, "gate1")
    assert receipt_b is not None and receipt_b.by == "bob"
    assert receipt_b.supersedes is not None and receipt_b.supersedes.by == "alice"
    assert receipt_b.base_decision == receipt_a.operation_id
    assert handoff.load(run_dir).userRootCauseConfirmation == "partially_confirmed"
    assert any("superseding alice's" in e.event for e in handoff.load(run_dir).history)


def test_change_of_mind_ends_with_the_last_decision(run_dir: Path) -> None:
    first = _cli_confirm(run_dir, "ana", "confirm")
    assert first.exit_code == 0 and "gate 1 recorded: confirmed" in first.output
    # the person copies the base lunasol printed (the refusal, or status)
    base = gates.standing(run_dir, "gate1").operation_id  # type: ignore[union-attr]
    second = _cli_confirm(run_dir, "ana", "reject", "--base", base, "--supersede")
    assert second.exit_code == 0 and "gate 1 recorded: partially_confirmed" in second.output, second.output
    base2 = gates.standing(run_dir, "gate1").operation_id  # type: ignore[union-attr]
    third = _cli_confirm(run_dir, "ana", "confirm", "--base", base2, "--supersede")
    assert third.exit_code == 0 and "gate 1 recorded: confirmed" in third.output, third.output
    assert "replayed" not in third.output
    assert gates.confirmed_weaknesses(run_dir) == {
        "W-01": {"decision": "confirm", "note": None},
        "W-02": {"decision": "confirm", "note": None},
    }
    assert len({base, base2, gates.standing(run_dir, "gate1").operation_id}) == 3  # type: ignore[union-attr]
    # a retried identical command is still a replay: nothing changes
    rev = handoff.load(run_dir).revision
    again = _cli_confirm(run_dir, "ana", "confirm", "--base", base2, "--supersede")
    assert again.exit_code == 0 and "gate 1 replayed (nothing changed): confirmed" in again.output
    assert "no longer stands" not in again.output
    assert handoff.load(run_dir).revision == rev
    # the very first command, retried now, replays too, and says its decision no longer stands
    old = _cli_confirm(run_dir, "ana", "confirm")
    assert old.exit_code == 0 and "replayed" in old.output and "it no longer stands" in old.output


def test_superseding_gate_1_voids_proposals_and_gate_2(run_dir: Path) -> None:
    pdigest = _proposals(run_dir)
    sel, _ = select(run_dir, choice="proposal", proposal_id="P-01", by="bo", expected_digest=pdigest)
    head = gates.standing(run_dir, "gate1")
    assert head is not None and gates.standing(run_dir, "gate2") == sel
    res = _cli_confirm(run_dir, "ana", "reject", "--base", head.operation_id, "--supersede")
    assert res.exit_code == 0, res.output
    h = handoff.load(run_dir)
    assert (h.proposalGeneration, h.proposalSelection, h.proposals_digest) == ("not_started", "not_started", None)
    assert gates.standing(run_dir, "gate2") is None
    led = Ledger(run_dir)
    assert led.get("gate2").state == "invalidated"  # type: ignore[union-attr]
    st = runner.invoke(app, ["status", str(run_dir), "--json"])
    shown = json.loads(st.stdout)["gates"]
    assert shown["gate2"]["standing"] is False and "superseded by gate-1 decision" in shown["gate2"]["voided"]
    assert shown["gate1"]["standing"] is True and shown["gate1"]["by"] == "ana"
    text = runner.invoke(app, ["status", str(run_dir)]).output
    assert "receipt gate2:" not in text and "voided gate2:" in text


def test_select_supersede_names_the_standing_selection(run_dir: Path) -> None:
    pdigest = _proposals(run_dir)
    first, _ = select(run_dir, choice="proposal", proposal_id="P-01", by="alice", expected_digest=pdigest)
    with pytest.raises(NeedsRebase, match=r"gate 2 already decided: alice recorded selected \(P-01\)") as exc:
        select(run_dir, choice="proposal", proposal_id="P-02", by="bob", expected_digest=pdigest)
    assert f"--base {first.operation_id} --supersede" in exc.value.one_line()
    second, _ = select(
        run_dir,
        choice="proposal",
        proposal_id="P-02",
        by="bob",
        expected_digest=pdigest,
        expected_base=first.operation_id,
        supersede=True,
    )
    assert second.supersedes is not None and second.supersedes.by == "alice"
    assert gates.standing(run_dir, "gate2") == second
    # a base that is no longer the head (alice's, superseded) is stale
    with pytest.raises(NeedsRebase, match="bob recorded selected"):
        select(
            run_dir,
            choice="none",
            by="carol",
            expected_digest=pdigest,
            expected_base=first.operation_id,
            supersede=True,
        )


def test_interactive_confirm_binds_the_base_it_showed(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pipeline.cli.gates as cli_gates

    monkeypatch.setattr(cli_gates, "on_terminal", lambda: True)
    answers = "confirm\nn\nconfirm\nn\nana\n"
    first = runner.invoke(app, ["confirm", str(run_dir)], input=answers)
    assert first.exit_code == 0 and "gate 1 recorded: confirmed" in first.output, first.output
    head = gates.standing(run_dir, "gate1")
    assert head is not None and head.base_decision == "none"
    # a decision stands: said before any question, with how to replace it
    again = runner.invoke(app, ["confirm", str(run_dir)], input=answers)
    assert again.exit_code == 4 and "already decided: ana recorded confirmed" in again.stderr
    assert "W-01 (" not in again.output  # nothing was asked
    replaced = runner.invoke(app, ["confirm", str(run_dir), "--supersede"], input="reject\nn\nconfirm\nn\nbo\n")
    assert replaced.exit_code == 0, replaced.output
    assert "replacing the decision standing: ana recorded confirmed" in replaced.output
    now = gates.standing(run_dir, "gate1")
    assert now is not None and now.base_decision == head.operation_id and now.supersedes is not None


def test_the_report_says_which_receipt_stands(run_dir: Path) -> None:
    from pipeline.artifacts.rundir import RunDir
    from pipeline.report.build import _gate1_decisions, _gate_receipts

    assert _cli_confirm(run_dir, "alice", "confirm").exit_code == 0
    alice = gates.standing(run_dir, "gate1")
    assert alice is not None
    assert _cli_confirm(run_dir, "bob", "reject", "--base", alice.operation_id, "--supersede").exit_code == 0
    arts = RunDir(run_dir).read(frozenset({"gates", "handoff", "ledger"}))
    states = {r["by"]: r["state"] for r in _gate_receipts(arts)}
    assert states == {
        "alice": f"superseded by bob ({gates.standing(run_dir, 'gate1').operation_id})",  # type: ignore[union-attr]
        "bob": "stands",
    }
    assert _gate1_decisions(arts)["W-01"] == "reject"  # the cards show bob's decision, not alice's
    Ledger(run_dir).invalidate("gate1", "upstream sol recomputed: test")  # as a rerun that changed the shortlist
    arts = RunDir(run_dir).read(frozenset({"gates", "handoff", "ledger"}))
    assert {r["by"]: r["state"] for r in _gate_receipts(arts)}["bob"].startswith("voided")
    assert _gate1_decisions(arts) == {}
