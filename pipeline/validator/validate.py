"""Run every rule family over the cards of one file; deterministic, no model, no network."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.artifacts.proposal_card import ProposalCard
from pipeline.artifacts.proposals_file import read_entries
from pipeline.validator import behaviour, forbidden, lever, limits, quantities, run_rules, schema, similarity
from pipeline.validator.findings import CardReport, Finding
from pipeline.validator.run_rules import RunFacts, load_run_facts
from pipeline.validator.text import card_fields

RULES: dict[str, str] = {
    **schema.RULES,
    **limits.RULES,
    **forbidden.RULES,
    **quantities.RULES,
    **lever.RULES,
    **behaviour.RULES,
    **similarity.RULES,
    **run_rules.RULES,
}
"""Every rule id and what it catches (docs/validator.md explains each with examples)."""

PROMPT_RULES: dict[str, str] = {rule: what for rule, what in RULES.items() if rule not in limits.RULES}
"""The rules the proposer's prompt lists: all but the length bound, which a card of a few
sentences never meets (a too-long answer still gets the finding back on the re-ask)."""


@dataclass
class ValidationResult:
    """The verdict on one proposals file."""

    source: str
    cards: list[CardReport] = field(default_factory=list)
    run: str | None = None

    @property
    def valid(self) -> bool:
        """True when every card passed every rule."""
        return all(c.valid for c in self.cards)

    @property
    def findings(self) -> list[Finding]:
        """All findings, card by card."""
        return [f for c in self.cards for f in c.findings]

    def valid_cards(self) -> list[int]:
        """Indexes of the cards that passed."""
        return [c.index for c in self.cards if c.valid]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (what ``lunasol validate --json`` prints)."""
        return {
            "source": self.source,
            "run": self.run,
            "valid": self.valid,
            "cards": [c.as_dict() for c in self.cards],
            "counts": {
                "cards": len(self.cards),
                "valid": sum(1 for c in self.cards if c.valid),
                "invalid": sum(1 for c in self.cards if not c.valid),
                "findings": len(self.findings),
            },
        }


def check_card(card: ProposalCard, index: int, facts: RunFacts | None = None) -> list[Finding]:
    """The content rules (everything but schema and cross-card rules) for one parsed card."""
    prefix = f"proposals[{index}]"
    fields, raw = limits.bound_fields(card_fields(card, prefix))
    raw += forbidden.check_forbidden(fields)
    raw += quantities.check_quantities(fields)
    raw += lever.check_lever(fields)
    raw += behaviour.check_behaviour(fields)
    if facts is not None:
        raw += run_rules.check_run(card, prefix, fields, facts)
    return [Finding(rule=r, path=p, message=m, card=index, proposal_id=card.proposal_id) for r, p, m in raw]


def validate_entries(entries: list[Any], facts: RunFacts | None = None, source: str = "<cards>") -> ValidationResult:
    """Validate raw card entries (as read from YAML or returned by a model)."""
    result = ValidationResult(source=source, run=str(facts.run_dir) if facts else None)
    parsed: list[tuple[int, ProposalCard]] = []
    for index, entry in enumerate(entries):
        parsed_card, found = schema.check_schema(entry, index, f"proposals[{index}]")
        pid = parsed_card.proposal_id if parsed_card else _raw_id(entry)
        report = CardReport(index=index, proposal_id=pid, findings=found)
        if parsed_card is not None:
            report.findings += check_card(parsed_card, index, facts)
            parsed.append((index, parsed_card))
        result.cards.append(report)
    for finding in schema.check_duplicate_ids(parsed):
        result.cards[finding.card].findings.append(finding)
    for index, rule, path, message in similarity.check_duplicates(parsed):
        target = result.cards[index]
        target.findings.append(
            Finding(rule=rule, path=path, message=message, card=index, proposal_id=target.proposal_id)
        )
    return result


def validate_cards(cards: list[ProposalCard], facts: RunFacts | None = None) -> ValidationResult:
    """Validate already-parsed cards (the proposer's path)."""
    return validate_entries([c.model_dump(mode="json") for c in cards], facts)


def validate_file(path: Path, run_dir: Path | None = None) -> ValidationResult:
    """Read a proposals file and validate every card (``lunasol validate``)."""
    entries = read_entries(path)
    facts = load_run_facts(run_dir) if run_dir is not None else None
    return validate_entries(entries, facts, source=str(path))


def _raw_id(entry: Any) -> str | None:
    value = entry.get("proposal_id") if isinstance(entry, dict) else None
    return value if isinstance(value, str) else None
