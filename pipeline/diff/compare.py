"""The semantic diff of two runs: inputs, per-cell patterns, groups, weaknesses, proposals, gates, calls.

Every section lists what was added, removed or changed after matching by content
(see :mod:`pipeline.diff.match`). Volatile fields (timestamps, latencies, operation ids)
never count as differences; the diff of a run with itself is empty.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from functools import partial
from typing import Any, Literal

from pydantic import BaseModel, Field

from pipeline.artifacts.rundir import Row, RunArtifacts
from pipeline.diff.decisions import Decisions, build_decisions
from pipeline.diff.match import (
    FieldChange,
    cited_ids,
    field_changes,
    greedy_match,
    id_list,
    jaccard,
    text_similarity,
)

Status = Literal["added", "removed", "changed"]

# Keys that change between two runs of the same thing without meaning anything.
VOLATILE = frozenset(
    {
        "created_at",
        "started_at",
        "finished_at",
        "ended_at",
        "updated_at",
        "decided_at",
        "blocked_at",
        "written_at",
        "at",
        "ts",
        "timestamp",
        "time",
        "elapsed_s",
        "duration_s",
        "duration_ms",
        "latency_s",
        "latency_ms",
        "wall_s",
        "pid",
        "host",
        "hostname",
        "operation_id",
    }
)
# Identity of a run (shown in the header, not an input difference).
IDENTITY = frozenset({"run_id", "analysis_run_id", "run_dir", "runs_dir", "path"})

PATTERN_MATCH_THRESHOLD = 0.0  # any shared evidence event (Jaccard > 0) makes same-type patterns candidates
WEAKNESS_MATCH_THRESHOLD = 0.2
PROPOSAL_MATCH_THRESHOLD = 0.2


class Item(BaseModel):
    """One matched, added or removed output: ids on each side, match score, field changes."""

    status: Status
    a_id: str | None = None
    b_id: str | None = None
    kind: str | None = None  # pattern type, group type, source weakness...
    score: float | None = None  # the match score (Jaccard / similarity) for changed items
    changes: list[FieldChange] = Field(default_factory=list)
    a: Row | None = None  # the whole item as written (removed / changed)
    b: Row | None = None  # the whole item as written (added / changed)


class CellDiff(BaseModel):
    """Patterns of one cell that differ between the runs, and its coverage row (Luna status, counts)."""

    cell_id: str
    items: list[Item] = Field(default_factory=list)
    coverage: list[FieldChange] = Field(default_factory=list)


class Section(BaseModel):
    """A compared artifact: present on which side, and the items that differ."""

    present_a: bool
    present_b: bool
    items: list[Item] = Field(default_factory=list)
    unchanged: int = 0

    @property
    def differs(self) -> bool:
        """True when presence or any item differs."""
        return self.present_a != self.present_b or bool(self.items)


class CallTotals(BaseModel):
    """Model-call totals of one run (latency is shown elsewhere: it never makes runs differ)."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    cost_known: bool = True  # False when any call had no known price (then cost_usd is a lower bound)
    attempts: int = 0
    failures: int = 0
    by_role: dict[str, dict[str, float]] = Field(default_factory=dict)


class RunDiff(BaseModel):
    """Everything that differs between run A and run B."""

    a: str
    b: str
    a_run_id: str
    b_run_id: str
    inputs: list[FieldChange] = Field(default_factory=list)
    cells: list[CellDiff] = Field(default_factory=list)
    patterns: Section
    groups: Section
    weaknesses: Section
    weakness_map: dict[str, str] = Field(default_factory=dict)  # A id -> B id
    proposals: Section
    gates: list[FieldChange] = Field(default_factory=list)
    state: list[FieldChange] = Field(default_factory=list)
    calls_a: CallTotals
    calls_b: CallTotals
    calls: list[FieldChange] = Field(default_factory=list)
    decisions: Decisions = Field(default_factory=Decisions)  # the lead: what a reader decides on

    @property
    def identical(self) -> bool:
        """True when the outputs are the same (inputs may still differ; they are listed)."""
        return not (
            self.cells
            or self.patterns.differs
            or self.groups.differs
            or self.weaknesses.differs
            or self.proposals.differs
            or self.gates
            or self.state
            or self.calls
        )


