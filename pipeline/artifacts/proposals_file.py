"""Proposal files: YAML in and out.

A file holds one card (a mapping), a list of cards, or a mapping with key ``proposals``
(optionally with ``schema_version``). Reading never judges the cards: it returns the raw
entries so the validator can name every defect with a rule id; only a file that cannot be
read as one of those three shapes is ``BadInput`` (exit 2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from pipeline.artifacts.proposal_card import FIELD_ORDER, ProposalCard
from pipeline.artifacts.versions import VERSIONS
from pipeline.core.canonical import atomic_write_text
from pipeline.core.errors import BadInput
from pipeline.core.limits import check_size

WRAPPER_KEYS = frozenset({"proposals", "schema_version"})
PROPOSALS_SCHEMA_VERSION = VERSIONS["proposals"]


class ProposalsFile(BaseModel):
    """``proposals.yaml`` as lunasol writes it (reading also takes one card or a bare list of cards)."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = PROPOSALS_SCHEMA_VERSION
    proposals: list[ProposalCard] = Field(default_factory=list)


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML silently keeps the last one)."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_entries(text: str, source: str = "<text>") -> list[Any]:
    """Parse YAML text into the raw card entries (each should be a mapping)."""
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        first = " ".join(str(exc).split())
        raise BadInput(f"{source}: not readable YAML: {first}") from None
    except RecursionError:  # PyYAML's composer recurses once per nesting level
        raise BadInput(f"{source}: YAML nested too deeply to read (a card is a few levels deep)") from None
    if isinstance(data, list):
        return data
    if isinstance(data, dict):
        if "proposals" in data and "proposal_id" not in data:
            extra = sorted(str(k) for k in data if k not in WRAPPER_KEYS)
            if extra:
                raise BadInput(f"{source}: a proposals mapping may hold only 'proposals', found {extra}")
            version = data.get("schema_version", PROPOSALS_SCHEMA_VERSION)
            if not isinstance(version, int) or version > PROPOSALS_SCHEMA_VERSION:
                raise BadInput(
                    f"{source}: schema_version {version!r} is not supported "
                    f"(this lunasol reads <= {PROPOSALS_SCHEMA_VERSION})"
                )
            cards = data["proposals"]
            if cards is None:
                return []
            if not isinstance(cards, list):
                raise BadInput(f"{source}: 'proposals' must be a list of cards")
            return cards
        return [data]
    if data is None:
        raise BadInput(f"{source}: empty file (expected a card, a list of cards, or a 'proposals' mapping)")
    raise BadInput(f"{source}: expected a card, a list of cards, or a 'proposals' mapping, got {type(data).__name__}")


def read_entries(path: Path) -> list[Any]:
    """Read a proposals file into its raw entries; unreadable files raise BadInput."""
    if not path.is_file():
        raise BadInput(f"proposals file not found: {path}")
    check_size(path.stat().st_size, "LUNASOL_MAX_DOC_BYTES", str(path), "the file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise BadInput(f"{path}: not UTF-8 text") from None
    return parse_entries(text, source=str(path))


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line text so cards stay readable."""


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str_representer)


def card_to_dict(card: ProposalCard) -> dict[str, Any]:
    """A card as a plain dict in the card schema's field order."""
    data = card.model_dump(mode="json")
    return {key: data[key] for key in FIELD_ORDER}


def dump_cards(cards: list[ProposalCard]) -> str:
    """YAML text of a ``proposals`` mapping (deterministic: same cards, same bytes)."""
    doc = {"schema_version": PROPOSALS_SCHEMA_VERSION, "proposals": [card_to_dict(c) for c in cards]}
    return yaml.dump(doc, Dumper=_Dumper, allow_unicode=True, sort_keys=False, width=100)


def write_cards(path: Path, cards: list[ProposalCard]) -> None:
    """Atomically write cards as a ``proposals`` mapping."""
    atomic_write_text(path, dump_cards(cards))
