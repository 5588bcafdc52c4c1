"""What a reader decides on, first: weaknesses and proposals added, dropped or changed, and how support moved.

``lunasol diff`` opens with this summary (text, Markdown, JSON and HTML alike) before the per-cell
pattern detail, which at the demo's size is pages of event-id changes. It is derived from the same
content matching as the detailed sections (:mod:`pipeline.diff.compare`): a weakness of A and one
of B are "the same" when their support overlaps, whatever their ids.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from pipeline.artifacts.rundir import Row, RunArtifacts
from pipeline.core import duck
from pipeline.diff.match import FieldChange

DecisionStatus = Literal["added", "dropped", "changed", "unchanged"]
SUPPORT_KEYS = ("cells", "tasks", "runs", "pattern_groups")
STATEMENT_CHARS = 140  # of a card's statement in the summary line; --json and the detail have it all


class Support(BaseModel):
    """A weakness card's support counts on one side (absent side: None)."""

    cells: int = 0
    tasks: int = 0
    runs: int = 0
    pattern_groups: int = 0
    denominator: int | None = None  # eligible cells of that run, when the shortlist records them


class WeaknessDecision(BaseModel):
    """One weakness card as the reader decides on it: matched across runs, support on each side."""

    status: DecisionStatus
    a_id: str | None = None
    b_id: str | None = None
    statement: str = ""  # B's when the card is in B, else A's (whole; the text rendering shortens it)
    confidence_a: str | None = None
    confidence_b: str | None = None
    support_a: Support | None = None
    support_b: Support | None = None
    cells_gained: list[str] = Field(default_factory=list)  # support cells in B, not in A
    cells_lost: list[str] = Field(default_factory=list)  # support cells in A, not in B
    gate1_a: str | None = None  # the reviewer's gate-1 decision on the card, per run
    gate1_b: str | None = None
    changed_fields: list[str] = Field(default_factory=list)  # top-level fields with a change


class ProposalDecision(BaseModel):
    """One proposal card as the reader decides on it: matched across runs, validation on each side."""

    status: DecisionStatus
    a_id: str | None = None
    b_id: str | None = None
    source_weakness_a: str | None = None
    source_weakness_b: str | None = None
    summary: str = ""  # the proposed strategy, B's when in B
    verdict_a: str | None = None
    verdict_b: str | None = None
    changed_fields: list[str] = Field(default_factory=list)


class AskDecision(BaseModel):
    """One ask (``lunasol ask``) of either run, matched by its id (the same question, answer kind and filter)."""

    status: DecisionStatus
    ask_id: str
    question: str
    counts_a: dict[str, int] | None = None  # answer -> cells, plus "failed"
    counts_b: dict[str, int] | None = None
    answers_changed: list[str] = Field(default_factory=list)  # cells answered differently (or failed on one side)


class Decisions(BaseModel):
    """The lead of a diff: every weakness and proposal card of either run, matched, with counts."""

    weaknesses_present: tuple[bool, bool] = (False, False)
    proposals_present: tuple[bool, bool] = (False, False)
    weaknesses: list[WeaknessDecision] = Field(default_factory=list)
    proposals: list[ProposalDecision] = Field(default_factory=list)
    asks: list[AskDecision] = Field(default_factory=list)
    selected_a: str | None = None  # the proposal chosen at gate 2 (or "none"), per run
    selected_b: str | None = None

    def counts(self, kind: Literal["weaknesses", "proposals"]) -> dict[str, int]:
        """How many cards of ``kind`` were added, dropped, changed or unchanged."""
        rows: list[WeaknessDecision] | list[ProposalDecision] = getattr(self, kind)
        out = {s: 0 for s in ("added", "dropped", "changed", "unchanged")}
        for r in rows:
            out[r.status] += 1
        return out


def _short(text: str, n: int = STATEMENT_CHARS) -> str:
    t = " ".join(text.split())
    return t if len(t) <= n else t[: n - 1] + "…"