def _strip(obj: Any, ignore: frozenset[str]) -> Any:
    if isinstance(obj, dict):
        return {k: _strip(v, ignore) for k, v in obj.items() if k not in ignore}
    if isinstance(obj, list):
        return [_strip(v, ignore) for v in obj]
    return obj


def diff_inputs(a: RunArtifacts, b: RunArtifacts) -> list[FieldChange]:
    """run.json differences: bundle digest, models, template hashes, settings, versions.

    The bundle's location (a path relative to the run) is not an input when both runs record the
    bundle's digest: the digest says whether the bytes are the same.
    """
    return field_changes(_without_location(a.run), _without_location(b.run), ignore=VOLATILE | IDENTITY)


def _without_location(obj: Any) -> Any:
    """Drop bundle paths next to a bundle digest, at any depth (the digest is what identifies the bytes)."""
    if isinstance(obj, dict):
        has_digest = "bundle_digest" in obj
        return {
            k: _without_location(v)
            for k, v in obj.items()
            if not (has_digest and k in ("bundle", "bundle_path") and isinstance(v, str))
        }
    return obj


# ---------------------------------------------------------------- patterns
PATTERN_IGNORE = VOLATILE | {"pattern_id", "cell_id"}


def _evidence(p: Row) -> set[str]:
    return set(id_list(p.get("evidence"), "event_id", "id", "ref"))


def _pattern_score(a: Row, b: Row) -> float | None:
    if a.get("type") != b.get("type"):
        return None
    j = jaccard(_evidence(a), _evidence(b))
    # Same type, no shared evidence: only the same 'concerns' can pair them (weakly).
    if j <= PATTERN_MATCH_THRESHOLD:
        return 0.01 if a.get("concerns") == b.get("concerns") and a.get("concerns") else None
    return j


def _match_items(
    a_rows: list[Row],
    b_rows: list[Row],
    score: Callable[[Row, Row], float | None],
    threshold: float,
    id_key: str,
    ignore: frozenset[str],
    kind_key: str | None,
    normalise_b: Callable[[Row, Row], Row] | None = None,
) -> tuple[list[Item], int, list[tuple[int, int]]]:
    pairs, only_a, only_b = greedy_match(a_rows, b_rows, score, threshold)
    items: list[Item] = []
    unchanged = 0
    for i, j, s in pairs:
        ra, rb = a_rows[i], b_rows[j]
        cmp_b = normalise_b(ra, rb) if normalise_b else rb
        changes = field_changes(ra, cmp_b, ignore=ignore)
        if not changes:
            unchanged += 1
            continue
        items.append(
            Item(
                status="changed",
                a_id=_str(ra.get(id_key)),
                b_id=_str(rb.get(id_key)),
                kind=_str(ra.get(kind_key)) if kind_key else None,
                score=s,
                changes=changes,
                a=ra,
                b=rb,
            )
        )
    for i in only_a:
        ra = a_rows[i]
        kind = _str(ra.get(kind_key)) if kind_key else None
        items.append(Item(status="removed", a_id=_str(ra.get(id_key)), kind=kind, a=ra))
    for j in only_b:
        rb = b_rows[j]
        kind = _str(rb.get(kind_key)) if kind_key else None
        items.append(Item(status="added", b_id=_str(rb.get(id_key)), kind=kind, b=rb))
    return items, unchanged, [(i, j) for i, j, _ in pairs]


def _str(v: Any) -> str | None:
    return None if v is None else str(v)


