"""``synth.clone_diverse``: the demo over many distinct tasks, with per-task outcome mixes and varied cell lengths."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from pipeline.bundle.manifest import verify
from pipeline.bundle.request import load_request
from pipeline.bundle.synth import clone_diverse, tree_snapshot
from tests.conftest import DEMO_BUNDLE


def _outcomes(bundle: Path) -> dict[str, str]:
    lines = (bundle / "sidecar" / "outcomes.jsonl").read_text(encoding="utf-8").splitlines()
    return {r["cell_id"]: r["label"] for r in map(json.loads, lines)}


def test_tasks_families_outcome_mixes_and_lengths(tmp_path: Path) -> None:
    bundle = clone_diverse(DEMO_BUNDLE, tmp_path / "b", 120, 40)
    req = load_request(bundle)
    eligible = [c for c in req.cells if c.eligibility == "valid_behavior"]
    assert len(eligible) == 120 and len({t.task_id for t in req.tasks}) == 40
    assert Counter(c.task_id for c in eligible) == dict.fromkeys((t.task_id for t in req.tasks), 3)
    families = {t.task_id.rsplit("-", 1)[0] for t in req.tasks}
    assert 1 < len(families) < 40  # tasks share name families (about sqrt(tasks))
    labels = _outcomes(bundle)
    per_task: dict[str, set[str]] = {}
    for c in eligible:
        per_task.setdefault(c.task_id, set()).add(labels[c.cell_id])
    mixes = Counter(frozenset(v) for v in per_task.values())
    assert len(mixes) >= 2  # some tasks only pass, others fail or mix: not one batch-wide rate
    sizes = {sum(p.stat().st_size for p in (bundle / c.path / "sessions").glob("*.jsonl")) for c in eligible}
    assert len(sizes) > 24  # more lengths than the demo's 24 cells have
    for c in eligible[:5]:  # cell.json names the cell, its task and run
        meta = json.loads((bundle / c.path / "cell.json").read_text(encoding="utf-8"))
        assert (meta["cell_id"], meta["task_id"], meta["run_id"]) == (c.cell_id, c.task_id, c.run_id)
    verify(bundle)  # frozen: every file matches the manifest


def test_deterministic_and_refuses_more_tasks_than_cells(tmp_path: Path) -> None:
    a = tree_snapshot(clone_diverse(DEMO_BUNDLE, tmp_path / "a", 30, 30))
    b = tree_snapshot(clone_diverse(DEMO_BUNDLE, tmp_path / "b", 30, 30))
    assert a == b
    with pytest.raises(ValueError, match="tasks <= cells"):
        clone_diverse(DEMO_BUNDLE, tmp_path / "c", 10, 11)
