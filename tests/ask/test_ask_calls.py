"""``lunasol ask`` plans, pays and protects like every role: --dry-run, --batch, --budget-usd, redaction.

All through the local OpenAI-protocol server; the counts a test expects come from what the server
saw or from the IR read here, never from the code under test.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from pipeline.ask import AskSpec, run_ask
from pipeline.ask.stage import plan_ask
from pipeline.cli.app import app
from pipeline.core.settings import ModelSettings
from pipeline.models.errors import BudgetExceeded
from pipeline.testing.openai_server import FakeOpenAI
from tests.ask.test_ask import _cell, _expected, answering
from tests.conftest import copy_demo

QUESTION = "Did the reviewer re-read a file it had already read?"


@pytest.fixture
def run_copy(demo_gate1: Path, tmp_path: Path) -> Path:
    return copy_demo(demo_gate1, tmp_path)


def _tables(run: Path) -> set[str]:
    con = duckdb.connect(str(run / "ir.duckdb"), read_only=True)
    names = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    con.close()
    return names


def test_dry_run_plans_the_calls_the_ask_then_makes(
    run_copy: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    # At an 8K context the demo's cells split: the plan must count exactly the parts the ask then sends.
    settings = model_settings(context_tokens=8192)
    where = "task_id IN ('bat-sanitize', 'serde-rename-all')"
    spec = AskSpec(QUESTION, "yes-no", where=where)
    before = sorted(p.name for p in run_copy.iterdir())
    plan = plan_ask(run_copy, spec, settings)
    assert fake_llm.requests == [] and "asks" not in _tables(run_copy)
    assert sorted(p.name for p in run_copy.iterdir()) == before  # nothing written
    assert plan.cells == len(_expected(run_copy, where)) and plan.split > 0
    est = plan.estimate
    assert [r.role for r in est.roles] == ["ask"] and est.roles[0].over_budget == 0
    fake_llm.handler = answering(set(), set())
    _, results = run_ask(run_copy, spec, settings)
    per_cell: dict[str, int] = {}
    for r in fake_llm.requests:
        per_cell[_cell(r)] = per_cell.get(_cell(r), 0) + 1
    assert per_cell == plan.parts and est.calls == len(fake_llm.requests)
    assert {r.cell_id: r.parts for r in results} == plan.parts
    # The plan rendered the very requests the ask sent: their tokens, counted as the dry run counts, add up.
    import litellm

    counted = sum(
        litellm.token_counter(model=settings.model, messages=r["messages"], tools=r.get("tools"))
        for r in fake_llm.requests
    )
    assert est.prompt_tokens == counted and est.roles[0].largest_request <= est.roles[0].budget_tokens


def test_dry_run_cli_prices_and_shows_the_batch_price(run_copy: Path, fake_llm: FakeOpenAI) -> None:
    args = ["ask", str(run_copy), QUESTION, "--model", "openai/gpt-4o-mini", "--dry-run"]
    res = CliRunner().invoke(app, [*args, "--json", "--batch", "--context-tokens", "8192"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    est = out["estimate"]
    assert est["calls"] == sum(out["parts"].values()) > out["cells"] == len(_expected(run_copy))
    assert est["cost_usd"] > 0 and 0 < est["batch_cost_usd"] < est["cost_usd"]
    text = CliRunner().invoke(app, args).stdout
    assert "nothing was called" in text and re.search(r"^ask\s+24\s+\d+", text, re.M), text
    assert fake_llm.requests == [] and "asks" not in _tables(run_copy)
    unknown = CliRunner().invoke(app, ["ask", str(run_copy), QUESTION, "--model", "openai/no-such", "--dry-run"])
    assert unknown.exit_code == 0 and "price unknown" in unknown.stdout


def test_batch_sends_the_first_requests_as_one_provider_batch(
    run_copy: Path, demo_gate1: Path, tmp_path: Path, fake_llm: FakeOpenAI,
    model_settings: Callable[..., ModelSettings], monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("LUNASOL_BATCH_POLL_S", "0")
    batched_run = copy_demo(demo_gate1, tmp_path / "b")  # its own exchanges: nothing answered yet
    where = "task_id IN ('bat-sanitize', 'serde-rename-all', 'click-envvar-prefix')"
    spec = AskSpec(QUESTION, "yes-no", where=where)
    fake_llm.handler = answering(set(), set())
    _, sync = run_ask(run_copy, spec, model_settings())
    synchronous = len(fake_llm.requests)
    assert fake_llm.batch.created == 0
    fake_llm.reset()
    fake_llm.handler = answering(set(), set())
    _, batched = run_ask(batched_run, spec, model_settings(batch=True))
    assert fake_llm.batch.created == 1 and len(fake_llm.requests) == synchronous
    assert json.loads((batched_run / "batches.json").read_text())["batches"][0]["keys"]
    assert [(r.cell_id, r.answer, r.evidence) for r in batched] == [(r.cell_id, r.answer, r.evidence) for r in sync]


def test_budget_stops_the_ask_and_writes_no_partial_table(
    run_copy: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.handler = answering(set(), set())
    settings = model_settings(model="openai/gpt-4o-mini", budget_usd=1e-9, concurrency=1)
    with pytest.raises(BudgetExceeded):
        run_ask(run_copy, AskSpec(QUESTION, "yes-no"), settings)
    assert 0 < len(fake_llm.requests) < len(_expected(run_copy))
    assert "asks" not in _tables(run_copy)


def test_a_secret_in_a_cells_log_reaches_neither_the_server_nor_the_recording(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    from tests.ir.test_planted_secrets import _leaks, _plant
    from tests.sol.sol_helpers import make_bundle

    bundle = make_bundle(tmp_path)
    _plant(bundle)
    res = CliRunner().invoke(app, ["export", str(bundle), "--runs-dir", str(tmp_path / "runs"), "--run-id", "r"])
    assert res.exit_code == 0, res.output
    run = tmp_path / "runs" / "r"
    fake_llm.handler = answering(set(), set())
    store = tmp_path / "rec"
    _, results = run_ask(run, AskSpec(QUESTION, "yes-no"), model_settings(mode="record", store=store))
    planted = [r for r in fake_llm.requests if "REDACTED" in json.dumps(r)]
    assert planted and any(r.cell_id == "C001" and r.status == "ok" for r in results)  # the cell was asked
    assert _leaks(json.dumps(fake_llm.requests)) == []
    recorded = "".join(p.read_text(encoding="utf-8") for p in store.rglob("*.json"))
    assert recorded and "REDACTED" in recorded and _leaks(recorded) == []


def _cli_env(monkeypatch: pytest.MonkeyPatch, fake_llm: FakeOpenAI, model: str = "openai/test-model") -> None:
    monkeypatch.setenv("LUNASOL_MODEL", model)
    monkeypatch.setenv("LUNASOL_API_BASE", fake_llm.base_url)
    monkeypatch.setenv("LUNASOL_INSTRUCTOR_MODE", "tools")


def test_a_pending_batch_blocks_and_the_same_command_collects_it(
    run_copy: Path, fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.testing.openai_server import BatchPlan

    _cli_env(monkeypatch, fake_llm)
    monkeypatch.setenv("LUNASOL_BATCH_POLL_S", "0")
    monkeypatch.setenv("LUNASOL_BATCH_MAX_WAIT_S", "0")
    fake_llm.handler = answering(set(), set())
    fake_llm.batch.plan(BatchPlan(validating_polls=10**9))  # the provider has not finished it yet
    args = ["ask", str(run_copy), QUESTION, "--where", "task_id = 'bat-sanitize'", "--batch"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 3, res.output
    line = res.output.strip().splitlines()[-1]  # after the batch's progress lines: one error line
    assert line.startswith("lunasol: provider batch") and "not finished" in line
    assert "same lunasol ask command again" in line
    assert "asks" not in _tables(run_copy) and fake_llm.batch.created == 1
    (b,) = json.loads((run_copy / "batches.json").read_text())["batches"]
    fake_llm.batch.batches[b["id"]].plan = BatchPlan(validating_polls=0, in_progress_polls=0)
    res = CliRunner().invoke(app, [a for a in args if a != "--batch"])  # a batch still out keeps batching
    assert res.exit_code == 0, res.output
    assert fake_llm.batch.created == 1  # collected, never submitted twice
    assert "3/3 answered; yes 3" in res.output


def test_budget_cli_is_one_line_exit_3_and_a_higher_budget_pays_nothing_twice(
    run_copy: Path, fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    _cli_env(monkeypatch, fake_llm, "openai/gpt-4o-mini")
    fake_llm.handler = answering(set(), set())
    args = ["ask", str(run_copy), QUESTION, "--concurrency", "1"]
    res = CliRunner().invoke(app, [*args, "--budget-usd", "0.000000001"])
    assert res.exit_code == 3 and len(res.output.strip().splitlines()) == 1, res.output
    assert "budget exceeded" in res.output and "raise --budget-usd" in res.output
    paid = {json.dumps(r, sort_keys=True) for r in fake_llm.requests}
    assert paid and "asks" not in _tables(run_copy)
    res = CliRunner().invoke(app, [*args, "--budget-usd", "100"])
    assert res.exit_code == 0, res.output
    again = [json.dumps(r, sort_keys=True) for r in fake_llm.requests[len(paid) :]]
    assert not paid & set(again) and len(again) == len(_expected(run_copy)) - len(paid)
