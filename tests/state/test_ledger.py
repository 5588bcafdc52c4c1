"""The run ledger: reuse, invalidation cascades, zero-call reruns, one-changed-cell reruns, resume, block receipts."""

from __future__ import annotations

import json
import shlex
import shutil
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.core.canonical import read_json
from pipeline.core.context import RunOptions
from pipeline.core.errors import Blocked, NeedsRebase
from pipeline.core.settings import ModelSettings
from pipeline.gates import gate1 as gates
from pipeline.models import read_calls
from pipeline.run.runner import run
from pipeline.state import handoff
from pipeline.state import ledger as ledger_mod
from pipeline.state.ledger import CellResults, Ledger, cell_key
from pipeline.testing.openai_server import FakeOpenAI, Reply, completion_body, server_error
from tests.sol.sol_helpers import change_cell, make_bundle

# -- unit ----------------------------------------------------------------------------------------------


def test_a_save_writes_what_a_full_dump_writes_after_any_changes(tmp_path: Path) -> None:
    """Saves re-dump only the entries changed since the last one; the file stays the whole ledger's dump,
    through batches, invalidations, another writer's change and a batch that raised."""
    from pipeline.core.canonical import pretty_json_plain

    def full(led: Ledger) -> bytes:  # what the ledger holds in memory, dumped whole
        return pretty_json_plain(led.data.model_dump(mode="json"))

    led = Ledger(tmp_path)
    with led.batch():
        for i in range(30):
            led.mark_verified(f"luna/C{i:03d}", "luna", {"ir": f"d{i}"})
    assert (tmp_path / "ledger.json").read_bytes() == full(led)
    led.mark_pending("luna/C004", "luna", {"ir": "new"}, reason="running")
    led.invalidate_many(["luna/C001", "luna/C002"], "upstream changed")
    assert (tmp_path / "ledger.json").read_bytes() == full(led)
    other = Ledger(tmp_path)  # another writer (a gate decision) changes one entry
    other.mark_verified("luna/C010", "luna", {"ir": "other"})
    led.mark_verified("luna/C011", "luna", {"ir": "mine"})  # reloads the other's change first
    saved = json.loads((tmp_path / "ledger.json").read_text())
    assert saved["entries"]["luna/C010"]["inputs"] == {"ir": "other"}
    assert saved["entries"]["luna/C011"]["inputs"] == {"ir": "mine"}
    assert (tmp_path / "ledger.json").read_bytes() == full(led)
    with pytest.raises(RuntimeError), led.batch():
        led.mark_verified("luna/C012", "luna", {"ir": "lost"})
        raise RuntimeError("the stage failed")
    led.mark_verified("luna/C013", "luna", {"ir": "after"})
    saved = json.loads((tmp_path / "ledger.json").read_text())
    assert saved["entries"]["luna/C012"]["inputs"] == {"ir": "d12"}  # the failed batch saved nothing
    assert (tmp_path / "ledger.json").read_bytes() == full(led)


def test_a_save_is_written_a_chunk_of_entries_at_a_time(tmp_path: Path) -> None:
    # At 100,000 cells the ledger holds 200,000 entries: a save never joins them all at once (800 MiB
    # when it did), and its chunks are exactly the whole dump, entries in name order, commas between.
    from pipeline.core.canonical import pretty_json_plain

    led = Ledger(tmp_path)
    assert b"".join(led._chunks(3)) == pretty_json_plain(led.data.model_dump(mode="json"))  # empty
    with led.batch():
        for i in reversed(range(10)):
            led.mark_verified(f"luna/C{i:03d}", "luna", {"ir": f"d{i}"})
    chunks = list(led._chunks(3))
    assert len(chunks) == 1 + 4 + 1  # head, 10 entries by 3, tail
    assert b"".join(chunks) == pretty_json_plain(led.data.model_dump(mode="json"))
    assert b"".join(chunks) == (tmp_path / "ledger.json").read_bytes()


def test_ledger_states_history_and_reasons(tmp_path: Path) -> None:
    led = Ledger(tmp_path)
    (tmp_path / "out.json").write_text("{}", encoding="utf-8")
    assert led.check("a", {"x": "1"}) == (False, "never made")
    led.mark_pending("a", "a", {"x": "1"})
    assert led.check("a", {"x": "1"})[0] is False
    led.mark_verified("a", "a", {"x": "1"}, led.output_digests(["out.json"]))
    assert led.check("a", {"x": "1"}, ["out.json"]) == (True, "verified")
    ok, why = led.check("a", {"x": "2"}, ["out.json"])
    assert not ok and why.startswith("inputs changed: x")
    (tmp_path / "out.json").write_text('{"edited": 1}', encoding="utf-8")
    assert led.check("a", {"x": "1"}, ["out.json"]) == (False, "an output was modified outside lunasol")
    led.invalidate("a", "because I said so")
    again = Ledger(tmp_path).get("a")  # persisted
    assert again is not None and again.state == "invalidated" and again.reason == "because I said so"
    assert again.history[-1].state == "verified"  # the earlier state is kept, not deleted


