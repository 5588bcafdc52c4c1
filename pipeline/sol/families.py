"""Task families and bounded batch-wide aggregates for Sol's requests.

A request shows per-task counts only for the tasks it is about; facts about the whole batch are
bounded: per task while the tasks are few (:data:`TOP_K` or fewer, as small batches always were),
else per task family (the top :data:`TOP_K` by cells, with counts) and the rest summarised in one
line. A batch of 2,500 tasks then costs a request a few hundred characters, not a table of 2,500
tasks that at 128K left no room for any cell.

A task's family comes from its name's structure (``django__django-11099`` -> ``django__django``,
``task-7`` -> ``task``): the run of trailing digits (or a hex id) after the last separator is
dropped. When names carry no structure (every family a single task), tasks are grouped by the
signature of their pattern groups instead (:func:`families_of`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

TOP_K = 10
"""Tasks (or families) named with their counts in a batch-wide aggregate; the rest are summarised."""

_TAIL = re.compile(r"^(?P<stem>.*?[A-Za-z].*?)[-_.:/#@ ]+(?:[0-9]+|[0-9a-f]{6,}|v?[0-9]+(?:\.[0-9]+)+)$")


def task_family(task: str) -> str:
    """The family of a task, from its name: the name without its trailing number or id (itself if none)."""
    m = _TAIL.match(task)
    return m["stem"] if m else task


def families_of(tasks: Iterable[str], groups_of: dict[str, tuple[str, ...]] | None = None) -> dict[str, str]:
    """Task -> family: by name structure; by pattern-group signature when names carry no structure.

    ``groups_of``: per task, the sorted pattern-group ids of its cells (used only when every
    name-based family holds a single task while there are more than :data:`TOP_K` tasks).
    """
    tasks = sorted(set(tasks))
    by_name = {t: task_family(t) for t in tasks}
    if len(tasks) <= TOP_K or len(set(by_name.values())) < len(tasks) or not groups_of:
        return by_name
    # No structure in the names: tasks whose cells fall in the same pattern groups read together.
    return {t: "groups:" + ("+".join(groups_of.get(t, ())[:2]) or "none") for t in tasks}


def _outcome(cell: dict[str, Any]) -> str:
    return str(cell.get("outcome") or "no outcome")


def _mix(counts: Counter[str]) -> str:
    return ", ".join(f"{o} {n}" for o, n in sorted(counts.items()))


def _per_task(cells: list[dict[str, Any]]) -> dict[str, Counter[str]]:
    per_task: dict[str, Counter[str]] = {}
    for c in cells:
        per_task.setdefault(str(c["task_id"]), Counter())[_outcome(c)] += 1
    return per_task


def _by_family(per_task: dict[str, Counter[str]], k: int) -> list[str]:
    """The outcome totals, the ``k`` largest families with their counts, the rest in one clause."""
    fam = families_of(per_task)
    per_family: dict[str, Counter[str]] = {}
    tasks_in: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for t, counts in per_task.items():
        per_family.setdefault(fam[t], Counter()).update(counts)
        tasks_in[fam[t]] += 1
        total.update(counts)
    ranked = sorted(per_family, key=lambda f: (-sum(per_family[f].values()), f))
    cells = sum(total.values())
    parts = [f"{cells} cell(s) of {len(per_task)} tasks in {len(per_family)} famil(ies): {_mix(total)}"]
    parts += [f"family {f} ({tasks_in[f]} task(s)): {_mix(per_family[f])}" for f in ranked[:k]]
    rest = ranked[k:]
    if rest:
        other: Counter[str] = Counter()
        for f in rest:
            other.update(per_family[f])
        parts.append(
            f"{len(rest)} more famil(ies) ({sum(tasks_in[f] for f in rest)} task(s), "
            f"{sum(other.values())} cell(s)): {_mix(other)}"
        )
    return parts


def bounded_by_task(cells: list[dict[str, Any]], k: int = TOP_K, only: set[str] | None = None) -> str:
    """Counts per task and outcome of ``cells`` (``task: outcome n, ...; ...``), bounded in size.

    Up to ``k`` tasks: every task (the form small batches always had). More: the outcome totals,
    the ``k`` largest task families with their counts, and the rest summarised in one clause.
    ``only``: per-task counts for these tasks (a partition's), every other task by family after
    ``elsewhere:``, so a request never names a task outside its partition.
    """
    per_task = _per_task(cells)
    if only is not None:
        mine = {t: v for t, v in per_task.items() if t in only}
        rest = {t: v for t, v in per_task.items() if t not in only}
        parts = [f"{t}: {_mix(mine[t])}" for t in sorted(mine)]
        if rest:
            parts.append("elsewhere: " + "; ".join(_by_family(rest, k)))
        return "; ".join(parts)
    if len(per_task) <= k:
        return "; ".join(f"{t}: {_mix(per_task[t])}" for t in sorted(per_task))
    return "; ".join(_by_family(per_task, k))


class TaskCounts:
    """Counts per task and outcome of a list of cell rows, aggregated once, for many :func:`bounded_by_task` views.

    ``bounded(k, only)`` equals ``bounded_by_task(cells, k, only)`` for the cells it was made from,
    at a cost that does not grow with the rows: the other tasks' family totals are the whole
    totals minus the partition's tasks (a map request's group header is made per partition and
    group; recounting every occurrence of the group each time made Sol's CPU grow with cells²).
    """

    def __init__(self, cells: Iterable[dict[str, Any]]) -> None:
        self.per_task = _per_task(list(cells))
        self.per_family: dict[str, Counter[str]] = {}
        self.tasks_in: Counter[str] = Counter()
        self.total: Counter[str] = Counter()
        for t, counts in self.per_task.items():
            f = task_family(t)  # families_of without pattern-group signatures: by name
            self.per_family.setdefault(f, Counter()).update(counts)
            self.tasks_in[f] += 1
            self.total.update(counts)
        self._ranked: list[str] | None = None  # families by size, then name (made when first asked)
        self._sizes: dict[str, int] = {}

    @classmethod
    def of(cls, per_task: dict[str, Counter[str]]) -> TaskCounts:
        """The counts of rows whose counts per task and outcome are ``per_task`` (already counted, e.g. by a query)."""
        made = cls(())
        for t, counts in per_task.items():
            made.per_task[t] = Counter(counts)
            f = task_family(t)
            made.per_family.setdefault(f, Counter()).update(counts)
            made.tasks_in[f] += 1
            made.total.update(counts)
        return made

    def bounded(self, k: int = TOP_K, only: set[str] | None = None) -> str:
        """:func:`bounded_by_task` of the rows this was made from (same text)."""
        if only is None:
            if len(self.per_task) <= k:
                return "; ".join(f"{t}: {_mix(self.per_task[t])}" for t in sorted(self.per_task))
            return "; ".join(self._by_family({}, k))
        mine = {t: self.per_task[t] for t in only if t in self.per_task}
        parts = [f"{t}: {_mix(mine[t])}" for t in sorted(mine)]
        if len(mine) < len(self.per_task):
            parts.append("elsewhere: " + "; ".join(self._by_family(mine, k)))
        return "; ".join(parts)

    def _by_family(self, without: dict[str, Counter[str]], k: int) -> list[str]:
        """:func:`_by_family` of every task but those in ``without``, at a cost of the families those touch.

        The ranking of the untouched families is made once; only the families of ``without`` are
        counted again and merged into it (copying every family's counts per call grew with the
        batch's families, once per map request and group).
        """
        if self._ranked is None:
            self._sizes = {f: sum(c.values()) for f, c in self.per_family.items()}
            self._ranked = sorted(self.per_family, key=lambda f: (-self._sizes[f], f))
        touched: dict[str, tuple[Counter[str], int]] = {}
        total = Counter(self.total)
        for t, counts in without.items():
            f = task_family(t)
            c, n = touched.get(f, (self.per_family[f], self.tasks_in[f]))
            touched[f] = (c - counts, n - 1)  # drops outcomes left at 0, as a sum over the rest never has them
            total.subtract(counts)
        total = +total
        left = {f: c for f, (c, n) in touched.items() if n}
        families = len(self.per_family) - (len(touched) - len(left))
        moved = sorted(((-sum(c.values()), f) for f, c in left.items()))
        top: list[tuple[str, Counter[str], int]] = []
        untouched = (f for f in self._ranked if f not in touched)
        nxt = next(untouched, None)
        while len(top) < k and (nxt is not None or moved):
            if nxt is not None and (not moved or (-self._sizes[nxt], nxt) < moved[0]):
                top.append((nxt, self.per_family[nxt], self.tasks_in[nxt]))
                nxt = next(untouched, None)
            else:
                f = moved.pop(0)[1]
                top.append((f, left[f], touched[f][1]))
        cells = sum(total.values())
        n_tasks = len(self.per_task) - len(without)
        parts = [f"{cells} cell(s) of {n_tasks} tasks in {families} famil(ies): {_mix(total)}"]
        parts += [f"family {f} ({n} task(s)): {_mix(c)}" for f, c, n in top]
        if families > len(top):
            other = Counter(total)
            for _, c, _n in top:
                other.subtract(c)
            other = +other
            parts.append(
                f"{families - len(top)} more famil(ies) ({n_tasks - sum(n for _, _, n in top)} task(s), "
                f"{sum(other.values())} cell(s)): {_mix(other)}"
            )
        return parts


def bounded_list(items: list[str], k: int = TOP_K) -> str:
    """``a, b, c`` for up to ``k`` items, else the first ``k`` and how many more (never an unbounded list)."""
    if len(items) <= k:
        return ", ".join(items)
    return ", ".join(items[:k]) + f", and {len(items) - k} more"


def walk_order(cells: Iterable[dict[str, Any]], task_groups: dict[str, tuple[str, ...]]) -> list[str]:
    """The eligible ``cells``' ids in the order partitions take them: families, their tasks, then cell ids (sorted).

    ``task_groups``: per task, the sorted pattern groups of its cells' occurrences (what :func:`families_of`
    reads when task names carry no structure). The order :func:`pipeline.sol.partition.partition`
    walks: a request's cells are then mostly one run of it.
    """
    cells_of: dict[str, list[str]] = {}
    for c in cells:
        cells_of.setdefault(str(c["task_id"]), []).append(str(c["cell_id"]))
    fam = families_of(cells_of, {t: task_groups.get(t, ()) for t in cells_of})
    by_family: dict[str, list[str]] = {}
    for t in sorted(cells_of):
        by_family.setdefault(fam[t], []).append(t)
    return [cell for _f, ts in sorted(by_family.items()) for t in ts for cell in sorted(cells_of[t])]
