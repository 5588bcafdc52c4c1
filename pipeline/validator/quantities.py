"""No invented quantitative targets in predictions and rejection conditions.

A card must not state percentages, score deltas, cell counts and tool-call thresholds that have
no historical effect size behind them. The rule covers the fields that *predict* or
*decide*: ``strategy_change``, ``expected_effect``, ``rejection_conditions`` and
``regression_risks``. The ``evidence`` section reports what was observed, so figures are
allowed there (and in ``root_cause``, which restates the confirmed weakness).

What counts as a quantity (English and Chinese alike):

* a number (digits) with a unit: percent (``30%``, ``30 percent``, ``百分点``), multiplier
  (``0.7x``, ``2 倍``, ``3-fold``), score (``+5 分``, ``5 points``), cells (``3 cells``,
  ``3 个 cell``), tool calls / steps / turns / retries / times (``5 次``, ``5 tool calls``),
  time (``10 分钟``, ``30s``), tokens or money;
* a number (digits) after or before a comparator (``at most 5``, ``不超过 5``, ``≥ 0.8``,
  ``3 以上``) or with a sign (``+5``);
* a number word (``five``, ``五``, ``两``) with a comparator and a count unit
  (``at most five tool calls``, ``不超过五次``); ``at least one`` / ``至少一`` mean "any" and pass;
* a fraction word: ``三成``, ``百分之三十``; a multiplier word: ``halve``, ``double``,
  ``减半``, ``翻倍``.

Historical basis: a quantity passes when the same sentence cites where it comes from -
a basis word (``baseline``, ``historical``, ``observed in``, ``measured in``, ``based on``,
``基线``, ``历史``, ``依据``, ``根据``, ``参照``, ``实测``) *and* a concrete reference to a cell
(``C004``), a harness / generation (``H0``, ``G2``, ``第 2 代``) or a run id
(``h0-bat-sanitize-r1``). With ``--run``, every cited cell must exist in that run
(``V-RUN-CELL-UNKNOWN``, :mod:`pipeline.validator.run_rules`).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from pipeline.validator.findings import TextField
from pipeline.validator.text import sentences

RULES: dict[str, str] = {
    "V-QUANT-INVENTED": "a quantitative target in a prediction or rejection condition without a cited historical basis",
}

PREDICTION_AREAS = ("strategy_change", "expected_effect", "rejection_conditions", "regression_risks")

_NUM = r"\d+(?:[.,]\d+)?(?:\s?[-–~～到至]\s?\d+(?:[.,]\d+)?)?"
# A number that is not part of an identifier (C004, W-03, r3, 0.7.1) or a ref (#L10).
_DIGITS = rf"(?:(?<![\w.#:/-])[+＋−-]\s?{_NUM}|(?<![\w.#:/+＋−-]){_NUM})"
_CN_NUM = r"[零一二两三四五六七八九十百千万半几]+"
_EN_NUM = (
    r"(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|fifteen|twenty|thirty|forty|fifty|"
    r"sixty|seventy|eighty|ninety|hundred|a dozen|dozen|a few|several)"
)
# A figure written in words: "fifty", "twenty-five", "a hundred", "ninety nine".
_EN_FIGURE = (
    r"(?:a\s+)?(?:(?:twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety)(?:[- ](?:one|two|three|four|five|six|"
    r"seven|eight|nine))?|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|"
    r"sixteen|seventeen|eighteen|nineteen|hundred)"
)

_UNIT = (
    r"(?P<unit>"
    r"%|％|\s?(?:percent|per cent|pct\b|percentage points?|pp\b|个?百分点)|"
    r"\s?(?:[x×](?![A-Za-z])|倍|-?fold\b|times\s+(?:more|less|fewer|faster|slower|higher|lower|as))|"
    r"\s?(?:分(?!钟|之|析|支|布|配|别|类|开|解|成|阶|工|组|散|歧|片|离)|points?\b|pts?\b)|"
    r"\s?(?:个\s?)?(?:cells?\b|单元)|"
    r"\s?(?:次|个)?\s?(?:tool[ -]?calls?|工具调用|调用|calls?\b|steps?\b|步|turns?\b|轮|回合|iterations?\b|"
    r"attempts?\b|retries\b|re-?runs?\b|次重试|重试|rounds?\b|times\b|次|遍)|"
    r"\s?(?:ms\b|milliseconds?|s\b|secs?\b|seconds?|mins?\b|minutes?|h\b|hrs?\b|hours?|days?|毫秒|秒|分钟|小时|天)|"
    r"\s?k?\s?(?:tokens?\b|个?\s?token)|\s?(?:美元|元|dollars?|usd\b)"
    r")"
)
_CMP_BEFORE_EN = (
    r"(?:at most|at least|no more than|no fewer than|no less than|not more than|not less than|fewer than|less than|"
    r"more than|greater than|lower than|higher than|under|below|above|over|within|up to|exceeds?|exceeding|"
    r"reach(?:es|ing)?|drops? to|falls? to|rises? to|by)"
)
_CMP_BEFORE_CN = (
    r"(?:不超过|不多于|不少于|不低于|不高于|不大于|不小于|至多|最多|至少|最少|少于|多于|低于|高于|超过|大于|小于|"
    r"达到|降至|降到|减至|减到|提升至|提升到|提高到|提高至|增加到|控制在|"
    r"(?:减少|降低|缩短|增加|提高|提升|下降|上升|压缩|控制|缩减)(?:到|至|为|在))"
)
_CHANGE_CN = r"(?:减少|增加|提高|降低|下降|上升|缩短|延长)"
_CMP_SYMBOL = r"(?:≤|≥|<=|>=|<|>|＜|＞|=)"
_CMP_AFTER = (
    r"(?:以内|以下|以上|及以上|及以下|或更多|或以上|或更少|or more|or fewer|or less|or above|or below|\+(?!\d))"
)

_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("a figure with a unit", re.compile(rf"{_DIGITS}{_UNIT}", re.IGNORECASE)),
    ("a signed figure", re.compile(r"(?<![\w.#:/-])[+＋−]\d+(?:\.\d+)?")),
    (
        "a figure in words with a unit",
        re.compile(
            rf"(?i)\b{_EN_FIGURE}[\s-]?(?:percent\b|per cent\b|%|percentage points?\b|pp\b|points?\b|-?fold\b|"
            r"times\s+(?:more|less|fewer|faster|slower|higher|lower|as)\b)|"
            r"[零一二两三四五六七八九十百千]+\s?个?百分点|(?<![一二两三四五六七八九十百千])[两二三四五六七八九十]+倍"
        ),
    ),
    (
        "a threshold",
        re.compile(
            rf"(?:\b{_CMP_BEFORE_EN}\s*|{_CMP_BEFORE_CN}\s*|{_CHANGE_CN}\s*|{_CMP_SYMBOL}\s*){_DIGITS}|{_DIGITS}\s*{_CMP_AFTER}",
            re.IGNORECASE,
        ),
    ),
    (
        "a counted threshold",
        re.compile(
            rf"(?:\b(?:{_CMP_BEFORE_EN}|to)\s+{_EN_NUM}\s+(?:\w+[ -])?(?:tool[ -]?calls?|calls?|steps?|turns?|"
            rf"iterations?|attempts?|retries|re-?runs?|rounds?|times|cells?|minutes?|hours?|seconds?|tokens?|points?)\b)|"
            rf"(?:{_CMP_BEFORE_CN}\s*{_CN_NUM}\s*(?:次|步|轮|个|遍|回合|分钟|小时|秒|天|分|倍|tool|cell))",
            re.IGNORECASE,
        ),
    ),
    (
        "a fraction",
        re.compile(
            r"(?<![统合单唯变])[一二两三四五六七八九十]成(?!不变|为|功|本|员|果|熟|就|立|型|长|绩|效|形|分|的)|"
            r"百分之\s*[\d零一二两三四五六七八九十百]+|[一二两三四五六七八九十]分之[一二三四五六七八九十]|"
            r"(?i:\b(?:a|one|two|three)[- ](?:third|quarter|fifth|tenth)s?\b)|"
            r"(?i:\b(?:by|to|in|of|under|over|than|about|around|roughly|nearly|almost)\s+(?:a\s+|one\s+)?half\b)|"
            r"一半|半数|过半"
        ),
    ),
    ("a ratio", re.compile(r"(?<![\w./#:-])\d+(?:\.\d+)?\s?/\s?\d+(?:\.\d+)?(?![\w/])")),
    (
        "a change between figures",
        re.compile(
            rf"(?i)\bfrom\s+{_DIGITS}\s+(?:down\s+|up\s+)?to\s+{_DIGITS}|"
            rf"从\s*{_DIGITS}\s*(?:次|步|轮|个|分钟|秒)?\s*(?:降|减|提|增|缩)?(?:低|少|高|加|短)?(?:到|至)\s*{_DIGITS}"
        ),
    ),
    (
        "a multiplier",
        re.compile(
            r"(?i)减半|减少一半|降低一半|砍半|翻倍|翻番|翻一番|加倍|双倍|\bhalve[sd]?\b|\bhalving\b|\bcut\s+(?:\w+\s+)?in\s+half\b|"
            r"\bdoubl(?:e[sd]?|ing)\b(?![- ]check)|\btripl(?:e[sd]?|ing)\b|\bquadrupl(?:e[sd]?|ing)\b|"
            r"\btwice as\b|\bhalf as\b|\b(?:two|three|four|five|ten)fold\b"
        ),
    ),
]
_ANY_IS_FINE = re.compile(r"(?i)at least (?:one|a|an)\b|至少(?:一|有一)")

_BASIS_WORD = re.compile(
    r"(?i)\bbaseline\b|\bhistoric(?:al|ally)?\b|\bhistory\b|\bobserved in\b|\bmeasured in\b|\bbased on\b|\bas in\b|"
    r"\beffect size\b|基线|历史|依据|根据|参照|实测|观测到|对照"
)
CELL_REF = re.compile(r"(?<![\w-])C\d{2,}(?!\w)")
RUN_REF = re.compile(r"(?<![\w-])[a-z][a-z0-9]*(?:-[a-z0-9]+)*-r\d+(?![\w-])")
_GEN_REF = re.compile(r"(?<![\w-])[HG]\d+(?!\w)|\bgeneration\s+\d+\b|第\s*\d+\s*代")


@dataclass(frozen=True)
class Quantity:
    """One quantity found in one field."""

    path: str
    kind: str
    text: str
    sentence: str
    cells: tuple[str, ...]
    runs: tuple[str, ...]
    has_basis: bool


def has_basis(sentence: str) -> bool:
    """A sentence cites a historical basis: a basis word and a concrete cell, generation or run."""
    if not _BASIS_WORD.search(sentence):
        return False
    return bool(CELL_REF.search(sentence) or RUN_REF.search(sentence) or _GEN_REF.search(sentence))


def find_quantities(fields: list[TextField]) -> list[Quantity]:
    """Every quantity in the prediction areas, with whether its sentence cites a basis."""
    found: list[Quantity] = []
    for f in fields:
        if f.area not in PREDICTION_AREAS:
            continue
        for raw in sentences(f.text):
            sentence = unicodedata.normalize("NFKC", raw)
            for kind, pattern in _PATTERNS:
                m = pattern.search(sentence)
                while m is not None and _ANY_IS_FINE.match(sentence, m.start()):
                    m = pattern.search(sentence, m.end())
                if m is None:
                    continue
                found.append(
                    Quantity(
                        path=f.path,
                        kind=kind,
                        text=m.group(0).strip(),
                        sentence=raw,
                        cells=tuple(CELL_REF.findall(raw)),
                        runs=tuple(RUN_REF.findall(raw)),
                        has_basis=has_basis(raw),
                    )
                )
                break
    return found


def check_quantities(fields: list[TextField]) -> list[tuple[str, str, str]]:
    """Return (rule, path, message) for every invented quantity (first per field)."""
    out: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    for q in find_quantities(fields):
        if q.has_basis or q.path in seen:
            continue
        seen.add(q.path)
        out.append(
            (
                "V-QUANT-INVENTED",
                q.path,
                f"{q.kind} {q.text!r} with no cited historical basis; predict the direction and the behaviour, "
                "or cite the baseline (cell, run or generation) it comes from",
            )
        )
    return out
