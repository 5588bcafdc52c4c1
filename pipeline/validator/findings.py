"""What every rule reports: a rule id, a field path and one explanation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict


class Finding(BaseModel):
    """One broken rule on one field of one card."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rule: str
    path: str
    message: str
    card: int
    proposal_id: str | None = None

    def line(self) -> str:
        """``RULE path: explanation`` - the form printed and sent back to the model on a re-ask."""
        return f"{self.rule} {self.path}: {self.message}"


@dataclass(frozen=True)
class TextField:
    """One text leaf of a card: its path, its functional area and its text."""

    path: str
    area: str
    text: str


@dataclass
class CardReport:
    """The verdict on one card."""

    index: int
    proposal_id: str | None
    findings: list[Finding] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        """True when no rule fired."""
        return not self.findings

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "index": self.index,
            "proposal_id": self.proposal_id,
            "valid": self.valid,
            "findings": [f.model_dump() for f in self.findings],
        }
