"""Sol's map step: the batch cut into partitions that each fit one call, and each partition rendered compactly.

Partitions follow task families first (whole families are packed together while they fit), then
chunks of cells (a family too large for one call is cut into consecutive cells). Pattern groups are
rendered compactly: a header with the group's batch-wide counts per task and outcome, then the
occurrences in this partition (a bounded sample with events and refs, the rest by id), so every
occurrence stays reachable by id while the prompt stays bounded.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pipeline.sol.batch import Batch, group_id
from pipeline.sol.timeline import fit_timelines, timeline_chars

OCCURRENCE_SAMPLE = 8  # occurrences of one group shown with events and refs per call; the rest by id
EVENTS_PER_OCCURRENCE = 4
REFS_PER_OCCURRENCE = 2
TIMELINE_SHARE = 0.5  # at most this share of a map prompt's room goes to timelines


@dataclass
class Chunk:
    """One map call's partition of the batch."""

    call_id: str
    tasks: list[str]
    cells: list[str]
    sizes: dict[str, int] = field(default_factory=dict, repr=False)


def outcome_of(cell: dict[str, Any]) -> str:
    """A cell's outcome label (or ``no outcome``)."""
    return str(cell.get("outcome") or "no outcome")


def by_task_outcome(cells: list[dict[str, Any]]) -> str:
    """``task: outcome n, outcome n; ...`` for a list of cell rows."""
    counts: Counter[tuple[str, str]] = Counter((str(c["task_id"]), outcome_of(c)) for c in cells)
    tasks: dict[str, list[str]] = {}
    for (task, outcome), n in sorted(counts.items()):
        tasks.setdefault(task, []).append(f"{outcome} {n}")
    return "; ".join(f"{t}: {', '.join(v)}" for t, v in tasks.items())


def cell_line(cell: dict[str, Any], coverage: dict[str, Any] | None) -> str:
    """One compact line per cell: ids, outcome and metrics, and what Luna and the Coordinator made of it."""
    metrics = " ".join(
        f"{k}={cell[k]}" for k in ("quality", "completion", "cost", "stability") if cell.get(k) is not None
    )
    cov = ""
    if coverage:
        cov = f" | patterns={coverage.get('patterns', 0)} groups={coverage.get('groups', 0)}"
        if coverage.get("luna_status") not in (None, "ok", "split"):
            cov += f" luna={coverage.get('luna_status')} ({coverage.get('luna_reason') or '-'})"
    return f"{cell['cell_id']} task={cell['task_id']} run={cell['run_id']} outcome={outcome_of(cell)} {metrics}{cov}"