def _list(v: Any) -> list[str]:
    if not isinstance(v, list):
        return []
    return [str(x.get("cell_id", x.get("id", x))) if isinstance(x, dict) else str(x) for x in v]


def _denominator(arts: RunArtifacts) -> int | None:
    den = arts.shortlist.get("denominator") if isinstance(arts.shortlist, dict) else None
    if isinstance(den, dict):
        n = den.get("eligible_cells")
        if isinstance(n, int) and not isinstance(n, bool):
            return n
        if isinstance(den.get("cells"), list):
            return len(den["cells"])
    return None


def _support(w: Row, denominator: int | None) -> Support:
    sup = w.get("support") if isinstance(w.get("support"), dict) else {}
    assert isinstance(sup, dict)
    counts = sup.get("counts") if isinstance(sup.get("counts"), dict) else {}
    assert isinstance(counts, dict)
    values: dict[str, int] = {}
    for key in SUPPORT_KEYS:
        n = counts.get(key)
        values[key] = n if isinstance(n, int) and not isinstance(n, bool) else len(_list(sup.get(key)))
    return Support(**values, denominator=denominator)


def _cells(w: Row | None) -> set[str]:
    sup = w.get("support") if w is not None and isinstance(w.get("support"), dict) else {}
    return set(_list(sup.get("cells"))) if isinstance(sup, dict) else set()


def _gate_receipts(arts: RunArtifacts, gate: str) -> Row | None:
    """The latest receipt of one gate (highest new revision, then file name)."""
    best: tuple[float, str, Row] | None = None
    for name, receipt in arts.gates.items():
        if str(receipt.get("gate") or name.split("-", 1)[0]) != gate:
            continue
        rev = receipt.get("new_revision")
        cand = (float(rev) if isinstance(rev, int | float) else 0.0, name, receipt)
        if best is None or cand[:2] > best[:2]:
            best = cand
    return best[2] if best else None


def _gate1(arts: RunArtifacts) -> dict[str, str]:
    receipt = _gate_receipts(arts, "gate1")
    if receipt is None:
        return {}
    request = receipt.get("request") if isinstance(receipt.get("request"), dict) else receipt
    assert isinstance(request, dict)
    decisions = request.get("decisions")
    out: dict[str, str] = {}
    if isinstance(decisions, dict):
        for wid, d in decisions.items():
            out[str(wid)] = str(d.get("decision")) if isinstance(d, dict) else str(d)
    elif isinstance(decisions, list):
        for d in decisions:
            if isinstance(d, dict):
                out[str(d.get("weakness_id", d.get("id")))] = str(d.get("decision"))
    return out


def _selected(arts: RunArtifacts) -> str | None:
    receipt = _gate_receipts(arts, "gate2")
    if receipt is None:
        return None
    request = receipt.get("request") if isinstance(receipt.get("request"), dict) else receipt
    assert isinstance(request, dict)
    for key in ("proposal_id", "proposal", "selected", "selection"):
        if request.get(key) is not None:
            return str(request[key])
    return "none" if request.get("none") else None


def _top_fields(changes: list[FieldChange]) -> list[str]:
    seen: list[str] = []
    for c in changes:
        top = c.path.split(".", 1)[0].split("[", 1)[0]
        if top not in seen:
            seen.append(top)
    return seen


def _strategy(p: Row) -> str:
    sc = p.get("strategy_change")
    if isinstance(sc, dict):
        return str(sc.get("proposed_strategy") or "")
    return str(sc or "")


def _verdict(p: Row | None) -> str | None:
    v = p.get("validation") if p is not None else None
    if not isinstance(v, dict):
        return None
    verdict = v.get("verdict")
    if verdict is True:
        return "valid"
    if verdict is False:
        return "invalid"
    return None if verdict is None else str(verdict)


