"""Diagnoses that name the cause, through the local server: a rejected request format, an answer cut at
max_tokens, a call's own latency apart from its queue time, progress in requests, and the mode a server takes.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from pipeline.core.errors import EXIT_BAD_INPUT, BadInput
from pipeline.models import ModelClient, servermodes
from pipeline.models.calllog import read_calls
from pipeline.models.errors import AnswerTruncated, ModelUnavailable
from pipeline.models.modes import resolve_mode
from pipeline.models.preflight import preflight
from pipeline.models.progress import Tally
from pipeline.testing.openai_server import FakeOpenAI, Reply, auto_answer, completion_body


class Fact(BaseModel):
    fact: str


def rejects_json_schema(request: dict[str, Any]) -> Reply:
    """llama-cpp-python's answer to a json_schema response format: an HTTP 500 naming it (as measured)."""
    fmt = request.get("response_format") or {}
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        return Reply(status=500, body={"error": {"message": "response_format.type must be text or json_object"}})
    return auto_answer(request)


def call(client: ModelClient, cell: str = "C001", *, soft: bool = False) -> Any:
    return client.call(
        role="t", cell_id=cell, context={"cell_id": cell, "text": "x"}, response_model=Fact, soft_fail=soft
    )


def test_a_rejected_request_format_is_a_configuration_error_not_retried(
    fake_llm: FakeOpenAI, model_settings: Any, tiny_prompts: Path, tmp_path: Path
) -> None:
    fake_llm.handler = rejects_json_schema
    settings = model_settings(model="openai/local", instructor_mode=None, transport_retries=4)
    servermodes.probe(settings.api_base, "openai/local")  # what the preflight of a live run does
    probed = len(fake_llm.requests)
    assert resolve_mode(settings, "openai/local", None) == "tools"  # chosen from the server's answers
    forced = settings.model_copy(update={"instructor_mode": "json_schema"})
    client = ModelClient(forced, tmp_path)
    with pytest.raises(BadInput) as err:
        asyncio.run(call(client))
    assert err.value.exit_code == EXIT_BAD_INPUT
    assert len(fake_llm.requests) == probed + 1  # one request: a format the server refuses is never retried
    line = err.value.one_line()
    assert "--mode json_schema" in line and "this server accepts --mode tools or --mode json" in line
    assert "provider down" not in line
    assert servermodes.read(settings.api_base, "openai/local") is None  # the server changed: probed again


LLAMA_CPP_PYTHON_500 = (  # the body llama-cpp-python 0.3.36 sent for a json_schema response format (probe, live)
    "{'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), "
    "'msg': \"Input should be 'text' or 'json_object'\", 'input': 'json_schema'}"
)


def test_llama_cpp_pythons_own_500_is_a_format_rejection(
    fake_llm: FakeOpenAI, model_settings: Any, tiny_prompts: Path, tmp_path: Path
) -> None:
    fake_llm.handler = lambda _r: Reply(
        status=500, body={"error": {"message": "1 validation error:\n " + LLAMA_CPP_PYTHON_500}}
    )
    client = ModelClient(model_settings(instructor_mode="json_schema"), tmp_path)
    with pytest.raises(BadInput, match="rejected the request format of --mode json_schema"):
        asyncio.run(call(client))
    assert len(fake_llm.requests) == 1


def test_a_format_rejection_without_a_probe_still_names_the_mode(
    fake_llm: FakeOpenAI, model_settings: Any, tiny_prompts: Path, tmp_path: Path
) -> None:
    fake_llm.handler = rejects_json_schema
    client = ModelClient(model_settings(instructor_mode="json_schema"), tmp_path)
    with pytest.raises(BadInput, match=r"rejected the request format of --mode json_schema.*pass another --mode"):
        asyncio.run(call(client))
    assert len(fake_llm.requests) == 1


def test_a_plain_500_is_still_retried(
    fake_llm: FakeOpenAI, model_settings: Any, tiny_prompts: Path, tmp_path: Path
) -> None:
    fake_llm.push(Reply(status=500, body={"error": {"message": "internal error"}}))
    fake_llm.handler = auto_answer
    client = ModelClient(model_settings(), tmp_path)
    out = asyncio.run(call(client))
    assert out.ok and out.transport_retries == 1


def cut_at_max_tokens(request: dict[str, Any]) -> Reply:
    body = completion_body(request, tool_arguments='{"fact": "the answer was cu')
    body["choices"][0]["finish_reason"] = "length"
    return Reply(body=body)


def test_an_answer_cut_at_max_tokens_says_so_and_the_unblock_raises_it(
    fake_llm: FakeOpenAI, model_settings: Any, tiny_prompts: Path, tmp_path: Path
) -> None:
    fake_llm.handler = cut_at_max_tokens
    client = ModelClient(model_settings(max_tokens=1024), tmp_path)
    with pytest.raises(AnswerTruncated) as err:
        asyncio.run(call(client))
    assert "cut at max_tokens=1024" in err.value.one_line() and "finish_reason length" in err.value.one_line()
    assert "--max-tokens 2048" in err.value.unblock


def test_cells_cut_in_a_row_block_on_max_tokens_not_on_the_provider(
    fake_llm: FakeOpenAI, model_settings: Any, tiny_prompts: Path, tmp_path: Path
) -> None:
    fake_llm.handler = cut_at_max_tokens
    client = ModelClient(model_settings(max_tokens=512, max_consecutive_failures=3), tmp_path)

    async def many() -> list[Any]:
        return [await call(client, f"C00{i}", soft=True) for i in range(1, 4)]

    with pytest.raises(ModelUnavailable) as err:
        asyncio.run(many())
    assert isinstance(err.value, AnswerTruncated)
    assert "3 calls in a row ran out of max_tokens" in err.value.one_line()
    assert "provider down" not in err.value.one_line()
    assert "--max-tokens 1024" in err.value.unblock