class Renderer:
    """Compact views of the batch, restricted to a set of cells."""

    def __init__(self, batch: Batch) -> None:
        self.batch = batch
        self.cells = batch.by_cell
        self.coverage = {str(r.get("cell_id")): r for r in batch.coverage}
        # per cell: the group ids and (group, occurrence) pairs that come from it
        self.occ_by_cell: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        self.groups = {gid: g for g in batch.groups if (gid := group_id(g))}
        for gid, g in self.groups.items():
            for o in g.get("occurrences") or []:
                if isinstance(o, dict) and o.get("cell_id"):
                    self.occ_by_cell.setdefault(str(o["cell_id"]), []).append((gid, o))
        self._headers: dict[str, str] = {}
        # each occurrence line and cell size is asked for several times per plan (partition, then
        # every map context): made once (pure functions of the batch)
        self._occ_lines: dict[str, str] = {}
        self._cell_lines: dict[str, str] = {}
        self._sizes: dict[tuple[str, int], tuple[int, set[str]]] = {}
        self._by_task: str | None = None

    @property
    def batch_by_task(self) -> str:
        """:func:`by_task_outcome` of every eligible cell (the same line in every map call)."""
        if self._by_task is None:
            self._by_task = by_task_outcome(self.batch.eligible)
        return self._by_task

    def group_header(self, gid: str) -> str:
        """A group's one-line header: type, concerns, batch-wide counts per task and outcome."""
        if gid not in self._headers:
            g = self.groups[gid]
            occ = [o for o in g.get("occurrences") or [] if isinstance(o, dict)]
            cells = [self.cells[str(o["cell_id"])] for o in occ if str(o.get("cell_id")) in self.cells]
            self._headers[gid] = (
                f"{gid} {g.get('type')} concerns={g.get('concerns')!r}: whole batch {len(occ)} occurrence(s) "
                f"in {len({c['cell_id'] for c in cells})} cell(s) [{by_task_outcome(cells)}]"
            )
        return self._headers[gid]

    def cell_line(self, cell: str) -> str:
        """:func:`cell_line` of an eligible cell (made once: partition sizes it, its map context shows it)."""
        line = self._cell_lines.get(cell)
        if line is None:
            line = self._cell_lines[cell] = cell_line(self.cells[cell], self.coverage.get(cell))
        return line

    def occurrence_line(self, o: dict[str, Any]) -> str:
        """One occurrence with a bounded list of its events and refs (the rest counted)."""
        oid = str(o["occurrence_id"])
        line = self._occ_lines.get(oid)
        if line is None:
            line = self._occ_lines[oid] = self._occurrence_line(o)
        return line

    def _occurrence_line(self, o: dict[str, Any]) -> str:
        cell = self.cells.get(str(o["cell_id"]), {})
        events = list(o.get("events") or [])
        refs = list(o.get("refs") or [])
        ev = ", ".join(events[:EVENTS_PER_OCCURRENCE]) + (
            f" (+{len(events) - EVENTS_PER_OCCURRENCE})" if len(events) > EVENTS_PER_OCCURRENCE else ""
        )
        rf = ", ".join(refs[:REFS_PER_OCCURRENCE]) + (
            f" (+{len(refs) - REFS_PER_OCCURRENCE})" if len(refs) > REFS_PER_OCCURRENCE else ""
        )
        where = f"{o['cell_id']} ({cell.get('task_id', '-')}, {outcome_of(cell)})"
        return f"  {o['occurrence_id']} {where}: events {ev}; refs {rf}"

    def groups_text(self, cells: list[str]) -> str:
        """The pattern groups seen in ``cells``: header, sampled occurrences, the rest by id."""
        wanted = set(cells)
        per_group: dict[str, list[dict[str, Any]]] = {}
        for c in cells:
            for gid, o in self.occ_by_cell.get(c, []):
                per_group.setdefault(gid, []).append(o)
        out: list[str] = []
        for gid in sorted(per_group):
            occ = sorted(per_group[gid], key=lambda o: str(o["occurrence_id"]))
            out.append(self.group_header(gid))
            out += [self.occurrence_line(o) for o in occ[:OCCURRENCE_SAMPLE]]
            rest = [str(o["occurrence_id"]) for o in occ[OCCURRENCE_SAMPLE:] if str(o["cell_id"]) in wanted]
            if rest:
                out.append(f"  {len(rest)} more occurrence(s) here, by id: {', '.join(rest)}")
        return "\n".join(out) if out else "none in these cells"

    def cell_size(self, cell: str, timeline_cap: int) -> tuple[int, set[str]]:
        """Characters a cell adds to a map prompt (without group headers) and the groups it brings."""
        known = self._sizes.get((cell, timeline_cap))
        if known is None:
            known = self._sizes[(cell, timeline_cap)] = self._cell_size(cell, timeline_cap)
        return known

    def _cell_size(self, cell: str, timeline_cap: int) -> tuple[int, set[str]]:
        size = len(self.cell_line(cell)) + 1
        gids: set[str] = set()
        for gid, o in self.occ_by_cell.get(cell, []):
            size += len(self.occurrence_line(o)) + 1
            gids.add(gid)
        size += min(timeline_chars(self.batch.timeline.get(cell, [])), timeline_cap)
        return size, gids


