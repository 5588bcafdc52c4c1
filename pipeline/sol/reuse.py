"""Sol's map answers kept across reruns: a map call whose request is unchanged takes its checked answer again.

A map call's first request is made of its context (the partition's cells, the occurrences and
timelines they show, the batch-wide counts in its group headers), the ``sol_map`` template, the
answer's schema, the model, the instructor mode and the sampling settings. :func:`map_key`
digests all of them, so an equal key means the same request byte for byte. The answer stored
under it (``runs/<id>/sol_map/<call>.json``, written when the call succeeded) is taken again only
if it still passes today's checks against the whole batch's evidence index; otherwise the call
is asked again. One changed cell changes the context of the partition that shows it (and of any
partition whose group headers count it), so only those map calls and the reduce are asked again.
:class:`PlanInputs` keeps the plan itself: a partition whose inputs are unchanged is not rendered,
counted or scanned again (its context digest, size and room are the last plan's).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pipeline
from pipeline.artifacts import rundir
from pipeline.core.canonical import digest
from pipeline.core.settings import ModelSettings
from pipeline.sol.cards import SolAnswer
from pipeline.state.ledger import CellResults, cell_key

if TYPE_CHECKING:
    from pipeline.sol.partition import Chunk, Renderer

MAP_ANSWERS_DIR = rundir.SOL_MAP_DIR  # runs/<id>/sol_map/<call id>.json, one per map call
COUNTS_ID = "request-tokens"  # runs/<id>/sol_map/request-tokens.json: map request digest -> tokens
PLAN_ID = "plan-inputs"  # runs/<id>/sol_map/plan-inputs.json: what each map context was made from -> its digest
CPT_STEADY = 0.02  # a characters-per-token rate within 2% of the last plan's plans as the last plan did


@dataclass
class StoredMap:
    """A map call's answer as it was accepted, with the exchanges it took."""

    answer: SolAnswer
    attempts: int
    keys: list[str]


@functools.cache
def _schema_digest() -> str:
    return digest(SolAnswer.model_json_schema())


def map_key(
    context_digest: str,
    *,
    template_hash: str,
    model: str | None,
    instructor_mode: str,
    settings: ModelSettings,
    max_tokens: int | None,
) -> str:
    """Digest of everything a map call's first request is made of (equal key: the same request).

    ``context_digest``: ``digest(context)`` of the call's template context. ``max_tokens``: the bound
    the request carries (:meth:`pipeline.models.client.ModelClient.max_tokens`, the role's bound capped
    by the answer's room), not the role's own ``max_tokens``: a settings change that leaves the
    request's bound as it was keeps the stored answer, one that changes it asks again.
    """
    return cell_key(
        context=context_digest,
        template=template_hash,
        schema=_schema_digest(),
        model=model,
        mode=instructor_mode,
        temperature=repr(settings.temperature),
        max_tokens=repr(max_tokens),
        max_reasks=repr(settings.max_reasks),
        lunasol=pipeline.__version__,
    )


def _counts_key(limits: str) -> str:
    # counts hold for one way of counting (the model's limits and tokenizer) and one lunasol
    return digest({"limits": limits, "lunasol": pipeline.__version__})


class MapAnswers:
    """The accepted answers of a run's map calls, by call id, each valid for one :func:`map_key`."""

    def __init__(self, run_dir: Path) -> None:
        self.store = CellResults(run_dir, MAP_ANSWERS_DIR)

    def get(self, call_id: str, key: str) -> StoredMap | None:
        """The answer stored for ``call_id`` under ``key``; None when absent, made with another key, or unreadable."""
        value = self.store.get(call_id, key)
        if not isinstance(value, dict):
            return None
        try:
            answer = SolAnswer.model_validate(value["answer"])
            return StoredMap(answer, int(value["attempts"]), [str(k) for k in value["keys"]])
        except (KeyError, TypeError, ValueError):  # an answer of an older shape: ask again
            return None

    def token_counts(self, limits: str) -> dict[str, int]:
        """Request digest -> tokens of the map requests the last plan counted under ``limits``."""
        value = self.store.get(COUNTS_ID, _counts_key(limits))
        if not isinstance(value, dict):
            return {}
        return {str(k): int(v) for k, v in value.items() if isinstance(v, int)}

    def put_counts(self, limits: str, counts: dict[str, int]) -> None:
        """Keep this plan's map request counts (only these: the file does not grow across runs)."""
        self.store.put(
            COUNTS_ID, digest({"limits": limits, "lunasol": pipeline.__version__}), dict(sorted(counts.items()))
        )

    def put(self, call_id: str, key: str, stored: StoredMap, inputs: dict[str, str | None]) -> None:
        """Keep an accepted answer (atomically) for the next run."""
        value = {"answer": stored.answer.model_dump(mode="json"), "attempts": stored.attempts, "keys": stored.keys}
        self.store.put(call_id, key, value, inputs=inputs)


@functools.cache
def _code_digest() -> str:
    # A map context is made by these modules: a change to any of them makes every context anew.
    h = hashlib.sha256()
    root = Path(pipeline.__file__).parent  # the files themselves (importing them by name would be a lookup)
    for name in ("luna/render", "sol/corpus", "sol/evidence", "sol/families", "sol/partition", "sol/plan",
                 "sol/timeline", "sol/timeline_cache", "sol/reuse"):  # fmt: skip
        h.update((root / f"{name}.py").read_bytes())
    return h.hexdigest()


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


