"""Sol sees what it cites: every event a pattern group cites is in Sol's request with its text, and a
citation of an event that was not in the request is refused (through the local server)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pipeline.core.canonical import read_json
from pipeline.core.context import RunOptions
from pipeline.models import read_calls
from pipeline.run.runner import run
from pipeline.sol.corpus import load_batch
from pipeline.sol.evidence import shown_events
from pipeline.sol.shortlist import SHORTLIST_FILE, read_shortlist
from pipeline.sol.stage import single_context
from pipeline.testing.openai_server import FakeOpenAI, Reply, completion_body
from tests.conftest import DEMO_RECORDINGS
from tests.state.test_ledger import sol_answer


def _recorded_sol_request() -> str:
    """The first user message of the demo's recorded Sol request (what the pipeline sent)."""
    found = []
    for path in DEMO_RECORDINGS.glob("*/*.json"):
        rec = read_json(path)
        if rec.get("role") == "sol":
            found.append(next(m["content"] for m in rec["request"]["messages"] if m["role"] == "user"))
    found = [f for f in found if "(a pilot: " not in f]  # the demo's pilot (--sample 8 --seed 1) has its own
    assert len(found) == 1, f"{len(found)} recorded Sol requests"
    return str(found[0])


def _events_with_text(text: str) -> dict[str, str]:
    """Event id -> its text, for every line of a request that starts with an event id and carries text."""
    out: dict[str, str] = {}
    for m in re.finditer(r"(?m)^\s*(\S+-e\d{4,}) (?:\d\d:\d\d:\d\d )?[^:\n]*: (\S.*)$", text):
        out.setdefault(m[1], m[2])
    return out


def test_the_demo_sol_request_holds_the_text_of_every_event_its_groups_cite(demo_gate1: Path) -> None:
    groups = read_json(demo_gate1 / "pattern-groups.json")["groups"]
    cited = {e for g in groups for o in g["occurrences"] for e in o["events"]}
    shortlist = read_shortlist(demo_gate1 / SHORTLIST_FILE)
    by_shortlist = {
        e
        for g in groups
        if g["group_id"] in {gid for w in shortlist.weaknesses for gid in w.support.pattern_groups}
        for o in g["occurrences"]
        for e in o["events"]
    }
    assert len(cited) > 300 and by_shortlist <= cited  # 361 on the demo, 60 of them shown before
    shown = _events_with_text(_recorded_sol_request())
    missing = sorted(cited - set(shown))
    assert not missing, f"{len(missing)} of {len(cited)} cited events have no text in the Sol request: {missing[:5]}"
    # the text is the event's own (a C004 tool result reads as one), not just its id
    con_text = {e: t for e, t in shown.items() if e in cited}
    assert all(len(t) >= 5 for t in con_text.values())
    # Luna's words travel with every occurrence
    patterns = [json.loads(x) for x in (demo_gate1 / "patterns.jsonl").read_text().splitlines()]
    request = _recorded_sol_request()
    grouped = {p for g in groups for o in g["occurrences"] for p in o["pattern_ids"]}
    for p in patterns:
        if p["pattern_id"] in grouped:
            assert " ".join(p["observed"].split()) in request
            assert " ".join(p["definition_fit"].split()) in request


def test_shown_events_are_what_the_rendered_context_holds(demo_gate1: Path) -> None:
    batch = load_batch(demo_gate1, demo_gate1 / "ir.duckdb")
    context = single_context(batch)
    shown = shown_events(context)
    assert "C004-e0012" not in shown or "C004-e0012" in context["timelines_text"] + context["groups_text"]
    # an id in a sentence ("(C011-e0131);") is found, the template's example id is not searched
    assert shown_events({"t": "opened (C011-e0131); then C011-e0136, and x-e12"}) == {"C011-e0131", "C011-e0136"}


def _scripted(replies: list[dict[str, Any]]) -> Any:
    seen: list[dict[str, Any]] = []

    def handle(request: dict[str, Any]) -> Reply:
        name = request["tools"][0]["function"]["name"] if request.get("tools") else ""
        if name == "SolAnswer":
            seen.append(request)
            data = replies[min(len(seen), len(replies)) - 1]
        else:
            data = {"patterns": [], "rejected_candidates": [], "none_reason": "nothing repeats or is left open"}
        return Reply(body=completion_body(request, tool_arguments=json.dumps(data)))

    handle.seen = seen  # type: ignore[attr-defined]
    return handle


def test_a_citation_of_an_event_sol_was_not_shown_is_refused(
    tmp_path: Path, runs_dir: Path, model_settings: Any, fake_llm: FakeOpenAI
) -> None:
    from tests.sol.sol_helpers import make_bundle

    unseen = json.loads(json.dumps(sol_answer()))
    # C001-e0002 is the reviewer's own message (the cell's main worker): not on the controller-level
    # timeline, and no pattern group cites it, so it is not in Sol's request
    unseen["weaknesses"][0]["first_divergence"]["event_refs"] = ["C001-e0002"]
    fake_llm.handler = h = _scripted([unseen])
    opts = RunOptions(bundle=make_bundle(tmp_path), run_id="r1", runs_dir=runs_dir, models=model_settings())
    run(opts, log=lambda _m: None)
    first = next(m["content"] for m in h.seen[0]["messages"] if m["role"] == "user")
    assert "C001-e0002" not in first and "C001-e0001" in first
    assert len(h.seen) == 3  # refused, re-asked twice with the reason, then dropped
    reask = json.dumps(h.seen[1]["messages"])
    assert "C001-e0002 was not shown in this request" in reask
    sl = read_shortlist(opts.runs_dir / "r1" / SHORTLIST_FILE)
    assert sl.weaknesses == [] and [d.weakness_id for d in sl.dropped] == ["W-01"]
    assert any("C001-e0002 was not shown" in r for r in sl.dropped[0].reasons)
    assert [c["role"] for c in read_calls(opts.runs_dir / "r1") if c["role"] == "sol"] == ["sol"]


