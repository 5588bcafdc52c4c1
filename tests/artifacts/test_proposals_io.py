"""Proposal files: the three shapes, round trip, JSON Schema, unreadable files, and the validate verb."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.core.errors import BadInput
from pipeline.proposals import ProposalCard, card_json_schema, dump_cards, parse_entries, read_entries, write_cards

VALID = Path(__file__).resolve().parents[1] / "cards" / "valid"
INVALID = Path(__file__).resolve().parents[1] / "cards" / "invalid"


def _one() -> dict[str, object]:
    data = yaml.safe_load((VALID / "en_failure_section.yaml").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def test_three_shapes() -> None:
    card = _one()
    assert parse_entries(yaml.safe_dump(card)) == [card]
    assert parse_entries(yaml.safe_dump([card, card])) == [card, card]
    assert parse_entries(yaml.safe_dump({"proposals": [card]})) == [card]
    assert parse_entries(yaml.safe_dump({"schema_version": 1, "proposals": []})) == []


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "empty file"),
        ("just a string", "expected a card"),
        ("proposals: {a: 1}", "must be a list"),
        ("proposals: []\nextra: 1", "may hold only"),
        ("schema_version: 99\nproposals: []", "schema_version"),
        ("a: [", "not readable YAML"),
        ("proposal_id: P-01\nproposal_id: P-02", "duplicate key"),
    ],
)
def test_unreadable_is_bad_input(text: str, needle: str) -> None:
    with pytest.raises(BadInput, match=needle):
        parse_entries(text)


def test_round_trip_is_deterministic(tmp_path: Path) -> None:
    cards = [ProposalCard.model_validate(e) for e in read_entries(VALID / "zh_two_strategies.yaml")]
    out = tmp_path / "proposals.yaml"
    write_cards(out, cards)
    again = [ProposalCard.model_validate(e) for e in read_entries(out)]
    assert again == cards
    assert dump_cards(again) == out.read_text(encoding="utf-8")
    assert "权限" in out.read_text(encoding="utf-8") or "环境" in out.read_text(encoding="utf-8")  # unicode kept
    assert list(yaml.safe_load(out.read_text(encoding="utf-8"))["proposals"][0]) == list(ProposalCard.model_fields)


def test_json_schema_is_the_fixed_schema() -> None:
    schema = card_json_schema()
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == set(ProposalCard.model_fields)
    assert set(schema["properties"]) == {
        "proposal_id",
        "parent_harness",
        "source_weakness",
        "evidence",
        "root_cause",
        "strategy_change",
        "expected_effect",
        "rejection_conditions",
        "regression_risks",
    }
    defs = schema["$defs"]
    assert set(defs["ExpectedMetrics"]["properties"]) == {"quality", "completion", "cost", "stability"}
    assert defs["RootCause"]["properties"]["confidence"]["enum"] == ["high", "medium", "low"]


def test_cli_validate_exit_codes(tmp_path: Path) -> None:
    runner = CliRunner()
    ok = runner.invoke(app, ["validate", str(VALID / "en_two_strategies.yaml")])
    assert ok.exit_code == 0, ok.output
    assert "2 of 2 cards valid" in ok.output
    bad = runner.invoke(app, ["validate", str(INVALID / "V-QUANT-INVENTED__zh_sancheng.yaml")])
    assert bad.exit_code == 1
    assert "V-QUANT-INVENTED proposals[0].expected_effect.expected_metrics.cost" in bad.output
    missing = runner.invoke(app, ["validate", str(tmp_path / "nope.yaml")])
    assert missing.exit_code == 2
    assert "Traceback" not in missing.output
    (tmp_path / "broken.yaml").write_text("a: [", encoding="utf-8")
    broken = runner.invoke(app, ["validate", str(tmp_path / "broken.yaml")])
    assert broken.exit_code == 2
    assert len([line for line in broken.output.splitlines() if line.strip()]) == 1


def test_cli_validate_json() -> None:
    result = CliRunner().invoke(app, ["validate", str(INVALID / "V-ONE-LEVER__en_also_adds.yaml"), "--json"])
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["valid"] is False
    assert data["counts"] == {"cards": 1, "valid": 0, "invalid": 1, "findings": 1}
    finding = data["cards"][0]["findings"][0]
    assert finding["rule"] == "V-ONE-LEVER"
    assert finding["path"] == "proposals[0].strategy_change.proposed_strategy"


def test_cli_validate_with_run(tmp_path: Path) -> None:
    from tests.cards.fixture_run import make_run

    run = make_run(tmp_path)
    runner = CliRunner()
    ok = runner.invoke(app, ["validate", str(VALID / "en_failure_section.yaml"), "--run", str(run)])
    assert ok.exit_code == 0, ok.output
    bad = runner.invoke(
        app, ["validate", str(INVALID / "run" / "V-RUN-PARENT__en_other_harness.yaml"), "--run", str(run)]
    )
    assert bad.exit_code == 1
    assert "V-RUN-PARENT proposals[0].parent_harness" in bad.output
    nowhere = runner.invoke(app, ["validate", str(VALID / "en_failure_section.yaml"), "--run", str(tmp_path / "x")])
    assert nowhere.exit_code == 2


def test_validate_help() -> None:
    result = CliRunner().invoke(app, ["validate", "--help"])
    assert result.exit_code == 0
    assert "--run" in result.output
