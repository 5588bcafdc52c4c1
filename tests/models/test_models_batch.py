"""Provider batches through litellm's files/batches API against the local server's batch endpoints."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pipeline.core.errors import BadInput
from pipeline.models.batch_api import BatchEndpoint, batch_line, provider_of, wire_body
from pipeline.testing.openai_server import BatchPlan, FakeOpenAI, Reply, answer, auto_answer, server_error

MODEL = "openai/test-model"
TOOLS_KW: dict[str, Any] = {
    "messages": [{"role": "system", "content": "extract"}, {"role": "user", "content": "log of C1"}],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "Finding",
                "description": "a finding",
                "parameters": {
                    "type": "object",
                    "properties": {"summary": {"type": "string"}},
                    "required": ["summary"],
                },
            },
        }
    ],
    "tool_choice": {"type": "function", "function": {"name": "Finding"}},
    "temperature": 0.0,
}


def kw(cell: str) -> dict[str, Any]:
    return {**TOOLS_KW, "messages": [TOOLS_KW["messages"][0], {"role": "user", "content": f"log of {cell}"}]}


def by_cell(request: dict[str, Any]) -> Reply:
    # An answer that depends on the request, so a swapped or misrouted answer would show.
    cell = request["messages"][-1]["content"].split()[-1]
    return answer({"summary": f"finding for {cell}"})(request)


async def test_wire_body_is_the_body_litellm_sends(fake_llm: FakeOpenAI) -> None:
    import litellm

    fake_llm.handler = by_cell
    body = await wire_body(MODEL, kw("C1"), api_base=fake_llm.base_url)
    assert fake_llm.requests == []  # capturing sends nothing
    await litellm.acompletion(model=MODEL, api_base=fake_llm.base_url, api_key="k", num_retries=0, **kw("C1"))
    assert fake_llm.requests == [body]
    assert body["model"] == "test-model" and body["tools"][0]["function"]["name"] == "Finding"


@pytest.mark.parametrize("client", ["auto", "litellm"])
async def test_a_batch_line_holds_the_body_the_synchronous_call_posts(
    tmp_path: Any,
    fake_llm: FakeOpenAI,
    model_settings: Any,
    tiny_prompts: Any,
    monkeypatch: pytest.MonkeyPatch,
    client: str,
) -> None:
    # Through the real paths both ways: a synchronous call (the openai SDK with --api-base, or
    # litellm), then the same call with --batch, its body built without litellm for the SDK.
    from pydantic import BaseModel

    from pipeline.models import ModelClient

    class Finding(BaseModel):
        summary: str

    monkeypatch.setenv("LUNASOL_BATCH_POLL_S", "0")
    (tiny_prompts / "luna.j2").write_text((tiny_prompts / "t.j2").read_text())
    fake_llm.handler = answer({"summary": "s"})
    bodies = []
    for batch in (False, True):
        c = ModelClient(model_settings(batch=batch, client=client), tmp_path / str(batch))
        if batch:
            await c.prefetch("luna", lambda: iter([("C1", {"cell_id": "C1", "text": "e1"}, Finding)]))
        await c.call(role="luna", cell_id="C1", context={"cell_id": "C1", "text": "e1"}, response_model=Finding)
        bodies.append(fake_llm.requests[-1])
    assert len(fake_llm.requests) == 2 and "x-lunasol-batch-item" in fake_llm.headers[-1]
    assert bodies[1] == bodies[0] and bodies[0]["model"] == "test-model"


async def test_capturing_a_body_keeps_nothing_of_the_request(fake_llm: FakeOpenAI) -> None:
    # Each capture ends in an error litellm maps through frames that hold the request: left as a
    # cycle, every prompt of a --batch run stayed in memory until a full collection (10,000 cells: 2.8 GiB).
    import gc
    import weakref

    class Message(dict[str, Any]):
        pass  # a dict that can be watched with a weak reference

    message = Message(role="user", content="the prompt of cell C1")
    gone = weakref.ref(message)
    gc.collect()
    gc.disable()
    try:
        body = await wire_body(MODEL, {**kw("C1"), "messages": [message]}, api_base=fake_llm.base_url)
        assert body["messages"][0]["content"] == "the prompt of cell C1"
        del message
        assert gone() is None  # freed by its reference count, with no collection run
    finally:
        gc.enable()


async def test_batch_answers_equal_synchronous_answers(fake_llm: FakeOpenAI) -> None:
    import litellm

    fake_llm.handler = by_cell
    cells = [f"C{n}" for n in range(1, 31)]
    bodies = {c: await wire_body(MODEL, kw(c), api_base=fake_llm.base_url) for c in cells}
    ep = BatchEndpoint(MODEL, api_base=fake_llm.base_url)
    bid = await ep.submit([batch_line(c, bodies[c]) for c in cells])
    state = await ep.wait(bid, poll_s=0)
    assert (state.status, state.total, state.completed, state.failed) == ("completed", 30, 30, 0)
    results = await ep.results(state)
    assert sorted(results) == sorted(cells) and all(r.ok for r in results.values())
    for c in ("C1", "C17", "C30"):
        sync = await litellm.acompletion(model=MODEL, api_base=fake_llm.base_url, api_key="k", num_retries=0, **kw(c))
        raw = results[c].body
        assert raw is not None
        assert raw["choices"][0]["message"]["tool_calls"] == [
            tc.model_dump(mode="json") for tc in sync.choices[0].message.tool_calls
        ]
        assert json.loads(raw["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]) == {
            "summary": f"finding for {c}"
        }
    assert (fake_llm.batch.uploads, fake_llm.batch.created) == (1, 1)


async def test_states_walk_validating_in_progress_completed(fake_llm: FakeOpenAI) -> None:
    fake_llm.handler = auto_answer
    fake_llm.batch.plan(BatchPlan(validating_polls=2, in_progress_polls=3))
    ep = BatchEndpoint(MODEL, api_base=fake_llm.base_url)
    bid = await ep.submit([batch_line("a", {"model": "test-model", "messages": []})])
    seen: list[str] = []
    state = await ep.wait(bid, poll_s=0, on_poll=lambda s: seen.append(s.status))
    assert seen == ["validating", "validating", "in_progress", "in_progress", "in_progress", "completed"]
    assert state.output_file_id and state.error_file_id is None
    # A terminal batch stays as it is; its files can be read again (a resume reads them after a crash).
    again = await ep.retrieve(bid)
    assert again == state
    assert sorted(await ep.results(again)) == ["a"]


async def test_max_wait_returns_the_unfinished_state(fake_llm: FakeOpenAI) -> None:
    fake_llm.batch.plan(BatchPlan(validating_polls=100))
    ep = BatchEndpoint(MODEL, api_base=fake_llm.base_url)
    bid = await ep.submit([batch_line("a", {"model": "test-model", "messages": []})])
    state = await ep.wait(bid, poll_s=0, max_wait_s=0)
    assert state.status == "validating" and not state.done and await ep.results(state) == {}


async def test_item_errors_go_to_the_error_file(fake_llm: FakeOpenAI) -> None:
    fake_llm.push(answer({"n": 1}), server_error(500), answer({"n": 3}))
    ep = BatchEndpoint(MODEL, api_base=fake_llm.base_url)
    lines = [batch_line(k, {"model": "test-model", "messages": [{"role": "user", "content": k}]}) for k in "abc"]
    state = await ep.wait(await ep.submit(lines), poll_s=0)
    assert (state.status, state.completed, state.failed) == ("completed", 2, 1)
    res = await ep.results(state)
    assert [k for k, r in sorted(res.items()) if r.ok] == ["a", "c"]
    assert res["b"].status_code == 500 and res["b"].error is not None and "500" in res["b"].error["message"]


async def test_expired_batch_answers_some_and_reports_the_rest(fake_llm: FakeOpenAI) -> None:
    fake_llm.handler = auto_answer
    fake_llm.batch.plan(BatchPlan(outcome="expired", answered=2))
    ep = BatchEndpoint(MODEL, api_base=fake_llm.base_url)
    lines = [batch_line(k, {"model": "test-model", "messages": [{"role": "user", "content": k}]}) for k in "abcde"]
    state = await ep.wait(await ep.submit(lines), poll_s=0)
    assert state.status == "expired" and state.done
    res = await ep.results(state)
    assert [k for k in sorted(res) if res[k].ok] == ["a", "b"]
    assert {res[k].error["code"] for k in "cde" if res[k].error} == {"batch_expired"}
    assert len(fake_llm.requests) == 2  # the expired items never reached the model


@pytest.mark.parametrize(
    ("lines", "problem"),
    [
        ([batch_line("a", {"messages": []}), batch_line("a", {"messages": []})], "duplicate custom_id"),
        ([{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {}}], "not the batch endpoint"),
    ],
)
async def test_invalid_input_fails_validation(fake_llm: FakeOpenAI, lines: list[dict[str, Any]], problem: str) -> None:
    ep = BatchEndpoint(MODEL, api_base=fake_llm.base_url)
    state = await ep.wait(await ep.submit(lines), poll_s=0)
    assert state.status == "failed" and any(problem in e for e in state.errors)
    assert await ep.results(state) == {} and fake_llm.requests == []


def test_batch_needs_an_openai_compatible_model() -> None:
    assert provider_of("openai/gpt-4o-mini") == "openai"
    with pytest.raises(BadInput, match="OpenAI-compatible"):
        provider_of("anthropic/claude-3-5-haiku")


async def test_three_hundred_calls_go_out_as_one_batch_each_key_once(
    tmp_path: Any, fake_llm: FakeOpenAI, model_settings: Any, tiny_prompts: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 10x the demo through the client: every call reaches the batcher before it submits (no bound).
    from pydantic import BaseModel

    from pipeline.models import ModelClient, read_calls
    from pipeline.models.batch_submit import read_batches

    class Finding(BaseModel):
        summary: str

    monkeypatch.setenv("LUNASOL_BATCH_POLL_S", "0")
    (tiny_prompts / "luna.j2").write_text((tiny_prompts / "t.j2").read_text())

    def by_cell_text(request: dict[str, Any]) -> Reply:
        return answer({"summary": "about " + request["messages"][-1]["content"].split(":")[0]})(request)

    fake_llm.handler = by_cell_text
    client = ModelClient(model_settings(batch=True, concurrency=4), tmp_path)
    cells = [f"C{n:03d}" for n in range(300)]
    outs = await client.gather(
        [
            client.call(role="luna", cell_id=c, context={"cell_id": c, "text": f"e1 {c}"}, response_model=Finding)
            for c in cells
        ]
    )
    assert [o.value.summary for o in outs] == [f"about Log of {c}" for c in cells]
    (b,) = read_batches(tmp_path)
    assert len(b["keys"]) == 300 == len(set(b["keys"])) and (fake_llm.batch.created, len(fake_llm.requests)) == (1, 300)
    assert sorted(b["keys"]) == sorted(r["keys"][0] for r in read_calls(tmp_path))


async def test_a_request_arriving_during_a_flush_gets_its_own_batch_submitted_while_the_first_runs(
    tmp_path: Any, fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from pipeline.models.batch_submit import Batcher, read_batches

    monkeypatch.setenv("LUNASOL_BATCH_POLL_S", "0.02")
    fake_llm.handler = by_cell
    fake_llm.batch.plan(BatchPlan(validating_polls=10**9))  # the first batch runs until the test ends it
    b = Batcher(MODEL, tmp_path, api_base=fake_llm.base_url, timeout_s=5, log=lambda _m: None)
    first = asyncio.create_task(b.answer("k1", kw("C1")))
    while not read_batches(tmp_path):
        await asyncio.sleep(0.01)
    second = asyncio.create_task(b.answer("k2", kw("C2")))
    again = asyncio.create_task(b.answer("k1", kw("C1")))  # the same request while its batch runs: no new item
    for _ in range(1000):  # the second batch goes out while the first is still open (not after it)
        if fake_llm.batch.created == 2:
            break
        await asyncio.sleep(0.01)
    assert fake_llm.batch.created == 2 and not first.done()
    (b1,) = [x for x in read_batches(tmp_path) if x["keys"] == ["k1"]]
    fake_llm.batch.batches[b1["id"]].plan = BatchPlan(validating_polls=0, in_progress_polls=0)
    answers = [await asyncio.wait_for(t, timeout=30) for t in (first, second, again)]
    assert [json.loads(a["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]) for a in answers if a] == [
        {"summary": "finding for C1"},
        {"summary": "finding for C2"},
        {"summary": "finding for C1"},
    ]
    batches = read_batches(tmp_path)
    assert [x["keys"] for x in batches] == [["k1"], ["k2"]] and fake_llm.batch.created == 2
    assert [x["status"] for x in batches] == ["completed", "completed"]


class _Killed(Exception):
    """Stands for SIGKILL inside the process: nothing after it in the flush runs."""


@pytest.mark.parametrize("accepted", [True, False], ids=["provider-accepted", "never-reached"])
async def test_a_kill_between_asking_for_a_batch_and_storing_its_id_submits_nothing_twice(
    tmp_path: Any, fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch, accepted: bool
) -> None:
    from pipeline.models.batch_submit import Batcher, read_batches

    monkeypatch.setenv("LUNASOL_BATCH_POLL_S", "0")
    fake_llm.handler = by_cell
    fake_llm.batch.plan(BatchPlan(), BatchPlan())  # an older, unrelated batch is listed too
    other = await BatchEndpoint(MODEL, api_base=fake_llm.base_url).submit(
        [batch_line("x", {**kw("C9"), "model": "test-model"})], metadata={"lunasol_intent": "someone-else"}
    )
    first = Batcher(MODEL, tmp_path, api_base=fake_llm.base_url, timeout_s=5, log=lambda _m: None)
    real_submit = first.endpoint.submit

    async def submit_then_die(lines: list[dict[str, Any]], *, metadata: dict[str, str] | None = None) -> str:
        if accepted:
            await real_submit(lines, metadata=metadata)  # the provider has the batch; its id is lost
        raise _Killed

    monkeypatch.setattr(first.endpoint, "submit", submit_then_die)
    with pytest.raises(_Killed):
        await first.answer("k1", kw("C1"))
    (pending,) = read_batches(tmp_path)
    assert pending["id"] is None and pending["status"] == "submitting" and pending["keys"] == ["k1"]

    logs: list[str] = []
    again = Batcher(MODEL, tmp_path, api_base=fake_llm.base_url, timeout_s=5, log=logs.append)
    body = await again.answer("k1", kw("C1"))
    assert body is not None
    assert json.loads(body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]) == {
        "summary": "finding for C1"
    }
    # counted at the server: the unrelated batch plus exactly one for k1, whichever side of the kill it fell
    assert fake_llm.batch.created == 2
    (settled,) = read_batches(tmp_path)
    assert settled["id"] not in (None, other) and settled["keys"] == ["k1"] and settled["status"] == "completed"
    assert any(("found by its submission token" if accepted else "never reached the provider") in m for m in logs)


# -- the provider's batch queue (OpenAI's enqueued-token limit) ------------------------------------

OPENAI_QUEUE_FULL = (
    "Enqueued token limit reached for gpt-4o-mini in organization org-snq6hvcTYRCMyB87hjZjkoFr. "
    "Limit: 2,000,000 enqueued tokens. Please try again once some in_progress batches have been completed."
)


def test_a_queue_full_batch_states_its_limit() -> None:
    from pipeline.models.batch_api import BatchState

    full = BatchState("b1", "failed", errors=[OPENAI_QUEUE_FULL], error_codes=["token_limit_exceeded"])
    assert full.queue_full and full.queue_limit() == 2_000_000
    other = BatchState("b2", "failed", errors=["line 3 is not JSON"], error_codes=["invalid_request"])
    assert not other.queue_full and other.queue_limit() is None
    assert not BatchState("b3", "completed", error_codes=["token_limit_exceeded"]).queue_full


def _answered(body: dict[str, Any] | None) -> str:
    assert body is not None
    return str(json.loads(body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])["summary"])


def _queued(fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch, n: int) -> tuple[list[tuple[str, Any]], int]:
    """``n`` requests answered by cell with no poll wait, and what one of them weighs at the server."""
    from pipeline.testing.openai_server import request_tokens

    monkeypatch.setenv("LUNASOL_BATCH_POLL_S", "0")
    fake_llm.handler = by_cell
    requests = [(f"k{i:03d}", kw(f"C{i:03d}")) for i in range(n)]
    return requests, request_tokens({**requests[0][1], "model": "test-model"})


async def test_three_hundred_requests_fill_a_full_queue_as_room_is_made(
    tmp_path: Any, fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 10x the demo against a queue that holds about a fifth of them, its limit not told to lunasol:
    # the first refusal teaches it (from the provider's message), the rest waits for room.
    from pipeline.models import batch_submit as batching
    from pipeline.models.batch_submit import Batcher, read_batches

    monkeypatch.setattr(batching, "BATCH_MAX_REQUESTS", 40)
    requests, one = _queued(fake_llm, monkeypatch, 300)
    limit = 60 * one  # the server's count: 60 requests of 300 fit at once
    fake_llm.batch.queue_tokens = limit
    # the first batch stays in progress while the next ones validate, so they find the queue full
    fake_llm.batch.plan(BatchPlan(validating_polls=0, in_progress_polls=40))
    logs: list[str] = []
    b = Batcher(MODEL, tmp_path, api_base=fake_llm.base_url, timeout_s=5, log=logs.append)
    await b.prefetch(lambda: iter(requests))
    answers = {k: await b.answer(k, kwargs) for k, kwargs in requests}

    assert {k: _answered(a) for k, a in answers.items()} == {k: f"finding for C{k[1:]}" for k, _ in requests}
    batches = read_batches(tmp_path)
    refused = [x for x in batches if x["status"] == "failed"]
    done = [x for x in batches if x["status"] == "completed"]
    assert refused and len(refused) + len(done) == len(batches)
    assert sorted(k for x in done for k in x["keys"]) == sorted(k for k, _ in requests)  # each answered once
    assert any("queue for openai/test-model is full (its limit: " + f"{limit:,}" in m for m in logs), logs
    assert b.queue_tokens == limit and fake_llm.batch.peak_enqueued <= limit
    assert len(fake_llm.requests) == 300  # every item once at the server: nothing was asked synchronously


async def test_a_stated_queue_limit_paces_a_resumed_process_from_its_first_batch(
    tmp_path: Any, fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 10,000-cell --batch run is resumed by another process (a block, Ctrl-C, a laptop asleep); the
    # limit the provider stated to the first one is not learned again through a refused round.
    from pipeline.models import batch_submit as batching
    from pipeline.models.batch_submit import QUEUE_NAME, Batcher, read_batches, read_queue_limit

    monkeypatch.setattr(batching, "BATCH_MAX_REQUESTS", 40)
    requests, one = _queued(fake_llm, monkeypatch, 200)
    limit = 60 * one
    fake_llm.batch.queue_tokens = limit
    fake_llm.batch.plan(BatchPlan(validating_polls=0, in_progress_polls=40))
    first = Batcher(MODEL, tmp_path, api_base=fake_llm.base_url, timeout_s=5, log=lambda _m: None)
    await first.prefetch(lambda: iter(requests[:100]))
    assert any(x["status"] == "failed" for x in read_batches(tmp_path))  # refused as full: the limit was learned
    assert read_queue_limit(tmp_path, MODEL) == limit and read_queue_limit(tmp_path, "openai/other") is None

    before = len(read_batches(tmp_path))
    fake_llm.batch.plan(BatchPlan(validating_polls=0, in_progress_polls=40))
    logs: list[str] = []
    resumed = Batcher(MODEL, tmp_path, api_base=fake_llm.base_url, timeout_s=5, log=logs.append)
    assert resumed.queue_tokens == limit and f"(stated to an earlier process, {QUEUE_NAME})" in logs[0]
    await resumed.prefetch(lambda: iter(requests[100:]))
    answers = {k: await resumed.answer(k, kwargs) for k, kwargs in requests[100:]}
    assert all(_answered(a) == f"finding for C{k[1:]}" for k, a in answers.items())
    later = read_batches(tmp_path)[before:]
    assert later and {x["status"] for x in later} == {"completed"}  # paced from the first batch: none refused
    assert fake_llm.batch.peak_enqueued <= limit


async def test_a_declared_queue_limit_is_never_exceeded(
    tmp_path: Any, fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.models.batch_submit import Batcher, read_batches

    requests, one = _queued(fake_llm, monkeypatch, 120)
    limit = 25 * one
    fake_llm.batch.queue_tokens = limit
    fake_llm.batch.default_plan = BatchPlan(validating_polls=0, in_progress_polls=3)
    b = Batcher(MODEL, tmp_path, api_base=fake_llm.base_url, timeout_s=5, log=lambda _m: None, queue_tokens=limit)
    await b.prefetch(lambda: iter(requests))
    answers = {k: await b.answer(k, kwargs) for k, kwargs in requests}
    assert all(_answered(a) == f"finding for C{k[1:]}" for k, a in answers.items())
    batches = read_batches(tmp_path)
    assert {x["status"] for x in batches} == {"completed"} and len(batches) > 5  # waited for room, never refused
    assert all(x["tokens"] <= limit for x in batches)
    assert 0 < fake_llm.batch.peak_enqueued <= limit


async def test_a_failed_batch_blocks_and_asks_nothing_synchronously(
    tmp_path: Any, fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.models.batch_submit import Batcher, BatchFailed, read_batches

    monkeypatch.setenv("LUNASOL_BATCH_POLL_S", "0")
    fake_llm.handler = by_cell
    fake_llm.batch.plan(BatchPlan(outcome="failed"))
    requests = [(f"k{i}", kw(f"C{i}")) for i in range(5)]
    b = Batcher(MODEL, tmp_path, api_base=fake_llm.base_url, timeout_s=5, log=lambda _m: None)
    await b.prefetch(lambda: iter(requests))
    with pytest.raises(BatchFailed, match="failed: batch failed validation") as info:
        await b.answer("k0", requests[0][1])
    assert "5 requests were not asked synchronously" in str(info.value) and "--resume --batch" in info.value.unblock
    assert fake_llm.requests == []  # not one request went out on its own
    # a later process submits them again (the failed batch is kept in the record)
    again = Batcher(MODEL, tmp_path, api_base=fake_llm.base_url, timeout_s=5, log=lambda _m: None)
    assert await again.prefetch(lambda: iter(requests)) == 5
    assert [_answered(await again.answer(k, kwargs)) for k, kwargs in requests] == [
        f"finding for C{i}" for i in range(5)
    ]
    assert [x["status"] for x in read_batches(tmp_path)] == ["failed", "completed"]


def test_a_failed_batch_quotes_a_bounded_part_of_what_the_provider_said() -> None:
    # A file's validation can fail on every line: the block quotes the first few errors, cut, and counts the rest.
    from pipeline.models.batch_api import BatchState
    from pipeline.models.batch_submit import _failed_error

    errors = [f"line {n}: {'x' * 1000}" for n in range(1, 1001)]
    exc = _failed_error(BatchState("b1", "failed", errors=errors, error_codes=["invalid_request"] * 1000), 1000, None)
    assert "line 1: " in str(exc) and "line 3: " in str(exc) and "line 4: " not in str(exc)
    assert "(and 997 more)" in str(exc) and len(str(exc)) < 1200


async def test_a_queue_that_stays_full_blocks_naming_the_limit_flag(
    tmp_path: Any, fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Someone else's batches fill the queue: one request is more than the room left. lunasol tries
    # once more after learning the limit, then blocks rather than asking synchronously.
    from pipeline.models.batch_submit import Batcher, BatchFailed

    monkeypatch.setenv("LUNASOL_BATCH_POLL_S", "0")
    fake_llm.handler = by_cell
    fake_llm.batch.queue_tokens = 5
    requests = [(f"k{i}", kw(f"C{i}")) for i in range(3)]
    b = Batcher(MODEL, tmp_path, api_base=fake_llm.base_url, timeout_s=5, log=lambda _m: None)
    await b.prefetch(lambda: iter(requests))
    with pytest.raises(BatchFailed, match="queue stayed full") as info:
        await b.answer("k1", requests[1][1])
    assert "--batch-queue-tokens 5" in info.value.unblock and "Limit: 5 enqueued tokens" in str(info.value)
    assert fake_llm.requests == [] and fake_llm.batch.created == 4  # one batch of 3, then one per request


async def test_requests_waiting_for_room_past_the_max_wait_block_and_go_on_resume(
    tmp_path: Any, fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.models.batch_submit import Batcher, BatchPending, read_batches

    monkeypatch.setenv("LUNASOL_BATCH_MAX_WAIT_S", "0")
    requests, one = _queued(fake_llm, monkeypatch, 9)
    limit = 4 * one  # a batch of 3 at a time (lunasol's weight)
    fake_llm.batch.plan(BatchPlan(validating_polls=10**9))  # the first batch outlives the wait
    first = Batcher(MODEL, tmp_path, api_base=fake_llm.base_url, timeout_s=5, log=lambda _m: None, queue_tokens=limit)
    submitted = await first.prefetch(lambda: iter(requests))
    (b1,) = read_batches(tmp_path)
    assert submitted == len(b1["keys"]) < 9 and b1["tokens"] <= limit
    held = [k for k, _ in requests if k not in b1["keys"]]
    with pytest.raises(BatchPending, match=f"{len(held)} requests are not submitted yet"):
        await first.answer(held[0], dict(requests)[held[0]])
    with pytest.raises(BatchPending, match="not finished"):
        await first.answer(b1["keys"][0], dict(requests)[b1["keys"][0]])
    # the provider finishes; the next process collects that batch and submits the held requests, paced
    fake_llm.batch.batches[b1["id"]].plan = BatchPlan(validating_polls=0, in_progress_polls=0)
    monkeypatch.delenv("LUNASOL_BATCH_MAX_WAIT_S")
    again = Batcher(MODEL, tmp_path, api_base=fake_llm.base_url, timeout_s=5, log=lambda _m: None, queue_tokens=limit)
    assert await again.prefetch(lambda: iter(requests)) == len(held)
    assert [_answered(await again.answer(k, kw_)) for k, kw_ in requests] == [f"finding for C{i:03d}" for i in range(9)]
    batches = read_batches(tmp_path)
    assert batches[0]["id"] == b1["id"] and sorted(k for b in batches for k in b["keys"]) == sorted(dict(requests))
    assert {b["status"] for b in batches} == {"completed"} and all(b["tokens"] <= limit for b in batches)


async def test_a_proxy_refusing_at_create_paces_the_batches_too(
    tmp_path: Any, fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A LiteLLM proxy's batch_enqueued_token_limit answers the create with a 429: what this run has in
    # the queue becomes the limit, the batch goes when one ends, and no record is left without an id.
    from pipeline.models import batch_submit as batching
    from pipeline.models.batch_submit import Batcher, read_batches

    monkeypatch.setattr(batching, "BATCH_MAX_REQUESTS", 4)
    requests, one = _queued(fake_llm, monkeypatch, 16)
    fake_llm.batch.queue_tokens = 9 * one
    fake_llm.batch.refuse_at_create = True
    fake_llm.batch.default_plan = BatchPlan(validating_polls=1, in_progress_polls=30)  # outlasts two submissions
    logs: list[str] = []
    b = Batcher(MODEL, tmp_path, api_base=fake_llm.base_url, timeout_s=5, log=logs.append)
    # The SDK retries a 429 twice within a second or two, which a real batch outlasts: not here.
    auth = b.endpoint._auth
    monkeypatch.setattr(b.endpoint, "_auth", lambda: {**auth(), "max_retries": 0})
    await b.prefetch(lambda: iter(requests))
    assert [_answered(await b.answer(k, kw_)) for k, kw_ in requests] == [f"finding for C{i:03d}" for i in range(16)]
    batches = read_batches(tmp_path)
    assert all(x["id"] for x in batches) and {x["status"] for x in batches} == {"completed"}
    assert sorted(k for x in batches for k in x["keys"]) == sorted(dict(requests))
    assert any("refused a batch" in m and "at create" in m for m in logs), logs
    assert len(fake_llm.requests) == 16  # each item once, in a batch
