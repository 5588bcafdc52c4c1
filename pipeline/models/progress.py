"""Run many awaitables with a concurrency bound, with progress people can trust.

On a terminal: a rich bar with rate, ETA, in-flight / retried / failed counts and spend against
the budget. Off a terminal (CI, nohup): the same figures as a plain line every few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, TypeVar

R = TypeVar("R")


class Usage(Protocol):
    """What the bar shows of the client's running spend (the client's ``Usage`` has it)."""

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens so far."""
        ...

    @property
    def cost_usd(self) -> float:
        """Spend so far, in US dollars."""
        ...

    @property
    def cost_known(self) -> bool:
        """False when a model has no price in litellm's map."""
        ...


class Outcome(Protocol):
    """What progress reads of a finished call, when the awaitable returns one (the client's CallOutcome)."""

    ok: bool
    transport_retries: int


Budget = tuple[float | None, int | None]  # (usd, tokens)
Requests = Callable[[], tuple[int, int, int]]  # (model calls finished, requests being answered, calls queued)

PLAIN_EVERY_S = 15.0  # seconds between progress lines when stderr is not a terminal (CI, nohup)


def plain_every() -> float:
    """LUNASOL_PROGRESS_EVERY seconds (0 switches the plain lines off), else PLAIN_EVERY_S."""
    raw = os.environ.get("LUNASOL_PROGRESS_EVERY", "")
    try:
        return float(raw) if raw else PLAIN_EVERY_S
    except ValueError:
        return PLAIN_EVERY_S


def _duration(seconds: float) -> str:
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Tally:
    """Counters of one batch of calls, and the line that describes them."""

    def __init__(
        self,
        total: int,
        label: str,
        usage: Callable[[], Usage] | None,
        budget: Budget | None,
        requests: Requests | None = None,
    ) -> None:
        self.total, self.label, self.usage, self.budget = total, label, usage, budget
        self.requests = requests  # a cell split in parts is many requests: an 18-minute cell is not "0/1, ETA ?"
        self.done = self.in_flight = self.retried = self.failed = 0
        self.started = time.monotonic()

    def finished(self, result: object) -> None:
        """Count one finished call (failures and transport retries when the result says so)."""
        self.done += 1
        self.in_flight -= 1
        if getattr(result, "ok", True) is False:
            self.failed += 1
        retries = getattr(result, "transport_retries", 0)
        self.retried += retries if isinstance(retries, int) else 0

    def rate_eta(self) -> tuple[float, float | None]:
        """Calls per second so far and the seconds left at that rate (None before the first call ends)."""
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = self.done / elapsed
        return rate, (self.total - self.done) / rate if self.done else None

    def spend(self) -> str:
        """Tokens and cost so far, against the budget when one is set."""
        if self.usage is None:
            return ""
        u = self.usage()
        usd, tokens = self.budget or (None, None)
        cost = f"${u.cost_usd:.4f}" if u.cost_known else "cost unknown"
        if usd is not None:
            cost += f" of ${usd:.2f} budget"
        tok = f"{u.total_tokens:,} tok" + (f" of {tokens:,}" if tokens is not None else "")
        return f"{tok} · {cost}"

    def counts(self) -> str:
        """In flight, retried and failed calls (and the model requests made so far, when known)."""
        asked = ""
        if self.requests is not None:
            done, sending, queued = self.requests()
            asked = f" · requests {done} done, {sending} sent, {queued} queued"
        return f"in flight {self.in_flight}{asked} · retried {self.retried} · failed {self.failed}"

    def line(self) -> str:
        """One plain progress line (for logs: no bar, no control characters)."""
        rate, eta = self.rate_eta()
        pct = 100 * self.done // self.total if self.total else 100
        left = "ETA " + (_duration(eta) if eta is not None else "?")
        parts = [f"{self.label}: {self.done}/{self.total} ({pct}%)", f"{rate:.2f}/s", left, self.counts()]
        if self.usage is not None:
            parts.append(self.spend())
        parts.append(f"elapsed {_duration(time.monotonic() - self.started)}")
        return " · ".join(parts)


async def gather_bounded(
    coros: Iterable[Awaitable[R]],
    limit: int,
    *,
    label: str = "model calls",
    usage: Callable[[], Usage] | None = None,
    progress: bool | None = None,
    budget: Budget | None = None,
    plain_every_s: float | None = None,
    requests: Requests | None = None,
    total: int | None = None,
    keep: bool = True,
) -> list[R]:
    """Await every item with at most ``limit`` running; results in input order.

    ``limit`` workers take the items in order, one at a time: an item is made (when ``coros`` is a
    generator and ``total`` says how many it yields) and awaited only when a worker is free, so a
    batch of 100,000 cells never holds 100,000 coroutines and tasks at once. ``keep`` False: the
    results are dropped as they come (the caller wrote them already) and ``[]`` is returned.

    The first exception cancels the rest and is re-raised (a ``BudgetExceeded`` stops the stage).
    ``progress`` defaults to "stderr is a TTY": a bar with rate, ETA, in-flight / retried / failed
    counts and spend against the budget. Off a terminal (CI, nohup) the same figures are printed
    as one plain line to stderr every ``plain_every_s`` seconds (default ``PLAIN_EVERY_S``; a batch
    shorter than that prints nothing), so a long stage never looks frozen in a log.
    """
    items: Iterable[Awaitable[R]] = coros
    if total is None:
        items = list(coros)
        total = len(items)
    show = sys.stderr.isatty() if progress is None else progress
    tally = Tally(total, label, usage, budget, requests)
    bar: Any = None
    task_id: Any = None
    ticker: asyncio.Task[None] | None = None
    if show and total:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[counts]} · {task.fields[spend]}"),
            console=Console(stderr=True),
            transient=False,
        )
        bar.start()
        task_id = bar.add_task(label, total=total, rate="", counts=tally.counts(), spend=tally.spend())
    every = plain_every() if plain_every_s is None else plain_every_s
    if not show and total and progress is None and every > 0:

        async def tick() -> None:
            while True:
                await asyncio.sleep(every)
                print(tally.line(), file=sys.stderr, flush=True)

        ticker = asyncio.ensure_future(tick())

    results: list[Any] = [None] * total if keep else []
    source = enumerate(items)  # shared by the workers: each item is handed out once, in order

    async def worker() -> None:
        for i, aw in source:
            tally.in_flight += 1
            try:
                result = await aw
            except BaseException:
                tally.in_flight -= 1
                raise
            tally.finished(result)
            if bar is not None:
                rate, _ = tally.rate_eta()
                bar.update(task_id, advance=1, rate=f"{rate:.2f}/s", counts=tally.counts(), spend=tally.spend())
            if keep:
                results[i] = result
            del result, aw  # a finished item's frame and result are not held while the next one runs

    workers = [asyncio.ensure_future(worker()) for _ in range(min(max(1, limit), total))]
    try:
        await asyncio.gather(*workers)
        return results
    except BaseException:
        for t in workers:
            t.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        if isinstance(items, list):  # close coroutines that never started, so Python does not warn about them
            for _, aw in source:
                if inspect.iscoroutine(aw) and inspect.getcoroutinestate(aw) == inspect.CORO_CREATED:
                    aw.close()
        elif inspect.isgenerator(items):
            items.close()  # the items not made yet are never made
        raise
    finally:
        if bar is not None:
            bar.stop()
        if ticker is not None:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
            if time.monotonic() - tally.started >= every:
                print(tally.line(), file=sys.stderr, flush=True)  # the last figures of a long batch
