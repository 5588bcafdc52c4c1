"""``lunasol handoff``: the brief for the implementing agent, on the demo after gate 2 (P-02 selected)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pipeline.agent import handoff_brief
from pipeline.agent.bounds import LOG_FENCE
from pipeline.agent.brief import SINGLE_LEVER
from pipeline.cli.app import app
from pipeline.models.prompts import fenced
from tests.conftest import DEMO_BUNDLE, copy_demo
from tests.followup.test_followup_demo import _through_gate2

runner = CliRunner()


@pytest.fixture(scope="module")
def gate2(demo_gate1: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the demo taken through gate 1, the proposer (replayed) and gate 2 (P-02)."""
    run_dir = copy_demo(demo_gate1, tmp_path_factory.mktemp("handoff"))
    _through_gate2(run_dir, "P-02")
    return run_dir


def _card(run_dir: Path, pid: str) -> dict[str, object]:
    cards = yaml.safe_load((run_dir / "proposals.yaml").read_text(encoding="utf-8"))["proposals"]
    card: dict[str, object] = next(c for c in cards if c["proposal_id"] == pid)
    return card


def test_the_brief_for_the_selected_card(gate2: Path) -> None:
    before = set(gate2.iterdir())
    res = runner.invoke(app, ["handoff", str(gate2)])
    assert res.exit_code == 0, res.output
    path = gate2 / "handoff-P-02.md"
    assert res.output.strip() == f"wrote {path} (brief for P-02)"
    assert set(gate2.iterdir()) - before == {path}  # no temporary file left beside it
    text = path.read_text(encoding="utf-8")
    card = _card(gate2, "P-02")
    assert text.startswith("# Handoff: implement P-02 of run ")
    assert (
        "Gate 2 selected P-02. A selection is not an authorisation to change anything outside the card's lever" in text
    )
    assert SINGLE_LEVER in text
    strategy = card["strategy_change"]
    assert isinstance(strategy, dict) and strategy["proposed_strategy"] in text
    conditions = card["rejection_conditions"]
    assert isinstance(conditions, list) and len(conditions) == 7
    judged = text.split("## What you will be judged on", 1)[1]
    for i, cond in enumerate(conditions, start=1):
        assert f"\n{i}. {cond}\n" in judged
    assert f"lunasol followup {gate2} --proposal P-02 --child runs/<next generation run>" in text
    assert f"lunasol mcp {gate2}" in text and "docs/handoff.md" in text
    # a few resolved excerpts, each framed as untrusted log content and equal to the bundle's own line
    excerpts = fenced(text, LOG_FENCE)
    assert len(excerpts) == 3 and text.count(">>>") == 3
    first = excerpts[0]
    cited = next(line for line in first.splitlines() if line.startswith(">"))
    number, raw = cited[1:].lstrip().split("  ", 1)
    ref_path = first.split("# ", 1)[1].split("#L", 1)[0]
    assert (DEMO_BUNDLE / ref_path).read_text(encoding="utf-8").split("\n")[int(number) - 1] == raw


def test_another_card_is_briefed_as_not_selected(gate2: Path, tmp_path: Path) -> None:
    out = tmp_path / "p01.md"
    res = runner.invoke(app, ["handoff", str(gate2), "--proposal", "P-01", "-o", str(out)])
    assert res.exit_code == 0, res.output
    text = out.read_text(encoding="utf-8")
    assert "P-01 is NOT the card selected at gate 2 (gate 2: selected)" in text
    assert "not an authorisation to change anything outside the card's lever" in text
    md, pid = handoff_brief(gate2, "P-01")
    assert pid == "P-01" and md == text


def test_unknown_card_and_bad_output_are_one_line(gate2: Path, tmp_path: Path) -> None:
    res = runner.invoke(app, ["handoff", str(gate2), "--proposal", "P-09"])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "P-01, P-02" in res.output
    res = runner.invoke(app, ["handoff", str(gate2), "-o", str(tmp_path / "nowhere" / "b.md")])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "existing directory" in res.output


def test_without_a_selection_one_line_and_exit_2(demo_copy: Path) -> None:
    res = runner.invoke(app, ["handoff", str(demo_copy)])
    assert res.exit_code == 2, res.output
    assert res.output.count("\n") == 1 and "no card selected at gate 2" in res.output
    assert "--proposal" in res.output
    assert not list(demo_copy.glob("handoff-*"))


def test_without_a_child_run_the_followup_tool_says_how_to_make_one(gate2: Path) -> None:
    from pipeline.agent import Runs, run_summary, tools

    fu = tools.get_followup(Runs([gate2]))
    assert not fu.found and fu.verdict is None
    assert fu.how_to_make_one == f"lunasol followup {gate2} --proposal P-02 --child runs/<next generation run>"
    summary = run_summary(Runs([gate2]))
    assert "- eligible cells by outcome: completed 21, workflow_failed 3" in summary
    assert f"- none yet ({fu.how_to_make_one})" in summary