def test_a_ledger_parses_the_file_only_when_another_writer_changed_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[int] = []
    parse = ledger_mod._split
    monkeypatch.setattr(ledger_mod, "_split", lambda *a, **k: parsed.append(1) or parse(*a, **k))
    run = Ledger(tmp_path)
    for i in range(5):  # a run's own changes, one after the other: nothing to parse again
        run.mark_verified(f"s{i}", "s", {"x": str(i)})
        with run.batch():
            run.mark_pending(f"c{i}", "s", {})
    assert parsed == []
    gate = Ledger(tmp_path)  # another writer (a gate decision) parses it once and changes it
    assert len(parsed) == 1
    gate.mark_verified("gate1", "gate1", {"d": "1"})
    run.mark_verified("s9", "s", {})  # the run sees the gate's entry: parsed again, nothing lost
    assert len(parsed) == 2
    assert {"gate1", "s9"} <= set(Ledger(tmp_path).data.entries)
    assert run.get("gate1") is not None
    # a batch that raises saves nothing; the next change starts from the file, not the half change
    with pytest.raises(RuntimeError), run.batch():
        run.mark_verified("half", "s", {})
        raise RuntimeError("stage failed")
    run.mark_verified("s10", "s", {})
    assert run.get("half") is None and Ledger(tmp_path).get("half") is None
    assert Ledger(tmp_path).data == run.data


def test_a_ledger_in_another_form_loads_and_a_bad_entry_is_named(tmp_path: Path) -> None:
    """The file is split into entries by text only in the form lunasol writes; any other form of the
    same document (a hand edit, another tool) is parsed whole and still loads; a bad entry is one
    clear line naming it; a newer schema version is refused."""
    from pipeline.core.errors import BadInput

    led = Ledger(tmp_path)
    with led.batch():
        for i in range(3):
            led.mark_verified(f"luna/C{i}", "luna", {"ir": f"d{i}"}, {"luna/C{i}.json": f"o{i}"})
        led.invalidate("luna/C1", "cell C1 IR changed")
    path = tmp_path / "ledger.json"
    written = path.read_bytes()
    path.write_text(json.dumps(json.loads(written)))  # compact, one line
    other = Ledger(tmp_path)
    assert other.data == led.data and other.names_for_stage("luna") == ["luna/C0", "luna/C1", "luna/C2"]
    other.mark_pending("luna/C2", "luna", {"ir": "d9"})  # saved back in lunasol's own form
    assert json.loads(path.read_bytes())["entries"]["luna/C2"]["state"] == "pending"
    assert Ledger(tmp_path).get("luna/C1").history[0].state == "verified"  # type: ignore[union-attr]
    path.write_bytes(written.replace(b'"state": "invalidated"', b'"state": "gone"'))
    with pytest.raises(BadInput, match="entry luna/C1"):
        Ledger(tmp_path)
    path.write_bytes(written.replace(b'"schema_version": 1', b'"schema_version": 99'))
    with pytest.raises(BadInput, match="newer"):
        Ledger(tmp_path)


def test_a_ledger_holds_its_entries_as_text(tmp_path: Path) -> None:
    """At 100,000 cells a run's ledger has 200,000 entries: held as their text (about 0.4 KB each), not as
    pydantic objects (3.3 KB each), so it stays a small part of a run's memory."""
    led = Ledger(tmp_path)
    with led.batch():
        for i in range(2_000):
            digests = {"key": f"sha256:{i:064d}", "cell": f"sha256:{i + 1:064d}", "template": "sha256:" + "t" * 64}
            led.mark_verified(f"luna/C{i:05d}", "luna", digests, {f"luna/C{i:05d}.json": f"sha256:{i:064x}"})
    tracemalloc.start()
    held = Ledger(tmp_path)
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert size / 2_000 < 1_000, f"{size / 2_000:.0f} bytes an entry"
    assert held.get("luna/C01999") == led.get("luna/C01999") and len(held.names()) == 2_000


