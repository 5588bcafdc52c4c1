"""MAST trace splitting on hand-made snippets of each log style (no shared data needed)."""

from __future__ import annotations

import json
from itertools import pairwise

import pytest

from pipeline.adapters.mast import choose_style, split_lines, split_trace

SNIPPETS = {
    "loguru": (
        "2025-01-17 11:39:57.347 | INFO     | metagpt.roles.role:_act:391 - Alice(SimpleCoder): to do X\n"
        "```python\nprint(1)\n```\n"
        "2025-01-17 11:40:06.753 | INFO     | __main__:_act:85 - Bob(SimpleTester): to do Y\n"
        "def test(): pass\n",
        ["Alice(SimpleCoder)", "Bob(SimpleTester)"],
    ),
    "hyperagent": (
        "HyperAgent_x - INFO - Planner's Response: Thought: look\n\nIntern Name: Navigator\n"
        "HyperAgent_x - INFO - Inner-Navigator-Assistant's Response: found it\n"
        "HyperAgent_x - INFO - Navigator->Planner: here it is\n",
        ["Planner", "Inner-Navigator-Assistant", "Navigator"],
    ),
    "appworld": (
        "Response from Supervisor Agent\n    send_message(app_name='spotify')\n"
        "Code Execution Output\n\n    ok\n"
        "    Response from spotify Agent\n        print(1)\n",
        ["Supervisor", "environment", "spotify"],
    ),
    "chatdev": (
        "[2023-25-08 13:20:07 INFO] flask app.py did not start for online log\n"
        "[2023-25-08 13:20:12 INFO] Chief Product Officer: **Chief Product Officer<->Chief Executive Officer on : "
        "DemandAnalysis, turn 0**\n\n[ChatDev is a software company]\n"
        "[2023-25-08 13:20:15 INFO] Chief Executive Officer: <INFO> Application\n",
        ["harness", "Chief Product Officer", "Chief Executive Officer"],
    ),
    "autogen": (
        "user_proxy (to assistant):\n\nSolve 1+1\n\n----\nassistant (to user_proxy):\n\n2\n",
        ["user_proxy", "assistant"],
    ),
    "magentic": (
        "---------- user ----------\nFind the paper\n---------- MagenticOneOrchestrator ----------\nPlan: search\n"
        "---------- WebSurfer ----------\nI typed 'paper'\n",
        ["user", "MagenticOneOrchestrator", "WebSurfer"],
    ),
}


@pytest.mark.parametrize("style", sorted(SNIPPETS))
def test_each_style_splits_into_speaker_turns(style: str) -> None:
    text, actors = SNIPPETS[style]
    lines = text.split("\n")
    assert choose_style(lines) == style
    turns = split_lines(lines)
    assert [t.actor for t in turns] == actors
    covered = {n for t in turns for n in range(t.first, t.last + 1)}
    assert {n for n, line in enumerate(lines, 1) if line.strip()} <= covered  # no line lost
    assert all(a.last < b.first for a, b in pairwise(turns))  # no line twice


def test_no_header_is_one_turn_and_preamble_is_kept() -> None:
    turns = split_lines(["just some", "free text", ""])
    assert len(turns) == 1 and (turns[0].first, turns[0].last) == (1, 2) and turns[0].detail == "preamble"
    text, _ = SNIPPETS["autogen"]
    turns = split_lines(["INFO setup done", *text.split("\n")])
    assert turns[0].detail == "preamble" and turns[1].actor == "user_proxy"


def test_json_trace_drops_notes_and_keeps_messages() -> None:
    trace = json.dumps(
        {
            "problem_statement": ["Add 2 and 2"],
            "trajectory": [{"content": ["4"], "role": "assistant", "name": "solver"}],
            "note": {"text": ["The agent forgot to verify the sum at all."]},
            "other_data": {"answer": "4"},
        },
        indent=4,
    )
    turns, labels, task = split_trace(trace)
    assert task == "Add 2 and 2"
    assert [t.actor for _, t in turns] == ["user", "solver"]
    assert labels["note"]["text"] == ["The agent forgot to verify the sum at all."]
    assert all("forgot" not in t.text for _, t in turns)


def test_evaluation_trailer_becomes_a_label() -> None:
    trace = 'Response from Supervisor Agent\n    done\n\nEvaluation\n{\n    "success": false\n}'
    turns, labels, _ = split_trace(trace)
    assert labels["trace_evaluation"] == {"success": False}
    assert all("success" not in t.text for _, t in turns)
