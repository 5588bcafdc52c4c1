"""Luna's deterministic answer checks and IR rendering, without a model."""

from __future__ import annotations

from typing import Any

import duckdb
import pytest

from pipeline.luna import LunaAnswer, check_answer, load_cells, merge_cell, split_parts, why_phrases
from pipeline.luna.render import render_event, trim
from pipeline.probes import ProbeHit, run_probes, write_probe_hits
from pipeline.probes.synthetic import write_cells


@pytest.mark.parametrize(
    "text",
    [
        "The reviewer re-read the file because the controller had no back transition.",
        "This is the root cause of the failure.",
        "The harness should route the blocker back to design.",
        "The blocker should be fixed in design.md first.",
        "We recommend adding a back-route.",
        "评审者重复检查，根因是缺少回退路径。",
        "控制器应该把问题交还给设计阶段。",
        "建议增加 back 命令。",
        "由于没有回退路径，评审反复进行。",
    ],
)
def test_why_phrases_flag_causes_and_remedies(text: str) -> None:
    assert why_phrases(text)


@pytest.mark.parametrize(
    "text",
    [
        "The candidate fixed the import and re-ran the focused tests; they passed.",
        "The fixture directory was listed three times with identical output.",
        'The reviewer quoted the obligation "tests should cover ESC and BEL" and moved on.',
        "Obligation O-2 (`a CHANGELOG entry should be added`) was opened at tasks and never closed.",
        "Review ran twice on the same source digest; the second run added no new finding.",
        "评审者两次读取同一文件，期间源文件和控制器状态均未变化。",
        "Due diligence: the design stage read proposal.md once.",
    ],
)
def test_why_phrases_leave_descriptions_alone(text: str) -> None:
    assert why_phrases(text) == []


def _hit(**kw: Any) -> ProbeHit:
    base: dict[str, Any] = {
        "hit_id": "C001-H01",
        "probe_id": "repeat_call_same_state",
        "cell_id": "C001",
        "type": "repeated_exploration",
        "key": "target:read_file:a",
        "evidence": ["C001-e0001", "C001-e0003"],
        "first_seq": 1,
        "last_seq": 3,
        "proves_unchanged": True,
        "explanation": "two identical reads",
    }
    base.update(kw)
    return ProbeHit(**base)


def _pattern(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "type": "repeated_exploration",
        "concerns": "target:read_file:a",
        "observed": "file a was read twice with identical arguments",
        "definition_fit": "no state change between the two reads",
        "evidence": ["C001-e0001", "C001-e0003"],
        "state_changed": False,
        "candidates": ["C001-H01"],
        "confidence": "high",
    }
    base.update(kw)
    return base


SHOWN = {f"C001-e{i:04d}" for i in range(5)}


def check(patterns: list[dict[str, Any]], rejected: list[dict[str, Any]] | None = None) -> list[str]:
    ans = LunaAnswer.model_validate({"patterns": patterns, "rejected_candidates": rejected or []})
    return check_answer(ans, cell_id="C001", shown_ids=SHOWN, candidates=[_hit()])


def test_a_good_answer_passes() -> None:
    assert check([_pattern()]) == []


def test_repeated_exploration_needs_two_events_and_no_change() -> None:
    errs = check([_pattern(evidence=["C001-e0001"], state_changed=True)])
    assert any("at least two distinct" in e for e in errs)
    assert any("state_changed is true" in e for e in errs)


def test_unknown_and_foreign_ids_are_named() -> None:
    errs = check([_pattern(evidence=["C001-e0001", "C002-e0003", "C001-e0042"])])
    assert "C001-e0042, C002-e0003 is not an event of cell C001" in errs[0]


def test_candidates_must_each_get_a_verdict_once() -> None:
    assert any("neither confirmed" in e for e in check([_pattern(candidates=[])]))
    both = check([_pattern()], [{"candidate": "C001-H01", "observation": "not it", "state_changed": False}])
    assert any("both confirmed and rejected" in e for e in both)
    ghost = check([_pattern(candidates=["C001-H01", "C001-H09"])])
    assert any("C001-H09 are not probe candidates" in e for e in ghost)


def test_extra_fields_are_refused_by_the_schema() -> None:
    with pytest.raises(ValueError):
        LunaAnswer.model_validate({"patterns": [_pattern(root_cause="x")], "rejected_candidates": []})


