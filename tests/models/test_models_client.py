"""ModelClient through the real local server: litellm -> HTTP -> 127.0.0.1 (fixtures from pipeline.testing)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from pipeline.core.canonical import canonical_json
from pipeline.core.settings import ModelSettings
from pipeline.models import BudgetExceeded, ModelClient, ModelUnavailable, ReplayMiss, read_calls
from pipeline.models.errors import ContextExceeded, ModelRefused
from pipeline.testing.openai_server import FakeOpenAI, Reply, rate_limited, raw_answer, server_error, unauthorized

pytestmark = pytest.mark.usefixtures("tiny_prompts")


class Finding(BaseModel):
    """Small output model for tests."""

    summary: str
    event_ids: list[str]


GOOD = {"summary": "tests failed twice", "event_ids": ["C1-e1", "C1-e2"]}


def ctx(cell: str = "C1", text: str = "e1 run tests\ne2 fail") -> dict[str, Any]:
    return {"cell_id": cell, "text": text}


async def one(client: ModelClient, cell: str = "C1", **kw: Any) -> Any:
    return await client.call(role="t", cell_id=cell, context=ctx(cell), response_model=Finding, **kw)


def artifact(outcomes: list[Any]) -> bytes:
    # What a role would write from its outcomes: values, keys, tokens, cost.
    rows = [
        {"cell": o.cell_id, "value": o.value, "keys": o.keys, "tokens": o.tokens, "cost": o.cost_usd, "ok": o.ok}
        for o in outcomes
    ]
    return canonical_json(rows).encode()


def store_bytes(store: Path) -> dict[str, bytes]:
    return {str(p.relative_to(store)): p.read_bytes() for p in sorted(store.glob("*/*.json"))}


# -- record / replay ---------------------------------------------------------------------------


async def test_record_then_replay_is_byte_identical_and_works_with_server_down(tmp_path: Path) -> None:
    store = tmp_path / "store"
    cells = ["C1", "C2", "C3"]
    with FakeOpenAI() as srv:
        # C2's first answer is schema-invalid: the re-ask path is recorded too.
        def handler(req: dict[str, Any]) -> Reply:
            first_ask_for_c2 = "C2" in req["messages"][1]["content"] and len(req["messages"]) == 2
            return raw_answer('{"summary": 1}' if first_ask_for_c2 else json.dumps(GOOD))(req)

        srv.handler = handler
        settings = ModelSettings(model="openai/test-model", api_base=srv.base_url, mode="record", store=store)
        rec = ModelClient(settings, tmp_path / "run-rec")
        recorded = [await one(rec, c) for c in cells]
        n_http = len(srv.requests)
    assert n_http == 4 and [o.attempts for o in recorded] == [1, 2, 1]
    files_after_record = store_bytes(store)
    assert len(files_after_record) == 4

    # the server is down now: the port refuses connections
    replay_settings = settings.model_copy(update={"mode": "replay"})
    rep = ModelClient(replay_settings, tmp_path / "run-rep")
    replayed = [await one(rep, c) for c in cells]
    assert artifact(replayed) == artifact(recorded)
    assert store_bytes(store) == files_after_record  # replay never writes
    assert rep.store is not None and rep.store.unused() == []
    assert [r["mode"] for r in read_calls(tmp_path / "run-rep")] == ["replay"] * 3


async def test_replay_infers_model_from_store(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.push_answer(GOOD)
    await one(ModelClient(model_settings(mode="record", store=tmp_path / "s"), tmp_path / "r1"))
    client = ModelClient(ModelSettings(mode="replay", store=tmp_path / "s"), tmp_path / "r2")
    assert client.model == "openai/test-model"
    assert (await one(client)).value == Finding(**GOOD)


async def test_replay_miss_names_role_cell_template_key(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.push_answer(GOOD)
    await one(ModelClient(model_settings(mode="record", store=tmp_path / "s"), tmp_path / "r1"))
    client = ModelClient(model_settings(mode="replay", store=tmp_path / "s"), tmp_path / "r2")
    n_before = len(fake_llm.requests)
    with pytest.raises(ReplayMiss) as err:
        await one(client, cell="C9")  # a prompt never recorded
    e = err.value
    assert e.exit_code == 3 and e.role == "t" and e.cell_id == "C9" and e.key.startswith("sha256:")
    assert e.reason == "missing_data"
    assert e.template_hash.startswith("sha256:")
    msg = e.one_line()
    assert "role=t" in msg and "cell=C9" in msg and e.key in msg and "--record" in msg
    assert len(fake_llm.requests) == n_before  # never a live fallback
    assert read_calls(tmp_path / "r2")[-1]["outcome"] == "replay_miss"


async def test_replay_key_names_the_model(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    # The same prompt recorded for one model must not be served for another (DESIGN: model is in the key).
    fake_llm.push_answer(GOOD)
    recorded = await one(ModelClient(model_settings(mode="record", store=tmp_path / "s"), tmp_path / "r1"))
    other = ModelClient(model_settings(mode="replay", store=tmp_path / "s", model="openai/other"), tmp_path / "r2")
    with pytest.raises(ReplayMiss) as err:
        await one(other)
    assert err.value.key not in recorded.keys
    stored = [json.loads(p.read_text()) for p in (tmp_path / "s").rglob("*.json")]
    assert [r["request"]["model"] for r in stored] == ["openai/test-model"]


async def test_record_serves_repeated_request_from_store(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.push_answer(GOOD)
    fake_llm.push_answer({"summary": "different", "event_ids": []})
    client = ModelClient(model_settings(mode="record", store=tmp_path / "s"), tmp_path / "r")
    a, b = await one(client), await one(client)
    assert len(fake_llm.requests) == 1 and a.value == b.value  # same answer in record as replay will give


async def test_recordings_hold_no_key_or_auth_header(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-SECRET-123")
    fake_llm.push_answer(GOOD)
    await one(ModelClient(model_settings(mode="record", store=tmp_path / "s"), tmp_path / "r"))
    assert fake_llm.headers[-1]["authorization"] == "Bearer sk-test-SECRET-123"  # the key did reach the server
    text = "".join(p.read_text() for p in (tmp_path / "s").glob("*/*.json"))
    assert "SECRET" not in text and "Authorization" not in text and str(fake_llm.port) not in text
    rec = json.loads(next((tmp_path / "s").glob("*/*.json")).read_text())
    assert rec["response_source"] == "http_body" and rec["response"]["id"].startswith("chatcmpl-")
    assert {"key", "role", "cell_id", "template_hash", "model", "request", "response", "attempt"} <= set(rec)
    assert set(rec["versions"]) == {"litellm", "instructor", "pydantic", "openai"}


# -- faults --------------------------------------------------------------------------------------

TRANSPORT_FAULTS = {
    "429+retry-after": rate_limited(0),
    "500": server_error(500),
    "503": server_error(503),
    "timeout": Reply(delay_s=0.8),
    "dropped-connection": Reply(drop=True),
    "invalid-json-body": Reply(body=b"<html>bad gateway</html>"),
}


@pytest.mark.parametrize("via", ["auto", "litellm"])  # openai SDK straight, and through litellm
@pytest.mark.parametrize("fault", list(TRANSPORT_FAULTS))
async def test_transport_fault_is_retried_and_recovered(
    via: str, fault: str, tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.push(TRANSPORT_FAULTS[fault])
    fake_llm.push_answer(GOOD)
    client = ModelClient(model_settings(client=via, timeout_s=0.5), tmp_path / "r")
    out = await one(client)
    assert out.ok and out.value == Finding(**GOOD)
    assert out.transport_retries == 1 and out.attempts == 1
    assert len(fake_llm.requests) == 2
    assert read_calls(tmp_path / "r")[0]["transport_retries"] == 1


@pytest.mark.parametrize("via", ["auto", "litellm"])  # openai SDK straight, and through litellm
async def test_persistent_5xx_blocks_after_bounded_retries(
    via: str, tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.handler = lambda _req: server_error(500)
    client = ModelClient(model_settings(client=via, transport_retries=2), tmp_path / "r")
    with pytest.raises(ModelUnavailable, match="after 2 retries") as err:
        await one(client)
    assert err.value.exit_code == 3 and len(fake_llm.requests) == 3
    assert read_calls(tmp_path / "r")[0]["outcome"] == "model_unavailable"


@pytest.mark.parametrize("via", ["auto", "litellm"])  # openai SDK straight, and through litellm
async def test_client_error_is_not_retried(
    via: str, tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.push(Reply(status=400, body={"error": {"message": "bad request"}}))
    with pytest.raises(ModelRefused) as err:
        await one(ModelClient(model_settings(client=via), tmp_path / "r"))
    assert len(fake_llm.requests) == 1
    # a configuration error: exit 2, and the line says what to change instead of "--resume"
    assert err.value.exit_code == 2 and err.value.reason == "bad_request"
    assert "--mode json" in err.value.one_line() and "--resume" not in err.value.one_line()


@pytest.mark.parametrize("via", ["auto", "litellm"])  # openai SDK straight, and through litellm
async def test_retry_after_is_honoured(
    via: str,
    tmp_path: Path,
    fake_llm: FakeOpenAI,
    model_settings: Callable[..., ModelSettings],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LUNASOL_TEST_NO_WAIT")
    fake_llm.push(rate_limited(0.4))
    fake_llm.push_answer(GOOD)
    start = time.perf_counter()
    out = await one(ModelClient(model_settings(client=via), tmp_path / "r"))
    assert out.ok and time.perf_counter() - start >= 0.4


@pytest.mark.parametrize("bad", ["{not json", '{"summary": "x"}', '{"summary": 3, "event_ids": "C1-e1"}'])
async def test_schema_invalid_answer_is_reasked(
    bad: str, tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.push(raw_answer(bad))
    fake_llm.push_answer(GOOD)
    out = await one(ModelClient(model_settings(), tmp_path / "r"))
    assert out.ok and out.attempts == 2 and len(set(out.keys)) == 2
    reask = fake_llm.requests[1]["messages"]
    assert reask[-1]["role"] == "tool" and "Validation Error" in reask[-1]["content"]


async def test_always_invalid_is_a_recorded_failure(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.handler = raw_answer('{"summary": 1}')
    out = await one(ModelClient(model_settings(max_reasks=1), tmp_path / "r"))
    assert not out.ok and out.value is None and out.attempts == 2 and len(fake_llm.requests) == 2
    assert out.errors and "summary" in out.errors[0]
    row = read_calls(tmp_path / "r")[0]
    assert row["outcome"] == "invalid" and row["errors"] == out.errors


# -- check re-ask ----------------------------------------------------------------------------------

KNOWN = {"C1-e1", "C1-e2"}


def cites_known(f: Finding) -> list[str]:
    return [f"cited event id {e} does not exist in cell C1" for e in f.event_ids if e not in KNOWN]


async def test_check_reask_fixes_invented_id_and_replays_same_path(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.push_answer({"summary": "s", "event_ids": ["C1-e1", "C004-e9999"]})
    fake_llm.push_answer(GOOD)
    rec = ModelClient(model_settings(mode="record", store=tmp_path / "s"), tmp_path / "r1")
    out = await one(rec, check=cites_known)
    assert out.ok and out.value == Finding(**GOOD) and out.attempts == 2
    last = fake_llm.requests[1]["messages"]
    assert last[-2]["role"] == "assistant" and "C004-e9999" in last[-2]["content"]
    assert last[-1]["role"] == "user" and "cited event id C004-e9999 does not exist in cell C1" in last[-1]["content"]
    # every attempt recorded, in order
    recs = [json.loads((tmp_path / "s").joinpath(k[7:9], k[7:] + ".json").read_text()) for k in out.keys]
    assert [r["attempt"] for r in recs] == [0, 1]
    rep = ModelClient(model_settings(mode="replay", store=tmp_path / "s", api_base=None), tmp_path / "r2")
    again = await one(rep, check=cites_known)
    assert again.keys == out.keys and artifact([again]) == artifact([out])


async def test_check_failure_after_reasks_is_returned_not_dropped(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.handler = lambda req: raw_answer(json.dumps({"summary": "s", "event_ids": ["C9-e1"]}))(req)
    out = await one(ModelClient(model_settings(max_reasks=2), tmp_path / "r"), check=cites_known)
    assert not out.ok and out.value is None and out.attempts == 3
    assert out.errors == ["cited event id C9-e1 does not exist in cell C1"]
    assert out.last_answer == {"summary": "s", "event_ids": ["C9-e1"]}
    assert read_calls(tmp_path / "r")[0]["outcome"] == "check_failed"


async def test_log_text_with_braces_reaches_the_model_verbatim(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.push_answer({"summary": "s", "event_ids": ["C1-e1", "C1-x"]})
    fake_llm.push_answer(GOOD)
    raw = "e1 {{ config.secret }} {% if a %}x{% endif %}"
    client = ModelClient(model_settings(), tmp_path / "r")
    out = await client.call(role="t", cell_id="C1", context=ctx(text=raw), response_model=Finding, check=cites_known)
    assert out.ok
    assert all(raw in r["messages"][1]["content"] for r in fake_llm.requests)


# -- concurrency, budget, call log -----------------------------------------------------------------


async def test_concurrency_bound_holds(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    for _ in range(100):  # a reply still sleeping from an earlier fault test would count as in flight
        if fake_llm.in_flight == 0:
            break
        await asyncio.sleep(0.02)
    fake_llm.reset()
    fake_llm.handler = raw_answer(json.dumps(GOOD))
    fake_llm.delay_s = 0.05
    client = ModelClient(model_settings(concurrency=3), tmp_path / "r")
    outs = await client.gather([one(client, f"C{i}") for i in range(15)], label="t")
    assert all(o.ok for o in outs) and [o.cell_id for o in outs] == [f"C{i}" for i in range(15)]
    assert fake_llm.max_in_flight == 3


async def test_budget_tokens_stops_cleanly(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.handler = raw_answer(json.dumps(GOOD))
    client = ModelClient(model_settings(budget_tokens=1, concurrency=1), tmp_path / "r")
    with pytest.raises(BudgetExceeded) as err:
        await client.gather([one(client, f"C{i}") for i in range(5)])
    e = err.value
    assert e.exit_code == 3 and e.spent_tokens > 0 and e.data["budget_tokens"] == 1
    assert len(fake_llm.requests) == 1  # the first call ran; no other call was started
    assert "--resume" in e.unblock


async def test_budget_usd_with_priced_model(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.handler = raw_answer(json.dumps(GOOD))
    client = ModelClient(model_settings(model="openai/gpt-4o-mini", budget_usd=1e-9), tmp_path / "r")
    first = await one(client)
    assert first.cost_usd is not None and first.cost_usd > 0
    with pytest.raises(BudgetExceeded) as err:
        await one(client, "C2")
    assert err.value.spent_usd == pytest.approx(first.cost_usd)
    assert client.usage().cost_known and client.usage().calls == 2


async def test_unknown_price_is_none_not_zero(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.push_answer(GOOD)
    client = ModelClient(model_settings(), tmp_path / "r")
    out = await one(client)
    assert out.cost_usd is None and not client.usage().cost_known
    assert client.usage().as_dict()["cost_usd"] is None


async def test_calls_jsonl_has_one_whole_line_per_call(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.handler = raw_answer(json.dumps(GOOD))
    client = ModelClient(model_settings(), tmp_path / "r")
    outs = await asyncio.gather(*[one(client, f"C{i}") for i in range(10)])
    rows = read_calls(tmp_path / "r")
    assert len(rows) == 10 and {r["cell_id"] for r in rows} == {f"C{i}" for i in range(10)}
    for r in rows:
        assert r["role"] == "t" and r["mode"] == "live" and r["model"] == "openai/test-model"
        assert r["outcome"] == "ok" and r["attempts"] == 1 and r["latency_ms"] > 0
        assert r["prompt_tokens"] > 0 and r["completion_tokens"] > 0 and r["cost_usd"] is None
        assert r["template_hash"] == outs[0].template_hash
    assert sorted(r["keys"][0] for r in rows) == sorted(o.key for o in outs)


def test_bad_settings_are_bad_input(tmp_path: Path) -> None:
    from pipeline.core.errors import BadInput

    with pytest.raises(BadInput, match="needs a recording directory"):
        ModelClient(ModelSettings(model="openai/x", mode="record"), tmp_path)
    with pytest.raises(BadInput, match="replay store not found"):
        ModelClient(ModelSettings(model="openai/x", mode="replay", store=tmp_path / "nope"), tmp_path)


async def test_no_model_is_bad_input(tmp_path: Path) -> None:
    from pipeline.core.errors import BadInput

    with pytest.raises(BadInput, match="no model given"):
        await one(ModelClient(ModelSettings(), tmp_path))


@pytest.mark.parametrize("via", ["auto", "litellm"])  # openai SDK straight, and through litellm
async def test_auth_error_is_a_credential_refusal_never_retried(
    via: str, tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.push(unauthorized())
    with pytest.raises(ModelRefused) as err:
        await one(
            ModelClient(model_settings(client=via), tmp_path / "r"), soft_fail=True
        )  # not a per-cell failure either
    assert err.value.reason == "credential" and err.value.exit_code == 2 and len(fake_llm.requests) == 1
    assert "OPENAI_API_KEY" in err.value.one_line() and "--resume" not in err.value.one_line()
    assert read_calls(tmp_path / "r")[0]["outcome"] == "model_refused"


@pytest.mark.parametrize("via", ["auto", "litellm"])  # openai SDK straight, and through litellm
async def test_unknown_model_404_is_not_retried(
    via: str, tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.push(Reply(status=404, body={"error": {"message": "model 'nope' not found", "type": "not_found"}}))
    with pytest.raises(ModelRefused) as err:
        await one(ModelClient(model_settings(client=via), tmp_path / "r"))
    assert err.value.reason == "not_found" and len(fake_llm.requests) == 1 and "--model" in err.value.one_line()


async def test_concurrent_record_keeps_each_raw_body_with_its_request(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    def echo_cell(req: dict[str, Any]) -> Reply:
        cell = req["messages"][1]["content"].split()[2].rstrip(":")  # "Log of C7:\n..."
        return raw_answer(json.dumps({"summary": cell, "event_ids": []}))(req)

    fake_llm.handler = echo_cell
    fake_llm.delay_s = 0.02
    client = ModelClient(model_settings(mode="record", store=tmp_path / "s", concurrency=6), tmp_path / "r")
    outs = await client.gather([one(client, f"C{i}") for i in range(12)])
    assert [o.value.summary for o in outs] == [f"C{i}" for i in range(12)]  # type: ignore[union-attr]
    for path in (tmp_path / "s").glob("*/*.json"):
        rec = json.loads(path.read_text())
        assert rec["response_source"] == "http_body"
        args = rec["response"]["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
        assert json.loads(args)["summary"] == rec["cell_id"]
        assert rec["cell_id"] in rec["request"]["messages"][1]["content"]


async def test_cached_prompt_tokens_are_logged_and_replayed(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    from pipeline.models import format_summary, summarise
    from pipeline.testing.openai_server import completion_body

    def cached(request: dict[str, Any]) -> Reply:
        return Reply(body=completion_body(request, tool_arguments=json.dumps(GOOD), usage=(40, 5), cached_tokens=32))

    store = tmp_path / "store"
    fake_llm.handler = cached
    rec = ModelClient(model_settings(mode="record", store=store), tmp_path / "rec")
    await one(rec, "C1")
    fake_llm.handler = None
    rep = ModelClient(model_settings(mode="replay", store=store), tmp_path / "rep")
    await one(rep, "C1")
    for run in ("rec", "rep"):
        (row,) = read_calls(tmp_path / run)
        assert (row["prompt_tokens"], row["cached_tokens"]) == (40, 32)
    summary = summarise(tmp_path / "rep")
    assert summary["totals"]["cached_tokens"] == 32
    assert "cached" in format_summary(summary).splitlines()[0]


@pytest.mark.parametrize("status", [400, 500])
@pytest.mark.parametrize("via", ["auto", "litellm"])  # openai SDK straight, and through litellm
async def test_a_context_overflow_is_never_retried_even_as_a_5xx(
    via: str, status: int, tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    # OpenAI's body; some OpenAI-compatible servers send it with a 500
    message = "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens."
    fake_llm.handler = lambda _req: Reply(
        status=status,
        body={"error": {"message": message, "type": "invalid_request_error", "code": "context_length_exceeded"}},
    )
    with pytest.raises(ContextExceeded) as err:
        await one(ModelClient(model_settings(client=via, context_tokens=16000), tmp_path / "r"))
    assert len(fake_llm.requests) == 1 and err.value.exit_code == 3
    assert "--context-tokens 8192" in str(err.value.unblock)  # lowered to what the provider said


async def test_a_404_quotes_what_its_body_says(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    """A 404 that is not about the model (a wrong path) is quoted, not called "model ... was not found"."""
    fake_llm.push(Reply(status=404, body={"error": {"message": "no route /v2/chat/completions", "type": "nf"}}))
    with pytest.raises(ModelRefused) as err:
        await one(ModelClient(model_settings(), tmp_path / "r"))
    line = err.value.one_line()
    assert "was not found" not in line and "404" in line and "no route /v2/chat/completions" in line
    assert "--api-base" in line and len(fake_llm.requests) == 1


async def test_a_200_carrying_a_context_error_is_named_as_one(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    error = {"message": "This model's maximum context length is 8192 tokens", "code": "context_length_exceeded"}
    body = {"error": error}
    fake_llm.push(Reply(status=200, body=body))
    with pytest.raises(ContextExceeded) as err:
        await one(ModelClient(model_settings(), tmp_path / "r"))
    line = err.value.one_line()
    assert "exceeds its context" in line and "context_length_exceeded" in line and "no choices" not in line
    assert len(fake_llm.requests) == 1  # not retried
    assert "--context-tokens 8192" in err.value.unblock  # the size the body states


async def test_a_200_carrying_another_error_says_what_it_says(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.handler = lambda _req: Reply(status=200, body={"error": {"message": "upstream overloaded", "code": "x"}})
    with pytest.raises(ModelUnavailable) as err:
        await one(ModelClient(model_settings(), tmp_path / "r"))
    assert "only an error: x: upstream overloaded" in err.value.one_line()


def test_a_server_told_not_to_keep_requests_still_counts_and_answers() -> None:
    import urllib.request

    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 4000}]}
    with FakeOpenAI(raw_answer('{"ok": true}'), context_tokens=100_000, keep_requests=False) as srv:
        req = urllib.request.Request(
            srv.base_url + "/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            reply = json.loads(resp.read())
        assert reply["choices"][0]["message"]["content"] == '{"ok": true}'
        assert srv.requests == [] and srv.headers == []  # a 100,000-cell benchmark's bodies are not held
        assert srv.largest_request >= 1000  # counted all the same
