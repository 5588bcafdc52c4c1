"""Rules that need the run (``lunasol validate FILE --run RUN``).

The run's facts are read through :func:`load_run_facts` only: ``run.json`` (parent harness),
``weakness-shortlist.json`` (weaknesses and their support, digest-checked by
:mod:`pipeline.sol.shortlist`), and the gate-1 receipt via
:func:`pipeline.gates.gate1.confirmed_weaknesses` (bound to the current shortlist digest; silence is
never approval).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.artifacts.proposal_card import ProposalCard
from pipeline.artifacts.run_info import read_run_info
from pipeline.artifacts.rundir import RunDir
from pipeline.core import duck
from pipeline.core.errors import BadInput, Blocked, LunasolError
from pipeline.gates.gate1 import confirmed_weaknesses
from pipeline.ir.refs import resolve_ref
from pipeline.sol.shortlist import read_shortlist
from pipeline.validator.findings import TextField
from pipeline.validator.quantities import CELL_REF

RULES: dict[str, str] = {
    "V-RUN-PARENT": "parent_harness is not the run's parent harness",
    "V-RUN-WEAKNESS-UNKNOWN": "source_weakness is not in the run's weakness shortlist",
    "V-RUN-WEAKNESS-UNCONFIRMED": (
        "source_weakness has no confirm / amend decision in a gate-1 receipt on the current shortlist"
    ),
    "V-RUN-TASK-OUTSIDE": "an affected task lies outside the weakness's support",
    "V-RUN-RUN-OUTSIDE": "an affected run lies outside the weakness's support",
    "V-RUN-CELL-UNKNOWN": "the card names a cell the run does not have",
    "V-RUN-REF-UNKNOWN": "the card cites an event id or source ref that does not resolve in the run",
}

EVENT_REF = re.compile(r"(?<![\w-])C\d{2,}-e\d{3,}(?!\w)")
SOURCE_REF = re.compile(r"(?<![\w/.#-])[\w.-]+(?:/[\w.-]+)+#L\d+(?:-L\d+)?")


@dataclass(frozen=True)
class WeaknessSupport:
    """The support of one weakness: cells, tasks and runs (computed by Sol from the IR)."""

    weakness_id: str
    cells: frozenset[str]
    tasks: frozenset[str]
    runs: frozenset[str]


@dataclass
class RunFacts:
    """What the run-dependent rules need to know about one run."""

    run_dir: Path
    parent_harness: str | None
    weaknesses: dict[str, WeaknessSupport] = field(default_factory=dict)
    confirmed: dict[str, str] = field(default_factory=dict)  # weakness id -> decision (confirm / amend)
    unconfirmed_reason: str | None = None  # why no gate-1 receipt counts, with the unblock command
    cells: frozenset[str] = frozenset()
    shortlist_digest: str | None = None
    has_ir: bool = False

    def unknown_events(self, event_ids: set[str]) -> set[str]:
        """Event ids not in the run's IR (none when the run has no IR to check against)."""
        if not event_ids or not self.has_ir:
            return set()

        con = duck.connect(RunDir(self.run_dir).ir, read_only=True)
        try:
            ids = sorted(event_ids)
            marks = ", ".join("?" for _ in ids)
            found = {
                r[0] for r in con.execute(f"SELECT event_id FROM events WHERE event_id IN ({marks})", ids).fetchall()
            }
        finally:
            con.close()
        return event_ids - found

    def unresolved_refs(self, refs: set[str]) -> dict[str, str]:
        """Source refs that do not resolve to the frozen bundle bytes, with the reason."""
        if not refs or not RunDir(self.run_dir).run_json.is_file():
            return {}
        if read_run_info(self.run_dir).bundle is None:
            return {}  # a run without a recorded bundle has nothing to resolve refs against

        out: dict[str, str] = {}
        for ref in sorted(refs):
            try:
                resolve_ref(self.run_dir, ref)
            except (LunasolError, OSError, ValueError) as exc:
                out[ref] = exc.one_line() if isinstance(exc, LunasolError) else str(exc)
        return out


