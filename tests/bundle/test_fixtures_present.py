"""Guard: the committed demo fixtures exist, so the demo tests' ``skipif`` markers cannot hide a loss.

Several demo tests skip when their fixtures are absent (a leftover from when the fixtures were still
being recorded). Now that the fixtures are committed, a deleted or renamed fixture must fail the suite
instead of turning those tests into silent skips. These conditions mirror the skip conditions.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import DEMO_BUNDLE, DEMO_RECORDINGS

ROOT = Path(__file__).resolve().parents[2]
ANSWERS = ROOT / "fixtures" / "answers" / "h0-demo"


def test_demo_bundle_is_committed() -> None:
    assert (DEMO_BUNDLE / "manifest.json").is_file()
    assert (DEMO_BUNDLE / "analysis-request.json").is_file()


def test_demo_recordings_hold_luna_sol_and_proposer_exchanges() -> None:
    roles = {json.loads(p.read_text(encoding="utf-8")).get("role") for p in DEMO_RECORDINGS.glob("*/*.json")}
    assert {"luna", "sol", "proposer"} <= roles


def test_hand_written_answers_are_committed() -> None:
    assert (ANSWERS / "sol.json").is_file()
    assert any((ANSWERS / "luna").glob("C*.json"))
