"""The proposer through the real model client and a local OpenAI-compatible server, and gate 2.

Answers are hand-written fixtures (cards from tests/cards/valid), routed by the weakness id the prompt names.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.core.canonical import read_json, sha256_file
from pipeline.core.errors import BadInput, NeedsRebase
from pipeline.core.settings import ModelSettings
from pipeline.gates.gate2 import select, selection_status
from pipeline.proposals.proposer import PROPOSALS_FILE, VALIDATION_FILE, propose, run_model_settings
from pipeline.report.build import render_report
from pipeline.state import handoff
from pipeline.state.ledger import Ledger
from pipeline.testing.openai_server import FakeOpenAI, Reply, answer
from pipeline.validator import validate_file
from tests.cards.fixture_run import make_run

VALID = Path(__file__).resolve().parents[1] / "cards" / "valid"
WEAKNESS_HEAD = re.compile(r"^## The confirmed weakness (W-\d+) ", re.M)


def card(name: str) -> dict[str, Any]:
    data = yaml.safe_load((VALID / name).read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def request_id(request: dict[str, Any]) -> str:
    for m in request.get("messages", []):
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            found = WEAKNESS_HEAD.search(m["content"])
            if found:
                return f"proposer/{found.group(1)}"
    return ""


def serve(fake: FakeOpenAI, answers: dict[str, list[list[dict[str, Any]]]]) -> None:
    """Route by weakness id; each weakness gets its scripted answers in order (the last one repeats)."""
    served: dict[str, int] = {}

    def handle(request: dict[str, Any]) -> Reply:
        rid = request_id(request)
        seq = answers.get(rid)
        if seq is None:
            return Reply(status=400, body={"error": {"message": f"no answer for {rid}"}})
        n = served.get(rid, 0)
        served[rid] = n + 1
        cards = seq[min(n, len(seq) - 1)]
        body: dict[str, Any] = {"proposals": cards}
        if not cards:
            body["note"] = "no single lever follows from this evidence"
        return answer(body)(request)

    fake.handler = handle


@pytest.fixture
def run(runs_dir: Path) -> Path:
    return make_run(runs_dir)


def test_two_strategies_and_an_honest_zero(
    run: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    serve(
        fake_llm,
        {
            "proposer/W-02": [[card("en_failure_section.yaml"), card("en_w02_edit_gate.yaml")]],
            "proposer/W-04": [[]],
        },
    )
    result = propose(run, model_settings(), log=lambda _m: None)
    assert [c.proposal_id for c in result.cards] == ["P-01", "P-02"]
    assert {c.source_weakness for c in result.cards} == {"W-02"}
    # one call per confirmed weakness (W-09 was rejected at gate 1: no call)
    assert sorted(request_id(r) for r in fake_llm.requests) == ["proposer/W-02", "proposer/W-04"]
    val = read_json(run / VALIDATION_FILE)
    by_w = {w["weakness_id"]: w for w in val["weaknesses"]}
    assert by_w["W-04"]["zero_cards"] is True and by_w["W-04"]["decision"] == "amend"
    assert by_w["W-04"]["note"] == "no single lever follows from this evidence"
    assert by_w["W-02"]["accepted"] == ["P-01", "P-02"]
    assert val["proposals_digest"] == sha256_file(run / PROPOSALS_FILE)
    # the written file passes the validator against the run, and the handoff moved on
    assert validate_file(run / PROPOSALS_FILE, run).valid
    h = handoff.load(run)
    assert (h.proposalGeneration, h.proposalSelection) == ("done", "pending")
    assert h.proposals_digest == val["proposals_digest"]
    # the amended note and the weakness's support reach the prompt
    w04 = next(r for r in fake_llm.requests if request_id(r) == "proposer/W-04")
    text = json.dumps(w04["messages"], ensure_ascii=False)
    assert "narrowed to denials of out-of-scope writes" in text
    assert "h0-httpx-proxy-env-r5" in text


def test_invalid_card_is_reasked_with_rule_messages(
    run: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    bad = card("en_failure_section.yaml")
    bad["expected_effect"]["expected_metrics"]["cost"] = "Uninformative cycles should fall by 30%."
    serve(fake_llm, {"proposer/W-02": [[bad], [card("en_failure_section.yaml")]], "proposer/W-04": [[]]})
    result = propose(run, model_settings(), log=lambda _m: None)
    assert [c.proposal_id for c in result.cards] == ["P-01"]
    w02 = [r for r in fake_llm.requests if request_id(r) == "proposer/W-02"]
    assert len(w02) == 2
    reask = json.dumps(w02[1]["messages"][-1], ensure_ascii=False)
    assert "V-QUANT-INVENTED proposals[0].expected_effect.expected_metrics.cost" in reask


def test_one_reask_or_none_gives_the_same_proposals_digest(
    runs_dir: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    # Gate 2 binds to the proposals digest: the cards decide it, not how they were obtained.
    bad = card("en_failure_section.yaml")
    bad["expected_effect"]["expected_metrics"]["cost"] = "Uninformative cycles should fall by 30%."
    good = card("en_failure_section.yaml")
    digests, attempts = [], []
    for sub, first in (("a", bad), ("b", good)):
        run_dir = make_run(runs_dir / sub)
        serve(fake_llm, {"proposer/W-02": [[first], [good]], "proposer/W-04": [[]]})
        result = propose(run_dir, model_settings(), log=lambda _m: None)
        digests.append(result.proposals_digest)
        w02 = next(w for w in read_json(run_dir / VALIDATION_FILE)["weaknesses"] if w["weakness_id"] == "W-02")
        attempts.append(w02["call"]["attempts"])
    assert attempts == [2, 1]  # one re-ask, then none
    assert digests[0] == digests[1]


def test_card_still_invalid_is_kept_out_with_reasons(
    run: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    bad = card("en_w02_edit_gate.yaml")
    bad["strategy_change"]["proposed_strategy"] += " It also raises the step budget for long suites."
    serve(fake_llm, {"proposer/W-02": [[card("en_failure_section.yaml"), bad]], "proposer/W-04": [[]]})
    result = propose(run, model_settings(max_reasks=1), log=lambda _m: None)
    assert [c.proposal_id for c in result.cards] == ["P-01"]
    val = read_json(run / VALIDATION_FILE)
    rejected = [c for c in val["cards"] if c["status"] == "rejected"]
    assert [(c["proposal_id"], c["model_proposal_id"]) for c in rejected] == [("R-01", "P-02")]
    assert {f["rule"] for f in rejected[0]["findings"]} == {"V-ONE-LEVER"}
    assert "P-02" not in (run / PROPOSALS_FILE).read_text(encoding="utf-8")


def test_a_call_whose_answers_all_fail_is_failed_not_an_honest_zero(
    run: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    served = {"proposer/W-02": [card("en_failure_section.yaml")]}

    def handle(request: dict[str, Any]) -> Reply:
        # W-04: no card and no note, every time (the schema wants a note with an empty list)
        return answer({"proposals": served.get(request_id(request), [])})(request)

    fake_llm.handler = handle
    settings = model_settings()
    argv = ["propose", str(run), "--model", str(settings.model), "--api-base", fake_llm.base_url, "--mode", "tools"]
    out = CliRunner().invoke(app, argv)
    assert out.exit_code == 3, out.output  # missing cards block, with a receipt: never exit 0
    receipt = read_json(run / "block-receipt.json")
    assert receipt["stage"] == "propose" and "W-04" in receipt["blocking_constraint"]
    assert receipt["requested_unblock"].startswith(f"lunasol propose {run}")
    assert "--proposal P-" not in out.output  # W-02's card exists, but the run is blocked: no select offered
    val = read_json(run / VALIDATION_FILE)
    by_w = {w["weakness_id"]: w for w in val["weaknesses"]}
    assert by_w["W-04"]["call"]["ok"] is False and by_w["W-04"]["zero_cards"] is False
    assert "[propose] 1 proposal card(s) [W-02: 1, W-04: FAILED]" in out.output
    attempts = by_w["W-04"]["call"]["attempts"]
    assert attempts > 1  # re-asked before it was called failed
    [failed_line] = [line for line in out.output.splitlines() if "W-04: FAILED after" in line]
    assert failed_line.startswith(f"  W-04: FAILED after {attempts} attempt(s), its cards are missing (not zero): ")
    assert len(failed_line) < 250 and "errors.pydantic.dev" not in failed_line  # one phrase, not a dump
    assert "honest zero" not in out.output
    assert f"unblock: lunasol propose {run}" in out.output
    entry = Ledger(run).get("proposals")
    assert entry is not None and entry.state == "pending" and "W-04" in str(entry.reason)
    html, _ = render_report(run)
    assert '<span class="badge bad">call failed</span> cards missing, not zero: ValidationError' in html
    # answered on the retry: the entry is verified
    serve(fake_llm, {"proposer/W-02": [[card("en_failure_section.yaml")]], "proposer/W-04": [[]]})
    assert not propose(run, settings, log=lambda _m: None).failed
    entry = Ledger(run).get("proposals")
    assert entry is not None and entry.state == "verified"


def test_outside_support_is_rejected_against_the_run(
    run: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    outside = copy.deepcopy(card("en_failure_section.yaml"))
    outside["evidence"]["affected_runs"] = ["h0-somewhere-else-r1"]
    serve(fake_llm, {"proposer/W-02": [[outside]], "proposer/W-04": [[]]})
    result = propose(run, model_settings(max_reasks=0), log=lambda _m: None)
    assert result.cards == []
    val = read_json(run / VALIDATION_FILE)
    assert [f["rule"] for f in val["cards"][0]["findings"]] == ["V-RUN-RUN-OUTSIDE"]


def test_propose_refuses_without_gate1(runs_dir: Path, fake_llm: FakeOpenAI) -> None:
    run = make_run(runs_dir, confirmed=False)
    # An ordering mistake is a usage error with the command to run, not a blocked run.
    with pytest.raises(BadInput, match="lunasol confirm"):
        propose(run, ModelSettings(model="openai/x", api_base=fake_llm.base_url), log=lambda _m: None)
    assert not (run / PROPOSALS_FILE).exists()
    assert not (run / "block-receipt.json").exists()
    assert fake_llm.requests == []
    result = CliRunner().invoke(app, ["propose", str(run)])
    assert result.exit_code == 2
    assert "lunasol confirm" in result.output and "lunasol show" in result.output
    assert not (run / "block-receipt.json").exists()


def test_record_then_replay_is_byte_identical(
    runs_dir: Path, tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    serve(
        fake_llm,
        {"proposer/W-02": [[card("en_failure_section.yaml"), card("en_w02_edit_gate.yaml")]], "proposer/W-04": [[]]},
    )
    store = tmp_path / "store"
    first = make_run(runs_dir / "one")
    propose(first, model_settings(mode="record", store=store), log=lambda _m: None)
    fake_llm.handler = None  # replay must not reach the server
    n_requests = len(fake_llm.requests)
    second = make_run(runs_dir / "two")  # same run id, another place: the same requests
    propose(second, ModelSettings(mode="replay", store=store), log=lambda _m: None)
    assert len(fake_llm.requests) == n_requests
    assert (first / PROPOSALS_FILE).read_bytes() == (second / PROPOSALS_FILE).read_bytes()
    assert read_json(first / VALIDATION_FILE)["cards"] == read_json(second / VALIDATION_FILE)["cards"]


def test_run_model_settings_from_run_json(runs_dir: Path) -> None:
    run = make_run(runs_dir)
    data = read_json(run / "run.json")
    data["inputs"] = {"models": {"model": "openai/m", "mode": "replay", "store": "/rec", "concurrency": 3}}
    (run / "run.json").write_text(json.dumps(data), encoding="utf-8")
    s = run_model_settings(run)
    assert (s.model, s.mode, str(s.store), s.concurrency) == ("openai/m", "replay", "/rec", 3)
    s2 = run_model_settings(run, mode="record", store=Path("/new"))
    assert (s2.mode, str(s2.store)) == ("record", "/new")
    s3 = run_model_settings(run, model="openai/other", api_base="http://127.0.0.1:1/v1")
    assert (s3.model, s3.mode, s3.store) == ("openai/other", None, None)


# -- gate 2 ---------------------------------------------------------------------------------------


@pytest.fixture
def proposed(run: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]) -> Path:
    serve(
        fake_llm,
        {"proposer/W-02": [[card("en_failure_section.yaml"), card("en_w02_edit_gate.yaml")]], "proposer/W-04": [[]]},
    )
    propose(run, model_settings(), log=lambda _m: None)
    return run


def test_select_is_a_receipt_that_does_not_authorise(proposed: Path) -> None:
    digest = handoff.load(proposed).proposals_digest
    receipt, replayed = select(proposed, choice="proposal", proposal_id="P-02", by="ana", expected_digest=digest)
    assert not replayed
    assert receipt.gate == "gate2" and receipt.subject.digest == digest
    assert receipt.request["authorises_implementation"] is False
    assert handoff.load(proposed).proposalSelection == "selected"
    status = selection_status(proposed)
    assert status["proposal_id"] == "P-02" and status["authorises_implementation"] is False
    assert "not an authorisation" in status["meaning"]
    again, replayed = select(
        proposed, choice="proposal", proposal_id="P-02", by="ana", operation_id=receipt.operation_id
    )
    assert replayed and again == receipt


def test_select_stale_digest_and_revision(proposed: Path) -> None:
    base = handoff.load(proposed)
    with pytest.raises(NeedsRebase):
        select(proposed, choice="none", by="ana", expected_digest="sha256:" + "0" * 64)
    select(proposed, choice="redo", by="ana", expected_revision=base.revision)
    with pytest.raises(NeedsRebase):
        select(proposed, choice="none", by="bob", expected_revision=base.revision)


def test_select_cli(proposed: Path) -> None:
    runner = CliRunner()
    unknown = runner.invoke(app, ["select", str(proposed), "--proposal", "P-09", "--by", "ana"])
    assert unknown.exit_code == 2 and "no proposal P-09" in unknown.output
    both = runner.invoke(app, ["select", str(proposed), "--none", "--redo", "--by", "ana"])
    assert both.exit_code == 2
    stale = runner.invoke(app, ["select", str(proposed), "--none", "--by", "ana", "--digest", "sha256:" + "1" * 64])
    assert stale.exit_code == 4 and "needs_rebase" in stale.output
    # compare-and-set is not opt-in: without --digest the selection is refused, saying where to get it
    bare = runner.invoke(app, ["select", str(proposed), "--proposal", "P-01", "--by", "ana"])
    assert bare.exit_code == 2 and "--digest is required" in bare.output and "lunasol status" in bare.output
    digest = str(handoff.load(proposed).proposals_digest)
    args = ["select", str(proposed), "--proposal", "P-01", "--by", "ana", "--operation-id", "op-1", "--digest", digest]
    ok = runner.invoke(app, args)
    assert ok.exit_code == 0, ok.output
    assert "not an authorisation" in ok.output
    replay = runner.invoke(app, [*args, "--json"])
    assert replay.exit_code == 0 and json.loads(replay.stdout)["replayed"] is True
    # proposals cannot be regenerated under a decided gate 2 without a redo
    again = runner.invoke(app, ["propose", str(proposed)])
    assert again.exit_code == 2 and "--redo" in again.output


def test_redo_then_propose_again(
    proposed: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    select(proposed, choice="redo", by="ana")
    assert handoff.next_command(proposed).startswith("lunasol propose")
    serve(fake_llm, {"proposer/W-02": [[card("en_w02_edit_gate.yaml")]], "proposer/W-04": [[]]})
    result = propose(proposed, model_settings(), log=lambda _m: None)
    assert [c.proposal_id for c in result.cards] == ["P-01"]
    assert handoff.load(proposed).proposalSelection == "pending"


@pytest.mark.parametrize("verb", ["propose", "select", "validate"])
def test_help(verb: str) -> None:
    result = CliRunner().invoke(app, [verb, "--help"])
    assert result.exit_code == 0


def test_select_refuses_proposals_made_from_an_older_shortlist(proposed: Path) -> None:
    handoff.update(proposed, {"shortlist_digest": "sha256:" + "2" * 64}, "shortlist recomputed (test)")
    with pytest.raises(NeedsRebase, match="lunasol propose"):
        select(proposed, choice="proposal", proposal_id="P-01", by="ana")


def test_when_every_call_fails_the_missing_cards_are_not_called_none(
    run: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.handler = lambda request: answer({"proposals": []})(request)  # no card, no note: never valid
    settings = model_settings()
    argv = ["propose", str(run), "--model", str(settings.model), "--api-base", fake_llm.base_url, "--mode", "tools"]
    out = CliRunner().invoke(app, argv)
    assert out.exit_code == 3, out.output
    lines = out.output.splitlines()
    assert "no proposal card: the proposer failed for W-02, W-04" in lines
    assert "--proposal P-01" not in out.output and (run / "block-receipt.json").is_file()
    assert handoff.next_command(run).startswith(f"lunasol propose {run}")  # never a select of a missing card
    assert "no proposal card" not in [line.strip() for line in lines]  # never the bare line of an honest zero
