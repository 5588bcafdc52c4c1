"""``lunasol ask``: one call per cell through the local OpenAI-protocol server; cited events must resolve.

The server answers from what each request shows (the task named in the prompt decides yes or no,
the first event id of the log is cited), so the expected counts are computed here independently
from the IR's cells and outcomes tables, with the Coordinator's rule for a successful cell.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pytest
from typer.testing import CliRunner

from pipeline.ask import AskSpec, parse_answer_kind, run_ask, summarise
from pipeline.ask.answer import answer_model, check_answer
from pipeline.cli.app import app
from pipeline.core.errors import BadInput
from pipeline.core.settings import ModelSettings
from pipeline.testing.openai_server import FakeOpenAI, Reply, completion_body
from tests.conftest import copy_demo

EVENT = re.compile(r"\b(C\d{3}-e\d{4})\b")
YES_TASKS = {"bat-sanitize", "click-envvar-prefix"}
SUCCESS = ("completed", "success", "succeeded", "resolved", "passed")


def _user(request: dict[str, Any]) -> str:
    return str(next(m["content"] for m in request["messages"] if m["role"] == "user"))


def _cell(request: dict[str, Any]) -> str:
    m = re.match(r"Cell (C\d{3})", _user(request))
    assert m is not None
    return m.group(1)


def answering(
    invent_once: set[str], invent_always: set[str], values: tuple[str, str] = ("yes", "no")
) -> Callable[[dict[str, Any]], Reply]:
    """Yes for the YES_TASKS, citing the log's first event; invented ids for some cells (once or always)."""
    asked: dict[str, int] = {}

    def handle(request: dict[str, Any]) -> Reply:
        text = _user(request)
        cell = _cell(request)
        asked[cell] = asked.get(cell, 0) + 1
        task = re.search(r"· task (\S+)", text)
        yes = bool(task and task.group(1) in YES_TASKS)
        first = EVENT.findall(text.split("<<<log", 1)[1])[0]
        evidence = [first]
        if cell in invent_always or (cell in invent_once and asked[cell] == 1):
            evidence = [f"{cell}-e9999"]
        data = {"answer": values[0] if yes else values[1], "explanation": f"opens with {first}", "evidence": evidence}
        return Reply(body=completion_body(request, tool_arguments=json.dumps(data)))

    return handle


@pytest.fixture
def run_copy(demo_gate1: Path, tmp_path: Path) -> Path:
    return copy_demo(demo_gate1, tmp_path)


def _expected(run: Path, where: str = "TRUE") -> dict[str, dict[str, Any]]:
    con = duckdb.connect(str(run / "ir.duckdb"), read_only=True)
    rows = con.execute(
        "SELECT c.cell_id, c.task_id, o.label FROM cells c LEFT JOIN outcomes o USING (cell_id) "
        f"WHERE c.eligibility = 'valid_behavior' AND ({where}) ORDER BY c.cell_id"
    ).fetchall()
    con.close()
    return {
        c: {"task": t, "outcome": "unknown" if lab is None else "successful" if lab.lower() in SUCCESS else "failed"}
        for c, t, lab in rows
    }


