"""Sol's reduce, before and around the model: deterministic pre-merge and token-measured packing.

Drafts that cite the same set of pattern groups, or that put their first divergence at the same
stage and actor on the same kind of event, are one weakness seen from several partitions: they are
merged here, before any model call (the support is the union of their checked support; the
representative's reasoning is kept and names what it absorbed). The rest are packed into reduce
requests by tokens counted with the budget's own counter: every pack holds at least two drafts
whenever two fit, so each round can halve the drafts and the tree's depth grows with log(drafts).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipeline.core import duck
from pipeline.models.budget import RoleBudget, count_text
from pipeline.sol.cards import Support, SupportCounts, WeaknessCard
from pipeline.sol.checks import EVENT_ID_RE
from pipeline.sol.corpus import Batch
from pipeline.sol.reduce import Draft, register
from pipeline.sol.timeline_cache import capped

_CONFIDENCE = {"high": 0, "medium": 1, "low": 2}
PACK_SEPARATOR_TOKENS = 2  # the blank line between two drafts


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def divergence_keys(batch: Batch, drafts: list[Draft]) -> dict[str, tuple[Any, ...] | None]:
    """Per draft: (stage, actor, the kinds and details of its first-divergence events), or None.

    None when the draft cites no first-divergence event the IR knows (nothing to compare on).
    """
    refs = sorted({e for d in drafts for e in d.card.first_divergence.event_refs if EVENT_ID_RE.match(e)})
    kinds: dict[str, tuple[str, str]] = {}
    if refs:
        # The ids joined as a registered table, not an IN list of literals: with ~10,000 drafts (100,000
        # cells) the literal list ran out of DuckDB's 512 MiB over the events table.
        con = capped(duck.connect(batch.ir_path, read_only=True))
        try:
            register(con, "_first_divergence", {"event_id": ("str", refs)})
            found = con.execute(
                "SELECT e.event_id, e.kind, coalesce(e.detail, '') FROM events e "
                "SEMI JOIN _first_divergence r ON e.event_id = r.event_id"
            ).fetchall()
        finally:
            con.close()
        kinds = {str(e): (str(k), str(d)) for e, k, d in found}
    out: dict[str, tuple[Any, ...] | None] = {}
    for d in drafts:
        where = d.card.first_divergence.where
        sig = tuple(sorted({kinds[e] for e in d.card.first_divergence.event_refs if e in kinds}))
        out[d.draft_id] = (_norm(where.stage), _norm(where.actor), sig) if sig else None
    return out


def _union(values: list[list[str]]) -> list[str]:
    out: list[str] = []
    seen: set[str] = set()
    for vs in values:
        for v in vs:
            if v not in seen:
                seen.add(v)
                out.append(v)
    return out


def _merged(keep: Draft, others: list[Draft]) -> Draft:
    """``keep`` with the union of everyone's checked support and seen cells; it names what it absorbed."""
    every = [keep, *others]
    s = [d.card.support for d in every]
    cells = sorted(_union([x.cells for x in s]))
    tasks = sorted(_union([x.tasks for x in s]))
    runs = sorted(_union([x.runs for x in s]))
    groups = sorted(_union([x.pattern_groups for x in s]))
    support = Support(
        cells=cells,
        tasks=tasks,
        runs=runs,
        pattern_groups=groups,
        event_refs=_union([x.event_refs for x in s]),
        counts=SupportCounts(cells=len(cells), tasks=len(tasks), runs=len(runs), pattern_groups=len(groups)),
    )
    items = []
    seen_items: set[str] = set()
    for d in every:
        for i in d.card.counter_evidence.items:
            if i.cell not in seen_items:
                seen_items.add(i.cell)
                items.append(i)
    counter = keep.card.counter_evidence.model_copy(update={"items": items})
    if items:
        counter = counter.model_copy(update={"none_reason": None})
    card = keep.card.model_copy(update={"support": support, "counter_evidence": counter})
    return Draft(
        draft_id=keep.draft_id,
        call_id=keep.call_id,
        card=WeaknessCard.model_validate(card.model_dump()),
        seen_cells=sorted(_union([d.seen_cells for d in every])),
        absorbed=_union([keep.absorbed, *([o.draft_id, *o.absorbed] for o in others)]),
        sources=_union([d.map_calls for d in every]),
    )


