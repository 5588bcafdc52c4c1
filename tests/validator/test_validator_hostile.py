"""The validator against hostile cards: huge words, homoglyphs, invisible characters, numbers in words."""

from __future__ import annotations

import copy
import re
import sys
import time
import unicodedata
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.validator import forbidden, lever, quantities, validate_entries
from pipeline.validator.findings import TextField
from pipeline.validator.limits import MAX_CARD_CHARS, MAX_FIELD_CHARS
from pipeline.validator.normal_form import _FORMAT_PLANES, rule_text

BASE: dict[str, Any] = yaml.safe_load(
    (Path(__file__).resolve().parents[1] / "cards" / "valid" / "en_failure_section.yaml").read_text(encoding="utf-8")
)
STRATEGY = "strategy_change.proposed_strategy"
COST = "expected_effect.expected_metrics.cost"

# Units that made one or another pattern backtrack per character (a word of them, repeated).
HOSTILE_UNITS = ["a", "a_", "1", "中", "-", "1-", "if(", "a.", "1,", "x=", "\u200b"]
WORD = 100_000
BUDGET_S = 10.0  # generous on a shared machine: the quadratic patterns took > 100 s for one such word


def _card_with(path: str, value: Any) -> dict[str, Any]:
    card = copy.deepcopy(BASE)
    node = card
    keys = path.split(".")
    for key in keys[:-1]:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if isinstance(node, list):
        node[int(keys[-1])] = value
    else:
        node[keys[-1]] = value
    return card


def rules_with(path: str, value: Any) -> set[str]:
    return {f.rule for f in validate_entries([_card_with(path, value)]).findings}


