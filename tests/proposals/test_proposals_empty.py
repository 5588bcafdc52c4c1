"""Honest empties, proposer side: zero cards need a note with content; a placeholder note is re-asked and then
the weakness's call fails (its cards are missing, not zero)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.core.canonical import read_json
from pipeline.core.settings import ModelSettings
from pipeline.proposals.proposer import VALIDATION_FILE, propose
from pipeline.testing.openai_server import FakeOpenAI, Reply, answer
from tests.cards.fixture_run import make_run
from tests.proposals.test_proposals_proposer import card, request_id


def test_a_placeholder_note_is_reasked_then_the_call_fails(
    runs_dir: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    run = make_run(runs_dir)
    seen: list[dict[str, Any]] = []

    def handle(request: dict[str, Any]) -> Reply:
        if request_id(request) == "proposer/W-04":
            seen.append(request)
            return answer({"proposals": [], "note": "n/a"})(request)  # a placeholder, every time
        return answer({"proposals": [card("en_failure_section.yaml")]})(request)

    fake_llm.handler = handle
    result = propose(run, model_settings(), log=lambda _m: None)
    assert len(seen) == 3  # the first answer and two re-asks
    assert all("says nothing" in json.dumps(r["messages"]) for r in seen[1:])
    val = read_json(run / VALIDATION_FILE)
    w04 = next(w for w in val["weaknesses"] if w["weakness_id"] == "W-04")
    assert w04["call"]["ok"] is False and w04["zero_cards"] is False  # missing, not an honest zero
    assert "W-04" in str(result.failed)
