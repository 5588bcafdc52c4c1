"""Deterministic checks of weakness cards: each check with a passing and a failing case."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from pipeline.sol.cards import SupportDraft, WeaknessDraft
from pipeline.sol.checks import check_answer, check_card, find_prescriptions
from tests.sol.sol_helpers import draft, index


def errors_of(**over: Any) -> list[str]:
    card, errs = check_card(WeaknessDraft.model_validate(draft(**over)), index())
    assert (card is None) == bool(errs)
    return errs


def test_valid_card_passes_and_support_is_computed_from_refs() -> None:
    card, errs = check_card(WeaknessDraft.model_validate(draft()), index())
    assert errs == []
    assert card is not None
    assert card.support.cells == ["C001", "C002", "C003"]
    # tasks and runs come from the IR's cells table, not from the model
    assert card.support.tasks == ["bat", "prom", "pytest"]
    assert card.support.runs == ["h0-bat-C001", "h0-prom-C002", "h0-pytest-C003"]
    assert card.support.counts.model_dump() == {"cells": 3, "tasks": 3, "runs": 3, "pattern_groups": 1}


def test_support_counts_follow_the_citations_not_a_claim() -> None:
    two = draft(
        support={"cells": ["C001", "C002"], "pattern_groups": ["G-01"], "event_refs": []},
        first_divergence={**draft()["first_divergence"]},
    )
    card, errs = check_card(WeaknessDraft.model_validate(two), index())
    assert errs == [] and card is not None
    assert card.support.counts.cells == 2 and card.support.counts.tasks == 2


def test_model_cannot_write_its_own_counts() -> None:
    with pytest.raises(ValidationError):
        SupportDraft.model_validate({"cells": ["C001"], "counts": {"cells": 9}})


@pytest.mark.parametrize(
    ("cells", "needle"),
    [
        (["C001", "C002", "C003", "C099"], "C099 is not a cell of this run"),
        (["C001", "C002", "C003", "C009"], "C009 is excluded"),
    ],
)
def test_cells_must_be_in_the_denominator(cells: list[str], needle: str) -> None:
    errs = errors_of(support={"cells": cells, "pattern_groups": ["G-01"], "event_refs": ["C003-e0002"]})
    assert any(needle in e for e in errs), errs


def test_refs_must_resolve() -> None:
    errs = errors_of(
        support={"cells": ["C001", "C002", "C003"], "pattern_groups": ["G-01"], "event_refs": ["C003-e0099"]}
    )
    assert any("C003-e0099: no such event" in e for e in errs)
    errs = errors_of(
        support={
            "cells": ["C001", "C002", "C003"],
            "pattern_groups": ["G-01"],
            "event_refs": ["cells/C003/sessions/01-review-reviewer.jsonl#L40-L41"],
        }
    )
    assert any("no IR event covers lines 40-41" in e for e in errs)
    errs = errors_of(
        support={"cells": ["C001", "C002", "C003"], "pattern_groups": ["G-01"], "event_refs": ["see the log"]}
    )
    assert any("not an event id" in e for e in errs)


def test_source_ref_resolves_to_its_cell() -> None:
    ok = draft(
        support={
            "cells": ["C001", "C002", "C003"],
            "pattern_groups": ["G-01"],
            "event_refs": ["cells/C003/sessions/01-review-reviewer.jsonl#L1-L3"],
        }
    )
    assert check_card(WeaknessDraft.model_validate(ok), index())[1] == []


def test_ref_from_a_cell_not_cited_is_refused() -> None:
    errs = errors_of(
        support={"cells": ["C001", "C002", "C003"], "pattern_groups": ["G-01"], "event_refs": ["C005-e0001"]}
    )
    assert any("C005, which is not one of the cells cited" in e for e in errs)


def test_every_support_cell_needs_a_cited_ref_or_group() -> None:
    errs = errors_of(support={"cells": ["C001", "C002", "C003"], "pattern_groups": ["G-01"], "event_refs": []})
    assert any("C003 is cited but no cited ref or pattern group comes from it" in e for e in errs)


def test_unknown_pattern_group() -> None:
    errs = errors_of(
        support={"cells": ["C001", "C002", "C003"], "pattern_groups": ["G-77"], "event_refs": ["C003-e0002"]}
    )
    assert any("G-77 is not a pattern group" in e for e in errs)


def test_first_divergence_inside_support() -> None:
    fd = draft()["first_divergence"] | {"cells": ["C001", "C005"], "event_refs": ["C005-e0000"]}
    errs = errors_of(first_divergence=fd)
    assert any("C005 is not one of the support cells" in e for e in errs)


def test_counter_evidence_present_or_explicitly_empty() -> None:
    assert any("empty without a reason" in e for e in errors_of(counter_evidence={"items": []}))
    empty_with_reason = draft(counter_evidence={"items": [], "none_reason": "no cell of H0 met the same blocker"})
    assert check_card(WeaknessDraft.model_validate(empty_with_reason), index())[1] == []
    both = {"items": draft()["counter_evidence"]["items"], "none_reason": "none"}
    assert any("one or the other" in e for e in errors_of(counter_evidence=both))


def test_counter_evidence_refs_resolve_in_their_cell_and_harness() -> None:
    wrong_cell = {"items": [{"cell": "C004", "refs": ["C005-e0001"], "note": "x"}]}
    assert any("C005, which is not one of the cells cited" in e for e in errors_of(counter_evidence=wrong_cell))
    other_harness = {"items": [{"cell": "C010", "refs": ["C010-e0001"], "note": "x"}]}
    assert any("another harness" in e for e in errors_of(counter_evidence=other_harness))


def test_alternatives_and_prediction_required() -> None:
    assert any("alternative_explanations" in e for e in errors_of(alternative_explanations=[]))
    assert any("too short to be falsifiable" in e for e in errors_of(counterfactual_prediction="it fails"))


@pytest.mark.parametrize(
    "text",
    [
        "The controller should add a back transition.",
        "Remove the standalone validation stage.",
        "The fix lives in src/workflow.js near acceptStage.",
        "Edit harness.ps1 to parse the verdict.",
        "Run `git checkout -b fix` and then `matspec back --to design`.",
        "diff --git a/x b/x\n@@ -1 +1 @@",
        "控制器应增加 back 转移。",
        "删除默认的 Validation 阶段。",
        "建议引入结构化 verdict。",
        "We recommend introducing a typed verdict.",
    ],
)
def test_prescriptions_are_rejected(text: str) -> None:
    assert find_prescriptions(text), text
    errs = errors_of(statement=text)
    assert any("prescribes a change" in e for e in errs)


@pytest.mark.parametrize(
    "text",
    [
        "The validator could only write validation.md; the source artifact did not change.",
        "Review re-ran the same focused tests against an unchanged source digest.",
        "审查者发现上游阻塞后只能修改自己的报告，源工件和控制器状态都没有改变。",
        "The reviewer asked for permission to change design.md and the controller did not answer.",
    ],
)
def test_descriptions_are_not_prescriptions(text: str) -> None:
    assert find_prescriptions(text) == []
    assert errors_of(statement=text) == []


def test_prediction_may_say_should_but_not_name_files() -> None:
    ok = "If this holds, the next step after a blocker should again be the same check on an unchanged digest."
    assert errors_of(counterfactual_prediction=ok) == []
    bad = ok + " Then patch src/controller.py."
    assert any("counterfactual_prediction" in e and "file path" in e for e in errors_of(counterfactual_prediction=bad))


def test_check_answer_keeps_good_cards_and_reports_bad_ones() -> None:
    good = WeaknessDraft.model_validate(draft())
    bad = WeaknessDraft.model_validate(draft(weakness_id="W-02", support={"cells": ["C099"], "event_refs": ["x"]}))
    dup = WeaknessDraft.model_validate(draft())
    cards, failed = check_answer([good, bad, dup], index())
    assert [c.weakness_id for c in cards] == ["W-01"]
    assert set(failed) == {"W-02", "W-01"}
    assert any("used twice" in e for e in failed["W-01"])
    assert all(e.startswith("W-02: ") for e in failed["W-02"])