def _coverage_rows(arts: RunArtifacts) -> dict[str, Row]:
    """The Coordinator's per-cell coverage (Luna status, pattern counts), when pattern-groups.json has it."""
    doc = arts.groups_doc
    rows = doc.get("coverage") if isinstance(doc, dict) else None
    if not isinstance(rows, list):
        return {}
    return {str(r["cell_id"]): r for r in rows if isinstance(r, dict) and r.get("cell_id") is not None}


def diff_patterns(a: RunArtifacts, b: RunArtifacts) -> tuple[list[CellDiff], Section]:
    """Per cell: patterns matched by type and evidence overlap, then compared field by field."""
    by_a: dict[str, list[Row]] = defaultdict(list)
    by_b: dict[str, list[Row]] = defaultdict(list)
    for p in a.patterns or []:
        by_a[str(p.get("cell_id"))].append(p)
    for p in b.patterns or []:
        by_b[str(p.get("cell_id"))].append(p)
    cov_a, cov_b = _coverage_rows(a), _coverage_rows(b)
    cells: list[CellDiff] = []
    unchanged = 0
    for cell in sorted(set(by_a) | set(by_b) | set(cov_a) | set(cov_b)):
        items, same, _ = _match_items(by_a[cell], by_b[cell], _pattern_score, 0.0, "pattern_id", PATTERN_IGNORE, "type")
        unchanged += same
        coverage = field_changes(cov_a.get(cell), cov_b.get(cell), ignore=VOLATILE | {"cell_id"})
        if items or coverage:
            cells.append(CellDiff(cell_id=cell, items=items, coverage=coverage))
    section = Section(present_a=a.patterns is not None, present_b=b.patterns is not None, unchanged=unchanged)
    return cells, section


# ---------------------------------------------------------------- pattern groups
GROUP_IGNORE = VOLATILE | frozenset({"group_id", "pattern_group_id", "id", "pattern_id", "pattern_ids"})


def _group_id(g: Row) -> str | None:
    for key in ("group_id", "pattern_group_id", "id"):
        if g.get(key) is not None:
            return str(g[key])
    return None


def _cited_once(ignore: frozenset[str] = frozenset()) -> Callable[[Row], set[str]]:
    """``cited_ids`` of a row (its ``ignore`` fields left out), computed once per row object.

    The matchers score every pair: at 1,000 cells each pattern group cites thousands of events, and
    recomputing both sides per pair made ``lunasol diff`` take 19 s (269 s at 10,000 cells).
    """
    seen: dict[int, tuple[Row, set[str]]] = {}

    def cited(row: Row) -> set[str]:
        hit = seen.get(id(row))
        if hit is None or hit[0] is not row:
            hit = (row, cited_ids(_strip(row, ignore) if ignore else row))
            seen[id(row)] = hit
        return hit[1]

    return cited


def _group_score(a: Row, b: Row, cited: Callable[[Row], set[str]] | None = None) -> float | None:
    if a.get("type") != b.get("type"):
        return None
    cited = cited or _cited_once(GROUP_IGNORE)
    ca, cb = cited(a), cited(b)
    if ca or cb:
        j = jaccard(ca, cb)
        return j if j > 0 else None
    return 1.0 if a.get("key") == b.get("key") else None


def diff_groups(a: RunArtifacts, b: RunArtifacts) -> Section:
    """Pattern groups matched by type and the event ids their occurrences cite."""
    ga, gb = a.groups or [], b.groups or []
    # Groups carry their id under one of several names; normalise it so _match_items can report it.
    na = [{**g, "_id": _group_id(g)} for g in ga]
    nb = [{**g, "_id": _group_id(g)} for g in gb]
    score = partial(_group_score, cited=_cited_once(GROUP_IGNORE))
    items, unchanged, _ = _match_items(na, nb, score, 0.0, "_id", GROUP_IGNORE | {"_id"}, "type")
    for it in items:
        for row in (it.a, it.b):
            if row is not None:
                row.pop("_id", None)
    return Section(present_a=a.groups is not None, present_b=b.groups is not None, items=items, unchanged=unchanged)


