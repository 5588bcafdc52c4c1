"""``lunasol ask RUN --weakness W-01`` on the demo, replayed from the fixture store ``h0-demo-ask``.

The recorded answers are hand-written fixtures (``fixtures/answers/h0-demo/ask/W-01``). Expected
counts and per-cell answers are read here from those files, independently of the recordings and of
the ask's tables; the card's support and counter-evidence cells are read from the shortlist; every
cited event is resolved to the frozen raw bytes of the bundle.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
import pytest
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.ir.refs import ref_of, resolve_ref
from tests.conftest import ROOT

ASK_STORE = ROOT / "fixtures" / "recordings" / "h0-demo-ask"
ANSWERS = ROOT / "fixtures" / "answers" / "h0-demo" / "ask" / "W-01"


def _hand_written() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted(ANSWERS.glob("C*.json"))}


@pytest.fixture()
def asked(demo_copy: Path) -> tuple[Path, dict[str, Any], str]:
    """The demo copy asked W-01 by replay: (run dir, the --json summary, the text output)."""
    if not any(ASK_STORE.glob("*/*.json")):
        pytest.skip("ask recordings absent (run: python fixtures/record_demo.py --ask W-01)")
    args = ["ask", str(demo_copy), "--weakness", "W-01", "--replay", str(ASK_STORE)]
    text = CliRunner().invoke(app, args)
    assert text.exit_code == 0, text.output
    as_json = CliRunner().invoke(app, [*args, "--json"])
    assert as_json.exit_code == 0, as_json.output
    return demo_copy, json.loads(as_json.stdout), text.stdout


def test_weakness_ask_counts_match_the_hand_written_answers(asked: tuple[Path, dict[str, Any], str]) -> None:
    """Counts over the 24 cells and each cell's answer and events are the hand-written ones."""
    _run_dir, summary, text = asked
    hand = _hand_written()
    expected = Counter(a["answer"] for a in hand.values())
    assert summary["ask"]["weakness_id"] == "W-01"
    assert summary["overall"]["cells"] == len(hand) == 24
    assert summary["overall"]["failed"] == 0
    assert summary["overall"]["counts"] == {k: expected.get(k, 0) for k in ("supports", "contradicts", "neither")}
    got = {a["cell_id"]: a for a in summary["answers"]}
    assert set(got) == set(hand)
    for cell, a in hand.items():
        assert (got[cell]["answer"], got[cell]["evidence"]) == (a["answer"], sorted(a["evidence"])), cell
    # The text output shows the counts and every non-"neither" cell with its cited events.
    line = f"supports {expected['supports']} "
    assert any(x.startswith("  all: 24/24 answered;") and line in x for x in text.splitlines()), text
    for cell, a in hand.items():
        if a["answer"] != "neither":
            assert f"  {cell} [" in text and ", ".join(sorted(a["evidence"])) in text, cell


def test_hand_written_answers_follow_the_card(asked: tuple[Path, dict[str, Any], str]) -> None:
    """supports exactly for the card's support cells, contradicts for its counter-evidence cells."""
    run_dir, summary, _text = asked
    shortlist = json.loads((run_dir / "weakness-shortlist.json").read_text(encoding="utf-8"))
    card = next(w for w in shortlist["weaknesses"] if w["weakness_id"] == "W-01")
    by_answer: dict[str, set[str]] = {}
    for a in summary["answers"]:
        by_answer.setdefault(a["answer"], set()).add(a["cell_id"])
    assert by_answer["supports"] == set(card["support"]["cells"])
    assert by_answer["contradicts"] == {i["cell"] for i in card["counter_evidence"]["items"]}


def test_every_cited_event_resolves_to_raw_bytes(asked: tuple[Path, dict[str, Any], str]) -> None:
    """Each cited id is an event of its own cell whose ref hash-checks against the frozen bundle."""
    run_dir, summary, _text = asked
    con = duckdb.connect(str(run_dir / "ir.duckdb"), read_only=True)
    try:
        cited = [(a["cell_id"], e) for a in summary["answers"] for e in a["evidence"]]
        assert len(cited) >= 24
        for cell, event in cited:
            cols = "cell_id, source_path, line_start, line_end, json_pointer, source_sha256"
            row = con.execute(f"SELECT {cols} FROM events WHERE event_id = ?", [event]).fetchone()
            assert row is not None, event
            assert row[0] == cell, event
            view = resolve_ref(run_dir, ref_of(row[1], row[2], row[3], row[4]))
            assert view.sha256 == row[5] and view.lines.strip(), event
    finally:
        con.close()


def test_record_demo_routes_a_weakness_ask_by_cell_and_never_as_luna() -> None:
    """The ask prompt's cell line and question name the answer file; Luna's prompt still goes to Luna."""
    import sys

    sys.path.insert(0, str(ROOT))
    from fixtures.record_demo import answer_name

    question = "Question (answer with one of: supports, contradicts, neither):\n<question>\nWeakness W-01 states: x\n"
    ask = f"Cell C004 · task bat-sanitize · harness H0 · part 1/1\n\n{question}"
    assert answer_name({"messages": [{"role": "user", "content": ask}]}) == "ask/W-01/C004"
    split = ask.replace("part 1/1", "part 2/3")
    assert answer_name({"messages": [{"role": "user", "content": split}]}) == "ask/W-01/C004.part2of3"
    luna = "Cell C004 · task bat-sanitize · run r1 · harness H0 · part 1/1\nLog"
    assert answer_name({"messages": [{"role": "user", "content": luna}]}) == "luna/C004"
    # A user's own question (not from a card) has no hand-written answers: reported missing, never served Luna's.
    own = "Cell C004 · task bat-sanitize · harness H0 · part 1/1\n\nQuestion (answer yes or no):\nDid it loop?\n"
    assert answer_name({"messages": [{"role": "user", "content": own}]}) == "ask/own/C004"