def test_ask_counts_per_outcome_and_unresolved_events(
    run_copy: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.handler = answering(invent_once={"C004"}, invent_always={"C006"})
    spec = AskSpec("Did the reviewer re-read a file it had already read?", "yes-no")
    ask_id, results = run_ask(run_copy, spec, model_settings())
    by = {r.cell_id: r for r in results}
    expected = _expected(run_copy)
    assert set(by) == set(expected)
    # C004's first answer cited an id not in its log: re-asked, then kept; C006's never resolved: failed.
    assert by["C004"].status == "ok" and by["C004"].attempts == 2
    assert by["C006"].status == "failed" and "not shown in this log" in (by["C006"].reason or "")
    assert by["C006"].answer is None
    requests_c006 = [r for r in fake_llm.requests if _cell(r) == "C006"]
    assert len(requests_c006) == 3  # the first ask and two re-asks (max_reasks=2), then failed
    s = summarise(run_copy, ask_id)
    for outcome in ("successful", "failed"):
        cells = [c for c, e in expected.items() if e["outcome"] == outcome]
        answered = [c for c in cells if c != "C006"]
        yes = [c for c in answered if expected[c]["task"] in YES_TASKS]
        g = s["by_outcome"][outcome]
        assert (g["cells"], g["answered"], g["counts"]["yes"]) == (len(cells), len(answered), len(yes))
        if answered:
            p = len(yes) / len(answered)
            assert g["rates"]["yes"]["rate"] == round(p, 4)
            assert g["rates"]["yes"]["se"] == round((p * (1 - p) / len(answered)) ** 0.5, 4)
    # Every kept answer cites events that exist in its cell.
    con = duckdb.connect(str(run_copy / "ir.duckdb"), read_only=True)
    ids = {r[0] for r in con.execute("SELECT event_id FROM events").fetchall()}
    rows = con.execute("SELECT cell_id, evidence FROM ask_answers WHERE status = 'ok'").fetchall()
    con.close()
    assert rows and all(ev and set(ev) <= ids and all(e.startswith(c) for e in ev) for c, ev in rows)


def test_ask_where_replay_and_cli(
    run_copy: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings], tmp_path: Path
) -> None:
    fake_llm.handler = answering(set(), set())
    store = tmp_path / "rec"
    where = "task_id = 'bat-sanitize'"
    spec = AskSpec("Did the reviewer re-read a file?", "yes-no", where=where)
    ask_id, results = run_ask(run_copy, spec, model_settings(mode="record", store=store))
    assert {r.cell_id for r in results} == set(_expected(run_copy, where))
    assert all(r.answer == "yes" for r in results)
    sent = len(fake_llm.requests)
    # Replayed from the recording through the CLI: no request reaches the server, same answers.
    res = CliRunner().invoke(
        app,
        ["ask", str(run_copy), "Did the reviewer re-read a file?", "--where", where, "--replay", str(store), "--json"],
    )
    assert res.exit_code == 0, res.output
    assert len(fake_llm.requests) == sent
    out = json.loads(res.output)
    assert out["ask"]["ask_id"] == ask_id and out["overall"]["counts"]["yes"] == len(results)
    res = CliRunner().invoke(app, ["ask", str(run_copy), "Did it?", "--where", where, "--replay", str(store)])
    assert res.exit_code != 0 and "no recording" in res.output  # another question is another request


def test_ask_export_tables(run_copy: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]) -> None:
    fake_llm.handler = answering(set(), set())
    run_ask(run_copy, AskSpec("q?", "yes-no", where="task_id = 'bat-sanitize'"), model_settings())
    out = run_copy.parent / "parquet"
    res = CliRunner().invoke(app, ["export-tables", str(run_copy), "--parquet", str(out)])
    assert res.exit_code == 0, res.output
    con = duckdb.connect()
    n = con.execute(f"SELECT count(*) FROM read_parquet('{out / 'ask_answers.parquet'}')").fetchone()
    con.close()
    assert n is not None and n[0] == len(_expected(run_copy, "task_id = 'bat-sanitize'"))


def test_answer_kinds_and_checks() -> None:
    assert parse_answer_kind("yes-no") == ("yes-no", ())
    assert parse_answer_kind("number") == ("number", ())
    assert parse_answer_kind("review|validation|none") == ("choice", ("review", "validation", "none"))
    for bad in ("one", "a|a", ""):
        with pytest.raises(BadInput):
            parse_answer_kind(bad)
    model = answer_model("choice", ("a", "b"))
    with pytest.raises(ValueError):
        model.model_validate({"answer": "c", "explanation": "x", "evidence": []})
    ok = answer_model("yes-no").model_validate({"answer": "no", "explanation": "nothing shows it", "evidence": []})
    assert check_answer(ok, kind="yes-no", shown_ids={"C001-e0001"}) == []
    yes = answer_model("yes-no").model_validate({"answer": "yes", "explanation": "x", "evidence": []})
    assert "evidence is empty" in check_answer(yes, kind="yes-no", shown_ids=set())[0]


def test_bad_where_is_one_line_exit_2(run_copy: Path) -> None:
    for where, msg in (("no_such_column = 1", "not a valid filter"), ("task_id = 'none-such'", "no eligible cell")):
        res = CliRunner().invoke(app, ["ask", str(run_copy), "q?", "--where", where, "--replay", str(run_copy)])
        assert res.exit_code == 2, res.output
        assert msg in res.output and len(res.output.strip().splitlines()) == 1


