"""``--batch``: the first request of each batched call goes out in one provider batch, not synchronously.

:class:`Batcher` sits under the exchange. A stage first hands it every first request it will make
(:meth:`Batcher.prefetch`): they are submitted a bounded batch at a time, and all collected before
the stage's calls run, so no call waits holding its cell and prompt. A request not prefetched
arrives with its replay key (the key a synchronous call would use) and waits; once no new request
has arrived for a moment, every waiting request goes out the same way. Either way a key some
earlier process already submitted is found in the run's ``batches.json`` and collected from that
batch (never submitted twice); the rest go out as new batches. Each batch's keys and a random
intent token are written to ``batches.json`` *before* the batch is asked for, and the token goes
to the provider as batch metadata; the id is written as soon as the provider answers. A process
killed in between leaves a record without an id: the next flush finds the batch by its token in
the provider's list (adopting it) or, if the provider never accepted it, submits those keys again.
The answer is the provider's raw response body, which the exchange records exactly as a
synchronous answer. ``batches.json`` is read and written under a lock, but the provider is waited
on outside it: a later flush is submitted while earlier batches run, and a request already in a
running flush waits for that one.

* not finished within ``LUNASOL_BATCH_MAX_WAIT_S``: :class:`BatchPending` (a block; ``--resume``
  collects the same batch);
* an item the provider failed: answered ``None``, and the caller asks synchronously;
* an expired batch: answered items are used, the missing ones block with :class:`BatchExpired`,
  whose unblock (``--resume --batch``) submits only those;
* a batch the provider failed as a whole: :class:`BatchFailed` with the provider's errors; its
  requests are never asked synchronously behind the user's back (that is the full price), and
  ``--resume --batch`` submits them again;
* a batch failed because the model's batch queue was full (OpenAI's enqueued-token limit, its
  ``token_limit_exceeded``): the limit its message states is kept from then on, and its requests
  go again as the batches in progress finish. With a known limit (``--batch-queue-tokens``, or one
  learned so), prefetch keeps at most that many tokens enqueued: a batch waits for room. A limit the
  provider stated is kept in ``batch-queue.json`` too, so a resumed process paces from its first batch.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pipeline.artifacts.rundir import BATCH_QUEUE_FILE, BATCHES_FILE
from pipeline.core.canonical import atomic_write_text
from pipeline.core.errors import Blocked
from pipeline.core.memory import give_back
from pipeline.core.roles import ROLE_SPECS, VERB_ROLE_SPECS
from pipeline.models.batch_api import TERMINAL, BatchEndpoint, BatchState, ItemResult, batch_line, wire_bodies
from pipeline.models.transport import describe

BATCHED_ROLES = frozenset(r.name for r in (*ROLE_SPECS, *VERB_ROLE_SPECS) if r.batched)
"""Roles whose calls ``--batch`` sends as one provider batch (the per-cell fan-out)."""

BATCHES_NAME = BATCHES_FILE
QUEUE_NAME = BATCH_QUEUE_FILE
"""The model's enqueued-token limit as its provider stated it in a refusal (``{"model", "tokens"}``)."""
CLOSED_UNANSWERED = frozenset({"expired", "cancelled"})  # a batch that ended with requests left unanswered
RESUBMITTED = CLOSED_UNANSWERED | {"failed"}  # an earlier process's batch so ended: its unanswered keys go again
QUEUE_CHARS_PER_TOKEN = 3
"""Prompt characters per token when weighing a request against a batch queue limit.

Low on purpose (English prose is ~4, logs and JSON ~3 to 4), so the weight errs high: a queue is
filled to about three quarters rather than overfilled. A provider that counts otherwise fails a
batch as queue-full, and that batch goes again once room is made.
"""
IDLE_S = 0.2  # no new request for this long: every concurrent call of the stage has asked
BATCH_MAX_REQUESTS = 1000  # one prefetch batch at most (OpenAI allows 50,000 requests ...)
BATCH_MAX_CHARS = 20_000_000  # ... and 200 MB per batch file; a request's JSON is larger than its text
INTENT_KEY = "lunasol_intent"  # batch metadata naming the submission, to find it after a crash


class BatchPending(Blocked):
    """The provider has not finished the batch yet (exit 3; ``--resume`` collects it)."""


