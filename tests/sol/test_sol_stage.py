"""The Sol stage through the local OpenAI-compatible server: re-ask on check errors, drop with reasons, digest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.canonical import read_json, write_json
from pipeline.core.context import RunOptions
from pipeline.core.errors import BadInput
from pipeline.models import read_calls
from pipeline.run.runner import run
from pipeline.sol.shortlist import SHORTLIST_FILE, read_shortlist
from pipeline.testing.openai_server import FakeOpenAI, Reply, completion_body
from tests.state.test_ledger import sol_answer


def bad_card() -> dict[str, Any]:
    card = json.loads(json.dumps(sol_answer()["weaknesses"][0]))
    card["weakness_id"] = "W-02"
    card["support"]["cells"].append("C099")  # not a cell of the run
    card["statement"] = "The controller should add a back transition."  # a prescription
    return card


def scripted(sol_replies: list[dict[str, Any]]) -> Any:
    seen: list[dict[str, Any]] = []

    def handle(request: dict[str, Any]) -> Reply:
        name = request["tools"][0]["function"]["name"] if request.get("tools") else ""
        if name == "SolAnswer":
            seen.append(request)
            data = sol_replies[min(len(seen), len(sol_replies)) - 1]
        else:
            data = {"patterns": [], "rejected_candidates": [], "none_reason": "nothing repeats or is left open"}
        return Reply(body=completion_body(request, tool_arguments=json.dumps(data)))

    handle.seen = seen  # type: ignore[attr-defined]
    return handle


@pytest.fixture
def opts(tmp_path: Path, runs_dir: Path, model_settings: Any) -> RunOptions:
    from tests.sol.sol_helpers import make_bundle

    return RunOptions(bundle=make_bundle(tmp_path), run_id="r1", runs_dir=runs_dir, models=model_settings())


def test_check_errors_go_back_for_a_reask(opts: RunOptions, fake_llm: FakeOpenAI) -> None:
    good = sol_answer()
    fake_llm.handler = h = scripted([{"weaknesses": [*good["weaknesses"], bad_card()]}, good])
    run(opts, log=lambda _m: None)
    assert len(h.seen) == 2
    reask = json.dumps(h.seen[1]["messages"])
    assert "C099 is not a cell of this run" in reask and "prescribes a change" in reask
    sl = read_shortlist(opts.runs_dir / "r1" / SHORTLIST_FILE)
    assert [w.weakness_id for w in sl.weaknesses] == ["W-01"] and sl.dropped == []
    assert sl.call["attempts"] == 2 and sl.call["ok"] is True
    assert sl.denominator.eligible_cells == 5
    sol_calls = [c for c in read_calls(opts.runs_dir / "r1") if c["role"] == "sol"]
    assert len(sol_calls) == 1 and sol_calls[0]["attempts"] == 2


def test_a_weakness_that_stays_unsupported_is_dropped_with_reasons(opts: RunOptions, fake_llm: FakeOpenAI) -> None:
    both = {"weaknesses": [*sol_answer()["weaknesses"], bad_card()]}
    fake_llm.handler = h = scripted([both])
    run(opts, log=lambda _m: None)
    assert len(h.seen) == 3  # first answer + max_reasks (2)
    sl = read_shortlist(opts.runs_dir / "r1" / SHORTLIST_FILE)
    assert [w.weakness_id for w in sl.weaknesses] == ["W-01"]
    assert [d.weakness_id for d in sl.dropped] == ["W-02"]
    reasons = " ".join(sl.dropped[0].reasons)
    assert "C099" in reasons and "prescribes a change" in reasons
    assert sl.call["ok"] is False


def test_shortlist_digest_is_its_own_content(opts: RunOptions, fake_llm: FakeOpenAI) -> None:
    fake_llm.handler = scripted([sol_answer()])
    run(opts, log=lambda _m: None)
    path = opts.runs_dir / "r1" / SHORTLIST_FILE
    sl = read_shortlist(path)
    assert sl.digest == sl.content_digest()
    w = sl.weaknesses[0]
    assert w.support.counts.cells == 3 and w.support.tasks == ["bat", "prom", "pytest"]
    raw = read_json(path)
    raw["weaknesses"][0]["confidence"] = "high"  # an edit by hand
    write_json(path, raw)
    with pytest.raises(BadInput, match="does not match its digest"):
        read_shortlist(path)


def _lines(cell: str, n: int) -> list[tuple[str, str]]:
    details = ["stage_started", "state", "handoff", "stage_sent_back", "artifact_written"]
    return [(details[i % 5], f"{cell}-e{i:04d} review/controller {details[i % 5]}: text {i}") for i in range(n)]


def test_timelines_fit_the_budget_visibly() -> None:
    from pipeline.sol.stage import fit_timelines

    lines = {"C001": _lines("C001", 50), "C002": _lines("C002", 50)}
    full, omitted = fit_timelines(lines, 10**6)
    assert omitted == 0 and len(full["C001"]) == 50
    # a budget that only fits the valuable lines: low-value ones go, with a marker per cell
    valuable = sum(len(ln) + 1 for v in lines.values() for d, ln in v if d in ("state", "stage_sent_back"))
    mid, omitted = fit_timelines(lines, valuable + 200)
    assert omitted == 60
    assert mid["C001"][0] == "[30 stage-start / handoff / artifact lines omitted in this cell]"
    assert all("stage_started" not in ln for ln in mid["C001"][1:])
    # a tiny budget: each cell keeps its first and last lines and says how many were cut between
    tiny, omitted = fit_timelines(lines, 600)
    c1 = tiny["C001"]
    cut = next(ln for ln in c1 if ln.startswith("[... "))
    n_cut = int(cut.split()[1])
    assert c1[1].startswith("C001-e0001") and c1[-1].startswith("C001-e0048")
    assert omitted == 2 * (30 + n_cut)
    assert len(c1) - 2 + n_cut == 20  # every valuable line is either kept or counted as cut


def test_one_reask_or_none_gives_the_same_shortlist_digest(
    opts: RunOptions, tmp_path: Path, fake_llm: FakeOpenAI
) -> None:
    # Gate 1 binds to the digest: how Sol's answer was reached (attempts, exchange keys, errors
    # re-asked) must not change it, only what the shortlist says.
    good = sol_answer()
    fake_llm.handler = h = scripted([{"weaknesses": [*good["weaknesses"], bad_card()]}, good])
    run(opts, log=lambda _m: None)
    assert len(h.seen) == 2
    reasked = read_shortlist(opts.runs_dir / "r1" / SHORTLIST_FILE)
    other = tmp_path / "other-runs"
    fake_llm.handler = h2 = scripted([good])
    run(RunOptions(bundle=opts.bundle, run_id="r1", runs_dir=other, models=opts.models), log=lambda _m: None)
    assert len(h2.seen) == 1
    direct = read_shortlist(other / "r1" / SHORTLIST_FILE)
    assert (reasked.call["attempts"], direct.call["attempts"]) == (2, 1)
    assert reasked.call["key"] != direct.call["key"]  # the call metadata differs ...
    assert reasked.digest == direct.digest  # ... the digest does not
    # and content still counts: a different card is a different digest
    changed = direct.model_copy(deep=True)
    changed.weaknesses[0].statement += " (reworded)"
    assert changed.content_digest() != direct.digest
    meta = direct.model_copy(deep=True)
    assert meta.plan is not None
    meta.plan.calls[0].attempts, meta.plan.calls[0].reused, meta.plan.calls[0].key = 7, True, "sha256:other"
    meta.call = {"ok": True, "attempts": 7, "errors": ["timeout"], "key": "sha256:other"}
    assert meta.content_digest() == direct.digest
