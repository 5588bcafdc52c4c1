"""``weakness-shortlist.json``: the checked cards, the dropped ones with reasons, and the shortlist's own digest.

The digest is the digest of the canonical content without the ``digest`` field and without call
metadata (:data:`CALL_METADATA`: how the answer was reached, not what it says), so anyone can
recompute it and a resumed or re-asked run with the same cards has the same digest; gate 1 binds its
receipt to it. Reading a shortlist whose content no longer matches its digest is refused (it was
edited by hand).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from pipeline.artifacts.run_info import Pilot
from pipeline.artifacts.rundir import SHORTLIST
from pipeline.artifacts.schemas import read_document, upgrade
from pipeline.artifacts.versions import VERSIONS
from pipeline.core.canonical import digest, write_json
from pipeline.core.errors import BadInput
from pipeline.sol.cards import Dropped, SolPlan, WeaknessCard

SHORTLIST_FILE = SHORTLIST.filename
SHORTLIST_SCHEMA_VERSION = VERSIONS["weakness-shortlist"]
# Per-call facts of how Sol's answer was obtained (exchange keys, attempts and the errors re-asked,
# answers reused from a previous run, request sizes): a kill, a resume or one re-ask changes them
# while the cards stay the same, so the digest gate 1 binds to leaves them out (with ``call``).
SEALED_WITHOUT_CALLS = 4  # the first version sealed without call metadata (older: the whole content less digest)
CALL_METADATA = frozenset({"attempts", "key", "errors", "reused", "ok", "request_tokens"})


class Denominator(BaseModel):
    """Which cells the weaknesses are measured against."""

    model_config = ConfigDict(extra="forbid")

    eligible_cells: int
    cells: list[str]
    excluded: dict[str, str | None] = Field(default_factory=dict, description="excluded cell -> reason")


class Shortlist(BaseModel):
    """The Sol stage's output."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SHORTLIST_SCHEMA_VERSION
    run_id: str
    denominator: Denominator
    weaknesses: list[WeaknessCard]
    dropped: list[Dropped] = Field(default_factory=list)
    made_from: dict[str, str | None] = Field(default_factory=dict, description="input name -> digest")
    call: dict[str, Any] = Field(default_factory=dict, description="the Sol call: ok, attempts, errors")
    plan: SolPlan | None = Field(default=None, description="which Sol call saw which cells (none in a v1 file)")
    pilot: Pilot | None = Field(
        default=None, description="a pilot run's selection: the denominator is its subset of cells (none: every cell)"
    )
    digest: str = ""

    def content_digest(self) -> str:
        """Digest of the canonical content, without the digest field and call metadata (``call``, CALL_METADATA)."""
        return sealed_digest(self.model_dump(mode="json"))


def sealed_digest(doc: dict[str, Any]) -> str:
    """The digest v4 and later seal a shortlist document with: its content less ``digest`` and call metadata."""
    doc = {k: v for k, v in doc.items() if k not in ("digest", "call")}
    if doc.get("plan"):
        plan = dict(doc["plan"])
        plan["calls"] = [{k: v for k, v in c.items() if k not in CALL_METADATA} for c in plan.get("calls") or []]
        doc["plan"] = plan
    return digest(doc)


def write_shortlist(path: Path, shortlist: Shortlist) -> Shortlist:
    """Seal the shortlist with its digest and write it atomically."""
    shortlist.digest = shortlist.content_digest()
    write_json(path, shortlist.model_dump(mode="json"))
    return shortlist


def read_shortlist(path: Path) -> Shortlist:
    """Read and verify a shortlist (schema version and digest)."""
    if not path.is_file():
        raise BadInput(f"no weakness shortlist at {path}")

    raw = read_document(path)
    doc, found = upgrade(raw, "weakness-shortlist", str(path))  # newer refused (exit 2), older upgraded
    try:
        sl = Shortlist.model_validate(doc)
    except ValueError as exc:
        raise BadInput(f"{path}: not a valid weakness shortlist: {str(exc).splitlines()[0]}") from None
    # An upgraded file keeps the digest it was sealed with (gate 1 bound a receipt to it): check it
    # against the content as written, not as upgraded.
    if found == SHORTLIST_SCHEMA_VERSION:
        sealed = sl.content_digest()
    elif found >= SEALED_WITHOUT_CALLS:
        sealed = sealed_digest(raw)  # e.g. a v4 file: the same rule, on the fields it was written with
    else:
        sealed = digest(_without_digest(raw))
    if sl.digest != sealed:
        raise BadInput(f"{path}: content does not match its digest {sl.digest} (edited by hand?)")
    return sl


def _without_digest(raw: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in raw.items() if k != "digest"}