# ---------------------------------------------------------------- weaknesses
WEAKNESS_IGNORE = VOLATILE | frozenset({"weakness_id"})


def support_cells(w: Row) -> set[str]:
    """The cells a weakness card's support cites."""
    support = w.get("support")
    if isinstance(support, dict):
        return set(id_list(support.get("cells"), "cell_id", "id"))
    return set()


def _weakness_score(a: Row, b: Row, cited: Callable[[Row], set[str]] = cited_ids) -> float | None:
    cells = jaccard(support_cells(a), support_cells(b)) if support_cells(a) or support_cells(b) else 0.0
    refs_a, refs_b = cited(a), cited(b)
    refs = jaccard(refs_a, refs_b) if refs_a or refs_b else 0.0
    text = text_similarity(str(a.get("statement", "")), str(b.get("statement", "")))
    if cells == 0.0 and refs == 0.0:
        return None  # no shared support: never the same weakness, however alike the wording
    return 0.6 * cells + 0.3 * refs + 0.1 * text


def diff_weaknesses(a: RunArtifacts, b: RunArtifacts) -> tuple[Section, dict[str, str]]:
    """Weakness cards matched by support overlap (cells, refs), compared field by field."""
    wa, wb = a.weaknesses or [], b.weaknesses or []
    score = partial(_weakness_score, cited=_cited_once())
    threshold = WEAKNESS_MATCH_THRESHOLD
    items, unchanged, pairs = _match_items(wa, wb, score, threshold, "weakness_id", WEAKNESS_IGNORE, None)
    wmap = {str(wa[i].get("weakness_id")): str(wb[j].get("weakness_id")) for i, j in pairs}
    section = Section(present_a=a.weaknesses is not None, present_b=b.weaknesses is not None)
    section.items, section.unchanged = items, unchanged
    return section, wmap


# ---------------------------------------------------------------- proposals
PROPOSAL_IGNORE = VOLATILE | frozenset({"proposal_id"})


def _strategy_text(p: Row) -> str:
    sc = p.get("strategy_change")
    if isinstance(sc, dict):
        return str(sc.get("proposed_strategy") or "") + "\n" + str(sc.get("rationale") or "")
    return str(sc or "")


def validation_by_id(v: Any) -> dict[str, Row]:
    """validation.json results keyed by proposal id (shapes: list, {results|cards|proposals: [...]}, {id: {...}})."""
    rows: list[Row] = []
    if isinstance(v, list):
        rows = [r for r in v if isinstance(r, dict)]
    elif isinstance(v, dict):
        for key in ("results", "cards", "proposals", "items"):
            if isinstance(v.get(key), list):
                rows = [r for r in v[key] if isinstance(r, dict)]
                break
        else:
            return {str(k): r for k, r in v.items() if isinstance(r, dict)}
    return {str(r.get("proposal_id", r.get("id"))): r for r in rows}


def validation_summary(result: Row | None) -> Row | None:
    """A comparable view of one card's validation: verdict and the broken rule ids."""
    if result is None:
        return None
    verdict = result.get("verdict", result.get("status", result.get("valid", result.get("accepted"))))
    rules: list[str] = []
    for key in ("findings", "errors", "violations", "issues", "messages", "reasons"):
        val = result.get(key)
        if isinstance(val, list):
            rules += [str(e.get("rule", e.get("rule_id", e))) if isinstance(e, dict) else str(e) for e in val]
    return {"verdict": verdict, "rules": sorted(rules)}


def proposal_rows(arts: RunArtifacts) -> list[Row]:
    """A run's proposal cards, each with its validation summary under ``validation``."""
    vals = validation_by_id(arts.validation)
    return [{**p, "validation": validation_summary(vals.get(str(p.get("proposal_id"))))} for p in arts.proposals or []]