class PlanInputs:
    """What each map context of the last plan was made from, so that an unchanged partition is not made again.

    A map context is a function of its partition (tasks, cells, groups shown), the room it was
    fitted to, each cell's row, coverage, timeline lines and occurrence blocks (Luna's words and
    the cited events' text), the rows behind each shown group's header (its occurrences' cells,
    wherever they are in the batch), the batch-wide header and the code that renders it.
    :meth:`inputs` digests exactly these, far cheaper than rendering (a group header counts its
    whole group per partition) and counting the request. When a partition's inputs digest is the
    last plan's, its context digest, room and counted tokens are taken from there
    (``runs/<id>/sol_map/plan-inputs.json``, the last plan's only) and the context is rendered only
    if its call must be asked. One changed cell thus re-renders the partitions that show it (or a
    group whose header counts it), not the batch.
    """

    def __init__(self, run_dir: Path, limits: str) -> None:
        self.store = CellResults(run_dir, MAP_ANSWERS_DIR)
        self.key = digest({"limits": limits, "code": _code_digest(), "lunasol": pipeline.__version__})
        value = self.store.get(PLAN_ID, self.key)
        value = value if isinstance(value, dict) else {}
        maps, cpt = value.get("maps"), value.get("chars_per_token")
        self.last: dict[str, dict[str, Any]] = maps if isinstance(maps, dict) else {}
        self.last_cpt = float(cpt) if isinstance(cpt, int | float) and cpt > 0 else None
        self.records: dict[str, dict[str, Any]] = {}  # this plan's, set by the planner
        self.cpt: float | None = None
        self._groups: dict[str, str] = {}  # group id -> digest of what its header is made from
        self._batch: str | None = None

    @staticmethod
    def _row(renderer: Renderer, cell: str) -> str:
        return _json(renderer.cells.get(cell))

    def _group(self, renderer: Renderer, gid: str) -> str:
        # what the group's header is made from: the group as the Coordinator named it (id, type, concerns), its
        # occurrences and cells over the batch, and their counts per task and outcome (the rows it counts)
        known = self._groups.get(gid)
        if known is None:
            head, counts = renderer.group_counts(gid)
            per_task = {t: dict(sorted(c.items())) for t, c in sorted(counts.per_task.items())}
            known = self._groups[gid] = digest({"group": _json(renderer.groups.get(gid)), "head": head,
                                                 "per_task": per_task})  # fmt: skip
        return known

    def inputs(self, renderer: Renderer, chunk: Chunk, room_chars: int) -> str:
        """Digest of everything ``fitted_map_context(renderer, chunk, room_chars)`` is made from, but the call id."""
        if self._batch is None:
            b = renderer.batch
            self._batch = _json([b.run_id, b.harnesses, len(b.eligible), renderer.batch_by_task])
        h = hashlib.sha256()

        def put(*parts: str) -> None:
            h.update(len(parts).to_bytes(8, "big"))
            for part in parts:
                data = part.encode("utf-8", "surrogatepass")
                h.update(len(data).to_bytes(8, "big"))
                h.update(data)

        put(self._batch, str(room_chars), _json([chunk.tasks, chunk.cells, chunk.groups]))
        timelines = renderer.batch.timeline.lines(chunk.cells)
        found = renderer.occurrences(chunk.cells)
        evidence = renderer.evidence_for(chunk.cells)
        for c in chunk.cells:
            put(c, self._row(renderer, c), _json(renderer.coverage.get(c)))
            put(*(str(x) for pair in timelines.get(c, []) for x in pair))
            for gid, o in found.get(c, []):
                head, texts, events = renderer.occurrence_block(o, evidence)
                put(gid, _json(o), head, *(x for pair in (*texts, *events) for x in pair))
        for gid in sorted(set(renderer.group_ids(chunk.cells)) | set(chunk.groups or [])):
            put(gid, self._group(renderer, gid))
        return "sha256:" + h.hexdigest()

    def take(self, inputs: str) -> dict[str, Any] | None:
        """The last plan's record for a partition with these inputs (call id, room, context digest, tokens)."""
        rec = self.last.get(inputs)
        if not isinstance(rec, dict) or not {"id", "room", "context", "tokens", "request"} <= set(rec):
            return None
        return rec

    def steady_cpt(self, cpt: float) -> float:
        """The characters per token to plan with: the last plan's when ``cpt`` is within :data:`CPT_STEADY` of it.

        The rate is measured on a sample from the middle of the whole-batch prompt: one changed cell
        moves that sample, and a rate a hair off would give every partition another room (every map
        context made again, and any trimmed timeline cut elsewhere: every such call asked again).
        Partitions are sized in characters with a margin and every request is counted before it is
        sent, so a rate a few percent off is safe.
        """
        if self.last_cpt is not None and abs(cpt - self.last_cpt) <= CPT_STEADY * self.last_cpt:
            cpt = self.last_cpt
        self.cpt = cpt
        return cpt

    def save(self) -> None:
        """Keep this plan's records (only these: the file does not grow across runs)."""
        value = {"chars_per_token": self.cpt, "maps": dict(sorted(self.records.items()))}
        self.store.put(PLAN_ID, self.key, value)
