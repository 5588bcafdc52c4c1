"""Sol's plan: one call when the whole batch fits the model's budget, else map calls over partitions + reduce.

The single call's request is rendered and counted whole (messages and output schema) against the
``sol`` budget (:mod:`pipeline.models.budget`). When it does not fit, the batch is partitioned
(:mod:`pipeline.sol.partition`) so that every map request fits the ``sol_map`` budget; each map
request is rendered and counted, and a partition that still overflows is halved. Reduce calls are
packed the same way over the drafts (:mod:`pipeline.sol.reduce`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline.core import roles
from pipeline.core.canonical import canonical_json, digest, sha256_text
from pipeline.core.errors import Blocked
from pipeline.core.settings import ModelSettings
from pipeline.models import render
from pipeline.models.budget import RoleBudget, chars_per_token, request_tokens, role_budget
from pipeline.sol.cards import ReduceAnswer, SolAnswer
from pipeline.sol.corpus import Batch
from pipeline.sol.families import task_family
from pipeline.sol.partition import (
    Chunk,
    Renderer,
    fitted_map_context,
    map_context,
    partition,
    split,
    split_groups,
    split_occurrences,
)

if TYPE_CHECKING:
    from pipeline.sol.reuse import PlanInputs

ROLE = roles.SOL.name
MAP_ROLE = roles.SOL_MAP.name
REDUCE_ROLE = roles.SOL_REDUCE.name
SAFETY = 0.9  # plan pieces at 90% of the room: sizes are measured in characters, then counted
SAMPLE_CHARS = 60_000
# The single call is counted whole unless a sample already puts it at over this many times the budget:
# then counting a prompt of millions of tokens (seconds of CPU) could not change the decision.
COUNT_WHOLE_BELOW = 2.0
MAX_CHARS_PER_TOKEN = 10.0
"""More characters per token than any tokenizer gives on log text: a lower bound of a prompt's tokens."""


class MapCall:
    """One planned map call: its partition, its counted size, and its context rendered when asked for.

    A planned call keeps what renders its context (the renderer, the partition, the room its
    timelines were given), not the context: holding every map context of a 10,000-cell batch at once
    was ~130 million characters, twice over with their canonical JSON. :attr:`context` renders it
    again (the same bytes: rendering is a pure function of the batch); a context given at
    construction (tests) is held.
    """

    def __init__(
        self,
        chunk: Chunk,
        context: dict[str, Any] | None = None,
        tokens: int = 0,
        request_digest: str = "",
        *,
        renderer: Renderer | None = None,
        room_chars: int = 0,
        canonical_sha: str | None = None,
        lazy: bool = False,
    ) -> None:
        self.chunk = chunk
        self.tokens = tokens
        self.request_digest = request_digest  # what ``tokens`` counts (see :func:`request_digest`)
        self.renderer = renderer
        self.room_chars = room_chars
        self._held = context
        self._canonical_sha = canonical_sha
        # taken from the last plan (:class:`pipeline.sol.reuse.PlanInputs`): not rendered in this run, its
        # digest and size are that plan's; a stored answer was checked against the same request then
        self.lazy = lazy
        if context is None and renderer is None:
            raise ValueError("a MapCall needs its context or a renderer to make it")

    @property
    def context(self) -> dict[str, Any]:
        """The template context of this call (rendered anew unless held)."""
        if self._held is not None:
            return self._held
        assert self.renderer is not None
        return fitted_map_context(self.renderer, self.chunk, self.room_chars)

    @property
    def canonical(self) -> str:
        """The canonical JSON of the context (the map key and the shortlist's inputs digest it)."""
        return canonical_json(self.context)

    @property
    def canonical_sha(self) -> str:
        """``sha256_text(canonical)`` = ``digest(context)``: made once, or the last plan's when it was not rendered."""
        if self._canonical_sha is None:
            self._canonical_sha = sha256_text(self.canonical)
        return self._canonical_sha


def maps_digest(maps: list[MapCall]) -> str:
    """``digest({"maps": [every map context's digest]})`` (a partition taken from the last plan is not rendered)."""
    return digest({"maps": [m.canonical_sha for m in maps]})