def diff_proposals(a: RunArtifacts, b: RunArtifacts, wmap: dict[str, str]) -> tuple[Section, dict[str, str]]:
    """Proposal cards matched by (mapped) source weakness and strategy similarity; validation compared too."""
    pa, pb = proposal_rows(a), proposal_rows(b)

    def score(x: Row, y: Row) -> float | None:
        src = str(x.get("source_weakness"))
        if wmap.get(src, src) != str(y.get("source_weakness")):
            return None
        return text_similarity(_strategy_text(x), _strategy_text(y))

    def normalise(x: Row, y: Row) -> Row:
        # A renumbered source weakness is not a change: compare through the weakness map.
        src = str(x.get("source_weakness"))
        if wmap.get(src) == y.get("source_weakness"):
            return {**y, "source_weakness": x.get("source_weakness")}
        return y

    items, unchanged, pairs = _match_items(
        pa, pb, score, PROPOSAL_MATCH_THRESHOLD, "proposal_id", PROPOSAL_IGNORE, "source_weakness", normalise
    )
    pmap = {str(pa[i].get("proposal_id")): str(pb[j].get("proposal_id")) for i, j in pairs}
    section = Section(present_a=a.proposals is not None, present_b=b.proposals is not None)
    section.items, section.unchanged = items, unchanged
    return section, pmap


# ---------------------------------------------------------------- gates, state, calls
GATE_IGNORE = VOLATILE | frozenset({"run_id", "by", "base_revision", "new_revision", "request_digest"})
GATE_IGNORE = GATE_IGNORE | frozenset({"receipt_digest", "subject", "schema_version"})


PROPOSAL_KEYS = frozenset({"proposal_id", "proposal", "selected", "selection"})


def gate_decisions(receipt: Row, wmap: dict[str, str] | None = None, pmap: dict[str, str] | None = None) -> Row:
    """The decision content of a gate receipt (request and result), without digests, revisions or times.

    Weakness and proposal ids of run A are mapped to run B's (``wmap``, ``pmap``) so a renumbered
    shortlist or proposals file is not a change.
    """
    out: Row = {}
    request: Row = receipt["request"] if isinstance(receipt.get("request"), dict) else receipt
    for key, value in sorted(request.items()):
        if key in GATE_IGNORE or key in ("gate", "result"):
            continue
        if key == "decisions":
            value = _decision_map(value)
            if wmap is not None:
                value = {wmap.get(k, k): v for k, v in value.items()}
        elif key in PROPOSAL_KEYS and pmap is not None and isinstance(value, str):
            value = pmap.get(value, value)
        out[key] = _strip(value, VOLATILE)
    if isinstance(receipt.get("result"), dict):
        out["result"] = _strip(receipt["result"], VOLATILE)
    return out


def _decision_map(decisions: Any) -> Row:
    if isinstance(decisions, dict):
        return {str(k): v for k, v in decisions.items()}
    if isinstance(decisions, list):
        return {
            str(d.get("weakness_id", d.get("id", d.get("subject")))): {k: v for k, v in d.items()}
            for d in decisions
            if isinstance(d, dict)
        }
    return {}


def _rev(receipt: Row) -> float:
    return _num(receipt.get("new_revision"))


def _gates_view(arts: RunArtifacts, wmap: dict[str, str] | None, pmap: dict[str, str] | None = None) -> Row:
    """Per gate, the decision of its latest receipt (highest new revision, then file name)."""
    latest: dict[str, tuple[float, str, Row]] = {}
    for name, receipt in arts.gates.items():
        kind = str(receipt.get("gate") or name.split("-", 1)[0])
        cand = (_rev(receipt), name, receipt)
        if kind not in latest or cand[:2] > latest[kind][:2]:
            latest[kind] = cand
    return {kind: gate_decisions(r, wmap, pmap) for kind, (_, _, r) in sorted(latest.items())}


STATE_IGNORE = VOLATILE | IDENTITY | frozenset({"revision", "history", "receipts", "schema_version"})
# What identifies a block across runs (pipeline.state.blocking's receipt); its message names paths, so it is left out.
BLOCK_KEYS = ("stage", "constraint_class", "error", "reason", "role", "cell", "cell_id")


