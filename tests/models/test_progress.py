"""Progress people trust: rate, ETA, in-flight / retried / failed counts, spend against the budget,
and plain periodic lines when stderr is not a terminal."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

import pytest

from pipeline.models.progress import Tally, gather_bounded


@dataclass
class Spent:
    total_tokens: int = 1234
    cost_usd: float = 0.5
    cost_known: bool = True


@dataclass
class Result:
    ok: bool
    transport_retries: int = 0


def test_tally_line_has_every_figure() -> None:
    t = Tally(10, "luna", lambda: Spent(), (2.0, None))
    for r in (Result(True), Result(False), Result(True, transport_retries=2)):
        t.in_flight += 1
        t.finished(r)
    t.in_flight = 4
    line = t.line()
    assert line.startswith("luna: 3/10 (30%)")
    assert re.search(r"\d+\.\d\d/s", line) and "ETA " in line and "ETA ?" not in line
    assert "in flight 4 · retried 2 · failed 1" in line
    assert "1,234 tok" in line and "$0.5000 of $2.00 budget" in line
    assert "\x1b" not in line  # a plain line for logs


def test_unknown_cost_says_unknown() -> None:
    assert "cost unknown" in Tally(1, "x", lambda: Spent(cost_known=False), None).spend()


async def test_plain_lines_off_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    async def slow(i: int) -> Result:
        await asyncio.sleep(0.12)
        return Result(ok=i != 3)

    out = await gather_bounded([slow(i) for i in range(6)], 2, label="luna", plain_every_s=0.1)
    assert [r.ok for r in out] == [True, True, True, False, True, True]
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln]
    assert len(lines) >= 2  # periodic lines while it runs, then the final figures
    assert lines[-1].startswith("luna: 6/6 (100%)") and "failed 1" in lines[-1]
    assert any("in flight 2" in ln for ln in lines[:-1])


async def test_a_short_batch_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    async def quick() -> int:
        return 1

    assert await gather_bounded([quick() for _ in range(3)], 2, plain_every_s=30) == [1, 1, 1]
    assert capsys.readouterr().err == ""
