"""The targeted pattern in both generations: the weakness's groups matched in the child, counted per cell.

Two generations share no event ids, so a group is matched by what it is, not by what it cites: the
same pattern type and the same concerns key (``transition:review->review``), or failing that the
nearest key of the same type by the diff's text similarity (:mod:`pipeline.diff.match`), paired
greedily best first. A cell "has the pattern" when it occurs in any of the weakness's groups;
prevalence is those cells over the eligible cells Luna analysed, overall and per task family,
restricted to the families present in both generations.
"""

from __future__ import annotations

from typing import Any

from pipeline.core.errors import BadInput
from pipeline.diff.match import greedy_match, text_similarity
from pipeline.followup.inputs import RunSide
from pipeline.followup.schema import Families, FamilyRow, GroupMatch, TargetedChange
from pipeline.followup.stats import Direction, two_proportions

Row = dict[str, Any]

# A near key must be this similar (character bigrams) to stand for the same thing; below, no match.
KEY_SIMILARITY = 0.75


def _cells_of(group: Row) -> list[str]:
    support = group.get("support")
    cells = support.get("cells") if isinstance(support, dict) else None
    if not isinstance(cells, list):
        cells = [o.get("cell_id") for o in group.get("occurrences", []) if isinstance(o, dict)]
    return sorted({str(c) for c in cells if c})


def _key_score(a: Row, b: Row) -> float | None:
    if a.get("type") != b.get("type"):
        return None
    ka, kb = str(a.get("concerns") or ""), str(b.get("concerns") or "")
    return 1.0 if ka == kb else text_similarity(ka, kb)


def match_groups(parent_groups: list[Row], child_groups: list[Row]) -> list[tuple[Row, Row | None, float | None]]:
    """Each parent group with its child match (or None) and the score."""
    pairs, only_parent, _ = greedy_match(parent_groups, child_groups, _key_score, KEY_SIMILARITY)
    out: list[tuple[Row, Row | None, float | None]] = [(parent_groups[i], child_groups[j], s) for i, j, s in pairs]
    out += [(parent_groups[i], None, None) for i in only_parent]
    order = {id(g): n for n, g in enumerate(parent_groups)}
    return sorted(out, key=lambda t: order[id(t[0])])


def families(parent: RunSide, child: RunSide) -> Families:
    """Task families (of eligible analysed cells) in both, in the parent only, in the child only."""
    fp, fc = set(parent.cells.values()), set(child.cells.values())
    return Families(covered=sorted(fp & fc), parent_only=sorted(fp - fc), child_only=sorted(fc - fp))


def targeted_change(
    parent: RunSide, child: RunSide, group_ids: list[str], fams: Families, predicted: Direction = "down"
) -> tuple[TargetedChange, list[tuple[Row, Row | None, float | None]]]:
    """Prevalence of the weakness's groups in both generations, with the tests, and the matched groups."""
    by_id = {str(g.get("group_id")): g for g in parent.groups}
    missing = [g for g in group_ids if g not in by_id]
    if missing:
        raise BadInput(f"parent run {parent.run_dir}: the weakness cites groups {', '.join(missing)} it does not have")
    targets = [by_id[g] for g in group_ids]
    matched = match_groups(targets, child.groups)
    covered = set(fams.covered)
    p_cells = {c for g in targets for c in _cells_of(g) if parent.cells.get(c) in covered}
    c_cells = {c for _, m, _ in matched if m is not None for c in _cells_of(m) if child.cells.get(c) in covered}
    p_den = [c for c, t in parent.cells.items() if t in covered]
    c_den = [c for c, t in child.cells.items() if t in covered]
    overall = two_proportions(len(p_cells), len(p_den), len(c_cells), len(c_den), predicted)
    rows = []
    for fam in fams.covered:
        pn = [c for c, t in parent.cells.items() if t == fam]
        cn = [c for c, t in child.cells.items() if t == fam]
        test = two_proportions(
            sum(c in p_cells for c in pn), len(pn), sum(c in c_cells for c in cn), len(cn), predicted
        )
        rows.append(FamilyRow(task_id=fam, test=test))
    groups = [
        GroupMatch(
            parent_group=str(p.get("group_id")),
            type=str(p.get("type")),
            concerns=str(p.get("concerns") or ""),
            parent_cells=_cells_of(p),
            child_group=None if m is None else str(m.get("group_id")),
            child_concerns=None if m is None else str(m.get("concerns") or ""),
            child_cells=[] if m is None else _cells_of(m),
            score=s,
        )
        for p, m, s in matched
    ]
    change = TargetedChange(
        predicted=predicted,
        groups=groups,
        overall=overall,
        per_family=rows,
        parent_cells=sorted(p_cells),
        child_cells=sorted(c_cells),
        not_analysed={"parent": parent.not_analysed, "child": child.not_analysed},
    )
    return change, matched
