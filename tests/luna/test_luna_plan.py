"""Luna's dry-run plan streams: cells are loaded LOAD_CELLS at a time, and the calls are the same."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import pipeline.luna.stage  # noqa: F401 - loads the module looked up below
from pipeline.core.context import RunContext, RunOptions
from pipeline.core.settings import ModelSettings
from pipeline.luna import feed
from tests.conftest import DEMO_BUNDLE

luna_stage = sys.modules["pipeline.luna.stage"]  # the package re-exports a function named ``stage``


def _calls(run_dir: Path) -> list[tuple[str | None, str]]:
    opts = RunOptions(bundle=DEMO_BUNDLE, models=ModelSettings(model="openai/x"))
    ctx = RunContext(options=opts, run_dir=run_dir, log=lambda _m: None)
    return [(c.cell_id, repr(sorted(c.context.items()))) for c in luna_stage.plan(ctx)]


def test_the_dry_run_plan_loads_cells_a_chunk_at_a_time_and_plans_the_same_calls(
    demo_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = _calls(demo_copy)  # 24 eligible cells: one chunk at the default size
    chunks: list[int] = []
    real = feed.prepare

    def recording(con: Any, budget: int | None = None, only: list[str] | None = None, **kw: Any) -> Any:
        chunks.append(len(only or []))
        return real(con, budget, only=only, **kw)

    monkeypatch.setattr(feed, "LOAD_CELLS", 5)  # the dry run and --batch load cells through feed
    monkeypatch.setattr(feed, "prepare", recording)
    plan = luna_stage.plan(RunContext(RunOptions(bundle=DEMO_BUNDLE), demo_copy, log=lambda _m: None))
    first = next(plan)
    assert chunks == [5] and first.role == "luna"  # the first call comes before the rest of the batch is loaded
    plan.close()
    chunks.clear()
    assert _calls(demo_copy) == whole and chunks == [5, 5, 5, 5, 4]
