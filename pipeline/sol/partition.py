"""Sol's map step: the batch cut into partitions that each fit one call, and each partition rendered compactly.

Partitions follow task families first (:mod:`pipeline.sol.families`: whole families are packed
together while they fit), then tasks, then chunks of cells (a task too large for one call is cut into
consecutive cells). A request carries per-task facts only for its partition's tasks; batch-wide
counts are bounded aggregates (:func:`pipeline.sol.families.bounded_by_task`), never a per-task table
of the whole batch. Pattern groups are rendered compactly: a header with the group's batch-wide
counts (bounded the same way), then EVERY
occurrence in this partition with Luna's words and the text of every event it cites
(:mod:`pipeline.sol.evidence`). When that does not fit, a partition holds fewer cells (and so
fewer groups), never fewer facts per group. Cells are a table under a header line, not key=value
pairs repeated on every row.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from pipeline.sol.corpus import Batch, group_id
from pipeline.sol.evidence import GroupEvidence, occurrence_lines
from pipeline.sol.families import TaskCounts, families_of
from pipeline.sol.timeline import fit_timelines

CELL_HEADER = "cell|task|run|outcome|quality|completion|cost|stability|patterns|groups|luna"
"""The columns of :func:`cell_line` (said once, above the rows)."""
GROUP_TOP_K = 3  # families named in a map request's group header beside its own tasks (one header per group)
TIMELINE_SHARE = 0.5  # at most this share of a map prompt's room goes to timelines
SIZE_CELLS = 256  # cells whose occurrences are sized together (their evidence read in one query)
VIEW_OCCURRENCES = 4_096  # more occurrences than this in one text: their evidence is read a group at a time
# The whole batch's groups text reads a group's evidence this many occurrences at a time, by id: each read scans
# the evidence tables (its ids are cells far apart), so a slice is large (~35 MB of lines at most) and few
VIEW_SLICE = 32_768


@dataclass
class Chunk:
    """One map call's partition of the batch."""

    call_id: str
    tasks: list[str]
    cells: list[str]
    groups: list[str] | None = None  # only these pattern groups (one cell too large with all of its groups)
    occurrences: list[str] | None = None  # only these occurrences of its one group (that group too large alone)
    events: list[str] | None = None  # only these cited events' lines of its one occurrence (too large alone)


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
    """One row of the cell table (:data:`CELL_HEADER`): ids, outcome, metrics, what Luna and the Coordinator made of it.

    A missing value is ``-``; Luna's status is ``ok`` or ``<status> (<reason>)``.
    """
    metrics = [cell.get(k) for k in ("quality", "completion", "cost", "stability")]
    cov = coverage or {}
    luna = str(cov.get("luna_status") or "-")
    if cov.get("luna_status") not in (None, "ok", "split"):
        luna += f" ({cov.get('luna_reason') or '-'})"
    values = [
        cell["cell_id"],
        cell["task_id"],
        cell["run_id"],
        outcome_of(cell),
        *("-" if m is None else m for m in metrics),
        cov.get("patterns", "-" if coverage is None else 0),
        cov.get("groups", "-" if coverage is None else 0),
        luna,
    ]
    return "|".join(str(v) for v in values)


