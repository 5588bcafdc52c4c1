"""Deterministic checks of Sol's weakness cards against the run's IR.

Every cited cell must be an eligible cell of the run (the denominator); every ref (an event id
``C004-e0012`` or a source ref ``PATH#Lx-Ly``, optionally with the JSON pointer of an element
inside those lines) must resolve to an IR event; support counts are
computed from what is cited, never taken from the model; counter-evidence is present or
explicitly empty with a reason; and a card never prescribes a change (file paths, commands,
patches, "add X" / "remove Y" / "应增加" / "删除…"). Errors are one line each, prefixed with the
weakness id and the field, so they can go back to the model for a re-ask.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core import duck
from pipeline.core.refs import REF
from pipeline.ir.refs import ref_of
from pipeline.sol.cards import Support, SupportCounts, WeaknessCard, WeaknessDraft

EVENT_ID_RE = re.compile(r"^(?P<cell>.+)-e(?P<seq>\d{4,})$")


@dataclass(frozen=True, slots=True)
class CellInfo:
    """What the checks need to know about one cell."""

    task_id: str
    run_id: str
    harness: str | None
    eligible: bool
    exclusion_reason: str | None = None


@dataclass
class EvidenceIndex:
    """The run's evidence, indexed for resolving what a card cites.

    Built from an IR (``ir_path``), it reads the events a card cites when it is asked about them
    (:meth:`load`), never the whole IR: every event of a 10,000-cell batch as Python tuples would
    be ~1 GiB. ``events`` holds what is known so far (or, hand-built, every event).
    """

    cells: dict[str, CellInfo]
    events: dict[str, tuple[str, str, int, int]] = field(default_factory=dict)  # id -> cell, path, start, end
    groups: dict[str, set[str]] = field(default_factory=dict)  # pattern group id -> cells
    ir_path: Path | None = None
    pointers: dict[str, str] = field(default_factory=dict)  # event id -> its JSON pointer (events that have one)
    # path -> (start, end, cell, JSON pointer) of every event from that file
    _by_path: dict[str, list[tuple[int, int, str, str | None]]] = field(default_factory=dict, init=False, repr=False)
    _ids_by_path: dict[str, list[tuple[int, int, str]]] = field(default_factory=dict, init=False, repr=False)
    _asked: set[str] = field(default_factory=set, init=False, repr=False)  # ids and paths already looked up

    def __post_init__(self) -> None:
        for event_id, (cell, path, a, b) in self.events.items():
            self._by_path.setdefault(path, []).append((a, b, cell, None))
            self._ids_by_path.setdefault(path, []).append((a, b, event_id))
        if self.ir_path is None:  # hand-built: everything is already here
            self._asked.update(self.events)
            self._asked.update(f"path:{p}" for p in self._by_path)

    @property
    def denominator(self) -> list[str]:
        """Eligible cells, sorted."""
        return sorted(c for c, info in self.cells.items() if info.eligible)

    def load(self, refs: Iterable[str]) -> None:
        """Read from the IR the events ``refs`` name (event ids) and every event of the files they name (source refs).

        Each id and file is read once; a ref that does not resolve is remembered as such.
        """
        if self.ir_path is None:
            return
        ids, paths = set(), set()
        for raw in refs:
            ref = raw.strip()
            if EVENT_ID_RE.match(ref) and ref not in self._asked:
                ids.add(ref)
            elif (s := REF.match(ref)) and f"path:{s['path']}" not in self._asked:
                paths.add(s["path"])
        if not ids and not paths:
            return
        # An event id names its cell: ids are looked up within their cells, which DuckDB finds from
        # its zone maps, not by scanning every event id of the batch (a map answer's check cost 16 ms
        # at 1,000 cells and 107 ms at 10,000, once per map call: Sol's CPU grew with cells²).
        cells = sorted({m["cell"] for i in ids if (m := EVENT_ID_RE.match(i))})
        where = ["(cell_id IN (SELECT unnest(?::VARCHAR[])) AND event_id IN (SELECT unnest(?::VARCHAR[])))"]
        params: list[Any] = [cells, sorted(ids)]
        if paths:
            where.append("source_path IN (SELECT unnest(?::VARCHAR[]))")
            params.append(sorted(paths))
        con = duck.connect(self.ir_path, read_only=True)
        try:
            found = con.execute(
                "SELECT event_id, cell_id, source_path, line_start, line_end, json_pointer FROM events "
                f"WHERE {' OR '.join(where)}",
                params,
            ).fetchall()
        finally:
            con.close()
        for event_id, cell, path, a, b, pointer in found:
            if event_id in self.events:
                continue
            self.events[event_id] = (cell, path, int(a), int(b))
            if pointer is not None:
                self.pointers[event_id] = pointer
            if f"path:{path}" in self._asked:
                continue  # that file's spans are all known already
            self._by_path.setdefault(path, []).append((int(a), int(b), cell, pointer))
            self._ids_by_path.setdefault(path, []).append((int(a), int(b), event_id))
        self._asked.update(ids)
        self._asked.update(f"path:{p}" for p in paths)

    def source_ref(self, event_id: str) -> str | None:
        """The raw-bytes ref of a known event (``PATH#Lx-Ly``, with its JSON pointer when it has one)."""
        ev = self.events.get(event_id)
        if ev is None:
            return None
        _, path, a, b = ev
        return ref_of(path, a, b, self.pointers.get(event_id))

    def resolve(self, ref: str) -> tuple[str | None, str | None]:
        """The cell a ref belongs to, or (None, why it does not resolve)."""
        ref = ref.strip()
        self.load([ref])  # already known: no query
        m = EVENT_ID_RE.match(ref)
        if m and ref in self.events:
            return self.events[ref][0], None
        s = REF.match(ref)
        if s:
            path, a = s["path"], int(s["start"])
            b = int(s["end"]) if s["end"] else a
            if b < a:
                return None, f"{ref}: line range is backwards"
            spans = self._by_path.get(path)
            if not spans:
                return None, f"{ref}: no IR event comes from {path}"
            cells = {cell for lo, hi, cell, _ in spans if lo <= b and a <= hi}
            if not cells:
                return None, f"{ref}: no IR event covers lines {a}-{b} of {path}"
            if s["pointer"]:
                pointer = s["pointer"]
                cells = {c for lo, hi, c, p in spans if lo <= b and a <= hi and _within(pointer, p)}
                if not cells:
                    return None, f"{ref}: no IR event of lines {a}-{b} of {path} is at {pointer}"
            if len(cells) > 1:
                return None, f"{ref}: lines span several cells"
            return cells.pop(), None
        if m:
            return None, f"{ref}: no such event in this run's IR"
        return None, f"{ref}: not an event id (C004-e0012) or a source ref (PATH#Lx-Ly)"

    def events_of(self, ref: str) -> set[str]:
        """The event ids a resolving ref names: the event itself, or every event a source ref's lines overlap."""
        ref = ref.strip()
        if ref in self.events:
            return {ref}
        s = REF.match(ref)
        if not s:
            return set()
        self.load([ref])
        a = int(s["start"])
        b = int(s["end"]) if s["end"] else a
        return {e for lo, hi, e in self._ids_by_path.get(s["path"], []) if lo <= b and a <= hi}


def _within(pointer: str, event_pointer: str | None) -> bool:
    # An event without a pointer is its whole lines; one with a pointer is that element and what it holds.
    return event_pointer is None or pointer == event_pointer or pointer.startswith(event_pointer + "/")


def load_index(ir_path: Path, groups: dict[str, set[str]] | None = None, con: Any = None) -> EvidenceIndex:
    """The index of the run's DuckDB IR (and the Coordinator's pattern groups): cells now, events when cited.

    ``con``: an open connection to ``ir_path`` to read the cells with (else one is opened and closed).
    """
    own = con is None
    if own:
        con = duck.connect(ir_path, read_only=True)
    same: dict[Any, Any] = {}  # one string per value (tasks, harnesses, reasons repeat over cells)
    try:
        cells = {
            r[0]: CellInfo(
                task_id=same.setdefault(r[1], r[1]),
                run_id=r[2],
                harness=same.setdefault(r[3], r[3]),
                eligible=r[4] == "valid_behavior",
                exclusion_reason=same.setdefault(r[5], r[5]),
            )
            for r in con.execute(
                "SELECT cell_id, task_id, run_id, harness, eligibility, exclusion_reason FROM cells"
            ).fetchall()
        }
    finally:
        if own:
            con.close()
    return EvidenceIndex(cells=cells, groups=dict(groups or {}), ir_path=ir_path)


# -- prescriptions --------------------------------------------------------------------------------

_CODE_EXT = r"(?:py|js|mjs|ts|tsx|ps1|psm1|sh|bash|go|rs|java|rb|c|h|cpp|cs|kt|swift|php|toml|ini|cfg)"
_PRESCRIPTION_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    # a path with a directory and an extension, or any source-code file name (names a target file)
    ("file path", re.compile(r"(?<![\w#])(?:[\w.-]+/)+[\w.-]+\.[A-Za-z0-9]{1,5}\b(?!#L)")),
    ("file path", re.compile(rf"\b[\w-]+\.{_CODE_EXT}\b")),
    ("patch", re.compile(r"(?m)^(?:diff --git |@@ -\d|\+\+\+ |--- a/)")),
    ("command", re.compile(r"(?m)(?:^|`)\s*\$\s+\S")),
    (
        "command",
        re.compile(
            r"(?:^|[`\s])(?:git|rg|grep|sed|pip|npm|pytest|python3?|bash|sh|make|curl|kubectl|docker|matspec|lunasol)"
            r"\s+(?:-{1,2}\w|[a-z][\w-]*\s+-{1,2}\w|(?:add|apply|commit|checkout|install|run|back|show|rm|reset)\b)"
        ),
    ),
    (
        "prescription",
        re.compile(
            r"\b(?:should|must|needs? to|ought to|has to|have to|recommend(?:ed|s)?(?: to)?|suggest(?:ed|s)?|"
            r"propose[sd]?|we (?:can|could|will))\s+(?:to\s+)?(?:be\s+)?(?:add|remov|delet|drop|introduc|implement|"
            r"replac|insert|creat|renam|chang|modif|rewrit|split|merg|patch|fix|refactor|enabl|disabl)\w*\b",
            re.IGNORECASE,
        ),
    ),
    (
        "prescription",
        re.compile(
            r"(?:^|[.;:!?]\s+|\n\s*(?:[-*]|\d+\.)?\s*)(?:Add|Remove|Delete|Drop|Introduce|Implement|Replace|Insert|"
            r"Create|Rename|Modify|Rewrite|Patch|Fix|Refactor|Enable|Disable)\s+(?:a|an|the|\w+)"
        ),
    ),
    (
        "prescription",
        re.compile(
            r"(?:应|应该|应当|需要|必须|建议|最好|宜|要)(?:在\S{0,12})?(?:增加|添加|加入|新增|删除|删去|移除|去掉|去除|"
            r"改为|改成|修改|引入|实现|替换|重写|拆分|合并)"
        ),
    ),
    (
        "prescription",
        re.compile(
            r"(?:^|[。；;：:！!？?\n]\s*(?:[-*]|\d+\.)?\s*)(?:增加|添加|加入|新增|删除|移除|去掉|引入|替换|改为)"
        ),
    ),
)