@dataclass
class SolPlanDraft:
    """What Sol will do: the single call, or the map calls (reduce calls depend on their answers)."""

    mode: str  # "single" | "map_reduce"
    budget: RoleBudget
    single_tokens: int
    single_estimated: bool = False  # single_tokens from a sample (far over the budget), not counted whole
    single_at_least: bool = False  # single_tokens counts only what the prompt holds at least (it was never made)
    single_context: dict[str, Any] | None = None
    maps: list[MapCall] = field(default_factory=list)
    renderer: Renderer | None = None
    chars_per_token: float = 4.0
    counts: dict[str, int] = field(default_factory=dict)  # map request digest -> tokens (kept for the next run)

    def describe(self) -> str:
        """One line for output: the plan and its sizes."""
        if self.mode == "single":
            return f"one call over the batch ({self.single_tokens:,} tokens; budget {self.budget.input_tokens:,})"
        tasks = {t for m in self.maps for t in m.chunk.tasks}
        biggest = max((m.tokens for m in self.maps), default=0)
        single = (
            f"{'at least ' if self.single_at_least else ''}~{self.single_tokens:,} tokens, estimated from a sample"
            if self.single_estimated
            else (f"{self.single_tokens:,} tokens")
        )
        return (
            f"map/reduce: the single call would be {single} (budget "
            f"{self.budget.input_tokens:,}); {len(self.maps)} map call(s) over {len(tasks)} task(s) in "
            f"{len({task_family(t) for t in tasks})} famil(ies) "
            f"(largest {biggest:,} tokens), then reduce call(s) over their drafts"
        )


def count(budget: RoleBudget, role: str, context: dict[str, Any], response_model: type[Any]) -> int:
    """Tokens of the whole request ``role`` would send with ``context`` (counted, never the byte bound).

    Used for sizes that plan other requests (a prompt's fixed part, a reduce pack): the byte bound
    (1.35 tokens a byte without the model's tokenizer) left a 8K context almost no room.
    """
    return request_tokens(
        budget, render(role, context, response_model=response_model).messages, response_model, exact=True
    )


def request_digest(budget: RoleBudget, messages: list[dict[str, Any]], response_model: type[Any]) -> str:
    """What a count depends on: the messages, the answer's schema and how this model's tokens are counted.

    Each part is hashed with its length in front (unambiguous whatever the text holds): the repr of
    every message it replaced cost 0.4 CPU s over 294 map prompts of ~180,000 characters.
    """
    h = hashlib.sha256()
    fields = (str(x) for m in messages for k in sorted(m) for x in (k, m[k]))
    for part in (budget.limits.describe(), str(budget.limits.model), response_model.__name__, *fields):
        data = part.encode("utf-8")
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return "sha256:" + h.hexdigest()


def _count_map(
    budget: RoleBudget, context: dict[str, Any], known: dict[str, int], used: dict[str, int]
) -> tuple[int, str]:
    # A map request counted by an earlier run (same digest: same text, same tokenizer) is not counted again.
    messages = render(MAP_ROLE, context, response_model=SolAnswer).messages
    key = request_digest(budget, messages, SolAnswer)
    tokens = known.get(key)
    if tokens is None:
        tokens = request_tokens(budget, messages, SolAnswer)
    used[key] = tokens
    return tokens, key


def _fixed_tokens(budget: RoleBudget, renderer: Renderer) -> int:
    empty = map_context(renderer, Chunk(call_id="M00", tasks=[], cells=[]), 0)
    return count(budget, MAP_ROLE, empty, SolAnswer)


