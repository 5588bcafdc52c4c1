"""What real providers and local servers do, through the local server (real HTTP on 127.0.0.1).

Empty 200s, missing usage, slow answers, refused keys and unknown models; the raw answer kept
before it is parsed (a kill in between never pays twice); the preflight; per-role max_tokens and
the instructor mode chosen from the provider's capabilities.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.core.context import RunOptions
from pipeline.core.errors import BadInput
from pipeline.core.settings import ModelSettings
from pipeline.luna.patterns import LunaAnswer
from pipeline.models import ModelClient, ModelUnavailable, read_calls
from pipeline.models import exchange as exchange_mod
from pipeline.models.modes import capability_mode
from pipeline.models.preflight import preflight
from pipeline.models.transport import LOADING
from pipeline.run.runner import run
from pipeline.testing.openai_server import (
    FakeOpenAI,
    Reply,
    answer,
    empty_choices,
    requiring_key,
    unauthorized,
    without_usage,
)
from tests.sol.sol_helpers import make_bundle

pytestmark = pytest.mark.usefixtures("tiny_prompts")
ROOT = Path(__file__).resolve().parents[2]


class Finding(BaseModel):
    """Small output model for tests."""

    summary: str
    event_ids: list[str]


GOOD = {"summary": "tests failed twice", "event_ids": ["C1-e1", "C1-e2"]}


async def one(client: ModelClient, cell: str = "C1", **kw: Any) -> Any:
    model = kw.pop("response_model", Finding)
    return await client.call(
        role="t", cell_id=cell, context={"cell_id": cell, "text": "e1 x"}, response_model=model, **kw
    )


# -- empty answers -------------------------------------------------------------------------------


@pytest.mark.parametrize("via", ["auto", "litellm"])  # openai SDK straight, and through litellm
@pytest.mark.parametrize("content", [False, True], ids=["no-choices", "empty-content"])
async def test_empty_answer_is_retried_like_a_5xx(
    via: str, content: bool, tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.push(lambda r: empty_choices(r, content=content), answer(GOOD))
    out = await one(ModelClient(model_settings(client=via), tmp_path / "r"))
    assert out.ok and out.value == Finding(**GOOD)
    assert len(fake_llm.requests) == 2 and out.transport_retries == 1


@pytest.mark.parametrize("via", ["auto", "litellm"])  # openai SDK straight, and through litellm
async def test_persistent_empty_answers_fail_the_call_softly_or_block(
    via: str, tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.handler = empty_choices
    client = ModelClient(model_settings(client=via, transport_retries=2, max_consecutive_failures=2), tmp_path / "r")
    soft = await one(client, soft_fail=True)  # one cell among many: that cell fails, the run goes on
    assert not soft.ok and soft.value is None and len(fake_llm.requests) == 3
    assert "no choices" in soft.errors[0]
    assert read_calls(tmp_path / "r")[-1]["outcome"] == "model_unavailable"
    with pytest.raises(ModelUnavailable, match="2 calls in a row"):  # the second in a row: provider down
        await one(client, cell="C2", soft_fail=True)
    with pytest.raises(ModelUnavailable, match="no usable answer"):  # a single call (Sol) blocks at once
        await one(ModelClient(model_settings(client=via, transport_retries=0), tmp_path / "r2"))


async def test_an_answer_that_says_nothing_is_invalid_not_ok(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.handler = answer({})  # valid JSON, no statement at all
    out = await one(ModelClient(model_settings(max_reasks=1), tmp_path / "r"), response_model=LunaAnswer)
    assert not out.ok and len(fake_llm.requests) == 2  # re-asked once, then reported
    assert "patterns" in out.errors[0] and "Field required" in out.errors[0]
    # "nothing found" must be said: an empty list without a reason is re-asked too
    fake_llm.reset()
    fake_llm.push(answer({"patterns": [], "rejected_candidates": []}))
    fake_llm.handler = answer({"patterns": [], "rejected_candidates": [], "none_reason": "one read, one write"})
    out = await one(ModelClient(model_settings(), tmp_path / "r2"), response_model=LunaAnswer)
    assert out.ok and out.attempts == 2 and "none_reason" in json.dumps(fake_llm.requests[1]["messages"])


async def test_missing_usage_is_zero_tokens_and_replays_identically(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.handler = without_usage(answer(GOOD))
    rec = await one(ModelClient(model_settings(mode="record", store=tmp_path / "s"), tmp_path / "r1"))
    rep = await one(ModelClient(model_settings(mode="replay", store=tmp_path / "s"), tmp_path / "r2"))
    assert rec.ok and rep.ok and rec.value == rep.value and rec.keys == rep.keys
    assert rec.tokens == rep.tokens


@pytest.mark.parametrize("via", ["auto", "litellm"])  # openai SDK straight, and through litellm
async def test_slow_answer_times_out_and_fails_only_that_call(
    via: str, tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.push(Reply(body=None, delay_s=1.5))
    fake_llm.handler = answer(GOOD)
    client = ModelClient(model_settings(client=via, timeout_s=0.5, transport_retries=0), tmp_path / "r")
    slow = await one(client, soft_fail=True)
    assert not slow.ok and "Timeout" in slow.errors[0]
    assert (await one(client, cell="C2", soft_fail=True)).ok  # the next cell goes on


# -- refusals --------------------------------------------------------------------------------------


def test_cli_run_with_a_refused_key_exits_2_after_one_request(
    tmp_path: Path, fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LUNASOL_PROMPTS_DIR")  # the real role templates
    monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong")
    fake_llm.handler = requiring_key(answer(GOOD), "sk-right", fake_llm.last_headers)
    bundle = make_bundle(tmp_path)
    args = ["run", str(bundle), "--runs-dir", str(tmp_path / "runs"), "--model", "openai/test-model"]
    res = CliRunner().invoke(app, [*args, "--api-base", fake_llm.base_url, "--mode", "tools", "--concurrency", "1"])
    assert res.exit_code == 2, res.output
    line = res.output.strip().splitlines()[-1]
    assert "refused the key" in line and "--resume" not in line and "Traceback" not in res.output
    assert len(fake_llm.requests) == 1  # never retried


def test_unauthorized_reply_helper_is_openai_shaped() -> None:
    reply = unauthorized()
    assert reply.status == 401 and isinstance(reply.body, dict) and reply.body["error"]["code"] == "invalid_api_key"


# -- persist first ---------------------------------------------------------------------------------


class Killed(BaseException):
    """Stands for a kill: not an Exception, so nothing on the way catches it."""


@pytest.mark.parametrize("mode", ["live", "record"])
async def test_kill_between_receipt_and_parse_never_pays_twice(
    mode: str,
    tmp_path: Path,
    fake_llm: FakeOpenAI,
    model_settings: Callable[..., ModelSettings],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_llm.handler = answer(GOOD)
    store = {"mode": "record", "store": tmp_path / "s"} if mode == "record" else {}
    real = exchange_mod.response_from

    def killed(body: dict[str, Any], **_: Any) -> Any:
        raise Killed

    monkeypatch.setattr(exchange_mod, "response_from", killed)
    with pytest.raises(Killed):
        await one(ModelClient(model_settings(**store), tmp_path / "r"))
    assert len(fake_llm.requests) == 1
    monkeypatch.setattr(exchange_mod, "response_from", real)
    out = await one(ModelClient(model_settings(**store), tmp_path / "r"))  # the resume, a new client
    assert out.ok and out.value == Finding(**GOOD)
    assert len(fake_llm.requests) == 1  # the answer already received was not paid for again
    # a finished ok call asked again is served (its artifact may never have been written) ...
    again = await one(ModelClient(model_settings(**store), tmp_path / "r"))
    assert again.ok and len(fake_llm.requests) == 1
    # ... unless the caller asks for a new answer on purpose (a redo)
    redo = await one(ModelClient(model_settings(**store), tmp_path / "r", fresh=True))
    assert redo.ok and len(fake_llm.requests) == 2


def test_sigkill_right_after_the_answer_arrived_is_resumed_without_a_new_request(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings], tiny_prompts: Path
) -> None:
    fake_llm.handler = answer(GOOD)
    script = textwrap.dedent(
        f"""
        import asyncio, os, signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        from pipeline.core.settings import ModelSettings
        from pipeline.models import ModelClient, exchange
        from tests.models.test_models_real import Finding
        exchange.response_from = lambda body, **_: os.kill(os.getpid(), signal.SIGKILL)
        settings = ModelSettings(model="openai/test-model", api_base={fake_llm.base_url!r}, instructor_mode="tools")
        client = ModelClient(settings, {str(tmp_path / "r")!r})
        asyncio.run(client.call(role="t", cell_id="C1", context={{"cell_id": "C1", "text": "e1 x"}},
                                response_model=Finding))
        """
    )
    env = {**os.environ, "LUNASOL_PROMPTS_DIR": str(tiny_prompts)}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert len(fake_llm.requests) == 1 and list((tmp_path / "r" / "exchanges").glob("*/*.json"))
    resumed = asyncio.run(one(ModelClient(model_settings(), tmp_path / "r")))
    assert resumed.ok and resumed.value == Finding(**GOOD) and len(fake_llm.requests) == 1


# -- preflight -------------------------------------------------------------------------------------


def test_preflight_no_key_or_unknown_model_exits_2_before_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    bundle = make_bundle(tmp_path)
    runs = tmp_path / "runs"
    for model, expect in (("openai/gpt-4o-mini", "OPENAI_API_KEY is not set"), ("openai/gpt-4o-mimi", "did you mean")):
        res = CliRunner().invoke(app, ["run", str(bundle), "--runs-dir", str(runs), "--model", model])
        assert res.exit_code == 2, res.output
        # one error line; "loading model client" is progress, said only when litellm is not yet imported
        lines = [ln for ln in res.output.strip().splitlines() if ln != LOADING]
        assert expect in res.output and len(lines) == 1
        assert not runs.exists() or not any(runs.iterdir())  # nothing exported, no partial run
    with pytest.raises(BadInput, match="not reachable"):
        run(
            RunOptions(
                bundle=bundle, runs_dir=runs, models=ModelSettings(model="openai/x", api_base="http://127.0.0.1:9")
            )
        )


def test_preflight_passes_replay_and_a_reachable_server(fake_llm: FakeOpenAI) -> None:
    preflight(ModelSettings(model="openai/not-a-model", mode="replay", store=Path("x")))
    preflight(ModelSettings(model="openai/my-local-model", api_base=fake_llm.base_url))  # no key: a dummy is sent


# -- settings that local servers need --------------------------------------------------------------


async def test_max_tokens_is_sent_per_role_and_can_be_left_out(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    fake_llm.handler = answer(GOOD)
    await one(ModelClient(model_settings(), tmp_path / "r1"))
    await one(ModelClient(model_settings(max_tokens=300), tmp_path / "r2"))
    await one(ModelClient(model_settings(max_tokens=0), tmp_path / "r3"))
    assert [r.get("max_tokens") for r in fake_llm.requests] == [2048, 300, None]
    assert ModelSettings().max_tokens_for("sol") == 8192 and ModelSettings().max_tokens_for("luna") == 4096


async def test_mode_follows_capabilities_and_replay_uses_the_recorded_one(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    assert capability_mode("openai/gpt-4o-mini") == "tools"
    assert capability_mode("openai/some-local-gguf") == "json"  # unknown to litellm: no tool calls assumed
    fake_llm.handler = answer(GOOD)
    auto = ModelClient(model_settings(instructor_mode=None, mode="record", store=tmp_path / "s"), tmp_path / "r")
    assert auto.instructor_mode == "json"
    assert (await one(auto)).ok
    assert "tools" not in fake_llm.requests[0] and fake_llm.requests[0]["response_format"] == {"type": "json_object"}
    replay = ModelClient(ModelSettings(mode="replay", store=tmp_path / "s"), tmp_path / "r2")
    assert replay.instructor_mode == "json" and (await one(replay)).ok


def test_timeout_and_mode_come_from_env_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LUNASOL_TIMEOUT_S", "600")
    monkeypatch.setenv("LUNASOL_INSTRUCTOR_MODE", "md_json")
    s = ModelSettings.from_env(max_tokens=100)
    assert (s.timeout_s, s.instructor_mode, s.max_tokens) == (600.0, "md_json", 100)
    with pytest.raises(BadInput, match="--mode"):
        ModelSettings.from_env(instructor_mode="grammar")


def test_live_run_says_why_it_waits_for_litellm(tmp_path: Path) -> None:
    """Before litellm's first import (seconds), a live run's log says it is loading the model client."""
    code = (
        "from pipeline.core.settings import ModelSettings\n"
        "from pipeline.models.preflight import preflight\n"
        "import sys\n"
        "seen = []\n"
        "def log(m): seen.append((m, 'litellm' in sys.modules))\n"
        "preflight(ModelSettings(model='openai/gpt-4o-mini'), log=log)\n"
        "print(seen)\n"
    )
    env = {**os.environ, "OPENAI_API_KEY": "sk-test-not-sent"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[('loading model client (litellm)…', False)]"


@pytest.mark.parametrize("via", ["auto", "litellm"])
def test_a_compatible_server_is_called_without_litellm_unless_asked_for(
    via: str, tmp_path: Path, tiny_prompts: Path
) -> None:
    """``openai/...`` + ``--api-base``: preflight only connects, and the live call goes through the openai
    SDK without importing litellm (~2.5 CPU s) or the SDK's resource modules (~0.5 s); ``client="litellm"``
    imports it, announced before it happens."""
    code = (
        "import asyncio, sys\n"
        "from pydantic import BaseModel\n"
        "from pipeline.core.settings import ModelSettings\n"
        "from pipeline.models import ModelClient\n"
        "from pipeline.models.preflight import preflight\n"
        "from pipeline.testing.openai_server import FakeOpenAI, answer\n"
        "class A(BaseModel):\n"
        "    summary: str\n"
        "seen = []\n"
        "def log(m): seen.append((m, 'litellm' in sys.modules))\n"
        "with FakeOpenAI(answer({'summary': 'ok'})) as srv:\n"
        "    s = ModelSettings(model='openai/local', api_base=srv.base_url, instructor_mode='tools',"
        f" client={via!r})\n"
        "    preflight(s, log=log)\n"
        "    print('after preflight', 'litellm' in sys.modules)\n"
        "    c = ModelClient(s, sys.argv[1], log=log)\n"
        "    out = asyncio.run(c.call(role='luna', cell_id='C1', context={'cell_id': 'C1', 'text': 'e1'},"
        " response_model=A))\n"
        "    print(out.value.summary, [x for x in seen if 'litellm' in x[0]], 'litellm' in sys.modules)\n"
        "    print(srv.requests[0]['model'], 'openai.resources' in sys.modules)\n"
    )
    (tiny_prompts / "luna.j2").write_text((tiny_prompts / "t.j2").read_text())  # the subprocess inherits the dir
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "run")],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    called = "ok [] False" if via == "auto" else "ok [('loading model client (litellm)…', False)] True"
    assert out.stdout.splitlines() == ["after preflight False", called, "local False"]  # prefix stripped (litellm)


@pytest.mark.parametrize("mode", ["tools", "json", "md_json", "json_schema"])
async def test_the_sdk_request_is_the_one_chat_completions_create_sends(
    mode: str,
    tmp_path: Path,
    fake_llm: FakeOpenAI,
    model_settings: Callable[..., ModelSettings],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The SDK path posts the body and bearer key ``chat.completions.create`` would send for the same call."""
    from openai import AsyncOpenAI

    monkeypatch.setenv("OPENAI_API_KEY", "sk-the-users-key")
    fake_llm.push(answer(GOOD), answer(GOOD))
    out = await one(ModelClient(model_settings(instructor_mode=mode), tmp_path / "r"))
    assert out.ok
    ours, our_headers = fake_llm.requests[0], fake_llm.headers[0]
    theirs = AsyncOpenAI(api_key="sk-the-users-key", base_url=fake_llm.base_url)
    await theirs.chat.completions.create(**ours)
    assert fake_llm.requests[1] == ours
    assert our_headers.get("authorization") == fake_llm.headers[1].get("authorization") == "Bearer sk-the-users-key"