def premerge(batch: Batch, drafts: list[Draft]) -> list[Draft]:
    """Merge drafts that cite the same pattern groups or the same first divergence, without a model call.

    Same pattern groups: the same non-empty set. Same first divergence: the same stage and actor,
    and first-divergence events of the same kinds and details (:func:`divergence_keys`). The
    representative is the most confident draft with the most supporting cells (then the lowest id).
    """
    if len(drafts) < 2:
        return drafts
    parent = list(range(len(drafts)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def join(keys: Callable[[Draft], Any]) -> None:
        first: dict[Any, int] = {}
        for i, d in enumerate(drafts):
            k = keys(d)
            if k is None:
                continue
            if k in first:
                parent[find(i)] = find(first[k])
            else:
                first[k] = i

    join(lambda d: tuple(sorted(set(d.card.support.pattern_groups))) or None)
    div = divergence_keys(batch, drafts)
    join(lambda d: div[d.draft_id])
    clusters: dict[int, list[Draft]] = {}
    for i, d in enumerate(drafts):
        clusters.setdefault(find(i), []).append(d)
    out: list[Draft] = []
    for members in clusters.values():
        if len(members) == 1:
            out.append(members[0])
            continue
        ranked = sorted(
            members, key=lambda d: (_CONFIDENCE.get(d.card.confidence, 3), -len(d.card.support.cells), d.draft_id)
        )
        out.append(_merged(ranked[0], ranked[1:]))
    return sorted(out, key=lambda d: d.draft_id)


def similarity_order(drafts: list[Draft], turn: int) -> list[Draft]:
    """The order drafts are packed in: likely merges side by side.

    Turn 0 by their first pattern group, turn 1 by their first divergence's place, then by draft id
    rotated (a round that merged nothing is packed differently the next time).
    """
    if turn % 3 == 0:
        return sorted(drafts, key=lambda d: (min(d.card.support.pattern_groups, default="~"), d.draft_id))
    if turn % 3 == 1:
        return sorted(
            drafts,
            key=lambda d: (
                _norm(d.card.first_divergence.where.stage),
                _norm(d.card.first_divergence.where.actor),
                d.draft_id,
            ),
        )
    ids = sorted(drafts, key=lambda d: d.draft_id)
    half = len(ids) // 2
    return [x for pair in zip(ids[:half], ids[half:], strict=False) for x in pair] + ids[2 * half :]


def pack(
    drafts: list[Draft],
    blocks: dict[str, str],
    budget: RoleBudget,
    fixed_tokens: int,
    turn: int = 0,
) -> list[list[Draft]]:
    """Packs of drafts whose blocks fit the room ``budget.input_tokens - fixed_tokens``, measured in tokens.

    Each block is counted with the budget's own counter (:func:`count_text`), not estimated from
    its bytes. A pack takes a second draft even past the room when it would otherwise hold one:
    the caller renders and counts every request and halves one that does not fit.
    """
    room = budget.input_tokens - fixed_tokens
    packs: list[list[Draft]] = [[]]
    used = 0
    for d in similarity_order(drafts, turn):
        size = count_text(budget.limits, blocks[d.draft_id]) + PACK_SEPARATOR_TOKENS
        if len(packs[-1]) >= 2 and used + size > room:
            packs.append([])
            used = 0
        packs[-1].append(d)
        used += size
    packs = [p for p in packs if p]
    if len(packs) > 1 and len(packs[-1]) == 1:
        # a draft left alone could merge with nothing: it takes the previous pack's last (likely) neighbour
        if len(packs[-2]) >= 3:
            packs[-1].insert(0, packs[-2].pop())
        else:
            alone = packs.pop()  # popped before indexing: `packs[-2] += packs.pop()` indexes past the end
            packs[-1] += alone
    return packs