def plan_maps(
    renderer: Renderer,
    settings: ModelSettings,
    cpt: float,
    known: dict[str, int] | None = None,
    used: dict[str, int] | None = None,
    prior: PlanInputs | None = None,
) -> list[MapCall]:
    """Partition the batch so that every map request fits; each request rendered and counted.

    ``known``: request digest -> tokens, counts an earlier run made (:func:`request_digest`);
    ``used`` gets every count this plan made or took (halved partitions too), for the next run.
    ``prior``: the last plan's partitions by inputs; one whose inputs are unchanged is taken
    unrendered (:meth:`MapCall.made_before`), and ``prior.records`` gets this plan's for the next run.
    """
    known = known or {}
    used = {} if used is None else used
    budget = role_budget(settings, MAP_ROLE)
    fixed = _fixed_tokens(budget, renderer)
    room_tokens = budget.input_tokens - fixed
    if room_tokens <= 0:
        raise Blocked(
            f"the Sol map prompt alone ({fixed:,} tokens) exceeds the budget {budget.input_tokens:,} "
            f"({budget.limits.describe()})",
            reason="external_system",
            unblock="lunasol run BUNDLE --model MODEL_WITH_A_LARGER_CONTEXT --resume",
        )
    room_chars = int(room_tokens * cpt * SAFETY)
    out: list[MapCall] = []
    inputs: dict[int, str] = {}  # id(MapCall) -> its partition's inputs digest (for the next run's plan)

    def keep(chunk: Chunk, ctx: dict[str, Any], tokens: int, key: str, room: int, made: str) -> None:
        # Calls are appended in their final order: the id is final now (stable, readable, in partition
        # order; halved chunks renumbered). The id is in the prompt: a renamed request is counted again.
        call_id = f"M{len(out) + 1:02d}"
        if chunk.call_id != call_id:
            chunk.call_id = call_id
            ctx["call_id"] = call_id
            tokens, key = _count_map(budget, ctx, known, used)
        sha = sha256_text(canonical_json(ctx))  # the context itself is dropped: rendered again when asked
        out.append(MapCall(chunk, None, tokens, key, renderer=renderer, room_chars=room, canonical_sha=sha))
        inputs[id(out[-1])] = made

    todo = partition(renderer, room_chars)
    while todo:
        chunk = todo.pop(0)
        made = prior.inputs(renderer, chunk, room_chars) if prior is not None else ""
        rec = prior.take(made) if prior is not None else None
        # a partition whose inputs are the last plan's, under the same call id: its digest and size are taken
        if rec is not None and budget.fits(int(rec["tokens"])) and str(rec["id"]) == f"M{len(out) + 1:02d}":
            chunk.call_id = str(rec["id"])
            out.append(MapCall(chunk, None, int(rec["tokens"]), str(rec["request"]), renderer=renderer,
                               room_chars=int(rec["room"]), canonical_sha=str(rec["context"]), lazy=True))  # fmt: skip
            used[out[-1].request_digest] = out[-1].tokens
            inputs[id(out[-1])] = made
            continue
        ctx = fitted_map_context(renderer, chunk, room_chars)  # timelines get what cells and groups leave
        tokens, key = _count_map(budget, ctx, known, used)
        if budget.fits(tokens):
            keep(chunk, ctx, tokens, key, room_chars, made)
        elif len(chunk.cells) > 1:
            todo[:0] = split(chunk, renderer.cells)
        elif halves := split_groups(chunk, renderer):  # one cell: fewer groups per request, never fewer facts
            todo[:0] = halves
        elif (fitted := _shrunk(renderer, chunk, room_chars, tokens, budget, known, used)) is not None:
            keep(chunk, *fitted, made)
        elif halves := split_occurrences(chunk, renderer):  # one group: fewer occurrences (events), all facts
            todo[:0] = halves
        else:
            raise Blocked(
                f"cell {chunk.cells[0]} alone needs {tokens:,} tokens in a Sol map request"
                + (f" with its one pattern group {chunk.groups[0]}" if chunk.groups else "")
                + (f", occurrence {chunk.occurrences[0]}" if chunk.occurrences else "")
                + ", over the budget "
                f"{budget.input_tokens:,} ({budget.limits.describe()})",
                reason="external_system",
                unblock="lunasol run BUNDLE --model MODEL_WITH_A_LARGER_CONTEXT --resume",
            )
    if prior is not None:
        prior.records = {
            inputs[id(m)]: {"id": m.chunk.call_id, "room": m.room_chars, "context": m.canonical_sha,
                            "tokens": m.tokens, "request": m.request_digest}
            for m in out
            if inputs.get(id(m))
        }  # fmt: skip
    return out


def _shrunk(
    renderer: Renderer,
    chunk: Chunk,
    room_chars: int,
    tokens: int,
    budget: RoleBudget,
    known: dict[str, int],
    used: dict[str, int],
) -> tuple[dict[str, Any], int, str, int] | None:
    """One cell's map request made to fit by giving its timeline less room (None: it never fits).

    The room in characters comes from a sample's characters per token; a cell whose timeline is
    denser than the sample overflows by a few percent. Its timeline is trimmed further (marked in
    place, every event id still citable), in proportion to the overflow, before the cell is refused.
    Returns the context, its tokens, its request digest and the room it was rendered with.
    """
    for _ in range(4):
        room_chars = int(room_chars * budget.input_tokens / tokens * SAFETY)
        ctx = fitted_map_context(renderer, chunk, room_chars)
        tokens, key = _count_map(budget, ctx, known, used)
        if budget.fits(tokens):
            return ctx, tokens, key, room_chars
    return None


