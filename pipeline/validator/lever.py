"""Exactly one primary lever.

A card changes one harness strategy lever, so that its effect can be told apart. Bundling shows in the
``proposed_strategy`` (and its ``rationale``) as:

* an enumeration of two or more changes ("1. ... 2. ...", "first, ... second, ...", "一是…二是…");
* an additive connective followed by a change verb in the same clause ("also adds",
  "in addition, remove", "同时引入", "此外增加", "另外删除");
* a self-description as several levers ("two levers", "两项改动", "多个杠杆").

A clause that negates the bundle *before* the connective is the opposite of bundling and
passes: "本卡不同时引入 back transition", "this card does not also add a retry cap".
"""

from __future__ import annotations

import re

from pipeline.validator.findings import TextField
from pipeline.validator.text import clauses, negated_before

RULES: dict[str, str] = {"V-ONE-LEVER": "the strategy bundles more than one independent change"}

_CONNECTIVE = re.compile(
    r"(?i)\balso\b|\badditionally\b|\bin addition\b|\bas well as\b|\bfurthermore\b|\bmoreover\b|\bplus\b|"
    r"\bon top of (?:that|this)\b|\bseparately\b|\bat the same time\b|\balongside\b|\bas a second\b|\banother change\b|"
    r"同时|此外|另外|另行|并且还|而且还|还要|还将|还需|再加上|外加|顺便|以及|一并"
)
_CHANGE_VERB = re.compile(
    r"(?i)\b(?:add|adds|added|adding|introduce[sd]?|introducing|remove[sd]?|removing|delete[sd]?|deleting|drop(?:s|ped)?|"
    r"replace[sd]?|replacing|change[sd]?|changing|switch(?:es|ed)?|increase[sd]?|raise[sd]?|lower(?:s|ed)?|"
    r"reduce[sd]?|cap(?:s|ped)?|limit(?:s|ed)?|require[sd]?|enable[sd]?|disable[sd]?|split(?:s)?|merge[sd]?|"
    r"rewrite[s]?|grant(?:s|ed)?|extend(?:s|ed)?|shorten(?:s|ed)?|insert(?:s|ed)?|tighten(?:s|ed)?|relax(?:es|ed)?|"
    r"swap(?:s|ped)?|upgrade[sd]?|downgrade[sd]?|forbid(?:s)?|prohibit(?:s|ed)?)\b|"
    r"引入|增加|添加|新增|加入|加上|删除|移除|去掉|取消|替换|改为|改成|改变|修改|提高|降低|缩短|延长|要求|启用|禁用|"
    r"限制|拆分|合并|调整|换成|放宽|收紧|禁止|赋予|给予|升级|切换|增设"
)
_ENUM_ITEM = re.compile(
    r"(?i)(?:^|[\s:：;；,，。(（])(?:\(?[1-9][).、]|[①②③④⑤⑥]|\([a-e]\)|第[一二三四五]项|[一二三四]是|首先|其次|再次|"
    r"first(?:ly)?,|second(?:ly)?,|third(?:ly)?,|finally,)"
)
_SEVERAL = re.compile(
    r"(?i)\b(?:two|three|several|multiple|both)\s+(?:\w+\s+)?(?:levers|changes|interventions|strategies)\b|"
    r"(?:两|二|三|多|几)(?:个|项|条|处)(?:主要)?(?:杠杆|改动|改变|干预|策略变化|措施)|组合拳|组合措施"
)


def _connective_bundles(text: str) -> str | None:
    parts = clauses(text)
    for i, clause in enumerate(parts):
        for m in _CONNECTIVE.finditer(clause):
            if negated_before(clause, m.start()):
                continue
            rest = clause[m.end() :]
            if not rest.strip() and i + 1 < len(parts):
                rest = parts[i + 1]  # "in addition, remove ...": the change is in the next clause
            if _CHANGE_VERB.search(rest):
                return m.group(0)
    return None


def check_lever(fields: list[TextField]) -> list[tuple[str, str, str]]:
    """Return (rule, path, message) when the strategy bundles several independent changes."""
    out: list[tuple[str, str, str]] = []
    for f in fields:
        if not f.path.endswith((".proposed_strategy", ".rationale")):
            continue
        items = _ENUM_ITEM.findall(f.text)
        if f.path.endswith(".proposed_strategy") and len(items) >= 2:
            out.append(("V-ONE-LEVER", f.path, f"enumerates {len(items)} changes; a card changes one primary lever"))
            continue
        for clause in clauses(f.text):
            m = _SEVERAL.search(clause)
            if m and not negated_before(clause, m.start()):
                out.append(("V-ONE-LEVER", f.path, f"describes itself as several changes ({m.group(0)!r})"))
                break
        else:
            if f.path.endswith(".proposed_strategy"):
                word = _connective_bundles(f.text)
                if word:
                    out.append(
                        (
                            "V-ONE-LEVER",
                            f.path,
                            f"{word!r} adds a second change; split independent changes into separate cards",
                        )
                    )
    return out
