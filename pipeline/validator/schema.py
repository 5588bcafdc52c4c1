"""Schema rules: the card must be exactly the fixed proposal-card schema.

Pydantic does the checking; this module turns each pydantic error into a rule id and a
field path, and adds the checks pydantic cannot express (placeholder text, id formats,
duplicate ids in one file).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from pipeline.artifacts.proposal_card import ProposalCard
from pipeline.validator.findings import Finding
from pipeline.validator.text import card_fields

RULES: dict[str, str] = {
    "V-SCHEMA-MISSING": "a required field is missing",
    "V-SCHEMA-EXTRA": "a field that is not in the fixed schema",
    "V-SCHEMA-ENUM": "a value outside its enumeration (confidence: high / medium / low)",
    "V-SCHEMA-EMPTY": "empty or placeholder text, or an empty list",
    "V-SCHEMA-TYPE": "a value of the wrong type (text where a list is expected, a number for text, ...)",
    "V-SCHEMA-ID": "proposal_id / source_weakness / parent_harness not in their id formats",
    "V-DUPLICATE-ID": "two cards in one file with the same proposal_id",
    "V-NO-REJECTION-CONDITION": "no rejection condition",
    "V-NO-REGRESSION-RISK": "no regression risk",
}

# Text that fills a field without saying anything (checked after trimming, case-folded).
PLACEHOLDERS = frozenset(
    {
        "n/a",
        "na",
        "none",
        "null",
        "tbd",
        "todo",
        "-",
        "--",
        "...",
        "…",
        "?",
        "无",
        "暂无",
        "待定",
        "待补充",
        "略",
        "同上",
    }
)

ID_FORMATS: dict[str, tuple[re.Pattern[str], str]] = {
    "proposal_id": (re.compile(r"^P-\d+$"), "P-<number>, e.g. P-01"),
    "source_weakness": (re.compile(r"^W-\d+$"), "W-<number>, e.g. W-03"),
    "parent_harness": (re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$"), "a harness id without spaces, e.g. H0"),
}


def _path(prefix: str, loc: tuple[int | str, ...]) -> str:
    out = prefix
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _rule_for(error_type: str, loc: tuple[int | str, ...]) -> tuple[str, str]:
    top = loc[0] if loc else ""
    if error_type == "missing":
        return "V-SCHEMA-MISSING", "required field is missing"
    if error_type == "extra_forbidden":
        return "V-SCHEMA-EXTRA", "field is not part of the fixed proposal schema"
    if error_type in ("literal_error", "enum"):
        return "V-SCHEMA-ENUM", "must be one of high, medium, low"
    if error_type == "too_short" and len(loc) == 1 and top == "rejection_conditions":
        return "V-NO-REJECTION-CONDITION", "at least one condition that would reject the proposal is required"
    if error_type == "too_short" and len(loc) == 1 and top == "regression_risks":
        return "V-NO-REGRESSION-RISK", "at least one regression risk the new strategy could cause is required"
    if error_type in ("string_too_short", "too_short"):
        return "V-SCHEMA-EMPTY", "must not be empty"
    return "V-SCHEMA-TYPE", ""


def check_schema(entry: Any, index: int, prefix: str) -> tuple[ProposalCard | None, list[Finding]]:
    """Parse one raw entry into a card; return the card (None if invalid) and schema findings."""
    pid = entry.get("proposal_id") if isinstance(entry, dict) else None
    pid = pid if isinstance(pid, str) else None

    def finding(rule: str, path: str, message: str) -> Finding:
        return Finding(rule=rule, path=path, message=message, card=index, proposal_id=pid)

    if not isinstance(entry, dict):
        return None, [finding("V-SCHEMA-TYPE", prefix, f"a card must be a mapping, got {type(entry).__name__}")]
    try:
        card = ProposalCard.model_validate(entry)
    except ValidationError as exc:
        out = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            rule, msg = _rule_for(err["type"], loc)
            out.append(finding(rule, _path(prefix, loc), msg or err["msg"]))
        return None, out
    out = []
    for path, text in _leaves(card, prefix):
        if text.strip().casefold().rstrip("。.") in PLACEHOLDERS:
            rule = "V-SCHEMA-EMPTY"
            if path.startswith(f"{prefix}.rejection_conditions") and len(card.rejection_conditions) == 1:
                rule = "V-NO-REJECTION-CONDITION"
            elif path.startswith(f"{prefix}.regression_risks") and len(card.regression_risks) == 1:
                rule = "V-NO-REGRESSION-RISK"
            out.append(finding(rule, path, f"placeholder text {text.strip()!r} says nothing"))
    for key, (pattern, form) in ID_FORMATS.items():
        value = getattr(card, key)
        if not pattern.match(value):
            out.append(finding("V-SCHEMA-ID", f"{prefix}.{key}", f"{value!r} is not {form}"))
    return card, out


def _leaves(card: ProposalCard, prefix: str) -> list[tuple[str, str]]:

    return [(f.path, f.text) for f in card_fields(card, prefix)]


def check_duplicate_ids(cards: list[tuple[int, ProposalCard]]) -> list[Finding]:
    """Two cards in one file may not share a proposal_id."""
    seen: dict[str, int] = {}
    out = []
    for index, card in cards:
        if card.proposal_id in seen:
            out.append(
                Finding(
                    rule="V-DUPLICATE-ID",
                    path=f"proposals[{index}].proposal_id",
                    message=f"{card.proposal_id} is already used by proposals[{seen[card.proposal_id]}]",
                    card=index,
                    proposal_id=card.proposal_id,
                )
            )
        else:
            seen[card.proposal_id] = index
    return out
