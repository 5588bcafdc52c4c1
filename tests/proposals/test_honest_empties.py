"""Honest empties on the CLI and in the report: an empty card file is not a clean bill, a failed cell is
not "no pattern found", and a failed cell's reason is one phrase with the full errors one click away.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.core.phrases import one_phrase, parts_phrase
from pipeline.report.build import render_report
from pipeline.state import handoff

PYDANTIC_DUMP = (
    "ValidationError: 2 validation errors for LunaAnswer patterns Field required [type=missing, input_value={}, "
    "input_type=dict] For further information visit https://errors.pydantic.dev/2.13/v/missing "
    "rejected_candidates Field required [type=missing, input_value={}, input_type=dict] "
    "For further information visit https://errors.pydantic.dev/2.13/v/missing"
)
NO_REASON = (
    "ValidationError: 1 validation error for LunaAnswer Value error, patterns is empty but none_reason is "
    "missing: say what in the log shows none of the three patterns [type=value_error, input_value={}, "
    "input_type=dict]"
)


def test_validate_of_an_empty_card_file_says_so_and_exits_1(tmp_path: Path) -> None:
    # (a zero-byte file is unreadable input already: "empty file", exit 2)
    for text in ("proposals: []\n", "[]\n"):
        empty = tmp_path / "proposals.yaml"
        empty.write_text(text, encoding="utf-8")
        out = CliRunner().invoke(app, ["validate", str(empty)])
        assert out.exit_code == 1, (text, out.output)
        assert f"no proposal card in {empty}" in out.output and "nothing was validated" in out.output


def test_a_failure_reason_is_one_phrase() -> None:
    assert one_phrase(PYDANTIC_DUMP) == "patterns Field required; rejected_candidates Field required"
    assert one_phrase(NO_REASON) == "empty list without none_reason"
    assert parts_phrase([[NO_REASON]] * 29, 33) == "29 of 33 parts: empty list without none_reason"
    assert parts_phrase([[NO_REASON]] * 3 + [[PYDANTIC_DUMP]], 5) == (
        "4 of 5 parts: empty list without none_reason (+1 other cause)"
    )
    assert len(one_phrase("x" * 10_000)) <= 120
    torn = (  # SmolLM2 live, a part cut at max_tokens: the input value holds brackets of its own
        "ValidationError: 1 validation error for LunaAnswer Invalid JSON: EOF while parsing a string at line 1 "
        'column 629 [type=json_invalid, input_value=\'{ "patterns": [ ] ,"reje...":"2018-04-30T15:17:19.\', '
        "input_type=str] For further information visit https://errors.pydantic.dev/2.13/v/json_invalid"
    )
    assert one_phrase(torn) == "Invalid JSON: EOF while parsing a string at line 1 column 629"


def test_the_next_step_never_selects_a_card_that_does_not_exist(demo_copy: Path) -> None:
    h = handoff.load(demo_copy).model_copy(
        update={"userRootCauseConfirmation": "confirmed", "proposalGeneration": "done", "proposalSelection": "pending"}
    )
    validation = {"weaknesses": [{"weakness_id": "W-01", "call": {"ok": True}}], "cards": []}
    (demo_copy / "validation.json").write_text(json.dumps(validation), encoding="utf-8")
    assert "--proposal" not in handoff.next_command(demo_copy, h)  # an honest zero: --none or --redo only
    validation["cards"] = [{"proposal_id": "P-03", "status": "accepted"}]
    (demo_copy / "validation.json").write_text(json.dumps(validation), encoding="utf-8")
    assert "(--proposal P-03 | --none | --redo)" in handoff.next_command(demo_copy, h)
    validation["weaknesses"].append({"weakness_id": "W-02", "call": {"ok": False}})
    (demo_copy / "validation.json").write_text(json.dumps(validation), encoding="utf-8")
    assert handoff.next_command(demo_copy, h).startswith(f"lunasol propose {demo_copy}")


def test_the_report_shows_failed_cells_as_failed_with_the_full_errors_a_click_away(demo_copy: Path) -> None:
    con = duckdb.connect(str(demo_copy / "ir.duckdb"))
    try:
        reason = "29 of 33 parts: empty list without none_reason"
        con.execute("UPDATE luna_cells SET status = 'failed', reason = ?", [reason])
    finally:
        con.close()
    (demo_copy / "patterns.jsonl").write_text("", encoding="utf-8")
    row = {"role": "luna", "cell_id": "C004#2/33", "outcome": "invalid", "errors": [PYDANTIC_DUMP], "keys": []}
    with (demo_copy / "calls.jsonl").open("a", encoding="utf-8") as f:
        f.write(json.dumps({"schema_version": 1, **row}) + "\n")
    html, _ = render_report(demo_copy)
    assert "Luna found no pattern in any cell" not in html
    assert "Luna failed</span> on 24 of 24 cell(s)" in html
    assert "No pattern came from any cell because Luna failed, not because it found none." in html
    assert html.count("29 of 33 parts: empty list without none_reason") >= 24  # per cell, in both tables
    start = html.index('id="luna-failures-table"')
    table = html[start : html.index("</table>", start)]
    assert "<details><summary>1 error(s)</summary>" in table and "C004#2/33 (invalid): ValidationError" in table
