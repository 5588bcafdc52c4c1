"""The deterministic proposal-card validator: one small module per rule family.

Every finding carries a rule id (``V-...``), the field path (``proposals[0].evidence.summary``)
and one explanation; see docs/validator.md for every rule and the historical-basis policy.
"""

from pipeline.validator.findings import CardReport, Finding
from pipeline.validator.run_rules import RunFacts, load_run_facts
from pipeline.validator.validate import (
    PROMPT_RULES,
    RULES,
    ValidationResult,
    check_card,
    validate_cards,
    validate_entries,
    validate_file,
)

__all__ = [
    "PROMPT_RULES",
    "RULES",
    "CardReport",
    "Finding",
    "RunFacts",
    "ValidationResult",
    "check_card",
    "load_run_facts",
    "validate_cards",
    "validate_entries",
    "validate_file",
]
