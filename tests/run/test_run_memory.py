"""What a run carries from one stage to the next."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from pipeline.bundle import manifest as manifest_mod
from pipeline.core.context import RunContext, RunOptions
from pipeline.run import runner
from tests.conftest import DEMO_BUNDLE


def test_the_manifest_is_not_held_past_the_export(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # At 100,000 cells the remembered manifest is ~170 MB under every later stage; none of them reads it.
    held: list[int] = []
    select = runner._BY_NAME["select"]

    def watched(ctx: RunContext) -> Any:
        held.append(len(manifest_mod._remembered or {}))
        return select.run(ctx)

    export = runner._BY_NAME["export"]
    monkeypatch.setattr(runner, "STAGES", (export, dataclasses.replace(select, run=watched)))
    runner.run(RunOptions(bundle=DEMO_BUNDLE, runs_dir=tmp_path, run_id="r"), log=lambda _m: None)
    assert held == [0]  # the run's block still stands (select ran inside it), but holds no manifest
