"""Honest empties, model side: Sol's "no weakness" needs a stated reason; an empty answer without one
(or with a placeholder) is re-asked and then fails the call, never "0 weakness(es) kept", exit 0."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.core.canonical import read_json
from pipeline.sol.shortlist import SHORTLIST_FILE
from pipeline.testing.openai_server import FakeOpenAI, Reply, completion_body
from tests.sol.sol_helpers import make_bundle

LUNA = {"patterns": [], "rejected_candidates": [], "none_reason": "no step repeats on unchanged state"}


def _serve(fake: FakeOpenAI, sol: dict[str, Any]) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []

    def handle(request: dict[str, Any]) -> Reply:
        is_sol = request["tools"][0]["function"]["name"] == "SolAnswer"
        if is_sol:
            seen.append(request)
        return Reply(body=completion_body(request, tool_arguments=json.dumps(sol if is_sol else LUNA)))

    fake.handler = handle
    return seen


def _run(tmp_path: Path, fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.delenv("LUNASOL_CONTEXT_TOKENS", raising=False)
    args = ["run", str(make_bundle(tmp_path)), "--runs-dir", str(tmp_path / "runs"), "--run-id", "r1"]
    return CliRunner().invoke(
        app, [*args, "--model", "openai/test-model", "--api-base", fake.base_url, "--mode", "tools"]
    )


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ({"weaknesses": []}, "none_reason is missing"),
        ({"weaknesses": [], "none_reason": "none"}, "says nothing"),
    ],
)
def test_an_empty_sol_answer_without_a_reason_is_reasked_then_fails(
    tmp_path: Path, fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch, answer: dict[str, Any], said: str
) -> None:
    seen = _serve(fake_llm, answer)
    result = _run(tmp_path, fake_llm, monkeypatch)
    assert result.exit_code != 0, result.output
    assert "0 weakness(es) kept" not in result.output
    assert len(seen) == 3  # the first answer and two re-asks, each told what is missing
    for request in seen[1:]:
        assert said in json.dumps(request["messages"])
    assert not (tmp_path / "runs" / "r1" / SHORTLIST_FILE).exists()  # no shortlist that reads as "nothing found"
    receipt = read_json(tmp_path / "runs" / "r1" / "block-receipt.json")
    assert receipt["stage"] == "sol" and "Sol gave no answer that parses" in receipt["blocking_constraint"]
    assert said in receipt["blocking_constraint"]  # the reason the answer was refused, said where it blocked


def test_an_empty_sol_answer_with_a_reason_is_kept_and_said(
    tmp_path: Path, fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    reason = "every failed cell stopped on an infrastructure error before any harness decision"
    seen = _serve(fake_llm, {"weaknesses": [], "none_reason": reason})
    result = _run(tmp_path, fake_llm, monkeypatch)
    assert result.exit_code == 0, result.output
    assert len(seen) == 1
    assert f"0 weakness(es) kept (none: Sol says {reason})" in result.output
    shortlist = read_json(tmp_path / "runs" / "r1" / SHORTLIST_FILE)
    assert shortlist["weaknesses"] == [] and shortlist["call"]["none_reason"] == reason
