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


@dataclass
class MapCall:
    """One planned map call: its partition, its context and its counted size.

    A call whose partition's inputs are the last plan's (:class:`pipeline.sol.reuse.PlanInputs`) is
    made before: its context digest and size come from that plan, and :meth:`render` makes the
    context only when the call must be asked (``context`` is empty until then).
    """

    chunk: Chunk
    context: dict[str, Any]
    tokens: int
    request_digest: str = ""  # what ``tokens`` counts (see :func:`request_digest`)
    room_chars: int = 0  # characters the context was fitted to
    _canonical: str | None = field(default=None, repr=False, compare=False)
    _canonical_sha: str | None = field(default=None, repr=False, compare=False)
    _make: Callable[[], dict[str, Any]] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def made_before(cls, chunk: Chunk, rec: dict[str, Any], make: Callable[[], dict[str, Any]]) -> MapCall:
        """A call taken from the last plan's record (its context made by ``make`` if it is needed)."""
        call = cls(chunk=chunk, context={}, tokens=int(rec["tokens"]), request_digest=str(rec["request"]))
        call.room_chars, call._canonical_sha, call._make = int(rec["room"]), str(rec["context"]), make
        return call

    @property
    def lazy(self) -> bool:
        """True while the context is the last plan's, not rendered in this run."""
        return self._make is not None

    def render(self) -> dict[str, Any]:
        """The context, rendered now if it was taken from the last plan."""
        if self._make is not None:
            self.context, self._make = self._make(), None
            self._canonical = self._canonical_sha = None
        return self.context

    @property
    def canonical(self) -> str:
        """The canonical JSON of the context (made once: the map key and the shortlist's inputs digest it)."""
        if self._canonical is None:
            self._canonical = canonical_json(self.render())
        return self._canonical

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
            f"~{self.single_tokens:,} tokens, estimated from a sample"
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
    todo = partition(renderer, room_chars)
    inputs: dict[int, str] = {}  # id(MapCall) -> its partition's inputs digest
    taken: dict[int, str] = {}  # id(MapCall) -> the call id its recorded context was made with
    while todo:
        chunk = todo.pop(0)
        made = prior.inputs(renderer, chunk, room_chars) if prior is not None else ""
        rec = prior.take(made) if prior is not None else None
        if rec is not None and budget.fits(int(rec["tokens"])):
            m = MapCall.made_before(chunk, rec, _maker(renderer, chunk, int(rec["room"])))
            out.append(m)
            used[m.request_digest] = m.tokens
            inputs[id(m)], taken[id(m)] = made, str(rec["id"])
            continue
        ctx = fitted_map_context(renderer, chunk, room_chars)  # timelines get what cells and groups leave
        tokens, key = _count_map(budget, ctx, known, used)
        if budget.fits(tokens):
            out.append(MapCall(chunk=chunk, context=ctx, tokens=tokens, request_digest=key, room_chars=room_chars))
            inputs[id(out[-1])] = made
        elif len(chunk.cells) > 1:
            todo[:0] = split(chunk, renderer.cells)
        elif halves := split_groups(chunk, renderer):  # one cell: fewer groups per request, never fewer facts
            todo[:0] = halves
        elif (fitted := _shrunk(renderer, chunk, room_chars, tokens, budget, known, used)) is not None:
            out.append(fitted)
            inputs[id(fitted)] = made
        else:
            raise Blocked(
                f"cell {chunk.cells[0]} alone needs {tokens:,} tokens in a Sol map request"
                + (f" with its one pattern group {chunk.groups[0]}" if chunk.groups else "")
                + ", over the budget "
                f"{budget.input_tokens:,} ({budget.limits.describe()})",
                reason="external_system",
                unblock="lunasol run BUNDLE --model MODEL_WITH_A_LARGER_CONTEXT --resume",
            )
    # stable, readable ids in partition order (halved chunks renumbered)
    for i, m in enumerate(out, 1):
        if m.lazy and taken.get(id(m)) != f"M{i:02d}":  # recorded under another id: made anew under this one
            m.chunk.call_id = f"M{i:02d}"
            m.render()
            m.tokens, m.request_digest = _count_map(budget, m.context, known, used)
        elif m.chunk.call_id != f"M{i:02d}":  # the id is in the prompt: count the renamed request again
            m.chunk.call_id = f"M{i:02d}"
            m.context["call_id"] = m.chunk.call_id
            m.tokens, m.request_digest = _count_map(budget, m.context, known, used)
        m.chunk.call_id = f"M{i:02d}"
    if prior is not None:
        prior.records = {
            inputs[id(m)]: {
                "id": m.chunk.call_id,
                "room": m.room_chars,
                "context": m.canonical_sha,
                "tokens": m.tokens,
                "request": m.request_digest,
            }
            for m in out
            if inputs.get(id(m))
        }
    return out


def _maker(renderer: Renderer, chunk: Chunk, room: int) -> Callable[[], dict[str, Any]]:
    return lambda: fitted_map_context(renderer, chunk, room)


def _shrunk(
    renderer: Renderer,
    chunk: Chunk,
    room_chars: int,
    tokens: int,
    budget: RoleBudget,
    known: dict[str, int],
    used: dict[str, int],
) -> MapCall | None:
    """One cell's map request made to fit by giving its timeline less room (None: it never fits).

    The room in characters comes from a sample's characters per token; a cell whose timeline is
    denser than the sample overflows by a few percent. Its timeline is trimmed further (marked in
    place, every event id still citable), in proportion to the overflow, before the cell is refused.
    """
    for _ in range(4):
        room_chars = int(room_chars * budget.input_tokens / tokens * SAFETY)
        ctx = fitted_map_context(renderer, chunk, room_chars)
        tokens, key = _count_map(budget, ctx, known, used)
        if budget.fits(tokens):
            return MapCall(chunk=chunk, context=ctx, tokens=tokens, request_digest=key, room_chars=room_chars)
    return None


def plan_sol(
    batch: Batch,
    settings: ModelSettings,
    single: dict[str, Any],
    *,
    known: dict[str, int] | None = None,
    count_whole: bool = False,
    prior: PlanInputs | None = None,
) -> SolPlanDraft:
    """Decide: the single call (it fits) or map/reduce (with every map request planned).

    The single request is counted whole unless a sample of it puts it at over
    :data:`COUNT_WHOLE_BELOW` times the budget (``count_whole`` counts it whole anyway);
    ``known`` holds map request counts of an earlier run, ``prior`` its partitions (:func:`plan_maps`).
    """
    budget = role_budget(settings, ROLE)
    rendered = render(ROLE, single, response_model=SolAnswer)
    text = "\n".join(str(m["content"]) for m in rendered.messages)
    # characters per token of this batch's text, from a sample of the prompt (sizes are planned in characters)
    cpt = chars_per_token(budget.limits, text[len(text) // 2 : len(text) // 2 + SAMPLE_CHARS])
    estimate = math.ceil(len(text) / cpt)
    estimated = not count_whole and estimate > COUNT_WHOLE_BELOW * budget.input_tokens
    tokens = estimate if estimated else request_tokens(budget, rendered.messages, SolAnswer)
    if not estimated and budget.fits(tokens):
        return SolPlanDraft(mode="single", budget=budget, single_tokens=tokens, single_context=single)
    renderer = Renderer(batch)
    counts: dict[str, int] = {}
    if prior is not None:  # the last plan's rate when today's sample moved it by a little: the same partitions
        cpt = prior.steady_cpt(cpt)
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