def test_a_kill_mid_write_leaves_a_temp_file_the_next_run_removes(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings], tiny_prompts: Path
) -> None:
    """A SIGKILL between the temp file's write and its rename leaves ``exchanges/xx/.<key>.json.*.tmp``."""
    fake_llm.handler = answer(GOOD)
    script = textwrap.dedent(
        f"""
        import asyncio, os, signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        from pipeline.core import canonical
        from pipeline.core.settings import ModelSettings
        from pipeline.models import ModelClient
        from tests.models.test_models_real import Finding
        real = canonical._synced_temp
        def synced_then_killed(path, data):
            tmp = real(path, data)
            if path.parent.parent.name == "exchanges":
                os.kill(os.getpid(), signal.SIGKILL)
            return tmp
        canonical._synced_temp = synced_then_killed
        settings = ModelSettings(model="openai/test-model", api_base={fake_llm.base_url!r}, instructor_mode="tools")
        client = ModelClient(settings, {str(tmp_path / "r")!r})
        asyncio.run(client.call(role="t", cell_id="C1", context={{"cell_id": "C1", "text": "e1 x"}},
                                response_model=Finding))
        """
    )
    env = {**os.environ, "LUNASOL_PROMPTS_DIR": str(tiny_prompts)}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-2000:]
    exchanges = tmp_path / "r" / "exchanges"
    stray = list(exchanges.glob("*/.*.tmp"))
    assert len(stray) == 1 and not list(exchanges.glob("*/*.json"))
    ModelClient(model_settings(), tmp_path / "r")  # a write this fresh may be another process's: kept
    assert stray[0].exists()
    old = stray[0].stat().st_mtime - 60
    os.utime(stray[0], (old, old))
    resumed = asyncio.run(one(ModelClient(model_settings(), tmp_path / "r")))  # the next run
    assert resumed.ok and not list(exchanges.glob("*/.*.tmp"))
    assert len(fake_llm.requests) == 2  # the answer never reached the store: bought again, honestly