def partition(renderer: Renderer, room_chars: int) -> list[Chunk]:
    """Cut the eligible cells into chunks of at most ``room_chars`` each: task families first, then cells."""
    cap = max(int(room_chars * TIMELINE_SHARE) // 4, 400)  # one cell's timeline share in a full chunk
    families: dict[str, list[str]] = {}
    for c in renderer.batch.eligible:
        families.setdefault(str(c["task_id"]), []).append(str(c["cell_id"]))
    chunks: list[Chunk] = []
    cur: Chunk | None = None
    used = 0
    seen_groups: set[str] = set()

    def start() -> Chunk:
        nonlocal used, seen_groups
        used, seen_groups = 0, set()
        chunk = Chunk(call_id=f"M{len(chunks) + 1:02d}", tasks=[], cells=[])
        chunks.append(chunk)
        return chunk

    def cost(cell: str) -> tuple[int, set[str]]:
        size, gids = renderer.cell_size(cell, cap)
        return size + sum(len(renderer.group_header(g)) + 1 for g in gids - seen_groups), gids

    for task, cells in sorted(families.items()):
        family_cost = sum(renderer.cell_size(c, cap)[0] for c in cells)
        if cur is None or used + family_cost > room_chars:
            cur = start()  # a family starts a new chunk unless it fits beside the previous ones
        for cell in sorted(cells):
            size, gids = cost(cell)
            if cur.cells and used + size > room_chars:
                cur = start()
                size, gids = cost(cell)
            cur.cells.append(cell)
            if task not in cur.tasks:
                cur.tasks.append(task)
            cur.sizes[cell] = size
            used += size
            seen_groups |= gids
    return [c for c in chunks if c.cells]


def split(chunk: Chunk) -> list[Chunk]:
    """Halve a chunk whose rendered request turned out too large."""
    half = len(chunk.cells) // 2
    parts = [chunk.cells[:half], chunk.cells[half:]]
    return [
        Chunk(call_id=f"{chunk.call_id}{'ab'[i]}", tasks=list(chunk.tasks), cells=p, sizes=chunk.sizes)
        for i, p in enumerate(parts)
        if p
    ]


def map_context(renderer: Renderer, chunk: Chunk, timeline_chars: int) -> dict[str, Any]:
    """The template context of one map call over ``chunk``."""
    cells = [renderer.cells[c] for c in chunk.cells]
    return _map_context(renderer, chunk, cells, _cells_text(renderer, cells), timeline_chars)


def fitted_map_context(renderer: Renderer, chunk: Chunk, room_chars: int) -> dict[str, Any]:
    """:func:`map_context` whose timelines get what the cells and groups leave of ``room_chars`` (400 at least)."""
    cells = [renderer.cells[c] for c in chunk.cells]
    cells_text = _cells_text(renderer, cells)
    groups_text = renderer.groups_text(chunk.cells)
    timeline_chars = max(room_chars - len(cells_text) - len(groups_text), 400)
    return _map_context(renderer, chunk, cells, cells_text, timeline_chars, groups_text)


def _cells_text(renderer: Renderer, cells: list[dict[str, Any]]) -> str:
    return "\n".join(renderer.cell_line(c["cell_id"]) for c in cells)


def _map_context(
    renderer: Renderer,
    chunk: Chunk,
    cells: list[dict[str, Any]],
    cells_text: str,
    timeline_chars: int,
    groups_text: str | None = None,
) -> dict[str, Any]:
    batch = renderer.batch
    lines = {c: batch.timeline[c] for c in chunk.cells if c in batch.timeline}
    timelines, omitted = fit_timelines(lines, timeline_chars)
    outcome = {c["cell_id"]: f"{c['task_id']}, {outcome_of(c)}" for c in cells}
    negatives = [c["cell_id"] for c in cells if c.get("outcome") == "completed"]
    return {
        "call_id": chunk.call_id,
        "run_id": batch.run_id,
        "harnesses": batch.harnesses,
        "eligible_count": len(batch.eligible),
        "batch_by_task": renderer.batch_by_task,
        "tasks": chunk.tasks,
        "cell_count": len(cells),
        "cells_text": cells_text,
        "negatives": negatives,
        "groups_text": renderer.groups_text(chunk.cells) if groups_text is None else groups_text,
        "timelines_note": (
            "complete"
            if not omitted
            else f"trimmed to fit the prompt: {omitted} of {sum(len(v) for v in lines.values())} events "
            "omitted (marked in place); every event id stays citable"
        ),
        "timelines_text": "\n\n".join(
            f"### {cell} ({outcome.get(cell, '')})\n" + "\n".join(ls) for cell, ls in sorted(timelines.items())
        ),
    }