def _state_view(arts: RunArtifacts) -> Row:
    """handoff.json without bookkeeping (revision, history, receipt paths, digests) and the block reason."""
    view: Row = {}
    if arts.handoff is not None:
        view["handoff"] = {
            k: _strip(v, VOLATILE)
            for k, v in arts.handoff.items()
            if k not in STATE_IGNORE and not k.endswith("_digest")
        }
    if arts.block is not None:
        view["blocked"] = _strip({k: arts.block.get(k) for k in BLOCK_KEYS if k in arts.block}, VOLATILE)
    return view


def _num(v: Any) -> float:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0


def call_totals(calls: list[Row] | None) -> CallTotals:
    """Sum calls.jsonl: calls, tokens, cost, attempts, failures, per role."""
    t = CallTotals()
    by_role: dict[str, dict[str, float]] = {}
    for c in calls or []:
        usage: Row = c["usage"] if isinstance(c.get("usage"), dict) else {}
        tokens: Row = c["tokens"] if isinstance(c.get("tokens"), dict) else {}
        pt = _num(c.get("prompt_tokens", tokens.get("prompt", usage.get("prompt_tokens"))))
        ct = _num(c.get("completion_tokens", tokens.get("completion", usage.get("completion_tokens"))))
        raw_cost = c.get("cost_usd", c.get("cost"))
        cost = _num(raw_cost)
        if raw_cost is None:
            t.cost_known = False
        attempts = _num(c.get("attempts", 1)) if not isinstance(c.get("attempts"), list) else len(c["attempts"])
        outcome = str(c.get("outcome", "ok")).lower()
        failed = outcome not in ("ok", "success", "succeeded", "replayed", "cached", "done")
        t.calls += 1
        t.prompt_tokens += int(pt)
        t.completion_tokens += int(ct)
        t.cost_usd += cost
        t.attempts += int(attempts)
        t.failures += int(failed)
        r = by_role.setdefault(str(c.get("role", "?")), {"calls": 0, "tokens": 0, "cost_usd": 0.0, "failures": 0})
        r["calls"] += 1
        r["tokens"] += pt + ct
        r["cost_usd"] = round(r["cost_usd"] + cost, 6)
        r["failures"] += int(failed)
    t.cost_usd = round(t.cost_usd, 6)
    t.by_role = dict(sorted(by_role.items()))
    return t


def diff_runs(a: RunArtifacts, b: RunArtifacts) -> RunDiff:
    """Compare two loaded runs; the result is empty (``identical``) for a run and itself."""
    cells, patterns = diff_patterns(a, b)
    weaknesses, wmap = diff_weaknesses(a, b)
    proposals, pmap = diff_proposals(a, b, wmap)
    calls_a, calls_b = call_totals(a.calls), call_totals(b.calls)
    decisions = build_decisions(
        a,
        b,
        wmap,
        {(it.a_id, it.b_id): it.changes for it in weaknesses.items if it.status == "changed"},
        (proposal_rows(a), proposal_rows(b)),
        pmap,
        {(it.a_id, it.b_id): it.changes for it in proposals.items if it.status == "changed"},
    )
    return RunDiff(
        decisions=decisions,
        a=str(a.path),
        b=str(b.path),
        a_run_id=a.run_id,
        b_run_id=b.run_id,
        inputs=diff_inputs(a, b),
        cells=cells,
        patterns=patterns,
        groups=diff_groups(a, b),
        weaknesses=weaknesses,
        weakness_map=wmap,
        proposals=proposals,
        gates=field_changes(_gates_view(a, wmap, pmap), _gates_view(b, None)),
        state=field_changes(_state_view(a), _state_view(b)),
        calls_a=calls_a,
        calls_b=calls_b,
        calls=field_changes(
            calls_a.model_dump(exclude={"attempts"}) | {"present": a.calls is not None},
            calls_b.model_dump(exclude={"attempts"}) | {"present": b.calls is not None},
        ),
    )
