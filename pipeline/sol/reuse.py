"""Sol's map answers kept across reruns: a map call whose request is unchanged takes its checked answer again.

A map call's first request is made of its context (the partition's cells, the occurrences and
timelines they show, the batch-wide counts in its group headers), the ``sol_map`` template, the
answer's schema, the model, the instructor mode and the sampling settings. :func:`map_key`
digests all of them, so an equal key means the same request byte for byte. The answer stored
under it (``runs/<id>/sol_map/<call>.json``, written when the call succeeded) is taken again only
if it still passes today's checks against the whole batch's evidence index; otherwise the call
is asked again. One changed cell changes the context of the partition that shows it (and of any
partition whose group headers count it), so only those map calls and the reduce are asked again.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import pipeline
from pipeline.core.canonical import digest
from pipeline.core.settings import ModelSettings
from pipeline.sol.cards import SolAnswer
from pipeline.state.ledger import CellResults, cell_key

MAP_ANSWERS_DIR = "sol_map"  # runs/<id>/sol_map/<call id>.json, one per map call
COUNTS_ID = "request-tokens"  # runs/<id>/sol_map/request-tokens.json: map request digest -> tokens


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