def test_a_released_ledger_holds_nothing_and_reads_the_file_again_when_used(tmp_path: Path) -> None:
    """The runner releases the ledger while a stage runs (200,000 entries at 100,000 cells): nothing is held,
    every query and change after it sees the file as it is then (another writer's entries included), and a
    save never writes the released (empty) state over the file."""
    led = Ledger(tmp_path)
    with led.batch():
        for i in range(3):
            led.mark_verified(f"luna/C{i}", "luna", {"ir": f"d{i}"}, {f"luna/C{i}.json": f"o{i}"})
        led.mark_verified("luna", "luna", {"x": "1"})
    path = tmp_path / "ledger.json"
    written = path.read_bytes()
    before = led.data

    led.release()
    assert led._texts == {} and led._stages == {}  # nothing held
    assert led.get("luna/C1") == before.entries["luna/C1"]  # a query reads the file again
    assert led.names_for_stage("luna") == ["luna", "luna/C0", "luna/C1", "luna/C2"]

    led.release()
    led.save()  # a save of a released ledger writes what the file holds, never an empty ledger
    assert path.read_bytes() == written

    led.release()
    Ledger(tmp_path).mark_verified("gate1", "gate1", {"d": "1"})  # another writer, while released
    assert led.names() == ["gate1", "luna", "luna/C0", "luna/C1", "luna/C2"]
    led.release()
    led.mark_pending("luna/C2", "luna", {"ir": "d9"})  # a change after a release keeps every entry
    assert set(Ledger(tmp_path).names()) == {"gate1", "luna", "luna/C0", "luna/C1", "luna/C2"}
    assert Ledger(tmp_path).get("luna/C2").state == "pending"  # type: ignore[union-attr]

    with led.batch(), pytest.raises(RuntimeError, match="inside batch"):
        led.release()  # the batch's changes are not saved yet: releasing them would lose them


def test_cell_results_are_keyed(tmp_path: Path) -> None:
    store = CellResults(tmp_path, "luna")
    k1 = cell_key(cell="sha256:a", template="t", model="m")
    store.put("C001", k1, {"answers": [1]})
    assert store.get("C001", k1) == {"answers": [1]}
    assert store.get("C001", cell_key(cell="sha256:b", template="t", model="m")) is None
    assert store.get("C002", k1) is None


# -- the runner end to end on a tiny bundle, through the local OpenAI-compatible server ----------------


def sol_answer() -> dict[str, Any]:
    # It cites the controller's state lines (e0001): events on the timeline Sol is shown (a citation of an
    # event Sol was not shown is refused).
    return {
        "weaknesses": [
            {
                "weakness_id": "W-01",
                "statement": "After a reviewer reports a blocker in design, the run re-checks the same source.",
                "first_divergence": {
                    "where": {"stage": "review", "actor": "reviewer", "what": "blocker reported"},
                    "cells": ["C001"],
                    "event_refs": ["C001-e0001"],
                },
                "harness_attribution": {"attributed": True, "why": "the controller offers no route back to design"},
                "support": {
                    "cells": ["C001", "C002", "C003"],
                    "pattern_groups": [],
                    "event_refs": ["C001-e0001", "C002-e0001", "C003-e0001"],
                },
                "alternative_explanations": ["the reviewer model is weak"],
                "counter_evidence": {"items": [{"cell": "C004", "refs": ["C004-e0001"], "note": "completed"}]},
                "counterfactual_prediction": "A new run re-checks an unchanged source after a blocker; a source change "
                "before the re-check refutes it.",
                "confidence": "medium",
            }
        ]
    }


def handler(request: dict[str, Any]) -> Reply:
    name = request["tools"][0]["function"]["name"] if request.get("tools") else ""
    data = (
        sol_answer()
        if name == "SolAnswer"
        else {"patterns": [], "rejected_candidates": [], "none_reason": "nothing repeats or is left open"}
    )
    return Reply(body=completion_body(request, tool_arguments=json.dumps(data)))


def calls(run_dir: Path, role: str) -> int:
    return sum(1 for c in read_calls(run_dir) if c["role"] == role)


@pytest.fixture
def setup(tmp_path: Path, runs_dir: Path, fake_llm: FakeOpenAI, model_settings: Any) -> dict[str, Any]:
    fake_llm.handler = handler
    bundle = make_bundle(tmp_path)
    opts = RunOptions(bundle=bundle, run_id="r1", runs_dir=runs_dir, models=model_settings())
    return {"bundle": bundle, "opts": opts, "run_dir": runs_dir / "r1", "fake": fake_llm}


