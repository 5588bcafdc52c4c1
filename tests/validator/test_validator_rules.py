"""Rule-level tests: the same defect in Chinese and English, and the look-alikes that must pass."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.validator import validate_entries
from pipeline.validator.quantities import has_basis

BASE: dict[str, Any] = yaml.safe_load(
    (Path(__file__).resolve().parents[1] / "cards" / "valid" / "en_failure_section.yaml").read_text(encoding="utf-8")
)


def rules_with(path: str, value: Any) -> set[str]:
    card = copy.deepcopy(BASE)
    node = card
    keys = path.split(".")
    for key in keys[:-1]:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if isinstance(node, list):
        node[int(keys[-1])] = value
    else:
        node[keys[-1]] = value
    return {f.rule for f in validate_entries([card]).findings}


def test_base_card_is_valid() -> None:
    assert rules_with("proposal_id", "P-01") == set()


@pytest.mark.parametrize(
    "text",
    [
        "Cost should fall by 30%.",
        "成本应下降 30％。",
        "无效请求应减少三成。",
        "Cost should drop to 0.7x.",
        "Judge 分数应 +5 分。",
        "同一请求的重复不超过 5 次。",
        "The agent uses at most 5 tool calls after a failure.",
        "The agent uses at most five tool calls after a failure.",
        "Edit-and-rerun cycles should halve.",
        "无效编辑应减半。",
        "完成率提高百分之二十。",
        "Wall time stays under 10 minutes.",
        "每个 cell 在 10 分钟内结束。",
        "At least 3 cells should now complete.",
        "至少两个 cell 应完成。",
        "Judge scores reach >= 0.8.",
        "Cost doubles at most.",
        "Judge scores rise by 5 points over the baseline.",
        "Retries stay at 3 or more only for flaky tests.",
        "工具调用应控制在二十次以内。",
        "The agent finishes in 40 steps.",
        "Tool calls go from 40 to 20.",
        "工具调用从 40 次降到 20 次。",
        "Review rounds are cut to two rounds.",
        "Review 轮数减少到两轮。",
        "Judge scores reach 8/10.",
        "Cost shrinks twofold.",
        "Cost falls by a third.",
        "成本下降三分之一。",
    ],
)
def test_invented_quantities_are_caught_in_predictions(text: str) -> None:
    assert rules_with("expected_effect.expected_metrics.cost", text) == {"V-QUANT-INVENTED"}
    assert rules_with("rejection_conditions.0", text) == {"V-QUANT-INVENTED"}


@pytest.mark.parametrize(
    "text",
    [
        "Fewer uninformative cycles; no figure is predicted.",
        "默认路径少一个跨角色 transition。",
        "它通过减少一个独立 checker handoff 直接避免 C018 类型的 dead-end。",
        "back 是条件能力，可以发生零次或多次。",
        "At least one high-risk task is routed to the default flow.",
        "至少一个高风险任务被错误路由。",
        "C004/C015 的 Review dead-end 被误报为已解决。",
        "W-02 obligation-evidence gap 加重。",
        "下一步要么出现修复，要么稳定终止。",
        "Re-running the checker twice on unchanged source still happens.",
        "Rebuild time should fall toward the baseline observed in C001 of H0, about 4 minutes per cell.",
        "成本应回到 H0 基线（C001、C010 实测约 4 分钟）。",
        "The tests keep passing; no double-check is skipped.",
        "相同拒绝的处置应一成不变，统一成同一种终止方式。",
    ],
)
def test_look_alikes_and_cited_figures_pass(text: str) -> None:
    assert rules_with("expected_effect.expected_metrics.cost", text) == set()


def test_observed_figures_are_fine_in_evidence() -> None:
    assert rules_with("evidence.observed_impact.cost", "41 tool calls, 30% of them identical; 0.7x of H1.") == set()
    assert rules_with("evidence.summary", "重复请求 7 次，占三成步数。") == set()


def test_basis_needs_a_word_and_a_reference() -> None:
    assert has_basis("about 4 minutes, the baseline observed in C001")
    assert has_basis("依据 h0-bat-sanitize-r1 的实测")
    assert not has_basis("about 4 minutes, the baseline")
    assert not has_basis("about 4 minutes in C001")


@pytest.mark.parametrize(
    ("path", "text", "rule"),
    [
        ("strategy_change.proposed_strategy", "Edit controller.py so that failures come first.", "V-NO-TARGET-FILE"),
        ("strategy_change.proposed_strategy", "修改 review.md 的模板，让 blocker 更醒目。", "V-NO-TARGET-FILE"),
        ("strategy_change.current_strategy", "The router in lib/flow/route.go ignores verdicts.", "V-NO-SOURCE-PATH"),
        ("strategy_change.current_strategy", "See prompts/reviewer.md for the current wording.", "V-NO-SOURCE-PATH"),
        ("strategy_change.current_strategy", "The check at line 88 ignores verdicts.", "V-NO-SOURCE-PATH"),
        ("strategy_change.rationale", "This is a small diff against the runner.", "V-NO-PATCH"),
        ("regression_risks.0", "Apply a minimal patch to the router first, or the risk stays.", "V-NO-PATCH"),
        ("rejection_conditions.0", "补丁：在 Controller 中拦截负面 verdict 之后仍被 accept。", "V-NO-PATCH"),
        (
            "strategy_change.proposed_strategy",
            "Have the owner edit .workflow/tasks.md after a verdict.",
            "V-NO-TARGET-FILE",
        ),
        ("strategy_change.proposed_strategy", "Reword the reviewer prompt to stress ownership.", "V-NO-PROMPT-DIFF"),
        ("strategy_change.proposed_strategy", "把 reviewer 提示词改为“先读断言”。", "V-NO-PROMPT-DIFF"),
        ("strategy_change.proposed_strategy", "Call route_back(stage) when a verdict is negative.", "V-NO-CODE"),
        ("strategy_change.rationale", "Mutation type: routing.", "V-NO-MUTATION-FAMILY"),
        ("strategy_change.rationale", "它属于“控制面”机制类别。", "V-NO-TAXONOMY"),
    ],
)
def test_forbidden_content(path: str, text: str, rule: str) -> None:
    assert rules_with(path, text) == {rule}


@pytest.mark.parametrize(
    ("path", "text"),
    [
        ("evidence.summary", "The Validator could only write validation.md; review.md kept the blocker."),
        (
            "expected_effect.behavioral_change",
            "The run no longer creates or accepts validation.md before implementation.",
        ),
        ("strategy_change.current_strategy", "Validator 只能写 validation.md，跨阶段 blocker 因而增加一次 handoff。"),
        ("evidence.summary", "The failure is at cells/C011/trace.jsonl#L120-L134 in the bundle."),
        ("strategy_change.rationale", "This card names no target file or patch, and no prompt diff."),
        ("strategy_change.rationale", "本卡不指定 target file，也不给出补丁。"),
        ("evidence.summary", "Standard/Full profiles and design/tasks artifacts stay as they are in C011."),
        ("evidence.summary", "The run ended workflow_failed (C011) after valid_behavior checks."),
        ("strategy_change.current_strategy", "The harness returns to implementation after an import error."),
        ("evidence.summary", "C013 wrote a new changes.patch, its state digest changed, and the checks passed."),
        ("rejection_conditions.0", "The reviewer clears the blocker although the candidate's patch did not change."),
        (
            "expected_effect.behavioral_change",
            "After the verdict the owner rewrites .workflow/tasks.md and re-confirms it.",
        ),
        ("rejection_conditions.0", "审查者在 .workflow/delta-spec.md 未变化时清除了 blocker。"),
        ("evidence.summary", "C013 的 changes.patch 发生了真实变化，之后同一检查通过。"),
    ],
)
def test_forbidden_look_alikes_pass(path: str, text: str) -> None:
    assert rules_with(path, text) == set()


@pytest.mark.parametrize(
    "text",
    [
        "Put the failure section first. It also raises the step budget.",
        "Put the failure section first; in addition, remove the tail entirely.",
        "把失败段落放在前面，同时引入更大的步数预算。",
        "把失败段落放在前面；此外增加一个重跑确认阶段。",
        "First, put the failure section first. Second, restart the runner after each edit.",
        "一是把失败段落放前面，二是删除尾部截断。",
    ],
)
def test_bundled_levers_are_caught(text: str) -> None:
    assert rules_with("strategy_change.proposed_strategy", text) == {"V-ONE-LEVER"}


@pytest.mark.parametrize(
    "text",
    [
        "Put the failure section first. This card does not also raise the step budget.",
        "把失败段落放在前面。本卡不同时引入更大的步数预算。",
        "Put the failure section first and keep the tail; it also keeps the step budget as it is.",
        "把失败段落放在前面，同时保留尾部。",
        "Put the failure section first, without also changing the budget.",
    ],
)
def test_saying_what_a_card_does_not_also_do_passes(text: str) -> None:
    assert rules_with("strategy_change.proposed_strategy", text) == set()


def test_several_levers_in_rationale() -> None:
    assert rules_with("strategy_change.rationale", "It combines two levers: output order and budget.") == {
        "V-ONE-LEVER"
    }
    assert rules_with("strategy_change.rationale", "Repair and terminal are two branches of one lever.") == set()


@pytest.mark.parametrize("text", ["Quality will be higher.", "质量更高，运行更稳定。", "Better results overall."])
def test_unobservable_behaviour(text: str) -> None:
    assert rules_with("expected_effect.behavioral_change", text) == {"V-BEHAVIOR-UNOBSERVABLE"}


@pytest.mark.parametrize(
    "text", ["After a failure the agent reads the assertion.", "拒绝之后，agent 不再重复同一请求。"]
)
def test_observable_behaviour(text: str) -> None:
    assert rules_with("expected_effect.behavioral_change", text) == set()


def test_finding_paths_and_messages() -> None:
    card = copy.deepcopy(BASE)
    card["expected_effect"]["expected_metrics"]["cost"] = "Cost falls by 30%."
    del card["root_cause"]["confidence"]
    second = copy.deepcopy(BASE)
    second["proposal_id"] = "P-02"
    second["strategy_change"]["rationale"] = "It combines two levers: output order and budget."
    second["expected_effect"]["expected_metrics"]["cost"] = "Cost falls by 30%."
    result = validate_entries([card, second])
    lines = [f.line() for f in result.findings]
    assert "V-SCHEMA-MISSING proposals[0].root_cause.confidence: required field is missing" in lines
    assert any(x.startswith("V-QUANT-INVENTED proposals[1].expected_effect.expected_metrics.cost:") for x in lines)
    assert any(x.startswith("V-ONE-LEVER proposals[1].strategy_change.rationale:") for x in lines)
    assert [c.valid for c in result.cards] == [False, False]