def test_merge_orders_and_numbers_patterns_stably() -> None:
    seq_of = {f"C001-e{i:04d}": i for i in range(5)}
    a = LunaAnswer.model_validate(
        {
            "patterns": [
                _pattern(type="zero_information_gain", evidence=["C001-e0004"], candidates=[]),
                _pattern(evidence=["C001-e0003", "C001-e0001"]),
                _pattern(type="omission", concerns="Obligation: O-2", evidence=["C001-e0002"], candidates=[]),
            ],
            "rejected_candidates": [],
        }
    )
    merged = merge_cell("C001", [a], [_hit()], seq_of)
    assert [(p.pattern_id, p.type) for p in merged.patterns] == [
        ("C001-P01", "omission"),
        ("C001-P02", "repeated_exploration"),
        ("C001-P03", "zero_information_gain"),
    ]
    assert merged.patterns[0].concerns == "obligation:o-2"
    assert merged.patterns[1].evidence == ["C001-e0001", "C001-e0003"]  # sorted by seq
    assert merge_cell("C001", [a], [_hit()], seq_of) == merged


def test_render_event_trims_visibly_and_shows_ids_and_digests() -> None:
    line = render_event(
        {
            "event_id": "C001-e0007",
            "ts": "2026-08-09T10:01:02.345Z",
            "kind": "tool_result",
            "tool_name": "run_tests",
            "detail": "tool_result exit_code=1",
            "call_id": "call_9",
            "result_digest": "sha256:" + "ab" * 32,
            "text": "E" * 1000,
        }
    )
    assert line.startswith("C001-e0007 10:01:02 [tool_result run_tests exit_code=1] call=call_9 result=abababababab:")
    assert "chars trimmed" in line and len(line) < 600
    assert trim("short", 10) == "short"
    state = render_event(
        {"event_id": "C001-e0001", "kind": "state_change", "detail": "state", "state_digest": "sha256:" + "c" * 64,
         "text": "state sha256:" + "c" * 64 + ": current_stage=review"}
    )  # fmt: skip
    assert state.endswith("[state]: state sha256:cccccccccccc…: current_stage=review")


def test_split_keeps_every_event_and_places_candidates() -> None:
    con = duckdb.connect()
    events: list[dict[str, Any]] = []
    for stage in ("design", "review", "finalization"):
        events += [{"kind": "message", "stage": stage, "text": f"{stage} " + "y" * 200} for _ in range(4)]
    events.insert(5, {"kind": "tool_call", "stage": "review", "tool_name": "read_file", "args_digest": "sha256:1",
                      "state_digest": "sha256:s", "target": "a"})  # fmt: skip
    events.insert(7, {"kind": "tool_call", "stage": "review", "tool_name": "read_file", "args_digest": "sha256:1",
                      "state_digest": "sha256:s", "target": "a"})  # fmt: skip
    write_cells(con, {"C001": events})
    write_probe_hits(con, run_probes(con))
    [cell] = load_cells(con)
    whole = split_parts(cell, 100_000)
    assert len(whole) == 1 and whole[0].events == len(events)
    parts = split_parts(cell, 300)
    assert len(parts) > 1
    covered = [i for p in parts for i in sorted(p.shown_ids) if i in cell.seq_of and i in p.text]
    assert sorted(covered) == sorted(cell.seq_of)  # each event rendered in exactly one part
    assert sum(p.events for p in parts) == len(events)
    [home] = [p for p in parts if p.candidates]
    assert "C001-e0005" in home.text


@pytest.mark.parametrize("reason", ["No reason", "none", "n/a", "  "])
def test_an_empty_answer_must_say_what_shows_nothing(reason: str) -> None:
    # Gemma 3 270M answered {"patterns": [], "none_reason": "No reason"}: that is not "looked, found nothing".
    with pytest.raises(ValueError, match="none_reason"):
        LunaAnswer.model_validate({"patterns": [], "rejected_candidates": [], "none_reason": reason})


def test_a_short_observation_is_a_valid_nothing_found() -> None:
    a = LunaAnswer.model_validate({"patterns": [], "rejected_candidates": [], "none_reason": "one read, one write"})
    assert a.none_reason == "one read, one write"