@pytest.fixture(scope="module")
def _first_run(tmp_path_factory: pytest.TempPathFactory, _fake_llm_server: FakeOpenAI) -> Path:
    """One first run (bundle + run r1) for the module; ``ran`` copies it instead of running again."""
    root = tmp_path_factory.mktemp("ledger-first")
    _fake_llm_server.reset()
    _fake_llm_server.handler = handler
    settings = ModelSettings(
        model="openai/test-model", api_base=_fake_llm_server.base_url, timeout_s=5.0, instructor_mode="tools"
    )
    run(RunOptions(bundle=make_bundle(root), run_id="r1", runs_dir=root / "runs", models=settings), log=lambda _m: None)
    _fake_llm_server.reset()
    return root


@pytest.fixture
def ran(setup: dict[str, Any], _first_run: Path, tmp_path: Path) -> dict[str, Any]:
    """``setup`` after its first run (a copy of the module's; same depth, so run.json's relative bundle path holds)."""
    shutil.rmtree(setup["bundle"])
    shutil.copytree(_first_run, tmp_path, dirs_exist_ok=True)
    return setup


def test_first_run_stops_at_gate_1(setup: dict[str, Any]) -> None:
    res = run(setup["opts"], log=lambda _m: None)
    d = setup["run_dir"]
    assert res.ran == ["export", "select", "probes", "luna", "coordinator", "sol"]
    assert (calls(d, "luna"), calls(d, "sol")) == (5, 1)
    h = handoff.load(d)
    assert h.phase == "rootCausesMined" and h.userRootCauseConfirmation == "pending"
    led = Ledger(d)
    assert all(led.get(n).state == "verified" for n, _ in [("export", 0), ("luna", 0), ("sol", 0)])  # type: ignore[union-attr]
    assert led.get("luna/C003") is not None and led.get("ir/C003") is not None
    rj = read_json(d / "run.json")
    assert rj["inputs"]["bundle_digest"].startswith("sha256:") and rj["inputs"]["templates"]["sol"]
    assert rj["inputs"]["models"]["model"] == "openai/test-model"
    assert "export" in rj  # what the export stage wrote is kept