def plan_sol(
    batch: Batch,
    settings: ModelSettings,
    single: dict[str, Any] | Callable[[], dict[str, Any]],
    *,
    known: dict[str, int] | None = None,
    count_whole: bool = False,
    prior: PlanInputs | None = None,
) -> SolPlanDraft:
    """Decide: the single call (it fits) or map/reduce (with every map request planned).

    ``single``: the single call's context, or what makes it. Made only when it may fit: when the
    characters it holds at least (cells and pattern groups, counted without making them) are over
    :data:`COUNT_WHOLE_BELOW` times the budget even at :data:`MAX_CHARS_PER_TOKEN`, the plan is
    map/reduce without the whole-batch prompt (56 million characters at 10,000 cells, held several
    times over while it was rendered). Else the single request is counted whole unless a sample of it
    puts it at over :data:`COUNT_WHOLE_BELOW` times the budget (``count_whole`` counts it whole anyway);
    ``known`` holds map request counts of an earlier run, ``prior`` its partitions (:func:`plan_maps`).
    With ``prior``, the last plan's characters per token are kept when today's sample moved them by a
    little (:meth:`~pipeline.sol.reuse.PlanInputs.steady_cpt`): the same partitions are made again.
    """
    budget = role_budget(settings, ROLE)
    renderer = Renderer(batch)
    if callable(single) and not count_whole:
        eligible = [str(c["cell_id"]) for c in batch.eligible]
        rows = sum(len(renderer.cell_line(c)) + 1 for c in eligible)
        past = COUNT_WHOLE_BELOW * budget.input_tokens * MAX_CHARS_PER_TOKEN  # characters past it: map/reduce
        least = rows + renderer.groups_text_chars(eligible, stop_at=max(int(past) - rows, 0))
        if least > past:
            cpt = chars_per_token(budget.limits, renderer.sample_text(eligible, SAMPLE_CHARS))
            if prior is not None:
                cpt = prior.steady_cpt(cpt)
            counts: dict[str, int] = {}
            return SolPlanDraft(
                counts=counts,
                mode="map_reduce",
                budget=budget,
                single_tokens=math.ceil(least / cpt),
                single_estimated=True,
                single_at_least=True,
                maps=plan_maps(renderer, settings, cpt, known, counts, prior),
                renderer=renderer,
                chars_per_token=cpt,
            )
    if callable(single):
        single = single()
    rendered = render(ROLE, single, response_model=SolAnswer)
    text = "\n".join(str(m["content"]) for m in rendered.messages)
    # characters per token of this batch's text, from a sample of the prompt (sizes are planned in characters)
    cpt = chars_per_token(budget.limits, text[len(text) // 2 : len(text) // 2 + SAMPLE_CHARS])
    estimate = math.ceil(len(text) / cpt)
    estimated = not count_whole and estimate > COUNT_WHOLE_BELOW * budget.input_tokens
    tokens = estimate if estimated else request_tokens(budget, rendered.messages, SolAnswer)
    if not estimated and budget.fits(tokens):
        return SolPlanDraft(mode="single", budget=budget, single_tokens=tokens, single_context=single)
    del rendered, text, single  # the map calls are planned without the whole-batch prompt
    if prior is not None:  # the last plan's rate when today's sample moved it by a little: the same partitions
        cpt = prior.steady_cpt(cpt)
    counts = {}
    maps = plan_maps(renderer, settings, cpt, known, counts, prior)
    return SolPlanDraft(
        counts=counts,
        mode="map_reduce",
        budget=budget,
        single_tokens=tokens,
        single_estimated=estimated,
        maps=maps,
        renderer=renderer,
        chars_per_token=cpt,
    )


def reduce_budget(settings: ModelSettings) -> RoleBudget:
    """The budget of one reduce request."""
    return role_budget(settings, REDUCE_ROLE)


def reduce_tokens(budget: RoleBudget, context: dict[str, Any]) -> int:
    """Tokens of one reduce request."""
    return count(budget, REDUCE_ROLE, context, ReduceAnswer)