def test_latency_is_the_calls_own_time_and_queue_time_is_apart(
    fake_llm: FakeOpenAI, model_settings: Any, tiny_prompts: Path, tmp_path: Path
) -> None:
    fake_llm.handler = auto_answer
    fake_llm.delay_s = 0.3
    client = ModelClient(model_settings(concurrency=1), tmp_path)

    async def three() -> list[Any]:
        return list(await asyncio.gather(*(call(client, f"C00{i}") for i in range(1, 4))))

    started = time.perf_counter()
    outs = asyncio.run(three())
    wall_ms = (time.perf_counter() - started) * 1000
    assert all(o.ok for o in outs)
    rows = read_calls(tmp_path)
    assert len(rows) == 3
    # one at a time: the three calls' own times add up to the wall time, not to 1 + 2 + 3 delays
    assert sum(r["latency_ms"] for r in rows) <= wall_ms + 50
    assert all(250 <= r["latency_ms"] < 900 for r in rows)
    assert max(r["queue_ms"] for r in rows) >= 500  # the last one waited for the two before it
    assert client.request_counts() == (3, 0, 0)


def test_progress_counts_requests_as_well_as_cells() -> None:
    tally = Tally(1, "luna", None, None, requests=lambda: (29, 1, 3))
    line = tally.line()
    assert "luna: 0/1" in line and "requests 29 done, 1 sent, 3 queued" in line


def test_the_preflight_asks_the_server_once_which_modes_it_takes(
    fake_llm: FakeOpenAI, model_settings: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LUNASOL_CACHE_DIR", str(tmp_path / "cache"))

    def tools_unsupported(request: dict[str, Any]) -> Reply:  # Ollama without a tool-capable template
        if request.get("tools"):
            return Reply(status=400, body={"error": {"message": "model does not support tools"}})
        fmt = request.get("response_format") or {}
        if fmt.get("type") == "json_schema":
            return Reply(body=completion_body(request, content=json.dumps({"ok": True})))
        return Reply(body=completion_body(request, content="Yes, 2 is greater than 1."))  # prose: not in shape

    fake_llm.handler = tools_unsupported
    settings = model_settings(model="openai/small", instructor_mode=None)
    told: list[str] = []
    preflight(settings, told.append)
    assert len(fake_llm.requests) == 3
    assert told == [
        f"server modes at {fake_llm.base_url}: tools HTTP 400, json_schema in shape, json accepted; "
        "default --mode json_schema"
    ]
    assert resolve_mode(settings, "openai/small", None) == "json_schema"
    preflight(settings, told.append)  # cached: not asked again
    assert len(fake_llm.requests) == 3
    # a --mode given, or replay, never probes
    preflight(settings.model_copy(update={"model": "openai/other", "instructor_mode": "json"}))
    preflight(settings.model_copy(update={"model": "openai/other", "mode": "replay"}))
    assert len(fake_llm.requests) == 3
    # a URL's credentials never reach the cache (its file is named by a digest, the URL shown masked)
    secret = fake_llm.base_url.replace("http://", "http://me:s3cr3t-pw@")
    servermodes.probe(secret, "openai/small")
    assert all("s3cr3t-pw" not in f.read_text() for f in (tmp_path / "cache").rglob("*.json"))


def test_the_answer_bound_sent_fits_the_room_a_small_context_keeps(
    fake_llm: FakeOpenAI, model_settings: Any, tiny_prompts: Path, tmp_path: Path
) -> None:
    fake_llm.handler = auto_answer
    small = ModelClient(model_settings(context_tokens=8192), tmp_path / "a")
    assert small.max_tokens("luna") == 2048  # the role's 4,096 would pass the context beside a full prompt
    asyncio.run(call(small))
    assert fake_llm.requests[-1]["max_tokens"] == 2048
    assert ModelClient(model_settings(), tmp_path / "b").max_tokens("luna") == 4096  # no context given: unchanged
    assert ModelClient(model_settings(context_tokens=8192, max_tokens=3000), tmp_path / "c").max_tokens("luna") == 3000


def test_a_tool_call_torn_at_max_tokens_is_a_cut_answer_even_without_finish_reason_length(
    fake_llm: FakeOpenAI, model_settings: Any, tiny_prompts: Path, tmp_path: Path
) -> None:
    # llama-cpp-python 0.3.36, live: finish_reason "tool_calls", 384 of 384 tokens, the JSON torn mid-string
    def torn(request: dict[str, Any]) -> Reply:
        return Reply(body=completion_body(request, tool_arguments='{"fact": "no, no, no, no', usage=(900, 384)))

    fake_llm.handler = torn
    client = ModelClient(model_settings(max_tokens=384, max_reasks=0), tmp_path)
    with pytest.raises(AnswerTruncated, match="cut at max_tokens=384"):
        asyncio.run(call(client))
    fake_llm.handler = lambda r: Reply(body=completion_body(r, tool_arguments='{"fact": "no', usage=(900, 20)))
    out = asyncio.run(call(ModelClient(model_settings(max_tokens=384, max_reasks=0), tmp_path / "b")))
    assert not out.ok  # torn JSON well under the bound: an invalid answer, not a cut one