def test_a_cell_too_large_is_read_in_several_requests_each_with_whole_groups(demo_gate1: Path) -> None:
    from pipeline.sol.partition import Chunk, Renderer, map_context, split_groups

    batch = load_batch(demo_gate1, demo_gate1 / "ir.duckdb")
    renderer = Renderer(batch)
    whole = Chunk(call_id="M01", tasks=["bat-sanitize"], cells=["C004"])
    groups = renderer.group_ids(["C004"])
    halves = split_groups(whole, renderer)
    assert len(groups) > 2 and len(halves) == 2
    assert sorted(g for h in halves for g in h.groups or []) == groups  # every group, once
    occurrences: dict[str, list[dict[str, Any]]] = {}
    for gid, o in batch.occurrences(["C004"])["C004"]:
        occurrences.setdefault(gid, []).append(o)
    for half in halves:
        text = map_context(renderer, half, 10_000)["groups_text"]
        assert text.startswith(f"(this call shows {len(half.groups or [])} of the {len(groups)} pattern groups")
        shown = _events_with_text(text)
        for gid in groups:
            events = {e for o in occurrences[gid] for e in o["events"]}
            if gid in (half.groups or []):
                assert events <= set(shown), gid  # every fact of a group it shows
            else:
                assert f"\n{gid} " not in text  # a group it does not show is not there at all


def test_one_group_too_large_is_read_over_several_requests_with_every_fact(demo_gate1: Path) -> None:
    # One group of one cell too large for a request: its occurrences go to different requests, each
    # whole (Luna's words, every cited event's line); one occurrence too large: its event lines spread
    # over requests, each with the occurrence's head line naming every event. Never a fact dropped.
    from pipeline.sol.partition import Chunk, Renderer, map_context, split_groups, split_occurrences

    batch = load_batch(demo_gate1, demo_gate1 / "ir.duckdb")
    # the demo has no group twice in one cell: C004's occurrence of its largest group cut in two (its events apart)
    gid, mine = max(batch.occurrences(["C004"])["C004"], key=lambda p: len(p[1]["events"]))
    cut = len(mine["events"]) // 2
    # Sol reads occurrences from its table: this connection's temporary one of the same name is read instead
    con = batch.timeline.con
    con.execute("CREATE OR REPLACE TEMP TABLE _cut AS SELECT * FROM sol_occurrences")
    con.execute("CREATE OR REPLACE TEMP TABLE sol_occurrences AS SELECT * FROM _cut WHERE occurrence_id <> ?",
                [mine["occurrence_id"]])  # fmt: skip
    rank = batch.evidence.rank["C004"]
    for oid, events in ((f"{gid}-O90", mine["events"][:cut]), (f"{gid}-O91", mine["events"][cut:])):
        con.execute("INSERT INTO sol_occurrences VALUES (?, ?, ?, 'C004', ?, ?)",
                    [rank, gid, oid, mine["pattern_ids"], events])  # fmt: skip
    renderer = Renderer(batch)
    occ: dict[str, list[dict[str, Any]]] = {}
    for g, o in batch.occurrences(["C004"])["C004"]:
        occ.setdefault(g, []).append(o)
    assert len(occ[gid]) == 2
    one_group = Chunk(call_id="M01", tasks=["bat-sanitize"], cells=["C004"], groups=[gid])
    assert split_groups(one_group, renderer) == []  # one group: no group to move
    halves = split_occurrences(one_group, renderer)
    assert len(halves) == 2 and all(h.groups == [gid] for h in halves)
    assert sorted(o for h in halves for o in h.occurrences or []) == sorted(o["occurrence_id"] for o in occ[gid])
    for half in halves:
        text = map_context(renderer, half, 10_000)["groups_text"]
        assert f"of the {len(occ[gid])} occurrences of {gid} in these cells" in "\n".join(text.splitlines()[:2])
        shown = _events_with_text(text)
        for o in occ[gid]:
            if o["occurrence_id"] in (half.occurrences or []):
                assert set(o["events"]) <= set(shown)  # whole: every cited event with its text
                assert " ".join(o["events"]) in text
            else:
                assert f"{o['occurrence_id']} " not in text
    # one occurrence too large: halved by its events, the head line (every event id) in both
    first = halves[0]
    while len(first.occurrences or []) > 1:
        first = split_occurrences(first, renderer)[0]
    target = next(o for o in occ[gid] if o["occurrence_id"] == (first.occurrences or [""])[0])
    pieces = split_occurrences(first, renderer)
    assert len(pieces) == 2 and sorted(e for p in pieces for e in p.events or []) == sorted(target["events"])
    seen: set[str] = set()
    for piece in pieces:
        text = map_context(renderer, piece, 10_000)["groups_text"]
        assert " ".join(target["events"]) in text  # the occurrence's head names all its events
        assert "another call shows the others" in text
        seen |= set(_events_with_text(text)) & set(target["events"])
    assert seen == set(target["events"])
    # one event left: nothing more to cut (a request that still does not fit is refused, never trimmed)
    last = pieces[0]
    while len(last.events or []) > 1:
        last = split_occurrences(last, renderer)[0]
    assert split_occurrences(last, renderer) == []