class Renderer:
    """Compact views of the batch, restricted to a set of cells.

    Holds per eligible cell two numbers' worth (its size in a map prompt without its timeline, and the
    groups it brings), by rank; the occurrences themselves are read per request (:meth:`Batch.occurrences`).
    """

    def __init__(self, batch: Batch) -> None:
        self.batch = batch
        self.cells = batch.by_cell
        self.coverage = {str(r.get("cell_id")): r for r in batch.coverage}
        self.groups = {gid: g for g in batch.groups if (gid := group_id(g))}
        self._headers: dict[str, str] = {}
        self._counts: dict[str, tuple[str, TaskCounts]] | None = None
        # per eligible cell by rank (made in one walk of the batch when partitions are first sized): the
        # characters its row and occurrence blocks take in a map prompt, and the groups it brings
        self._base: array[int] | None = None
        self._gids: list[tuple[str, ...]] = []
        self._read: tuple[tuple[str, ...], dict[str, list[tuple[str, dict[str, Any]]]]] | None = None
        self._by_task: str | None = None
        self._walk: list[str] | None = None
        self._whole_chars: int | None = None

    @property
    def batch_by_task(self) -> str:
        """:func:`bounded_by_task` of every eligible cell (the same line in every map call, bounded in size)."""
        if self._by_task is None:
            self._by_task = self.batch.by_task
        return self._by_task

    def families(self) -> dict[str, list[str]]:
        """Task family -> its tasks (sorted), over the eligible cells (:func:`families_of`)."""
        tasks = {str(c["task_id"]) for c in self.batch.eligible}
        fam = families_of(tasks, {t: self.batch.task_groups.get(t, ()) for t in tasks})
        out: dict[str, list[str]] = {}
        for t in sorted(tasks):
            out.setdefault(fam[t], []).append(t)
        return out

    def occurrences(self, cells: list[str]) -> dict[str, list[tuple[str, dict[str, Any]]]]:
        """:meth:`Batch.occurrences` of ``cells``; the last read is kept (a request reads its cells several times)."""
        key = tuple(cells)
        if self._read is None or self._read[0] != key:
            self._read = (key, self.batch.occurrences(cells))
        return self._read[1]

    def group_header(self, gid: str, tasks: set[str] | None = None) -> str:
        """A group's one-line header: type, concerns, batch-wide counts per task and outcome.

        ``tasks``: a partition's tasks, counted per task; the group's other tasks by family
        (:func:`bounded_by_task`), so a map request names no task outside its partition.
        """
        if tasks is not None:
            head, counts = self.group_counts(gid)
            return f"{head} [{counts.bounded(GROUP_TOP_K, tasks)}]"
        if gid not in self._headers:
            head, counts = self.group_counts(gid)
            self._headers[gid] = f"{head} [{counts.bounded()}]"
        return self._headers[gid]

    def group_counts(self, gid: str) -> tuple[str, TaskCounts]:
        """A group's header without its counts, and its occurrences' counts per task (made once, every group)."""
        if self._counts is None:
            # every group's occurrences counted per cell in one query: per group, its occurrences (any cell), its
            # eligible cells, and per task and outcome the occurrences of those cells
            occ: Counter[str] = Counter()
            cells: Counter[str] = Counter()
            per_task: dict[str, dict[str, Counter[str]]] = {}
            for g, cell, n in self.batch.group_cell_counts():
                occ[g] += n
                row = self.cells.get(str(cell)) if cell is not None else None
                if row is not None:
                    cells[g] += 1
                    per_task.setdefault(g, {}).setdefault(str(row["task_id"]), Counter())[outcome_of(row)] += n
            self._counts = {}
            for g in {*self.groups, *occ}:
                meta = self.groups.get(g, {})
                head = (
                    f"{g} {meta.get('type')} concerns={meta.get('concerns')!r}: whole batch {occ[g]} occurrence(s) "
                    f"in {cells[g]} cell(s)"
                )
                self._counts[g] = (head, TaskCounts.of(per_task.get(g, {})))
        return self._counts[gid]

    def cell_line(self, cell: str) -> str:
        """:func:`cell_line` of an eligible cell."""
        return cell_line(self.cells[cell], self.coverage.get(cell))

    def occurrence_block(
        self, o: dict[str, Any], evidence: GroupEvidence | None = None
    ) -> tuple[str, list[tuple[str, str]], list[tuple[str, str]]]:
        """One occurrence: head line, Luna's words, every cited event with its text (:func:`occurrence_lines`).

        Made anew each time (not kept): its lines copy the cited events' texts, and kept for every
        occurrence of a 10,000-cell batch they were as large as the evidence itself. ``evidence``:
        what :meth:`evidence_for` read for the occurrences rendered together (else read for this one).
        """
        cell = self.cells.get(str(o["cell_id"]), {})
        where = f"{o['cell_id']} ({cell.get('task_id', '-')}, {outcome_of(cell)})"
        if evidence is None:
            evidence = self.evidence_for([str(o["cell_id"])], [o])
        return occurrence_lines(o, where, evidence)

    def evidence_for(self, cells: list[str], occurrences: list[dict[str, Any]] | None = None) -> GroupEvidence:
        """Luna's words and the event lines ``occurrences`` cite (default: every occurrence of ``cells``), read now."""
        if occurrences is None:
            found = self.occurrences(cells)
            occurrences = [o for c in cells for _, o in found.get(c, [])]
        return self.batch.evidence.for_cells(cells, occurrences)

    def block_chars(self, o: dict[str, Any], evidence: GroupEvidence | None = None) -> int:
        """Characters an occurrence's block takes (before texts and events said earlier are left out)."""
        head, texts, events = self.occurrence_block(o, evidence)
        return len(head) + 1 + sum(len(line) + 1 for _, line in (*texts, *events))

    def _sized(self) -> tuple[array[int], list[tuple[str, ...]]]:
        """Per eligible cell by rank: its row's and occurrence blocks' characters, and its groups (sorted)."""
        if self._base is None:
            walk = self.walk
            base = array("q", bytes(8 * len(walk)))
            gids: list[tuple[str, ...]] = [()] * len(walk)
            rank = self.batch.evidence.rank
            same = {g: g for g in self.groups}
            for i in range(0, len(walk), SIZE_CELLS):
                # cells that follow each other in the partitions' walk: their occurrences and evidence in one read each
                cells = walk[i : i + SIZE_CELLS]
                found = self.batch.occurrences(cells)
                evidence = self.evidence_for(cells, [o for c in cells for _, o in found.get(c, [])])
                for c in cells:
                    mine = found.get(c, [])
                    at = rank[c]
                    base[at] = len(self.cell_line(c)) + 1 + sum(self.block_chars(o, evidence) for _, o in mine)
                    if mine:  # the groups' own id strings, not one copy per cell
                        gids[at] = tuple(sorted({same.get(g, g) for g, _ in mine}))
            self._base, self._gids = base, gids
        return self._base, self._gids

    @property
    def walk(self) -> list[str]:
        """The eligible cells in their ranks' order (:func:`pipeline.sol.families.walk_order`)."""
        if self._walk is None:
            rank = self.batch.evidence.rank
            self._walk = sorted(rank, key=rank.__getitem__)
        return self._walk

    def group_ids(self, cells: list[str]) -> list[str]:
        """The pattern groups with an occurrence in ``cells``, sorted."""
        found = self.occurrences(cells)
        return sorted({gid for c in cells for gid, _ in found.get(c, [])})

    def groups_text(
        self,
        cells: list[str],
        only: list[str] | None = None,
        tasks: set[str] | None = None,
        occurrences: list[str] | None = None,
        events: list[str] | None = None,
    ) -> str:
        """The pattern groups seen in ``cells``: header, then every occurrence here with its evidence.

        A text or an event line already said in this request is not said again (the occurrence's
        head line still names its events). ``only``: just these groups (a cell too large for one
        request with all of its groups is read in several, each with every fact of its groups).
        ``occurrences``: just these occurrences (one group too large for one request is read in
        several, each occurrence whole, with its events' text and Luna's words); ``events``: just
        these cited events' lines (one occurrence too large for one request: its head line and
        Luna's words in each, its events' lines spread over the requests).
        ``tasks``: the partition's tasks (:meth:`group_header`); None for the whole batch.
        """
        per_group, held = self._selected(cells, only, occurrences)
        out = list(self._lines(per_group, tasks, events))
        if out and occurrences is not None:
            shown = sum(map(len, per_group.values()))
            out.insert(0, f"(this call shows {shown} of the {held} occurrences of {', '.join(sorted(per_group))} in "
                          "these cells, each whole; other calls read the others)")  # fmt: skip
        if out and only is not None:
            every = self.group_ids(cells)
            out.insert(0, f"(this call shows {len(per_group)} of the {len(every)} pattern groups of these cells; "
                          "other calls read the others, each with all of its facts)")  # fmt: skip
        return "\n".join(out) if out else "none in these cells"

    def _selected(
        self, cells: list[str], only: list[str] | None, occurrences: list[str] | None
    ) -> tuple[dict[str, list[dict[str, Any]]], int]:
        """The occurrences shown, by group, and how many the wanted groups hold in ``cells`` (for the notes)."""
        wanted = None if occurrences is None else set(occurrences)
        per_group: dict[str, list[dict[str, Any]]] = {}
        held = 0
        found = self.occurrences(cells)
        for c in cells:
            for gid, o in found.get(c, []):
                if only is None or gid in only:
                    held += 1
                    if wanted is None or str(o["occurrence_id"]) in wanted:
                        per_group.setdefault(gid, []).append(o)
        return per_group, held

    def _lines(
        self, per_group: dict[str, list[dict[str, Any]]], tasks: set[str] | None, events: list[str] | None = None
    ) -> Iterator[str]:
        """The lines of :meth:`groups_text` (without its notes on what other calls read), one at a time."""
        many = sum(map(len, per_group.values())) > VIEW_OCCURRENCES
        evidence = None
        if not many:  # one request's occurrences: their evidence read at once
            cells = sorted({str(o["cell_id"]) for occ in per_group.values() for o in occ})
            evidence = self.evidence_for(cells, [o for occ in per_group.values() for o in occ])
        groups = ((gid, per_group[gid]) for gid in sorted(per_group))
        yield from self._group_lines(groups, tasks, None if many else evidence, events)

    def _group_lines(
        self,
        groups: Iterable[tuple[str, list[dict[str, Any]]]],
        tasks: set[str] | None,
        evidence: GroupEvidence | None,
        events: list[str] | None = None,
    ) -> Iterator[str]:
        """Each group's header and occurrences (sorted) with their evidence; ``evidence`` None: a group's at a time."""
        only_events = None if events is None else set(events)
        seen: set[str | bytes] = set()  # event ids, and Luna's texts by digest (the whole batch's are many)
        for gid, occ in groups:
            yield self.group_header(gid, tasks)
            shown = evidence
            ordered = sorted(occ, key=lambda o: str(o["occurrence_id"]))
            for i, o in enumerate(ordered):
                if evidence is None and i % VIEW_SLICE == 0:
                    # the whole batch's text: the evidence of a slice of the group at a time (a large group's
                    # lines, all held, were ~100 MB at 100,000 cells)
                    shown = self.batch.evidence.for_ids(ordered[i : i + VIEW_SLICE])
                head, texts, lines = self.occurrence_block(o, shown)
                yield head
                if only_events is not None:
                    lines = [(e, line) for e, line in lines if e in only_events]
                    yield (f"    (this call shows the lines of {len(lines)} of its {len(o.get('events') or [])} "
                           "events; another call shows the others)")  # fmt: skip
                for key, line in texts:
                    said = hashlib.blake2b(key.encode(), digest_size=16).digest()
                    if said not in seen:
                        seen.add(said)
                        yield line
                for key, line in lines:
                    if key not in seen:
                        seen.add(key)
                        yield line

    def _text_lines(self, cells: list[str], whole: bool) -> Iterator[str]:
        """The lines of ``groups_text(cells)``; the whole batch's (``whole``) a group's occurrences read at a time."""
        if whole:
            return self._group_lines(self.batch.group_stream(), None, None)
        return self._lines(self._selected(cells, None, None)[0], None)

    def _whole(self, cells: list[str]) -> bool:
        return len(cells) == len(self.batch.eligible) and set(cells) == self.batch.evidence.rank.keys()

    def groups_text_chars(self, cells: list[str], stop_at: int | None = None) -> int:
        """``len(groups_text(cells))`` (every group, whole-batch headers), counted without making the text.

        ``stop_at``: counting ends past it, so the count is a lower bound (what the single call's
        decision needs). The whole batch's text dedups every event line it says, by id: walked to its
        end at 100,000 cells that set alone held ~300 MiB, to learn a size past the budget after 0.4%.
        For the whole batch the count is kept, and :meth:`sample_text` samples the text it counted.
        """
        whole = self._whole(cells)
        if whole and self._whole_chars is not None:
            return self._whole_chars  # the whole batch's is asked twice per plan (its size, then its middle)
        chars = lines = 0
        for line in self._text_lines(cells, whole):
            chars += len(line)
            lines += 1
            if stop_at is not None and chars + lines - 1 > stop_at:
                break
        chars = chars + lines - 1 if lines else len("none in these cells")
        if whole:
            self._whole_chars = chars
        return chars

    def sample_text(self, cells: list[str], chars: int) -> str:
        """The middle ``chars`` characters of ``groups_text(cells)``, made without the rest of the text.

        What the characters per token of a whole-batch prompt are measured on when that prompt is
        not made: its middle is in its pattern groups. When the whole batch's count stopped early
        (:meth:`groups_text_chars`' ``stop_at``), the middle of the part it counted.
        """
        start = max(self.groups_text_chars(cells) // 2 - chars // 2, 0)
        pos, first = 0, 0
        kept: list[str] = []
        for line in self._text_lines(cells, self._whole(cells)):
            end = pos + len(line) + 1  # the line and its newline
            if end > start:
                first = first if kept else pos
                kept.append(line)
                if end >= start + chars:
                    break
            pos = end
        return "\n".join(kept)[start - first : start - first + chars]

    def cell_size(self, cell: str, timeline_cap: int) -> tuple[int, tuple[str, ...]]:
        """Characters a cell adds to a map prompt (without group headers) and the groups it brings."""
        base, gids = self._sized()
        at = self.batch.evidence.rank[cell]
        return base[at] + min(self.batch.timeline.chars(cell), timeline_cap), gids[at]


def partition(renderer: Renderer, room_chars: int) -> list[Chunk]:
    """Cut the eligible cells into chunks of at most ``room_chars`` each: task families, then tasks, then cells.

    A family starts a new chunk when it does not fit beside the previous ones but fits alone; a task
    starts one when it does not fit beside the previous ones; a task too large is cut into cells.
    """
    cap = max(int(room_chars * TIMELINE_SHARE) // 4, 400)  # one cell's timeline share in a full chunk
    by_task: dict[str, list[str]] = {}
    for c in renderer.batch.eligible:
        by_task.setdefault(str(c["task_id"]), []).append(str(c["cell_id"]))
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

    def cost(cell: str) -> tuple[int, tuple[str, ...]]:
        size, gids = renderer.cell_size(cell, cap)
        return size + sum(len(renderer.group_header(g)) + 1 for g in gids if g not in seen_groups), gids

    def plain(cells: list[str]) -> int:
        return sum(renderer.cell_size(c, cap)[0] for c in cells)

    for _family, tasks in sorted(renderer.families().items()):
        family_cost = sum(plain(by_task[t]) for t in tasks)
        if cur is not None and used + family_cost > room_chars and family_cost <= room_chars:
            cur = None  # the family fits alone: it starts a chunk rather than being cut across two
        for task in tasks:
            cells = by_task[task]
            if cur is None or used + plain(cells) > room_chars:
                cur = start()  # a task starts a new chunk unless it fits beside the previous ones
            for cell in sorted(cells):
                size, gids = cost(cell)
                if cur.cells and used + size > room_chars:
                    cur = start()
                    size, gids = cost(cell)
                cur.cells.append(cell)
                if task not in cur.tasks:
                    cur.tasks.append(task)
                used += size
                seen_groups.update(gids)
    return [c for c in chunks if c.cells]


def split_groups(chunk: Chunk, renderer: Renderer) -> list[Chunk]:
    """Halve the pattern groups of a one-cell chunk whose request is too large.

    Fewer groups per request, never fewer facts per group: empty when it holds one group (that one is
    cut between its occurrences by :func:`split_occurrences`, once a shorter timeline did not help).
    """
    groups = chunk.groups if chunk.groups is not None else renderer.group_ids(chunk.cells)
    if len(groups) < 2:
        return []
    half = len(groups) // 2
    return [
        Chunk(call_id=f"{chunk.call_id}{'gh'[i]}", tasks=list(chunk.tasks), cells=list(chunk.cells), groups=g)
        for i, g in enumerate((groups[:half], groups[half:]))
    ]


def split_occurrences(chunk: Chunk, renderer: Renderer) -> list[Chunk]:
    """Halve the occurrences of a one-cell, one-group chunk whose request is too large.

    Each request keeps whole occurrences (their cited events' text, Luna's observed and
    definition_fit) and the group's header; none is dropped. One occurrence too large alone is
    halved by its cited events (each request: its head line naming every event, Luna's words, the
    lines of its share of the events). Empty when one event is left.
    """
    groups = chunk.groups if chunk.groups is not None else renderer.group_ids(chunk.cells)
    if len(groups) != 1:
        return []
    read = renderer.occurrences(chunk.cells)
    found = {str(o["occurrence_id"]): o for c in chunk.cells for g, o in read.get(c, []) if g in groups}
    occ = chunk.occurrences if chunk.occurrences is not None else sorted(found)
    if len(occ) == 1:  # one occurrence too large alone: its events' lines over several requests
        events = chunk.events if chunk.events is not None else [str(e) for e in found[occ[0]].get("events") or []]
        if len(events) < 2:
            return []
        cut = len(events) // 2
        return [
            Chunk(
                call_id=f"{chunk.call_id}{'ef'[i]}",
                tasks=list(chunk.tasks),
                cells=list(chunk.cells),
                groups=list(groups),
                occurrences=list(occ),
                events=e,
            )
            for i, e in enumerate((events[:cut], events[cut:]))
        ]
    if len(occ) < 2:
        return []
    half = len(occ) // 2
    return [
        Chunk(
            call_id=f"{chunk.call_id}{'op'[i]}",
            tasks=list(chunk.tasks),
            cells=list(chunk.cells),
            groups=list(groups),
            occurrences=o,
        )
        for i, o in enumerate((occ[:half], occ[half:]))
    ]


def split(chunk: Chunk, task_of: dict[str, dict[str, Any]] | None = None) -> list[Chunk]:
    """Halve a chunk whose rendered request turned out too large.

    ``task_of``: cell rows by id; each half then names only its own cells' tasks (its request
    carries per-task facts for those alone).
    """
    half = len(chunk.cells) // 2
    parts = [chunk.cells[:half], chunk.cells[half:]]

    def tasks(cells: list[str]) -> list[str]:
        if task_of is None:
            return list(chunk.tasks)
        mine = {str(task_of[c]["task_id"]) for c in cells}
        return [t for t in chunk.tasks if t in mine]

    return [Chunk(call_id=f"{chunk.call_id}{'ab'[i]}", tasks=tasks(p), cells=p) for i, p in enumerate(parts) if p]


def map_context(renderer: Renderer, chunk: Chunk, timeline_chars: int) -> dict[str, Any]:
    """The template context of one map call over ``chunk``."""
    cells = [renderer.cells[c] for c in chunk.cells]
    return _map_context(renderer, chunk, cells, _cells_text(renderer, cells), timeline_chars)


def fitted_map_context(renderer: Renderer, chunk: Chunk, room_chars: int) -> dict[str, Any]:
    """:func:`map_context` whose timelines get what the cells and groups leave of ``room_chars`` (400 at least)."""
    cells = [renderer.cells[c] for c in chunk.cells]
    cells_text = _cells_text(renderer, cells)
    groups_text = renderer.groups_text(chunk.cells, chunk.groups, set(chunk.tasks), chunk.occurrences, chunk.events)
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
    lines = batch.timeline.lines(chunk.cells)  # this partition's cells only, read from the IR
    timelines, omitted = fit_timelines(lines, timeline_chars)
    outcome = {c["cell_id"]: f"{c['task_id']}, {outcome_of(c)}" for c in cells}
    negatives = [c["cell_id"] for c in cells if c.get("outcome") == "completed"]
    return {
        "call_id": chunk.call_id,
        "run_id": batch.run_id,
        "harnesses": batch.harnesses,
        "eligible_count": len(batch.eligible),
        **batch.pilot_context,  # a pilot: the prompt says its cells are a subset of the batch
        "batch_by_task": renderer.batch_by_task,
        "tasks": chunk.tasks,
        "cell_count": len(cells),
        "cell_header": CELL_HEADER,
        "cells_text": cells_text,
        "negatives": negatives,
        "groups_text": (
            renderer.groups_text(chunk.cells, chunk.groups, set(chunk.tasks), chunk.occurrences, chunk.events)
            if groups_text is None
            else groups_text
        ),
        "timelines_note": (
            "complete"
            if not omitted
            else f"trimmed to fit the prompt: {omitted} of {sum(len(v) for v in lines.values())} events "
            "omitted (marked in place); cite only events shown in this request"
        ),
        "timelines_text": "\n\n".join(
            f"### {cell} ({outcome.get(cell, '')})\n" + "\n".join(ls) for cell, ls in sorted(timelines.items())
        ),
    }
