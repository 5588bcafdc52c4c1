"""Run many awaitables with a concurrency bound; a rich progress bar with spend when stderr is a TTY."""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, TypeVar

R = TypeVar("R")


class Usage(Protocol):
    """What the bar shows of the client's running spend (the client's ``Usage`` has it)."""

    @property
    def total_tokens(self) -> int: ...
    @property
    def cost_usd(self) -> float: ...
    @property
    def cost_known(self) -> bool: ...


def _spend(usage: Callable[[], Usage] | None) -> str:
    if usage is None:
        return ""
    u = usage()
    cost = f"${u.cost_usd:.4f}" if u.cost_known else "cost unknown"
    return f" · {u.total_tokens:,} tok · {cost}"


async def gather_bounded(
    coros: Iterable[Awaitable[R]],
    limit: int,
    *,
    label: str = "model calls",
    usage: Callable[[], Usage] | None = None,
    progress: bool | None = None,
) -> list[R]:
    """Await every item with at most ``limit`` running; results in input order.

    The first exception cancels the rest and is re-raised (a ``BudgetExceeded`` stops the stage).
    ``progress`` defaults to "stderr is a TTY".
    """
    items = list(coros)
    sem = asyncio.Semaphore(max(1, limit))
    show = sys.stderr.isatty() if progress is None else progress
    bar: Any = None
    task_id: Any = None
    if show and items:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        bar.start()
        task_id = bar.add_task(label + _spend(usage), total=len(items))

    async def one(aw: Awaitable[R]) -> R:
        async with sem:
            result = await aw
        if bar is not None:
            bar.update(task_id, advance=1, description=label + _spend(usage))
        return result

    tasks = [asyncio.ensure_future(one(aw)) for aw in items]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for aw in items:  # close coroutines that never started, so Python does not warn about them
            if inspect.iscoroutine(aw) and inspect.getcoroutinestate(aw) == inspect.CORO_CREATED:
                aw.close()
        raise
    finally:
        if bar is not None:
            bar.stop()