def load_run_facts(run_dir: Path) -> RunFacts:
    """Read a run's facts defensively; a missing or unreadable run is BadInput (exit 2)."""
    if not run_dir.is_dir():
        raise BadInput(f"run directory not found: {run_dir}")
    parent: str | None = None
    parent = read_run_info(run_dir).parent_harness
    rd = RunDir(run_dir)
    if not rd.shortlist.is_file():
        raise BadInput(f"{run_dir} has no {rd.shortlist.name}: run the analysis up to gate 1 first")
    shortlist = read_shortlist(rd.shortlist)
    facts = RunFacts(run_dir=run_dir, parent_harness=parent, shortlist_digest=shortlist.digest)
    for w in shortlist.weaknesses:
        facts.weaknesses[w.weakness_id] = WeaknessSupport(
            weakness_id=w.weakness_id,
            cells=frozenset(w.support.cells),
            tasks=frozenset(w.support.tasks),
            runs=frozenset(w.support.runs),
        )
    facts.cells = frozenset(shortlist.denominator.cells) | frozenset(shortlist.denominator.excluded)
    facts.has_ir = rd.ir.is_file()
    try:
        decided = confirmed_weaknesses(run_dir)
    except Blocked as exc:
        facts.unconfirmed_reason = f"{exc.one_line()} (unblock: {exc.unblock})" if exc.unblock else exc.one_line()
    else:
        facts.confirmed = {w: str(d.get("decision")) for w, d in decided.items()}
    return facts


def check_run(card: ProposalCard, prefix: str, fields: list[TextField], facts: RunFacts) -> list[tuple[str, str, str]]:
    """Return (rule, path, message) for every run-dependent rule the card breaks."""
    out: list[tuple[str, str, str]] = []
    if facts.parent_harness is not None and card.parent_harness != facts.parent_harness:
        out.append(
            (
                "V-RUN-PARENT",
                f"{prefix}.parent_harness",
                f"{card.parent_harness!r} is not this run's parent harness {facts.parent_harness!r}",
            )
        )
    support = facts.weaknesses.get(card.source_weakness)
    if support is None:
        known = ", ".join(sorted(facts.weaknesses)) or "none"
        out.append(
            (
                "V-RUN-WEAKNESS-UNKNOWN",
                f"{prefix}.source_weakness",
                f"{card.source_weakness} is not in the run's weakness shortlist (it has {known})",
            )
        )
    elif card.source_weakness not in facts.confirmed:
        why = facts.unconfirmed_reason or "the gate-1 receipt does not confirm or amend it"
        out.append(("V-RUN-WEAKNESS-UNCONFIRMED", f"{prefix}.source_weakness", f"{card.source_weakness}: {why}"))
    if support is not None:
        for i, task in enumerate(card.evidence.affected_tasks):
            if task not in support.tasks:
                out.append(
                    (
                        "V-RUN-TASK-OUTSIDE",
                        f"{prefix}.evidence.affected_tasks[{i}]",
                        f"{task!r} is not in the support of {support.weakness_id} ({', '.join(sorted(support.tasks))})",
                    )
                )
        for i, run in enumerate(card.evidence.affected_runs):
            if run not in support.runs:
                out.append(
                    (
                        "V-RUN-RUN-OUTSIDE",
                        f"{prefix}.evidence.affected_runs[{i}]",
                        f"{run!r} is not in the support of {support.weakness_id} ({', '.join(sorted(support.runs))})",
                    )
                )
    if facts.cells:
        for f in fields:
            unknown = sorted({c for c in CELL_REF.findall(f.text) if c not in facts.cells})
            if unknown:
                out.append(("V-RUN-CELL-UNKNOWN", f.path, f"names {', '.join(unknown)}, not a cell of this run"))
    for f in fields:
        missing = sorted(facts.unknown_events(set(EVENT_REF.findall(f.text))))
        bad_refs = facts.unresolved_refs(set(SOURCE_REF.findall(f.text)))
        if missing:
            out.append(("V-RUN-REF-UNKNOWN", f.path, f"cites {', '.join(missing)}, not an event of this run's IR"))
        for ref, why in sorted(bad_refs.items()):
            out.append(("V-RUN-REF-UNKNOWN", f.path, f"cites {ref}, which does not resolve: {why}"))
    return out
