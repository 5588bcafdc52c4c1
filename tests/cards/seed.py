"""Extract the seed's example cards (P-01, P-02) at test time; their text is never copied into the project."""

from __future__ import annotations

import re

from tests.conftest import SHARED_SEEDS

SEED = SHARED_SEEDS / "000_c348cb21ec53c04e.txt"
_YAML_BLOCK = re.compile(r"```yaml\n(.*?)```", re.DOTALL)


def seed_yaml_blocks() -> list[str]:
    """The ```yaml blocks of seed 000 that hold a proposal card."""
    text = SEED.read_text(encoding="utf-8")
    return [b for b in _YAML_BLOCK.findall(text) if "proposal_id:" in b]