def test_question_is_redacted_before_any_request(
    run_copy: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.handler = answering(set(), set())
    secret = "ghp_abcdefghijklmnopqrstuvwxyz0123456789"
    ask_id, _ = run_ask(run_copy, AskSpec(f"Did it print {secret}?", "yes-no", where="task_id = 'bat-sanitize'"),
                        model_settings())  # fmt: skip
    assert fake_llm.requests and not any(secret in json.dumps(r) for r in fake_llm.requests)
    assert "[REDACTED:github-token]" in _user(fake_llm.requests[0])
    assert secret not in str(summarise(run_copy, ask_id)["ask"]["question"])


def test_eval_labels_scores_an_ask_with_known_counts(
    run_copy: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings], tmp_path: Path
) -> None:
    import random

    fake_llm.handler = answering(set(), invent_always={"C006"})
    ask_id, _ = run_ask(run_copy, AskSpec("Did the reviewer re-read a file?", "yes-no"), model_settings())
    expected = _expected(run_copy)
    rng = random.Random(11)
    labelled = sorted({*rng.sample(sorted(expected), 14), "C006"})
    gold_yes = {c for c in labelled if rng.random() < 0.5}
    csv = tmp_path / "ask-labels.csv"
    csv.write_text(
        "cell,label\n" + "".join(f"{c},{ask_id if c in gold_yes else 'none'}\n" for c in labelled), encoding="utf-8"
    )
    # The server's rule, applied here on its own: yes for the YES_TASKS; C006 never resolved (counts as no).
    pred_yes = {c for c in labelled if expected[c]["task"] in YES_TASKS and c != "C006"}
    want = {
        "tp": len(gold_yes & pred_yes),
        "fp": len(pred_yes - gold_yes),
        "fn": len(gold_yes - pred_yes),
        "tn": len(set(labelled) - gold_yes - pred_yes),
    }
    res = CliRunner().invoke(app, ["eval", str(run_copy), "--labels", str(csv), "--json"])
    assert res.exit_code == 0, res.output
    m = json.loads(res.output)["sources"]["asks"]["asks"][ask_id]
    assert {k: m[k] for k in want} == want
    assert m["failed_cells"] == ["C006"]
    assert want["fp"] + want["fn"] > 0 and want["tp"] > 0  # the labels disagree somewhere, agree somewhere
    text = CliRunner().invoke(app, ["eval", str(run_copy), "--labels", str(csv)]).output
    assert ask_id in text and "failed cells (counted as no): C006" in text


def test_weakness_question_sample_pilot(
    run_copy: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_llm.handler = answering(set(), set(), values=("supports", "neither"))
    monkeypatch.setenv("LUNASOL_MODEL", "openai/test-model")
    monkeypatch.setenv("LUNASOL_API_BASE", fake_llm.base_url)
    monkeypatch.setenv("LUNASOL_INSTRUCTOR_MODE", "tools")
    card = json.loads((run_copy / "weakness-shortlist.json").read_text())["weaknesses"][0]
    args = ["ask", str(run_copy), "--weakness", card["weakness_id"], "--sample", "6", "--seed", "3"]
    res = CliRunner().invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    # The question (the card's statement and prediction) is shown before it is sent, on stderr.
    assert card["statement"][:60] in res.stderr
    out = json.loads(res.stdout)
    assert out["ask"]["weakness_id"] == card["weakness_id"] and out["ask"]["sample"] == 6
    assert out["ask"]["choices"] == ["supports", "contradicts", "neither"]
    cells = [a["cell_id"] for a in out["answers"]]
    assert len(cells) == 6 and len(fake_llm.requests) == 6
    assert all(card["statement"][:60] in _user(r) for r in fake_llm.requests)
    # The same seed draws the same pilot; the sample is of the eligible cells.
    again = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)
    assert [a["cell_id"] for a in again["answers"]] == cells and set(cells) <= set(_expected(run_copy))
    want = sum(_expected(run_copy)[c]["task"] in YES_TASKS for c in cells)
    assert out["overall"]["counts"]["supports"] == want
    text = CliRunner().invoke(app, args).stdout
    assert "a PILOT: 6 sampled with seed 3" in text


def test_diff_shows_an_ask_answered_differently(
    demo_gate1: Path, tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    from pipeline.diff import diff_run_dirs, render_html, render_text

    a = copy_demo(demo_gate1, tmp_path / "a")
    b = copy_demo(demo_gate1, tmp_path / "b")
    spec = AskSpec(
        "Did the reviewer re-read a file?", "yes-no", where="task_id IN ('bat-sanitize', 'serde-rename-all')"
    )
    fake_llm.handler = answering(set(), set())
    run_ask(a, spec, model_settings())
    fake_llm.handler = answering(set(), invent_always={"C005"})  # C005 fails in B
    run_ask(b, spec, model_settings())
    d = diff_run_dirs(a, b)
    (q,) = d.decisions.asks
    assert (q.status, q.ask_id, q.answers_changed) == ("changed", spec.ask_id, ["C005"])
    assert q.counts_a is not None and q.counts_b is not None
    assert q.counts_b.get("failed") == 1 and q.counts_a["yes"] == q.counts_b["yes"] + 1
    text = render_text(d)
    assert text.index(f"changed {spec.ask_id}") < text.index("PATTERNS PER CELL")
    assert "1 cells answered differently: C005" in text and spec.ask_id in render_html(d)
