"""Recording store: key semantics, file content, and serving recordings from an OpenAI-compatible server."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from pipeline.core.errors import BadInput
from pipeline.core.settings import ModelSettings
from pipeline.models import ModelClient, RecordingStore, canonical_request, request_key
from pipeline.models.store import check_record
from pipeline.testing.openai_server import FakeOpenAI, raw_answer, serve_recordings

BASE: dict[str, Any] = {
    "model": "openai/m",
    "messages": [{"role": "user", "content": "hi"}],
    "tools": [{"type": "function", "function": {"name": "X", "parameters": {"type": "object"}}}],
    "tool_choice": {"type": "function", "function": {"name": "X"}},
    "temperature": 0.0,
}


def key(**changes: Any) -> str:
    return request_key(canonical_request({**BASE, **changes}, changes.pop("_mode", "tools")))


def test_key_ignores_endpoint_secrets_and_transport() -> None:
    same = key(api_base="http://a", api_key="sk-1", timeout=3, num_retries=0, max_retries=0, client=object())
    assert same == key() and same.startswith("sha256:")


@pytest.mark.parametrize(
    "change",
    [
        {"model": "openai/other"},
        {"messages": [{"role": "user", "content": "hi!"}]},
        {"temperature": 0.7},
        {"top_p": 0.5},
        {"max_tokens": 10},
        {"seed": 1},
        {"tools": [{"type": "function", "function": {"name": "Y", "parameters": {"type": "object"}}}]},
        {"response_format": {"type": "json_object"}},
    ],
)
def test_key_changes_with_what_changes_the_answer(change: dict[str, Any]) -> None:
    assert key(**change) != key()


def test_key_includes_instructor_mode() -> None:
    assert request_key(canonical_request(BASE, "tools")) != request_key(canonical_request(BASE, "json"))


def test_key_is_independent_of_dict_order() -> None:
    reordered = dict(reversed(list(BASE.items())))
    assert request_key(canonical_request(reordered, "tools")) == key()


def test_newer_schema_version_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="schema_version 99"):
        check_record({"schema_version": 99, "response": {}}, tmp_path / "x.json")
    with pytest.raises(BadInput, match="not a lunasol recording"):
        check_record([], tmp_path / "x.json")


def test_store_layout_and_unused(tmp_path: Path) -> None:
    store = RecordingStore(tmp_path, "replay")
    k = key()
    path = store.path_for(k)
    assert path == tmp_path / k[7:9] / f"{k[7:]}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"key": k, "response": {}, "model": "openai/m"}))
    assert store.keys() == [k] and store.unused() == [k] and store.models() == {"openai/m"}
    assert store.load(k) is not None and store.unused() == []


class Verdict(BaseModel):
    """Small output model."""

    label: str
    score: int


async def test_recordings_are_servable_by_an_openai_compatible_server(
    tmp_path: Path, tiny_prompts: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.push(raw_answer('{"label": "x"}'))  # schema-invalid first: a re-ask is recorded too
    fake_llm.handler = raw_answer('{"label": "ok", "score": 3}')
    rec = ModelClient(model_settings(mode="record", store=tmp_path / "s"), tmp_path / "r1")
    contexts = [{"cell_id": c, "text": f"log of {c}"} for c in ("C1", "C2")]
    recorded = [await rec.call(role="t", cell_id=c["cell_id"], context=c, response_model=Verdict) for c in contexts]
    assert [o.attempts for o in recorded] == [2, 1]

    # A plain live client against a server that only knows the recordings: same answers, same keys.
    with serve_recordings(tmp_path / "s") as server:
        live_settings = ModelSettings(model="openai/test-model", api_base=server.base_url, instructor_mode="tools")
        live = ModelClient(live_settings, tmp_path / "r2")
        served = [await live.call(role="t", cell_id=c["cell_id"], context=c, response_model=Verdict) for c in contexts]
        assert len(server.requests) == 3
    assert [o.value for o in served] == [o.value for o in recorded]
    assert [o.keys for o in served] == [o.keys for o in recorded]
    assert [o.tokens for o in served] == [o.tokens for o in recorded]


async def test_server_command_line_serves_recordings(
    tmp_path: Path, tiny_prompts: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    import subprocess
    import sys

    fake_llm.handler = raw_answer('{"label": "cli", "score": 7}')
    ctx = {"cell_id": "C1", "text": "x"}
    rec = ModelClient(model_settings(mode="record", store=tmp_path / "s"), tmp_path / "r1")
    await rec.call(role="t", cell_id="C1", context=ctx, response_model=Verdict)
    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "pipeline.testing.openai_server", "--port", "0", "--recordings", str(tmp_path / "s")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=root)
    try:
        assert proc.stdout is not None
        base = proc.stdout.readline().split()[-1]
        live = ModelClient(
            ModelSettings(model="openai/test-model", api_base=base, instructor_mode="tools"), tmp_path / "r2"
        )
        out = await live.call(role="t", cell_id="C1", context=ctx, response_model=Verdict)
        assert out.value == Verdict(label="cli", score=7)
        # a request that was never recorded gets a 404, which is not retried: one configuration error
        from pipeline.models.errors import ModelRefused

        with pytest.raises(ModelRefused, match="no recording matches"):
            await live.call(role="t", cell_id="C2", context={"cell_id": "C2", "text": "y"}, response_model=Verdict)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_resolve_settings_fills_model_for_replay(tmp_path: Path) -> None:
    from pipeline.models import resolve_settings

    k = key()
    store = RecordingStore(tmp_path, "replay")
    store.path_for(k).parent.mkdir(parents=True)
    store.path_for(k).write_text(json.dumps({"key": k, "response": {}, "model": "openai/m"}))
    assert resolve_settings(ModelSettings(mode="replay", store=tmp_path)).model == "openai/m"
    assert resolve_settings(ModelSettings(mode="replay", store=tmp_path, model="openai/x")).model == "openai/x"
    assert resolve_settings(ModelSettings(model=None)).model is None  # live: nothing to infer
    with pytest.raises(BadInput, match="replay store not found"):
        resolve_settings(ModelSettings(mode="replay", store=tmp_path / "nope"))