def _word(unit: str, size: int = WORD) -> str:
    return (unit * (size // len(unit) + 1))[:size]


@pytest.mark.parametrize("unit", HOSTILE_UNITS)
def test_every_content_pattern_is_linear_on_a_100k_word(unit: str) -> None:
    """The rule functions themselves (no length bound in front) finish a 100 kB word quickly."""
    text = _word(unit)
    fields = [TextField(path="proposals[0].strategy_change.proposed_strategy", area="strategy_change", text=text)]
    start = time.perf_counter()
    forbidden.check_forbidden(fields)
    quantities.check_quantities(fields)
    lever.check_lever(fields)
    assert time.perf_counter() - start < BUDGET_S


def test_the_code_pattern_scans_a_word_once() -> None:
    """The pattern that hung: ``\\w+\\s*==`` retried at every character of a word (quadratic)."""
    code = forbidden._CODE
    # Linear: matching one 100k word touches each character a bounded number of times, so it is
    # far below the ~5e9 steps of the old pattern; a timing bound this loose cannot flake.
    start = time.perf_counter()
    assert code.search(_word("a")) is None
    assert code.search(_word("a_")) is None
    assert time.perf_counter() - start < BUDGET_S
    assert code.search("if retries == 3 then stop") is not None  # still finds code
    assert code.search("if (done(x)) {") is not None


def test_a_huge_card_is_refused_by_length_quickly() -> None:
    card = _card_with(STRATEGY, _word("a_", 1_000_000))
    start = time.perf_counter()
    result = validate_entries([card])
    assert time.perf_counter() - start < BUDGET_S
    assert [f.path for f in result.findings if f.rule == "V-TOO-LONG"] == [
        "proposals[0].strategy_change.proposed_strategy"
    ]


def test_the_length_bounds() -> None:
    assert rules_with(STRATEGY, "Keep the failure section visible. " + "x" * (MAX_FIELD_CHARS - 40)) == set()
    assert rules_with(STRATEGY, "Keep the failure section visible. " + "x" * MAX_FIELD_CHARS) == {"V-TOO-LONG"}
    many = [f"Reject if the failure section is hidden in case {i}." for i in range(MAX_CARD_CHARS // 40)]
    findings = validate_entries([_card_with("rejection_conditions", many)]).findings
    assert {f.rule for f in findings} == {"V-TOO-LONG"}
    assert "not read" in findings[-1].message


@pytest.mark.parametrize(
    ("path", "text", "rule"),
    [
        (STRATEGY, "Tighten the check in \u0455r\u0441/\u0445.\u0440\u0443 before review.", "V-NO-SOURCE-PATH"),
        (STRATEGY, "Tighten the check in output_filt\u0435r.py before review.", "V-NO-TARGET-FILE"),
        (STRATEGY, "Make OUTPUT_FILTER.PY keep the failure section.", "V-NO-TARGET-FILE"),
        (STRATEGY, "Keep the failure section, as in SRC/Harness/Filter.TS.", "V-NO-SOURCE-PATH"),
        (STRATEGY, "Follow https://github.com/acme/harness/blob/main/filter.py for this.", "V-NO-SOURCE-PATH"),
        (STRATEGY, "Follow https://example.com/filter.py for this.", "V-NO-SOURCE-PATH"),
        (STRATEGY, "Keep the failure section in output_filter\u00a0.py output.", "V-NO-TARGET-FILE"),
        (STRATEGY, "Keep the failure section in output_filter\u202f.py output.", "V-NO-TARGET-FILE"),
        (STRATEGY, "Keep the failure section in output_filter.\u200bpy output.", "V-NO-TARGET-FILE"),
        (STRATEGY, "Keep the failure section in output_\u2060filter.py output.", "V-NO-TARGET-FILE"),
        (STRATEGY, "Keep the failure section in output_filter\u202eyp.\u202c output.", "V-NO-TARGET-FILE"),
        (STRATEGY, "Keep the failure section; \u202eyp.retlif_tuptuo\u202c", "V-NO-TARGET-FILE"),
        (STRATEGY, "Keep the failure section in \U0001d428\U0001d42e\U0001d42d.py output.", "V-NO-TARGET-FILE"),
        (STRATEGY, "The agent should call show\u200b_failure(result) first.", "V-NO-CODE"),
        (STRATEGY, "Show the failure section in the sys\u00adtem prompt.", "V-NO-PROMPT-DIFF"),
        (COST, "Cost should fall by fifty percent.", "V-QUANT-INVENTED"),
        (COST, "Cost should fall by twenty-five per cent.", "V-QUANT-INVENTED"),
        (COST, "Retries go up by half.", "V-QUANT-INVENTED"),
        (COST, "Retries drop to half.", "V-QUANT-INVENTED"),
        (COST, "Cost falls by three quarters.", "V-QUANT-INVENTED"),
        (COST, "Cost should drop by \uff13\uff10\uff05.", "V-QUANT-INVENTED"),
        (COST, "Cost should drop by 30\u00a0%.", "V-QUANT-INVENTED"),
        (COST, "Cost should fall by 3\u200b0%.", "V-QUANT-INVENTED"),
        (COST, "成本下降一半。", "V-QUANT-INVENTED"),
        (COST, "成本降低三成。", "V-QUANT-INVENTED"),
        (COST, "成本降低五十个百分点。", "V-QUANT-INVENTED"),
        (COST, "成本变为两倍。", "V-QUANT-INVENTED"),
        (COST, "半数 cell 的成本下降。", "V-QUANT-INVENTED"),
    ],
)
def test_bypasses_are_caught_with_their_rule(path: str, text: str, rule: str) -> None:
    assert rules_with(path, text) == {rule}


@pytest.mark.parametrize(
    "text",
    [
        "Cost falls; no figure is predicted.",
        "成本下降，不预测具体数字。",
        "Cost falls as fewer review rounds repeat the same check.",
        "A half-finished section is no longer shown as done.",
        "成本一成不变的 cell 不受影响。",
    ],
)
def test_look_alikes_of_the_new_quantities_pass(text: str) -> None:
    assert rules_with(COST, text) == set()


def test_chinese_text_is_read_as_written() -> None:
    text = "审查者看到失败段落后再决定是否重跑；口径不变，ー 号保留。"
    assert rule_text(text) == unicodedata.normalize("NFKC", text)


def test_the_format_character_planes_cover_every_format_character() -> None:
    scanned = {c for r in _FORMAT_PLANES for c in r if unicodedata.category(chr(c)) == "Cf"}
    everywhere = {c for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cf"}
    assert scanned == everywhere


def test_every_pattern_in_the_rule_modules_is_linear_on_runs_of_its_own_characters() -> None:
    """A sweep: every compiled pattern of the rule modules, on 40k-character runs of hostile units."""
    patterns = [v for m in (forbidden, quantities, lever) for v in vars(m).values() if isinstance(v, re.Pattern)]
    patterns += [p for _, p in quantities._PATTERNS]
    start = time.perf_counter()
    for pattern in patterns:
        for unit in [*HOSTILE_UNITS, "a ", "1 ", "by ", "./", "#L1", "不超过", "prompt "]:
            for _ in pattern.finditer(_word(unit, 10_000)):
                pass
    assert time.perf_counter() - start < BUDGET_S