def weakness_decisions(
    a: RunArtifacts, b: RunArtifacts, wmap: dict[str, str], changes: dict[tuple[str | None, str | None], list[str]]
) -> list[WeaknessDecision]:
    """Every weakness of A and B, matched through ``wmap`` (A id -> B id); ``changes`` keyed by (A id, B id)."""
    wa = {str(w.get("weakness_id")): w for w in a.weaknesses or []}
    wb = {str(w.get("weakness_id")): w for w in b.weaknesses or []}
    den_a, den_b = _denominator(a), _denominator(b)
    g1a, g1b = _gate1(a), _gate1(b)
    out: list[WeaknessDecision] = []
    for aid, ra in wa.items():
        bid = wmap.get(aid)
        rb = wb.get(bid) if bid is not None else None
        fields = changes.get((aid, bid), []) if rb is not None else []
        ca, cb = _cells(ra), _cells(rb)
        out.append(
            WeaknessDecision(
                status="dropped" if rb is None else "changed" if fields else "unchanged",
                a_id=aid,
                b_id=bid if rb is not None else None,
                statement=str((rb or ra).get("statement", "")),
                confidence_a=_opt(ra.get("confidence")),
                confidence_b=_opt(rb.get("confidence")) if rb else None,
                support_a=_support(ra, den_a),
                support_b=_support(rb, den_b) if rb else None,
                cells_gained=sorted(cb - ca) if rb else [],
                cells_lost=sorted(ca - cb) if rb else sorted(ca),
                gate1_a=g1a.get(aid),
                gate1_b=g1b.get(bid) if bid is not None else None,
                changed_fields=fields,
            )
        )
    matched_b = {v for v in wmap.values()}
    for bid, rb in wb.items():
        if bid in matched_b:
            continue
        out.append(
            WeaknessDecision(
                status="added",
                b_id=bid,
                statement=str(rb.get("statement", "")),
                confidence_b=_opt(rb.get("confidence")),
                support_b=_support(rb, den_b),
                cells_gained=sorted(_cells(rb)),
                gate1_b=g1b.get(bid),
            )
        )
    return out


def proposal_decisions(
    pa: list[Row],
    pb: list[Row],
    pmap: dict[str, str],
    changes: dict[tuple[str | None, str | None], list[str]],
) -> list[ProposalDecision]:
    """Every proposal of A and B (rows carry their ``validation`` summary), matched through ``pmap``."""
    by_a = {str(p.get("proposal_id")): p for p in pa}
    by_b = {str(p.get("proposal_id")): p for p in pb}
    out: list[ProposalDecision] = []
    for aid, ra in by_a.items():
        bid = pmap.get(aid)
        rb = by_b.get(bid) if bid is not None else None
        fields = changes.get((aid, bid), []) if rb is not None else []
        out.append(
            ProposalDecision(
                status="dropped" if rb is None else "changed" if fields else "unchanged",
                a_id=aid,
                b_id=bid if rb is not None else None,
                source_weakness_a=_opt(ra.get("source_weakness")),
                source_weakness_b=_opt(rb.get("source_weakness")) if rb else None,
                summary=_strategy(rb or ra),
                verdict_a=_verdict(ra),
                verdict_b=_verdict(rb),
                changed_fields=fields,
            )
        )
    matched_b = set(pmap.values())
    for bid, rb in by_b.items():
        if bid not in matched_b:
            out.append(
                ProposalDecision(
                    status="added",
                    b_id=bid,
                    source_weakness_b=_opt(rb.get("source_weakness")),
                    summary=_strategy(rb),
                    verdict_b=_verdict(rb),
                )
            )
    return out