def find_prescriptions(text: str, *, imperatives: bool = True) -> list[str]:
    """Every prescription in ``text`` as ``"<kind>: <matched text>"`` (empty when there is none).

    ``imperatives=False`` checks only paths, commands and patches: a counterfactual prediction
    may say what "should" be observed without prescribing anything.
    """
    found: list[str] = []
    for kind, rule in _PRESCRIPTION_RULES:
        if kind == "prescription" and not imperatives:
            continue
        for m in rule.finditer(text):
            snippet = " ".join(m.group(0).split())
            item = f"{kind}: {snippet!r}"
            if item not in found:
                found.append(item)
    return found


def _texts(d: WeaknessDraft) -> Iterable[tuple[str, str, bool]]:
    """(field path, text, check imperatives) for every free-text field of a card."""
    yield "statement", d.statement, True
    yield "first_divergence.where.what", d.first_divergence.where.what, True
    yield "harness_attribution.why", d.harness_attribution.why, True
    for i, alt in enumerate(d.alternative_explanations):
        yield f"alternative_explanations[{i}]", alt, True
    for i, item in enumerate(d.counter_evidence.items):
        yield f"counter_evidence.items[{i}].note", item.note, True
    if d.counter_evidence.none_reason:
        yield "counter_evidence.none_reason", d.counter_evidence.none_reason, True
    yield "counterfactual_prediction", d.counterfactual_prediction, False