class BatchExpired(Blocked):
    """The batch window closed before these requests were answered (exit 3; resume resubmits them)."""


class BatchFailed(Blocked):
    """The provider failed a whole batch, or its queue stayed full (exit 3; resume resubmits its requests)."""


def read_batches(run_dir: Path) -> list[dict[str, Any]]:
    """The batches this run submitted: ``[{id, keys, status}]`` in submission order."""
    path = Path(run_dir) / BATCHES_NAME
    if not path.is_file():
        return []
    data = json.loads(path.read_text(encoding="utf-8"))
    return list(data.get("batches", []))


def read_queue_limit(run_dir: Path, model: str) -> int | None:
    """The queue limit a provider stated for ``model`` to an earlier process of this run, if any."""
    try:
        data = json.loads((Path(run_dir) / QUEUE_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # absent or unreadable: learned again from the next refusal
        return None
    tokens = data.get("tokens") if isinstance(data, dict) and data.get("model") == model else None
    return tokens if type(tokens) is int and tokens > 0 else None


def _write_batches(run_dir: Path, batches: list[dict[str, Any]]) -> None:
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(run_dir) / BATCHES_NAME, json.dumps({"batches": batches}, indent=1, sort_keys=True) + "\n")


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


class Batcher:
    """Collects requests into provider batches for one run (see the module docstring)."""

    def __init__(
        self,
        model: str,
        run_dir: Path,
        *,
        api_base: str | None,
        timeout_s: float,
        log: Callable[[str], None],
        queue_tokens: int | None = None,
        sdk: bool = False,
    ) -> None:
        self.model = model
        self.sdk = sdk  # the synchronous calls go through the openai SDK: a batch line holds the body it posts
        self.run_dir = Path(run_dir)
        self.api_base = api_base
        self.endpoint = BatchEndpoint(model, api_base=api_base, timeout_s=timeout_s)
        self.log = log
        self.poll_s = _env_float("LUNASOL_BATCH_POLL_S", 30.0)
        max_wait = os.environ.get("LUNASOL_BATCH_MAX_WAIT_S")
        self.max_wait_s: float | None = _env_float("LUNASOL_BATCH_MAX_WAIT_S", 0.0) if max_wait else None
        self._waiting: dict[str, tuple[dict[str, Any], asyncio.Future[dict[str, Any] | None]]] = {}
        self._taken: dict[str, tuple[dict[str, Any], asyncio.Future[dict[str, Any] | None]]] = {}  # in a flush
        self._flusher: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._ready: dict[str, dict[str, Any] | Blocked | None] = {}  # key -> what prefetch() collected
        self.prefetched = False  # the stage's first requests went out through prefetch()
        # The model's enqueued-token limit: given (--batch-queue-tokens), or learned from a queue-full batch
        # (by this process, or stated to an earlier one of this run).
        self.queue_tokens = queue_tokens
        if queue_tokens is None:
            self.queue_tokens = read_queue_limit(self.run_dir, model)
            if self.queue_tokens is not None:
                log(
                    f"batch: the provider's batch queue for {model} holds at most {self.queue_tokens:,} tokens "
                    f"(stated to an earlier process, {QUEUE_NAME}); batches wait for room"
                )
        self._collecting: dict[str, asyncio.Task[tuple[BatchState, dict[str, ItemResult]]]] = {}
        self._enqueued: dict[str, int] = {}  # batch id -> its weight, while it is in the provider's queue
        self._stalled = False  # a batch in the queue outlived the max wait: nothing more is submitted
        self._held: set[str] = set()  # keys not submitted, for want of room in the queue

    async def answer(self, key: str, kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """The raw body answering this request (its replay key), or None: ask it synchronously."""
        if key in self._ready:  # collected by prefetch()
            got = self._ready[key]
            if isinstance(got, Blocked):
                raise got
            return got
        # the same request again while its first ask waits (a flush may already be running it): one answer
        entry = self._waiting.get(key) or self._taken.get(key)
        if entry is None:
            future: asyncio.Future[dict[str, Any] | None] = asyncio.get_running_loop().create_future()
            entry = (kwargs, future)
            self._waiting[key] = entry
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_when_idle())
        return await asyncio.shield(entry[1])

    async def _flush_when_idle(self) -> None:
        seen = -1
        while len(self._waiting) != seen:
            seen = len(self._waiting)
            await asyncio.sleep(IDLE_S)
        batch = dict(self._waiting)
        self._waiting.clear()
        self._taken.update(batch)
        # A request arriving from now on starts its own flush, submitted while this one's batch runs.
        self._flusher = None
        try:
            await self._flush(batch)
        except BaseException as exc:  # every waiting call learns what went wrong
            for _, fut in batch.values():
                if not fut.done():
                    fut.set_exception(exc if isinstance(exc, Exception) else asyncio.CancelledError())
            if not isinstance(exc, Exception):
                raise
        finally:
            for k in batch:
                self._taken.pop(k, None)

    async def _flush(self, waiting: dict[str, tuple[dict[str, Any], asyncio.Future[dict[str, Any] | None]]]) -> None:
        # batches.json is read and written under the lock; the provider is waited on outside it, so
        # the requests of a later flush (Luna's next chunk of cells) are submitted while this
        # batch runs, not after it finished (each batch can take hours).
        async with self._lock:
            batches = await self._settle_intents(read_batches(self.run_dir))
        where: dict[str, dict[str, Any]] = {}
        for b in batches:  # a later batch of the same key wins (a resubmission after expiry)
            for k in b["keys"]:
                where[k] = b
        results: dict[str, ItemResult] = {}
        states: dict[str, BatchState] = {}
        # 1. collect what earlier submissions hold (a crash or a block between submit and collect)
        for bid in dict.fromkeys(where[k]["id"] for k in waiting if k in where):
            state, items = await self._collect(bid)
            states[bid] = state
            results.update(items)
        retry = [
            k
            for k in waiting
            if k not in where or (states[where[k]["id"]].status in RESUBMITTED and not _ok(results.get(k)))
        ]
        # 2. submit the rest as one new batch, stored in the run before waiting on it
        if retry:
            record = await self._submit([(k, waiting[k][0]) for k in retry])
            bid = record["id"]
            state, items = await self._collect(bid)
            states[bid] = state
            for k in retry:
                where[k] = record
            results.update(items)
        await self._store_states(states)
        # 3. answer every waiting call
        pending = [k for k in waiting if not states[where[k]["id"]].done]
        expired = [k for k in waiting if k not in pending and not _ok(results.get(k)) and _expired(states, where, k)]
        per_batch = Counter(where[k]["id"] for k in waiting)
        failed: dict[str, BatchFailed] = {}  # one error per failed batch, as for pending and expired ones
        for key, (_, fut) in waiting.items():
            item = results.get(key)
            if key in pending or key in expired or fut.done():
                continue
            bid = where[key]["id"]
            if states[bid].status == "failed":
                if bid not in failed:
                    failed[bid] = _failed_error(states[bid], per_batch[bid], self.queue_tokens)
                fut.set_exception(failed[bid])
                continue
            fut.set_result(self._usable(bid, key, item))
        if pending:
            exc: Blocked = _pending_error(sorted({where[k]["id"] for k in pending}), states, len(pending))
            for k in pending:
                waiting[k][1].set_exception(exc)
        if expired:
            exc = _expired_error(sorted({where[k]["id"] for k in expired}), states, len(expired))
            for k in expired:
                if not waiting[k][1].done():
                    waiting[k][1].set_exception(exc)

    def _usable(self, bid: str, key: str, item: ItemResult | None) -> dict[str, Any] | None:
        """An answered item's body; None (logged) for an item the provider failed: it is asked synchronously."""
        if _ok(item):
            return item.body if item is not None else None
        why = "no answer" if item is None else f"status {item.status_code}: {item.error}"
        self.log(f"batch {bid}: item {key[:19]} failed ({why}); asking it synchronously")
        return None

    async def prefetch(self, requests: Callable[[], Iterable[tuple[str, dict[str, Any]]]]) -> int:
        """Submit every (key, kwargs) of ``requests()`` as it comes, in batches of bounded size; then collect them all.

        The stage's calls then find their answers at once (:meth:`answer`), so no call has to wait,
        holding its cell and prompt, until its batch answers: requests are made, submitted and
        dropped one batch at a time (``BATCH_MAX_REQUESTS`` requests, ``BATCH_MAX_CHARS``
        characters of prompt, and no more than the queue limit when one is known). A key an
        earlier process already submitted is collected from that batch, never submitted again,
        unless that batch ended without answering it (expired, cancelled, failed): then
        ``requests()`` is read again for those keys alone, as it is for a batch of this process
        refused because the queue was full. Returns how many were submitted.
        """
        self._held.clear()
        async with self._lock:
            batches = await self._settle_intents(read_batches(self.run_dir))
        where: dict[str, str] = {}
        for b in batches:  # a later batch of the same key wins (a resubmission after expiry)
            for k in b["keys"]:
                where[k] = b["id"]
            if b.get("status") not in TERMINAL:  # still in the provider's queue: it takes room there
                self._watch(b["id"], int(b.get("tokens") or 0))
        asked: dict[str, list[str]] = {}  # batch id -> the keys this prefetch takes from it

        def not_submitted(key: str) -> bool:
            if key in where:
                asked.setdefault(where[key], []).append(key)
                return False
            return True

        try:
            new = await self._submit_all(requests(), not_submitted)
            asked.update(new)
            states, results = await self._collect_all(list(asked))
            again = {
                k
                for bid, keys in asked.items()
                if states[bid].queue_full or (bid not in new and states[bid].status in RESUBMITTED)
                for k in keys
                if not _ok(results[bid].get(k))
            }
            while again:
                self.log(f"batch: {len(again)} requests of a batch that ended unanswered are submitted again")
                more = await self._submit_all(requests(), again.__contains__)
                more_states, more_results = await self._collect_all(list(more))
                states.update(more_states)
                results.update(more_results)
                for bid in asked:
                    asked[bid] = [k for k in asked[bid] if k not in again]
                asked.update(more)
                new.update(more)
                refused = {k for bid, keys in more.items() if more_states[bid].queue_full for k in keys}
                # Go on while a round gets anything through; a round the queue refused whole blocks.
                again = set() if refused == again - self._held else refused
        finally:
            for task in self._collecting.values():  # an earlier batch this stage did not ask for
                task.cancel()
            self._collecting.clear()
        await self._store_states(states)
        for bid, keys in asked.items():
            state, items = states[bid], results[bid]
            if not state.done:
                self._ready.update(dict.fromkeys(keys, _pending_error([bid], states, len(keys))))
                continue
            if state.status == "failed":
                self._ready.update(dict.fromkeys(keys, _failed_error(state, len(keys), self.queue_tokens)))
                continue
            expired = [k for k in keys if not _ok(items.get(k)) and state.status in CLOSED_UNANSWERED]
            if expired:
                self._ready.update(dict.fromkeys(expired, _expired_error([bid], states, len(expired))))
            for k in keys:
                if k not in expired:
                    self._ready[k] = self._usable(bid, k, items.get(k))
        if self._held:
            self._ready.update(dict.fromkeys(self._held, _held_error(len(self._held), self.queue_tokens)))
        self.prefetched = True
        return sum(len(keys) for keys in new.values())

    async def _submit_all(
        self, requests: Iterable[tuple[str, dict[str, Any]]], wanted: Callable[[str], bool]
    ) -> dict[str, list[str]]:
        """Submit the wanted requests (each key once) in batches of bounded size; batch id -> its keys.

        Each batch is watched from its submission on (:meth:`_watch`), so that with a queue limit
        a batch waits for room (:meth:`_room`) while earlier ones run.
        """
        out: dict[str, list[str]] = {}
        chunk: list[tuple[str, dict[str, Any]]] = []
        chars = weight = 0
        seen: set[str] = set()
        for key, kwargs in requests:
            if key in seen:
                continue
            seen.add(key)
            if not wanted(key):
                continue
            w = _weight(kwargs)
            if chunk and self.queue_tokens is not None and weight + w > self.queue_tokens:
                await self._send(chunk, weight, out)
                chunk, chars, weight = [], 0, 0
                give_back()  # the batch's prompts and file are free now (pipeline.core.memory)
            chunk.append((key, kwargs))
            chars += _chars(kwargs)
            weight += w
            if len(chunk) >= BATCH_MAX_REQUESTS or chars >= BATCH_MAX_CHARS:
                await self._send(chunk, weight, out)
                chunk, chars, weight = [], 0, 0
                give_back()
        if chunk:
            await self._send(chunk, weight, out)
            del chunk
            give_back()
        return out

    async def _send(self, chunk: list[tuple[str, dict[str, Any]]], weight: int, out: dict[str, list[str]]) -> None:
        """Submit one batch once the queue has room for it; held back (not submitted) when it never does.

        A create refused with a 429 (a LiteLLM proxy's ``batch_enqueued_token_limit``) is the
        queue limit too: what is in the queue becomes the limit, and the batch goes when there is room.
        """
        while True:
            if not await self._room(weight):
                self._held.update(k for k, _ in chunk)
                return
            try:
                record = await self._submit(chunk, weight)
                break
            except Exception as exc:
                if getattr(exc, "status_code", None) != 429:
                    raise
                held = sum(self._enqueued.values())
                if not held:  # nothing of this run is in the queue to wait for
                    raise _refused_error(len(chunk), exc) from None
                if self.queue_tokens is None or held < self.queue_tokens:
                    self.queue_tokens = held
                    self.log(
                        f"batch: the provider refused a batch of ~{weight:,} tokens at create ({describe(exc)}); "
                        f"from now on at most {held:,} tokens are enqueued at once"
                    )
                await self._wait_for_any()
        out[record["id"]] = [k for k, _ in chunk]
        self._watch(record["id"], weight)

    def _watch(self, bid: str, weight: int) -> None:
        """Start collecting a batch in the queue now; until it ends it weighs ``weight`` tokens there."""
        if bid not in self._collecting:
            self._collecting[bid] = asyncio.create_task(self._collect(bid))
            self._enqueued[bid] = weight

    async def _room(self, weight: int) -> bool:
        """Wait until ``weight`` more tokens fit the queue limit; False when a batch outlived the max wait."""
        while True:
            self._settle_queue()
            if self._stalled:
                return False
            limit, enqueued = self.queue_tokens, sum(self._enqueued.values())
            if limit is None or not self._enqueued or enqueued + weight <= limit:
                return True  # alone in the queue, a batch over the limit still goes: the provider decides
            await self._wait_for_any()

    async def _wait_for_any(self) -> None:
        """Until one of this run's batches in the queue ends (or outlives the max wait)."""
        if self._enqueued:
            await asyncio.wait([self._collecting[b] for b in self._enqueued], return_when=asyncio.FIRST_COMPLETED)

    def _settle_queue(self) -> None:
        """Take the batches that ended out of the queue; a queue-full one teaches the limit."""
        for bid in [b for b in self._enqueued if self._collecting[b].done()]:
            weight = self._enqueued.pop(bid)
            task = self._collecting[bid]
            if task.cancelled() or task.exception() is not None:
                continue  # raised where the batch is collected
            state, _ = task.result()
            if state.queue_full:
                self._learn_limit(bid, state, weight)
            elif not state.done:
                self._stalled = True  # waiting on past the max wait is for --resume to do

    def _learn_limit(self, bid: str, state: BatchState, weight: int) -> None:
        stated = state.queue_limit()
        # Without a stated limit, the queue held what was in it besides this batch: no more than that goes at once.
        limit = stated or sum(self._enqueued.values()) or None
        if limit is not None and (self.queue_tokens is None or limit < self.queue_tokens):
            self.queue_tokens = limit
            if stated:  # a provider's fact, kept for a resumed process (the other guess holds only for now)
                self.run_dir.mkdir(parents=True, exist_ok=True)
                atomic_write_text(self.run_dir / QUEUE_NAME, json.dumps({"model": self.model, "tokens": limit}) + "\n")
            self.log(
                f"batch {bid}: the provider's batch queue for {self.model} is full "
                f"({'its limit' if stated else 'what was in it'}: {limit:,} tokens; this batch ~{weight:,}); "
                "from now on batches wait for room, and this one goes again"
            )

    async def _collect_all(self, ids: list[str]) -> tuple[dict[str, BatchState], dict[str, dict[str, ItemResult]]]:
        """Wait for these batches together (each up to the max wait); their states and items by batch id."""
        for bid in ids:
            self._watch(bid, 0)  # an earlier batch already ended weighs nothing in the queue
        tasks = [self._collecting.pop(bid) for bid in ids]
        try:
            collected = await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:  # none is left running behind the error
                task.cancel()
            raise
        finally:
            weights = {bid: self._enqueued.pop(bid, 0) for bid in ids}
        for bid, (state, _) in zip(ids, collected, strict=True):
            if state.queue_full:
                self._learn_limit(bid, state, weights[bid])
        return (
            {bid: state for bid, (state, _) in zip(ids, collected, strict=True)},
            {bid: items for bid, (_, items) in zip(ids, collected, strict=True)},
        )

    async def _store_states(self, states: dict[str, BatchState]) -> None:
        """Write each batch's last seen status into ``batches.json`` (``lunasol status`` shows it)."""
        async with self._lock:
            batches = read_batches(self.run_dir)
            for b in batches:
                if b["id"] in states:
                    b["status"] = states[b["id"]].status
            _write_batches(self.run_dir, batches)

    async def _submit(self, requests: list[tuple[str, dict[str, Any]]], weight: int | None = None) -> dict[str, Any]:
        """Submit one new batch of (key, kwargs), stored in ``batches.json`` before the provider can accept it.

        ``weight``: its estimated tokens in the provider's queue (kept in the record for a later process).
        """
        keys = [k for k, _ in requests]
        bodies = await wire_bodies(self.model, [kw for _, kw in requests], api_base=self.api_base, sdk=self.sdk)
        lines = [batch_line(k, body) for k, body in zip(keys, bodies, strict=True)]
        del bodies
        intent = uuid.uuid4().hex
        record: dict[str, Any] = {"id": None, "intent": intent, "keys": keys, "status": "submitting"}
        record["tokens"] = sum(_weight(kw) for _, kw in requests) if weight is None else weight
        async with self._lock:
            batches = read_batches(self.run_dir)  # another flush may have added its batch meanwhile
            batches.append(record)
            _write_batches(self.run_dir, batches)  # before the provider can accept anything
            try:
                bid = await self.endpoint.submit(lines, metadata={"lunasol_run": self.run_dir.name, INTENT_KEY: intent})
            except Exception as exc:
                if 400 <= (getattr(exc, "status_code", None) or 0) < 500:  # the provider answered "no": no batch
                    batches.remove(record)
                    _write_batches(self.run_dir, batches)
                raise
            record.update(id=bid, status="submitted")
            _write_batches(self.run_dir, batches)
        self.log(f"batch {bid}: {len(keys)} requests submitted (stored in {BATCHES_NAME})")
        return record

    async def _settle_intents(self, batches: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # A record without an id: an earlier process asked for a batch and died before storing its id.
        unsettled = [b for b in batches if not b.get("id")]
        if not unsettled:
            return batches
        for b in unsettled:
            bid = await self.endpoint.find(INTENT_KEY, str(b.get("intent")))
            if bid is None:
                self.log(f"batch submission {str(b.get('intent'))[:8]} never reached the provider: its keys go again")
            else:
                self.log(f"batch {bid}: found by its submission token after an interrupted submit")
                b.update(id=bid, status="submitted")
        settled = [b for b in batches if b.get("id")]
        _write_batches(self.run_dir, settled)
        return settled

    async def _collect(self, bid: str) -> tuple[BatchState, dict[str, ItemResult]]:
        last: list[tuple[str, int]] = []

        def on_poll(s: BatchState) -> None:
            # One line per change, not per poll: a batch can take hours at one poll every 30 s.
            if [(s.status, s.completed)] != last:
                last[:] = [(s.status, s.completed)]
                self.log(f"batch {bid}: {s.status} ({s.completed}/{s.total} answered)")

        state = await self.endpoint.wait(bid, poll_s=self.poll_s, max_wait_s=self.max_wait_s, on_poll=on_poll)
        return state, (await self.endpoint.results(state) if state.done else {})


def _ok(item: ItemResult | None) -> bool:
    return item is not None and item.ok


def _expired(states: dict[str, BatchState], where: dict[str, dict[str, Any]], key: str) -> bool:
    return states[where[key]["id"]].status in CLOSED_UNANSWERED


def _pending_error(ids: list[str], states: dict[str, BatchState], n: int) -> BatchPending:
    return BatchPending(
        f"provider batch {', '.join(ids)} not finished ({', '.join(states[i].status for i in ids)}); "
        f"{n} requests wait for it",
        reason="external_system",
        tried=[{"action": "poll batch", "outcome": f"{states[i].status}, {states[i].completed} done"} for i in ids],
        unblock="lunasol run BUNDLE --resume --batch (collects the same batch; nothing is submitted twice)",
    )


def _expired_error(ids: list[str], states: dict[str, BatchState], n: int) -> BatchExpired:
    return BatchExpired(
        f"provider batch {', '.join(ids)} expired with {n} requests unanswered "
        f"(the answered ones are kept; resuming submits only these {n})",
        reason="external_system",
        tried=[{"action": "collect batch", "outcome": f"expired, {states[i].completed} answered"} for i in ids],
        unblock=f"lunasol run BUNDLE --resume --batch (answered requests are kept; submits only the {n} missing)",
    )


SAID_ERRORS = 3  # a failed batch's errors quoted in its block (a file's validation can list one per line)


def _said(errors: list[str]) -> str:
    """The provider's first few errors, each folded and cut at 300 characters, and how many more."""
    said = "; ".join(" ".join(e.split())[:300] for e in errors[:SAID_ERRORS]) or "the provider gave no reason"
    return said + (f" (and {len(errors) - SAID_ERRORS} more)" if len(errors) > SAID_ERRORS else "")


def _failed_error(state: BatchState, n: int, limit: int | None) -> BatchFailed:
    said = _said(state.errors)
    if state.queue_full:
        cap = f" --batch-queue-tokens {limit}" if limit else ""  # the limit, when the provider stated one
        return BatchFailed(
            f"provider batch {state.id} was refused: the model's batch queue stayed full ({said}); "
            f"{n} requests are not answered, and none was asked synchronously",
            reason="external_system",
            tried=[{"action": "submit batch again after room was made", "outcome": f"failed: {said}"}],
            unblock=f"lunasol run BUNDLE --resume --batch{cap} (once the model's other batches have finished)",
        )
    return BatchFailed(
        f"provider batch {state.id} failed: {said}; its {n} requests were not asked synchronously "
        "(that would cost the full price)",
        reason="external_system",
        tried=[{"action": "collect batch", "outcome": f"failed: {said}"}],
        unblock="lunasol run BUNDLE --resume --batch (submits them again; or --resume alone asks them synchronously)",
    )


def _refused_error(n: int, exc: BaseException) -> BatchFailed:
    return BatchFailed(
        f"the provider refused to create a batch of {n} requests ({describe(exc)}), with none of this run's "
        "batches in its queue to wait for; none was asked synchronously",
        reason="external_system",
        tried=[{"action": "create batch", "outcome": describe(exc)}],
        unblock="lunasol run BUNDLE --resume --batch (once the model's other batches have finished)",
    )


def _held_error(n: int, limit: int | None) -> BatchPending:
    return BatchPending(
        f"{n} requests are not submitted yet: the model's batch queue (limit {f'{limit:,}' if limit else '?'} tokens) "
        "had no room "
        "before the batches in it reached LUNASOL_BATCH_MAX_WAIT_S",
        reason="external_system",
        tried=[{"action": "wait for room in the batch queue", "outcome": "a batch in it outlived the max wait"}],
        unblock="lunasol run BUNDLE --resume --batch (collects the batches in the queue, then submits these)",
    )


def _weight(kwargs: dict[str, Any]) -> int:
    """A request's estimated tokens in a provider's batch queue: its prompt and tools (see QUEUE_CHARS_PER_TOKEN)."""
    tools = kwargs.get("tools")
    chars = _chars(kwargs) + (len(json.dumps(tools, ensure_ascii=False)) if tools else 0)
    return max(1, math.ceil(chars / QUEUE_CHARS_PER_TOKEN))


def _chars(kwargs: dict[str, Any]) -> int:
    # what a request weighs in a batch file, near enough: its messages' text
    return sum(len(str(m.get("content") or "")) for m in kwargs.get("messages", []))