def _asks(arts: RunArtifacts) -> dict[str, tuple[str, dict[str, str]]]:
    """Per ask id: its question and, per cell, the answer (or "failed"), from the run's DuckDB; {} without asks."""
    if not arts.ir_path.is_file():
        return {}
    con = duck.connect(arts.ir_path, read_only=True)
    try:
        if not duck.has_table(con, "asks"):
            return {}
        out: dict[str, tuple[str, dict[str, str]]] = {
            str(a): (str(q), {}) for a, q in con.execute("SELECT ask_id, question FROM asks").fetchall()
        }
        for ask_id, cell, status, answer in con.execute(
            "SELECT ask_id, cell_id, status, answer FROM ask_answers"
        ).fetchall():
            if str(ask_id) in out:
                out[str(ask_id)][1][str(cell)] = str(answer) if status == "ok" else "failed"
        return out
    finally:
        con.close()


def _tally(answers: dict[str, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in answers.values():
        out[v] = out.get(v, 0) + 1
    return dict(sorted(out.items()))


def ask_decisions(a: RunArtifacts, b: RunArtifacts) -> list[AskDecision]:
    """Every ask of either run: its counts on each side and the cells answered differently."""
    qa, qb = _asks(a), _asks(b)
    out: list[AskDecision] = []
    for ask_id in sorted(set(qa) | set(qb)):
        ra, rb = qa.get(ask_id), qb.get(ask_id)
        if ra is not None and rb is not None:
            cells = sorted(c for c in set(ra[1]) | set(rb[1]) if ra[1].get(c) != rb[1].get(c))
            status: DecisionStatus = "changed" if cells else "unchanged"
        else:
            cells, status = [], "added" if ra is None else "dropped"
        out.append(
            AskDecision(
                status=status,
                ask_id=ask_id,
                question=(rb or ra or ("", {}))[0],
                counts_a=_tally(ra[1]) if ra else None,
                counts_b=_tally(rb[1]) if rb else None,
                answers_changed=cells,
            )
        )
    return out


def _opt(v: Any) -> str | None:
    return None if v is None else str(v)


def build_decisions(
    a: RunArtifacts,
    b: RunArtifacts,
    wmap: dict[str, str],
    weakness_changes: dict[tuple[str | None, str | None], list[FieldChange]],
    proposals: tuple[list[Row], list[Row]],
    pmap: dict[str, str],
    proposal_changes: dict[tuple[str | None, str | None], list[FieldChange]],
) -> Decisions:
    """The decisions summary of a diff from the matches :func:`pipeline.diff.compare.diff_runs` made."""
    wc = {k: _top_fields(v) for k, v in weakness_changes.items()}
    pc = {k: _top_fields(v) for k, v in proposal_changes.items()}
    return Decisions(
        weaknesses_present=(a.weaknesses is not None, b.weaknesses is not None),
        proposals_present=(a.proposals is not None, b.proposals is not None),
        weaknesses=weakness_decisions(a, b, wmap, wc),
        proposals=proposal_decisions(proposals[0], proposals[1], pmap, pc),
        selected_a=_selected(a),
        selected_b=_selected(b),
        asks=ask_decisions(a, b),
    )


# ---------------------------------------------------------------- rendering (text / Markdown)


def support_line(w: WeaknessDecision) -> str:
    """``support: cells 3 of 24 -> 1 of 24, ... (+C007 -C004)`` (one side only for an added or dropped card)."""
    sa, sb = w.support_a, w.support_b

    def rate(s: Support) -> str:
        return f" of {s.denominator}" if s.denominator else ""

    if sa is not None and sb is not None:
        parts = [f"cells {sa.cells}{rate(sa)} -> {sb.cells}{rate(sb)}"]
        parts += [f"{k.replace('_', ' ')} {getattr(sa, k)} -> {getattr(sb, k)}" for k in SUPPORT_KEYS[1:]]
        moved = []
        if w.cells_gained:
            moved.append("+" + ",".join(w.cells_gained))
        if w.cells_lost:
            moved.append("-" + ",".join(w.cells_lost))
        return "support: " + ", ".join(parts) + (f" ({' '.join(moved)})" if moved else "")
    s = sb or sa
    assert s is not None
    return f"support: {s.cells} cells{rate(s)}, {s.tasks} tasks, {s.runs} runs, {s.pattern_groups} pattern groups"


def _arrow(a: str | None, b: str | None, status: DecisionStatus = "changed") -> str | None:
    # An added card has only B's value and a dropped one only A's: no arrow to an absent side.
    if status == "added":
        return b
    if status == "dropped":
        return a
    if a is None and b is None:
        return None
    if a == b:
        return a
    return f"{a or '—'} -> {b or '—'}"


def ids(status: DecisionStatus, a: str | None, b: str | None) -> str:
    """``W-01``, ``W-01 -> W-02`` (renumbered) or the one side's id of an added / dropped card."""
    return _arrow(a, b, status) or "—"


def render_lines(d: Decisions, md: bool) -> list[str]:
    """The lead section of the text and Markdown diffs."""
    h = (lambda s: f"## {s}") if md else (lambda s: s.upper())
    bullet = "- " if md else "  "
    sub = "  - " if md else "      "
    out = [h("decisions") + (" — " if md else ": ") + "weaknesses and proposals, matched by what they cite"]

    def tally(kind: Literal["weaknesses", "proposals"], present: tuple[bool, bool]) -> str:
        if not any(present):
            return f"{kind}: in neither run"
        side = "" if all(present) else " (only in A)" if present[0] else " (only in B)"
        c = d.counts(kind)
        return f"{kind}{side}: " + ", ".join(f"{c[s]} {s}" for s in ("added", "dropped", "changed", "unchanged"))

    out.append(bullet + tally("weaknesses", d.weaknesses_present))
    for w in d.weaknesses:
        out.append(f"{bullet}{w.status} {ids(w.status, w.a_id, w.b_id)}: {_short(w.statement)}")
        out.append(sub + support_line(w))
        extra = []
        conf = _arrow(w.confidence_a, w.confidence_b, w.status)
        if conf:
            extra.append(f"confidence {conf}")
        g1 = _arrow(w.gate1_a, w.gate1_b, w.status)
        if g1:
            extra.append(f"gate 1 {g1}")
        if w.changed_fields:
            extra.append("changed: " + ", ".join(w.changed_fields))
        if extra:
            out.append(sub + "; ".join(extra))
    out.append(bullet + tally("proposals", d.proposals_present))
    for p in d.proposals:
        src = _arrow(p.source_weakness_a, p.source_weakness_b, p.status)
        out.append(f"{bullet}{p.status} {ids(p.status, p.a_id, p.b_id)} (for {src}): {_short(p.summary)}")
        extra = []
        verdict = _arrow(p.verdict_a, p.verdict_b, p.status)
        if verdict:
            extra.append(f"validation {verdict}")
        if p.changed_fields:
            extra.append("changed: " + ", ".join(p.changed_fields))
        if extra:
            out.append(sub + "; ".join(extra))
    sel = _arrow(d.selected_a, d.selected_b)
    if sel:
        out.append(bullet + f"gate 2 selection: {sel}")
    if d.asks:
        out.append(bullet + "asks: " + ", ".join(f"{n} {s}" for s, n in _ask_counts(d).items()))
    for q in d.asks:
        ca, cb = (_counts_text(c) for c in (q.counts_a, q.counts_b))
        out.append(f"{bullet}{q.status} {q.ask_id}: {_short(q.question)}")
        both = q.status in ("changed", "unchanged")
        out.append(sub + (f"{ca or '—'} -> {cb or '—'}" if both else (cb or ca or "")))
        if q.answers_changed:
            n = len(q.answers_changed)
            out.append(sub + f"{n} cells answered differently: " + ", ".join(q.answers_changed[:20]))
    return out


def _counts_text(c: dict[str, int] | None) -> str | None:
    return None if c is None else ", ".join(f"{k} {v}" for k, v in c.items())


def _ask_counts(d: Decisions) -> dict[str, int]:
    out = {s: 0 for s in ("added", "dropped", "changed", "unchanged")}
    for q in d.asks:
        out[q.status] += 1
    return out