# -- the checks -------------------------------------------------------------------------------------

MIN_PREDICTION_CHARS = 20


def cited_refs(d: WeaknessDraft | WeaknessCard) -> list[str]:
    """Every ref a draft cites (support, first divergence, counter-evidence)."""
    counter = [r for item in d.counter_evidence.items for r in item.refs]
    return [*d.support.event_refs, *d.first_divergence.event_refs, *counter]


def check_card(
    d: WeaknessDraft, index: EvidenceIndex, shown: set[str] | None = None
) -> tuple[WeaknessCard | None, list[str]]:
    """Check one draft card; return the checked card (support computed) or the list of errors.

    ``shown``: the event ids the request that wrote the card showed (:func:`pipeline.sol.evidence.shown_events`);
    a ref to any other event is refused, as a map call's citation of a cell it was not shown is.
    """
    errs: list[str] = []
    wid = d.weakness_id

    def err(path: str, msg: str) -> None:
        errs.append(f"{wid}: {path}: {msg}")

    index.load(cited_refs(d))  # every ref the card cites, read from the IR in one query

    def check_cell(path: str, cell: str) -> bool:
        info = index.cells.get(cell)
        if info is None:
            err(path, f"{cell} is not a cell of this run")
            return False
        if not info.eligible:
            err(path, f"{cell} is excluded, not in the denominator of eligible cells")
            return False
        return True

    def check_refs(path: str, refs: list[str], cells: set[str] | None) -> set[str]:
        """Resolve refs; return the cells they belong to. ``cells`` restricts where they may point."""
        seen: set[str] = set()
        for i, ref in enumerate(refs):
            cell, why = index.resolve(ref)
            if cell is None:
                err(f"{path}[{i}]", why or "does not resolve")
                continue
            if not check_cell(f"{path}[{i}]", cell):
                continue
            if cells is not None and cell not in cells:
                err(f"{path}[{i}]", f"{ref} is in {cell}, which is not one of the cells cited here")
                continue
            if shown is not None and not (index.events_of(ref) & shown):
                err(f"{path}[{i}]", f"{ref} was not shown in this request: cite only events shown with their text")
                continue
            seen.add(cell)
        return seen

    if not d.statement.strip():
        err("statement", "empty")
    # support: cells must each be backed by a cited ref or pattern group
    s = d.support
    if not s.cells:
        err("support.cells", "empty: a weakness needs at least one supporting cell")
    if len(set(s.cells)) != len(s.cells):
        err("support.cells", "lists a cell twice")
    support_cells = {c for i, c in enumerate(s.cells) if check_cell(f"support.cells[{i}]", c)}
    backed = check_refs("support.event_refs", s.event_refs, support_cells)
    for i, g in enumerate(s.pattern_groups):
        members = index.groups.get(g)
        if members is None:
            err(f"support.pattern_groups[{i}]", f"{g} is not a pattern group of this run")
            continue
        backed |= members & support_cells
    if not s.event_refs and not s.pattern_groups:
        err("support", "cites no event ref and no pattern group")
    for c in sorted(support_cells - backed):
        err("support.cells", f"{c} is cited but no cited ref or pattern group comes from it")
    # first divergence: inside the support
    fd = d.first_divergence
    if not fd.cells:
        err("first_divergence.cells", "empty")
    for i, c in enumerate(fd.cells):
        if check_cell(f"first_divergence.cells[{i}]", c) and c not in support_cells:
            err(f"first_divergence.cells[{i}]", f"{c} is not one of the support cells")
    if not fd.event_refs:
        err("first_divergence.event_refs", "empty: point at the events where it diverged")
    check_refs("first_divergence.event_refs", fd.event_refs, set(fd.cells))
    if not d.harness_attribution.why.strip():
        err("harness_attribution.why", "empty")
    # alternatives and counter-evidence
    if not [a for a in d.alternative_explanations if a.strip()]:
        err("alternative_explanations", "empty: name at least one other explanation that was considered")
    ce = d.counter_evidence
    if ce.items and ce.none_reason:
        err("counter_evidence", "has items and a none_reason; give one or the other")
    if not ce.items and not (ce.none_reason or "").strip():
        err("counter_evidence", "empty without a reason: give counter-evidence cells or say why there is none")
    harnesses = {index.cells[c].harness for c in support_cells}
    for i, item in enumerate(ce.items):
        if not check_cell(f"counter_evidence.items[{i}].cell", item.cell):
            continue
        if harnesses and index.cells[item.cell].harness not in harnesses:
            err(f"counter_evidence.items[{i}].cell", f"{item.cell} is from another harness")
        if not item.refs:
            err(f"counter_evidence.items[{i}].refs", "empty")
        check_refs(f"counter_evidence.items[{i}].refs", item.refs, {item.cell})
        if not item.note.strip():
            err(f"counter_evidence.items[{i}].note", "empty")
    if len(d.counterfactual_prediction.strip()) < MIN_PREDICTION_CHARS:
        err("counterfactual_prediction", "too short to be falsifiable: say what would be observed")
    for path, text, imperatives in _texts(d):
        for p in find_prescriptions(text, imperatives=imperatives):
            err(path, f"prescribes a change ({p}); a weakness explains why, only proposals propose")
    if errs:
        return None, errs
    cells = sorted(support_cells)
    groups = sorted(set(s.pattern_groups))
    tasks = sorted({index.cells[c].task_id for c in cells})
    runs = sorted({index.cells[c].run_id for c in cells})
    support = Support(
        cells=cells,
        tasks=tasks,
        runs=runs,
        pattern_groups=groups,
        event_refs=list(s.event_refs),
        counts=SupportCounts(cells=len(cells), tasks=len(tasks), runs=len(runs), pattern_groups=len(groups)),
    )
    data: dict[str, Any] = d.model_dump()
    data["support"] = support.model_dump()
    return WeaknessCard.model_validate(data), []


def check_answer(
    drafts: list[WeaknessDraft], index: EvidenceIndex, shown: set[str] | None = None
) -> tuple[list[WeaknessCard], dict[str, list[str]]]:
    """Check every card; return the passing cards and, per failing weakness id, its errors.

    ``shown``: as in :func:`check_card`.
    """
    cards: list[WeaknessCard] = []
    failed: dict[str, list[str]] = {}
    seen: set[str] = set()
    index.load([r for d in drafts for r in cited_refs(d)])  # one query for the whole answer, not one per card
    for d in drafts:
        if d.weakness_id in seen:
            failed.setdefault(d.weakness_id, []).append(f"{d.weakness_id}: weakness_id used twice")
            continue
        seen.add(d.weakness_id)
        card, errs = check_card(d, index, shown)
        if card is None:
            failed[d.weakness_id] = errs
        else:
            cards.append(card)
    return cards, failed


def answer_errors(drafts: list[WeaknessDraft], index: EvidenceIndex, shown: set[str] | None = None) -> list[str]:
    """Every error of an answer, flat (what goes back to the model on a re-ask)."""
    _, failed = check_answer(drafts, index, shown)
    return [e for errs in failed.values() for e in errs]
