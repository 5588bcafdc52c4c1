"""Proposal cards: the fixed schema, YAML in and out, and (phase 2) the proposer."""

from pipeline.artifacts.proposal_card import ProposalCard, ProposalList, card_json_schema
from pipeline.artifacts.proposals_file import dump_cards, parse_entries, read_entries, write_cards

__all__ = [
    "ProposalCard",
    "ProposalList",
    "card_json_schema",
    "dump_cards",
    "parse_entries",
    "read_entries",
    "write_cards",
]
