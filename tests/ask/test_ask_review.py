"""Asks where a reviewer looks: ``lunasol show`` lists them and opens one; gate 1's receipt may cite one.

Asked through the local server (the rule in tests/ask/test_ask.py: yes for two tasks, the log's
first event cited); expected counts are read from the IR here, independently of the code under test.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from pipeline.artifacts.schemas import load_artifact
from pipeline.ask import AskSpec, run_ask
from pipeline.cli.app import app
from pipeline.core.settings import ModelSettings
from pipeline.gates import gate1 as gates
from pipeline.testing.openai_server import FakeOpenAI
from tests.ask.test_ask import YES_TASKS, _expected, answering
from tests.conftest import copy_demo

QUESTION = "Did the reviewer re-read a file it had already read?"
WHERE = "task_id IN ('bat-sanitize', 'serde-rename-all', 'click-envvar-prefix')"


@pytest.fixture
def asked(
    demo_gate1: Path, tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> tuple[Path, str]:
    run = copy_demo(demo_gate1, tmp_path)
    fake_llm.handler = answering(set(), invent_always={"C006"})  # C006 never resolves: failed
    ask_id, _ = run_ask(run, AskSpec(QUESTION, "yes-no", where=WHERE), model_settings())
    return run, ask_id


def _show(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["show", *args])
    return res.exit_code, res.output


def test_show_lists_the_runs_asks_with_their_counts(asked: tuple[Path, str]) -> None:
    run, ask_id = asked
    expected = _expected(run, WHERE)
    answered = [c for c in expected if c != "C006"]
    yes = [c for c in answered if expected[c]["task"] in YES_TASKS]
    code, out = _show(str(run), "--json")
    assert code == 0, out
    (h,) = json.loads(out)["asks"]
    assert (h["ask_id"], h["cells"], h["answered"], h["failed"]) == (ask_id, len(expected), len(answered), 1)
    assert h["counts"]["yes"] == len(yes) and h["rates"]["yes"] == round(len(yes) / len(answered), 4)
    code, text = _show(str(run))
    assert code == 0 and f"{ask_id}: {len(answered)}/{len(expected)} answered, 1 FAILED; yes {len(yes)}" in text
    assert _show(str(run), "asks")[1] == text


def test_show_one_ask_prints_every_cell_with_its_cited_lines(asked: tuple[Path, str]) -> None:
    run, ask_id = asked
    code, out = _show(str(run), ask_id, "--evidence", "--json")
    assert code == 0, out
    doc = json.loads(out)
    con = duckdb.connect(str(run / "ir.duckdb"), read_only=True)
    rows = con.execute("SELECT cell_id, status, answer, evidence FROM ask_answers WHERE ask_id = ?", [ask_id])
    want = {c: (s, a, list(e)) for c, s, a, e in rows.fetchall()}
    con.close()
    assert {a["cell_id"]: (a["status"], a["answer"], a["evidence"]) for a in doc["answers"]} == want
    cited = {e for _, _, ev in want.values() for e in ev}
    assert cited and set(doc["evidence"]) == cited
    for e, item in doc["evidence"].items():  # every cited event's raw line, hash-checked
        (ev,) = item["evidence"]
        assert ev["status"] == "verified" and any(line["cited"] for line in ev["lines"]), e
    code, text = _show(str(run), ask_id)
    assert code == 0 and "C006" in text and "FAILED: part 1/1" in text and "not shown in this log" in text
    assert f"--ask {ask_id}" in text and doc["digest"] in text
    code, out = _show(str(run), "ask-0000000000")
    assert code == 2 and len(out.strip().splitlines()) == 1 and ask_id in out


def _confirm(run: Path, *extra: str) -> tuple[int, str]:
    digest = gates.shortlist_digest(run)
    args = ["confirm", str(run), "--decision", "W-01=confirm", "--decision", "W-02=reject", "--by", "ana"]
    res = CliRunner().invoke(app, [*args, "--digest", digest, *extra])
    return res.exit_code, res.output


def test_confirm_cites_an_ask_in_the_receipt(
    asked: tuple[Path, str], fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    run, ask_id = asked
    before = sorted((run / "gates").glob("*.json")) if (run / "gates").is_dir() else []
    code, out = _confirm(run, "--ask", "ask-0000000000")
    assert code == 2 and len(out.strip().splitlines()) == 1 and ask_id in out
    assert (sorted((run / "gates").glob("*.json")) if (run / "gates").is_dir() else []) == before  # nothing written
    shown = json.loads(_show(str(run), ask_id, "--json")[1])
    code, out = _confirm(run, "--ask", ask_id)
    assert code == 0 and f"cites {ask_id}" in out, out
    (path,) = (run / "gates").glob("gate1-*.json")
    receipt = load_artifact(path, "gate-receipt", gates.Receipt)
    assert receipt.ask is not None and receipt.schema_version == 3
    assert (receipt.ask.ask_id, receipt.ask.digest, receipt.ask.question) == (ask_id, shown["digest"], QUESTION)
    assert receipt.ask.counts == shown["overall"]["counts"] and receipt.ask.failed == 1
    assert receipt.request["ask"] == {"ask_id": ask_id, "digest": shown["digest"]}
    # The report marks the ask the standing decision cites, and says so when its answers change after.
    from pipeline.report.build import render_report

    def badge() -> str:
        html, _ = render_report(run)
        section = html[html.index(f'id="ask-{ask_id}"') : html.index('<section id="proposals">')]
        return section[: section.index("<details>")]

    assert "cited by gate 1" in badge() and "changed since" not in badge()
    con = duckdb.connect(str(run / "ir.duckdb"))
    con.execute("UPDATE ask_answers SET answer = 'no', evidence = [] WHERE ask_id = ? AND answer = 'yes'", [ask_id])
    con.close()
    assert "its answers changed since" in badge() and shown["digest"] in badge()
    # The digest is the answers': the same ask answered otherwise is another digest.
    other = copy_demo(run, run.parent.parent / "other")
    fake_llm.handler = answering(set(), set())
    run_ask(other, AskSpec(QUESTION, "yes-no", where=WHERE), model_settings())
    assert json.loads(_show(str(other), ask_id, "--json")[1])["digest"] != shown["digest"]


def test_a_receipt_without_ask_stays_as_it_was_and_an_older_one_migrates(asked: tuple[Path, str]) -> None:
    run, _ = asked
    code, out = _confirm(run)
    assert code == 0, out
    (path,) = (run / "gates").glob("gate1-*.json")
    doc = json.loads(path.read_text())
    assert "ask" not in doc and "ask" not in doc["request"]
    receipt = load_artifact(path, "gate-receipt", gates.Receipt)
    assert receipt.ask is None
    # The digest still seals what is written (no "ask": null in it).
    assert receipt.receipt_digest == gates.digest({k: v for k, v in doc.items() if k != "receipt_digest"})
    older = path.with_name("gate1-v2.json")
    older.write_text(json.dumps({**doc, "schema_version": 2}))
    assert load_artifact(older, "gate-receipt", gates.Receipt).ask is None


def test_the_report_has_an_asks_section_whose_yes_answers_link_to_their_raw_lines(
    asked: tuple[Path, str], tmp_path: Path
) -> None:
    import re

    from pipeline.report.build import read_page_data, write_report

    run, ask_id = asked
    expected = _expected(run, WHERE)
    answered = [c for c in expected if c != "C006"]
    yes = sorted(c for c in answered if expected[c]["task"] in YES_TASKS)
    page, stats = write_report(run, tmp_path / "report")
    html = page.read_text(encoding="utf-8")
    assert stats["unresolved"] == 0 and '<a href="#asks">Asks</a>' in html
    section = html[html.index('<section id="asks">') : html.index('<section id="proposals">')]
    assert f'id="ask-{ask_id}"' in section and f"{len(answered)} of {len(expected)} cells answered" in section
    assert f"{len(yes)}/{len(answered)}" in section  # the yes count over answered cells, all outcomes
    rows = re.findall(r'<tr data-cell="(C\d+)">(.*?)</tr>', section, re.S)
    assert sorted(c for c, _ in rows) == yes  # every yes listed, no "no"
    data = read_page_data(page)
    con = duckdb.connect(str(run / "ir.duckdb"), read_only=True)
    cited = dict(con.execute("SELECT cell_id, evidence FROM ask_answers WHERE ask_id = ?", [ask_id]).fetchall())
    con.close()
    for cell, row in rows:
        anchors = re.findall(r'<a class="ref" href="#(raw-[0-9a-f]+)" data-ref="[^"]+"[^>]*>([^<]+)</a>', row)
        assert {e for _, e in anchors} == set(cited[cell]), cell
        for anchor, event in anchors:  # the link opens the event's own raw lines, embedded in the page
            key, chunk, status = data["index"][anchor]
            assert (key, status) == (event, "verified") and data["chunks"][chunk]["refs"][anchor]["key"] == event
    assert "C006" in section and "1 cell(s) failed" in section


def test_a_run_without_asks_has_no_asks_section(demo_gate1: Path) -> None:
    from pipeline.report.build import render_report

    html, _ = render_report(demo_gate1)
    assert '<section id="asks">' not in html and 'href="#asks"' not in html


def test_number_and_choice_asks_are_listed_shown_and_reported(
    asked: tuple[Path, str], fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    from pipeline.report.build import render_report
    from pipeline.testing.openai_server import Reply, completion_body
    from tests.ask.test_ask import EVENT, _user

    run, yes_no = asked

    def number(request: dict[str, object]) -> Reply:
        first = EVENT.findall(_user(request).split("<<<log", 1)[1])[0]
        data = {"answer": 3, "explanation": f"three re-reads from {first}", "evidence": [first]}
        return Reply(body=completion_body(request, tool_arguments=json.dumps(data)))

    fake_llm.handler = number
    n_id, _ = run_ask(run, AskSpec("How many re-reads?", "number", where=WHERE), model_settings())
    fake_llm.handler = answering(set(), set(), values=("review", "design"))
    c_id, _ = run_ask(run, AskSpec("Which stage?", "choice", ("review", "design", "none"), where=WHERE),
                      model_settings())  # fmt: skip
    code, text = _show(str(run))
    assert code == 0 and "3 ask(s)" in text and f"{n_id}: " in text and "mean 3" in text
    assert f"{c_id}: " in text and "review " in text and "none 0" in text
    code, text = _show(str(run), n_id)
    assert code == 0 and "mean 3" in text and "three re-reads" in text
    html, stats = render_report(run)
    section = html[html.index('<section id="asks">') : html.index('<section id="proposals">')]
    assert stats["unresolved"] == 0 and all(f'id="ask-{a}"' in section for a in (yes_no, n_id, c_id))
    assert "mean 3" in section and "<th>design</th>" in section