def test_no_ledger_holds_entries_while_a_stage_runs(setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A stage runs without the run's ledger entries in memory (2 per cell: 123 MiB at 100,000 cells)."""
    import dataclasses
    import gc

    from pipeline.run import runner

    held: dict[str, int] = {}

    def watched(stage: Any) -> Any:
        def go(ctx: Any) -> Any:
            gc.collect()
            held[stage.name] = sum(len(o._texts) for o in gc.get_objects() if isinstance(o, Ledger))
            return stage.run(ctx)

        return dataclasses.replace(stage, run=go)

    monkeypatch.setattr(runner, "STAGES", tuple(watched(s) for s in runner.STAGES))
    run(setup["opts"], log=lambda _m: None)
    assert list(held) == ["export", "select", "probes", "luna", "coordinator", "sol"]
    assert held == dict.fromkeys(held, 0)
    assert len(Ledger(setup["run_dir"]).names_for_stage("luna")) > 5  # the entries are all there afterwards


def test_unchanged_rerun_makes_zero_model_calls(ran: dict[str, Any]) -> None:
    d = ran["run_dir"]
    before = (d / "weakness-shortlist.json").read_bytes()
    n_requests = len(ran["fake"].requests)
    res = run(ran["opts"], log=lambda _m: None)
    assert res.ran == [] and res.reused == ["export", "select", "probes", "luna", "coordinator", "sol"]
    assert len(ran["fake"].requests) == n_requests
    assert (calls(d, "luna"), calls(d, "sol")) == (5, 1)
    assert (d / "weakness-shortlist.json").read_bytes() == before


def test_one_changed_cell_costs_one_luna_call_and_invalidates_downstream(ran: dict[str, Any]) -> None:
    d = ran["run_dir"]
    gates.confirm(d, {"W-01": "confirm"}, by="ana", expected_digest=None, expected_revision=None)
    old_receipt = d / handoff.load(d).receipts["gate1"]
    old_digest = handoff.load(d).shortlist_digest
    change_cell(ran["bundle"], "C002")
    logs: list[str] = []
    ran["opts"].supersede = True  # gate 1 holds a decision: a rerun into this run id must say so
    res = run(ran["opts"], log=logs.append)
    assert res.ran == ["export", "select", "probes", "luna", "coordinator", "sol"]
    assert (calls(d, "luna"), calls(d, "sol")) == (6, 2)  # exactly one more Luna call, one more Sol call
    new_luna = [c for c in read_calls(d) if c["role"] == "luna"][-1]
    assert new_luna["cell_id"] == "C002"
    led = Ledger(d)
    ir2 = led.get("ir/C002")
    assert ir2 is not None and any(h.reason == "cell C002 IR changed" for h in ir2.history)
    assert led.get("ir/C001").history == []  # type: ignore[union-attr]  # untouched cells stay as they were
    luna2 = led.get("luna/C002")
    assert luna2 is not None and luna2.state == "verified" and luna2.history[-1].state == "invalidated"
    # the gate-1 decision was made on the old shortlist: invalidated (receipt kept), gate reopened
    g = led.get("gate1")
    assert g is not None and g.state == "invalidated" and "upstream export recomputed" in (g.reason or "")
    assert old_receipt.is_file()
    assert handoff.load(d).userRootCauseConfirmation == "pending"
    assert any("invalidated downstream" in line for line in logs)
    # deciding on the old shortlist now: needs_rebase, saying what changed
    with pytest.raises(NeedsRebase, match="same weaknesses; other fields changed"):
        gates.confirm(d, {"W-01": "confirm"}, by="bo", expected_digest=old_digest, expected_revision=None)
    assert (d / "superseded").is_dir()  # the outputs it replaced are kept


def test_a_rerun_into_a_gated_run_id_is_refused_unless_told_to_supersede(ran: dict[str, Any]) -> None:
    d = ran["run_dir"]
    digest = handoff.load(d).shortlist_digest
    gates.confirm(d, {"W-01": "confirm"}, by="alice", expected_digest=digest)
    before = {p: p.read_bytes() for p in (d / "handoff.json", d / "ledger.json", d / "weakness-shortlist.json")}
    n_requests = len(ran["fake"].requests)
    opts = ran["opts"]
    argv = ["run", str(opts.bundle), "--run-id", "r1", "--runs-dir", str(opts.runs_dir)]
    argv += ["--model", str(opts.models.model), "--api-base", str(opts.models.api_base), "--mode", "tools"]
    for extra in (["--resume"], []):  # the same bundle resumed, then a changed one
        if not extra:
            change_cell(ran["bundle"], "C002")
        res = CliRunner().invoke(app, [*argv, *extra])
        assert res.exit_code == 2, res.output
        err = res.stderr.strip()
        assert err.count("\n") == 0 and "Traceback" not in res.output
        assert "holds gate decisions (gate 1: alice recorded confirmed (W-01=confirm)" in err and "--supersede" in err
    # nothing was touched and nothing was asked
    assert {p: p.read_bytes() for p in before} == before and len(ran["fake"].requests) == n_requests
    res = CliRunner().invoke(app, [*argv, "--supersede"])
    assert res.exit_code == 0, res.output
    h = handoff.load(d)
    assert h.userRootCauseConfirmation == "pending" and h.shortlist_digest != digest
    # status lists the voided receipt as voided, never as the current decision
    st = CliRunner().invoke(app, ["status", str(d)])
    assert "receipt gate1:" not in st.output and "voided gate1:" in st.output
    assert "--base none" in st.output.splitlines()[-1]
    # now nothing stands: a rerun needs no --supersede
    assert CliRunner().invoke(app, argv).exit_code == 0


def test_blocked_sol_writes_receipt_and_resume_repeats_no_finished_call(setup: dict[str, Any]) -> None:
    d = setup["run_dir"]

    def sol_down(request: dict[str, Any]) -> Reply:
        name = request["tools"][0]["function"]["name"] if request.get("tools") else ""
        return server_error(503) if name == "SolAnswer" else handler(request)

    setup["fake"].handler = sol_down
    with pytest.raises(Blocked) as exc:
        run(setup["opts"], log=lambda _m: None)
    assert "block-receipt.json" in exc.value.one_line() and "--resume" in exc.value.unblock
    receipt = read_json(d / "block-receipt.json")
    assert receipt["stage"] == "sol" and receipt["requested_unblock"].endswith("--resume")
    assert "luna" in receipt["work_kept"]
    assert Ledger(d).get("sol").state == "pending"  # type: ignore[union-attr]
    assert "BLOCKED at sol" in CliRunner().invoke(app, ["status", str(d)]).output
    setup["fake"].handler = handler
    luna_before = calls(d, "luna")
    setup["opts"].resume = True
    res = run(setup["opts"], log=lambda _m: None)
    assert res.ran == ["sol"]
    assert calls(d, "luna") == luna_before
    assert not (d / "block-receipt.json").exists() and list((d / "block-receipts").glob("*.json"))


def test_a_cell_failing_on_transport_leaves_luna_pending_and_resume_retries_exactly_it(
    setup: dict[str, Any],
) -> None:
    d = setup["run_dir"]

    def c003_down(request: dict[str, Any]) -> Reply:
        luna = "LunaAnswer" in json.dumps(request.get("tools"))
        return server_error(503) if luna and "C003" in json.dumps(request.get("messages")) else handler(request)

    setup["fake"].handler = c003_down
    lines: list[str] = []
    result = run(setup["opts"], log=lines.append)  # one cell down does not block the run
    assert result.pending and "C003" in result.pending[0]
    assert any(line.startswith("NOT verified: luna: 1 cell(s) failed (C003)") and "--resume" in line for line in lines)
    entry = Ledger(d).get("luna")
    assert entry is not None and entry.state == "pending" and "C003" in (entry.reason or "")
    assert set(CellResults(d, "luna").records()) == {"C001", "C002", "C004", "C005"}
    ok_before = calls(d, "luna")
    setup["fake"].handler = handler
    setup["opts"].resume = True
    run(setup["opts"], log=lambda _m: None)
    assert calls(d, "luna") == ok_before + 1  # only C003 is asked again
    assert [c["cell_id"] for c in read_calls(d) if c["role"] == "luna"][-1] == "C003"
    entry = Ledger(d).get("luna")
    assert entry is not None and entry.state == "verified"


def test_provider_down_for_everyone_blocks(setup: dict[str, Any]) -> None:
    setup["fake"].handler = lambda _r: server_error(503)
    with pytest.raises(Blocked, match="in a row failed"):
        run(setup["opts"], log=lambda _m: None)


def test_cli_run_blocked_exits_3_with_one_line(setup: dict[str, Any], tmp_path: Path) -> None:
    empty = tmp_path / "store"
    empty.mkdir()
    res = CliRunner().invoke(
        app,
        [
            "run",
            str(setup["bundle"]),
            "--run-id",
            "r2",
            "--runs-dir",
            str(setup["run_dir"].parent),
            "--replay",
            str(empty),
            "--model",
            "openai/test-model",
        ],
    )
    assert res.exit_code == 3, res.output
    assert "Traceback" not in res.output
    receipt = read_json(setup["run_dir"].parent / "r2" / "block-receipt.json")
    assert "--record" in receipt["requested_unblock"] and "--run-id r2" in receipt["requested_unblock"]


def test_cli_dry_run_calls_nothing(setup: dict[str, Any]) -> None:
    res = CliRunner().invoke(
        app,
        [
            "run",
            str(setup["bundle"]),
            "--run-id",
            "r3",
            "--runs-dir",
            str(setup["run_dir"].parent),
            "--dry-run",
            "--model",
            "openai/gpt-4o-mini",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "luna" in res.output and "sol" in res.output and "nothing was called" in res.output
    assert setup["fake"].requests == []
    assert not (setup["run_dir"].parent / "r3").exists()


def test_resume_refuses_a_changed_bundle(ran: dict[str, Any]) -> None:
    change_cell(ran["bundle"], "C001")
    ran["opts"].resume = True
    from pipeline.core.errors import BadInput

    with pytest.raises(BadInput, match="bundle changed"):
        run(ran["opts"], log=lambda _m: None)
    shutil.rmtree(ran["run_dir"])


def test_bad_bundle_leaves_no_run_directory(setup: dict[str, Any]) -> None:
    from pipeline.core.errors import BundleError

    (setup["bundle"] / "cells" / "C001" / "controller.jsonl").write_text("changed\n", encoding="utf-8")  # not re-frozen
    with pytest.raises(BundleError):
        run(setup["opts"], log=lambda _m: None)
    assert not setup["run_dir"].exists()


def test_a_second_concurrent_run_is_refused(setup: dict[str, Any]) -> None:
    from pipeline.core.errors import BadInput
    from pipeline.run.runner import _exclusive_run

    d = setup["run_dir"]
    d.mkdir(parents=True)
    with _exclusive_run(d), pytest.raises(BadInput, match="another lunasol run is working"):
        run(setup["opts"], log=lambda _m: None)


def test_sol_without_a_parseable_answer_blocks_with_what_was_tried(setup: dict[str, Any]) -> None:
    from pipeline.testing.openai_server import raw_answer

    d = setup["run_dir"]

    def garbage_for_sol(request: dict[str, Any]) -> Reply:
        name = request["tools"][0]["function"]["name"] if request.get("tools") else ""
        return raw_answer('{"weaknesses": "not a list"}')(request) if name == "SolAnswer" else handler(request)

    setup["fake"].handler = garbage_for_sol
    for attempt in (1, 2):
        res = CliRunner().invoke(app, ["run", str(setup["bundle"]), "--run-id", "r1", "--runs-dir",
                                       str(d.parent), "--model", "openai/test-model", "--api-base",
                                       setup["fake"].base_url])  # fmt: skip
        assert res.exit_code == 3, res.output
        assert "blocked at sol" in res.output and "Traceback" not in res.output
        receipt = read_json(d / "block-receipt.json")
        assert receipt["tried_actions"] and receipt["tried_actions"][0]["outcome"]
        assert receipt.get("repeats", 1) == attempt  # the same wall twice is called out
        assert "--model OTHER_MODEL --resume" in receipt["requested_unblock"]
        assert "--run-id r1" in receipt["requested_unblock"]
    assert not (d / "weakness-shortlist.json").exists()  # nothing partial kept


def test_the_resume_command_keeps_the_settings_a_local_server_needs(setup: dict[str, Any]) -> None:
    """--mode, --max-tokens, --timeout and --concurrency are in the printed resume command, and it reuses every answer.

    Without them the resume would send other requests (mode and max_tokens are in every key: answers paid
    again) at the defaults a CPU server cannot meet (120 s, 8 requests at once).
    """
    d = setup["run_dir"]

    def by_schema(request: dict[str, Any]) -> Reply:
        text = json.dumps(request)
        assert not request.get("tools")  # json mode: the schema is in the prompt
        if "LunaAnswer" in text and "C003" in json.dumps(request.get("messages")):
            return server_error(503)
        data = sol_answer() if "SolAnswer" in text else json.loads(handler_args(request))
        return Reply(body=completion_body(request, tool_arguments=json.dumps(data)))

    def handler_args(request: dict[str, Any]) -> str:
        return json.dumps({"patterns": [], "rejected_candidates": [], "none_reason": "nothing repeats or is left open"})

    setup["fake"].handler = by_schema
    opts = setup["opts"]
    opts.models = opts.models.model_copy(
        update={"instructor_mode": "json", "max_tokens": 64, "timeout_s": 7.0, "concurrency": 2}
    )
    lines: list[str] = []
    run(opts, log=lines.append)
    (line,) = [ln for ln in lines if ln.startswith("NOT verified: luna")]
    command = line.split("retry exactly those with: ", 1)[1]
    argv = shlex.split(command)
    assert argv[:2] == ["lunasol", "run"]
    for flag, value in (("--mode", "json"), ("--max-tokens", "64"), ("--timeout", "7"), ("--concurrency", "2")):
        assert argv[argv.index(flag) + 1] == value, (flag, command)
    requests_before = len(setup["fake"].requests)
    luna_before = calls(d, "luna")

    def healthy(request: dict[str, Any]) -> Reply:
        text = json.dumps(request)
        data = sol_answer() if "SolAnswer" in text else json.loads(handler_args(request))
        return Reply(body=completion_body(request, tool_arguments=json.dumps(data)))

    setup["fake"].handler = healthy
    res = CliRunner().invoke(app, argv[1:])
    assert res.exit_code == 0, res.output
    assert calls(d, "luna") == luna_before + 1  # only C003: the others' keys (same mode, same max_tokens) held
    # C003, then Sol again (its input, Luna's patterns, changed), both asked as the first run asked
    resumed = setup["fake"].requests[requests_before:]
    assert len(resumed) == 2
    assert all(r.get("max_tokens") == 64 and not r.get("tools") for r in resumed)
    assert Ledger(d).get("luna").state == "verified"  # type: ignore[union-attr]


def test_no_sol_call_when_luna_analysed_no_cell(setup: dict[str, Any]) -> None:
    """Every cell's answers fail the checks (a model too weak for the task): Sol is not asked to explain nothing."""
    d = setup["run_dir"]

    def nonsense(request: dict[str, Any]) -> Reply:
        name = request["tools"][0]["function"]["name"] if request.get("tools") else ""
        if name == "SolAnswer":
            return handler(request)
        pattern = {
            "type": "omission",
            "concerns": "target:xxx",
            "observed": "xxxxxxxxxxxx",
            "definition_fit": "xxxxxxxxxxxx",
            "evidence": ["C999-e0001"],  # no such event: the check rejects it, every time
            "state_changed": False,
            "candidates": [],
            "confidence": "high",
        }
        data = {"patterns": [pattern], "rejected_candidates": [], "none_reason": None}
        return Reply(body=completion_body(request, tool_arguments=json.dumps(data)))

    setup["fake"].handler = nonsense
    with pytest.raises(Blocked, match=r"Luna analysed none of the 5 eligible cell\(s\)") as exc:
        run(setup["opts"], log=lambda _m: None)
    assert calls(d, "sol") == 0
    assert not [r for r in setup["fake"].requests if "SolAnswer" in json.dumps(r.get("tools"))]
    assert exc.value.unblock.endswith("--resume") and "BUNDLE" not in exc.value.unblock
    receipt = read_json(d / "block-receipt.json")
    assert receipt["stage"] == "sol" and receipt["constraint_class"] == "missing_data"
    assert Ledger(d).get("luna").state == "pending"  # type: ignore[union-attr]
    assert not (d / "weakness-shortlist.json").exists()
    # a resume against a model that answers asks exactly the failed cells, then Sol
    setup["fake"].handler = handler
    setup["opts"].resume = True
    res = run(setup["opts"], log=lambda _m: None)
    assert "sol" in res.ran and calls(d, "sol") == 1


def test_records_read_only_files_this_process_has_not_seen_as_they_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CellResults(tmp_path, "luna")
    written = {c: store.put(c, f"k-{c}", {"n": i}, inputs={"cell": f"d-{c}"}) for i, c in enumerate(["C1", "C2"])}
    opened: list[str] = []
    real_open = open

    def counting_open(path: Any, *a: Any, **k: Any) -> Any:
        opened.append(str(path))
        return real_open(path, *a, **k)

    monkeypatch.setattr(ledger_mod, "open", counting_open, raising=False)
    records = store.records()
    assert {c: r.file_digest for c, r in records.items()} == written and opened == []  # just written: not read
    assert records["C1"].key == "k-C1" and records["C1"].inputs == {"cell": "d-C1"}
    # changed behind this process's back (same key, other bytes): read again, the new digest recorded
    other = json.loads(store.path("C1").read_text())
    other["value"] = {"n": 99}
    store.path("C1").write_text(json.dumps(other))
    again = store.records()
    assert opened == [str(store.path("C1"))]
    assert again["C1"].file_digest == ledger_mod.sha256_bytes(store.path("C1").read_bytes()) != written["C1"]
    assert again["C2"] == records["C2"]
    # a new process (nothing seen) reads every file and finds the same records
    monkeypatch.setattr(ledger_mod, "_seen", {})
    assert CellResults(tmp_path, "luna").records() == again
    # what is not a result is left out, read or not
    (tmp_path / "luna" / "C3.json").write_text("not json")
    (tmp_path / "luna" / "C4.json").write_text('{"no": "key"}')
    assert set(store.records()) == {"C1", "C2"}


def test_cell_results_forget_what_the_process_remembers_and_still_read_the_files(tmp_path: Path) -> None:
    """After the runner records a stage's results it drops their records (``_seen``: ~0.5 KB a cell, ~50 MB at
    100,000 cells); the records then come from the files, the same."""
    store, other = CellResults(tmp_path, "luna"), CellResults(tmp_path / "elsewhere", "luna")
    for i in range(3):
        store.put(f"C{i}", f"k{i}", {"n": i}, {"cell": f"d{i}"})
    other.put("C9", "k9", {"n": 9})
    before = store.records()
    assert set(ledger_mod._seen[str(store.dir)]) == {"C0.json", "C1.json", "C2.json"}
    store.forget()
    assert str(store.dir) not in ledger_mod._seen
    assert set(ledger_mod._seen[str(other.dir)]) == {"C9.json"}  # another run's records are not this store's to drop
    assert store.records() == before


def test_what_the_process_remembers_of_a_result_takes_one_string(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record is held through the whole stage that writes it (100,000 at 100,000 cells): one string each,
    not a tuple of the stat's ints, a dataclass and its strings (820 bytes a record here before)."""
    store = CellResults(tmp_path, "luna")
    template, model = "sha256:" + "7" * 64, "openai/some-model"
    inputs = [{"cell": f"sha256:{i:064x}", "template": template, "model": model} for i in range(2_000)]
    keys = [f"sha256:{i + 1:064x}" for i in range(2_000)]
    before = len(ledger_mod._seen.get(str(store.dir), {}))
    tracemalloc.start()
    try:
        for i in range(2_000):
            store.put(f"C{i:05d}", keys[i], {"n": i}, inputs[i])
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(ledger_mod._seen[str(store.dir)]) == before + 2_000
    assert held / 2_000 < 600, f"{held / 2_000:.0f} bytes held per record"
    records = store.records()  # each from what was remembered, equal to what the files say
    monkeypatch.setattr(ledger_mod, "_seen", {})  # a new process: every file read
    assert records == store.records() and records["C00007"].inputs == inputs[7]
