"""Offline guarantee: importing, --help and replay never try the network.

Proved two ways: a replay in a subprocess inside a new network namespace (``unshare -rn``: only a
loopback device exists), and an audit hook in that subprocess that counts every non-loopback
lookup or connect (must be zero).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.core.settings import ModelSettings
from pipeline.models import ModelClient
from pipeline.testing.openai_server import FakeOpenAI

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import asyncio, json, sys
seen = []
def hook(event, args):
    if event == "socket.getaddrinfo" and str(args[0]) not in ("127.0.0.1", "::1", "localhost", "None"):
        seen.append(f"getaddrinfo {args[0]}")
    if event == "socket.connect" and isinstance(args[1], tuple) and args[1][0] not in ("127.0.0.1", "::1"):
        seen.append(f"connect {args[1]}")
sys.addaudithook(hook)
from pydantic import BaseModel
from pipeline.models import ModelClient
from pipeline.core.settings import ModelSettings

class F(BaseModel):
    summary: str
    event_ids: list[str]

async def main():
    c = ModelClient(ModelSettings(mode="replay", store=sys.argv[1]), sys.argv[2])
    out = await c.call(role="t", cell_id="C1", context={"cell_id": "C1", "text": "x"}, response_model=F)
    est_tokens = __import__("litellm").token_counter(model="meta-llama/Llama-3-8b", text="hello")
    print(json.dumps({"value": out.value.model_dump(), "keys": out.keys, "seen": seen, "tok": est_tokens}))
asyncio.run(main())
"""


def _unshare_works() -> str | None:
    if not shutil.which("unshare"):
        return "unshare not installed"
    probe = subprocess.run(["unshare", "-rn", "true"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"unshare -rn not permitted here: {probe.stderr.strip()}"


def _env(prompts: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LITELLM_", "HF_HUB_"))}
    env["LUNASOL_PROMPTS_DIR"] = str(prompts)  # the package itself must set the offline switches
    env["PYTHONPATH"] = str(ROOT)
    return env


async def test_replay_in_a_network_namespace(
    tmp_path: Path, tiny_prompts: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    reason = _unshare_works()
    if reason:
        pytest.skip(f"cannot prove no-network with a namespace: {reason}")
    fake_llm.push_answer({"summary": "s", "event_ids": ["C1-e1"]})
    rec = ModelClient(model_settings(mode="record", store=tmp_path / "s"), tmp_path / "r1")
    recorded = await rec.call(role="t", cell_id="C1", context={"cell_id": "C1", "text": "x"}, response_model=_model())
    proc = subprocess.run(
        ["unshare", "-rn", sys.executable, "-c", SCRIPT, str(tmp_path / "s"), str(tmp_path / "r2")],
        capture_output=True,
        text=True,
        env=_env(tiny_prompts),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["value"] == recorded.value.model_dump() and out["keys"] == recorded.keys  # type: ignore[union-attr]
    assert out["seen"] == []  # no lookup or connect beyond loopback, not even at litellm import
    assert out["tok"] > 0  # HF-tokenizer models fall back offline instead of hanging


def _model() -> type:
    from pydantic import BaseModel

    class F(BaseModel):
        summary: str
        event_ids: list[str]

    return F


def test_help_in_a_network_namespace(tmp_path: Path) -> None:
    reason = _unshare_works()
    if reason:
        pytest.skip(f"cannot prove no-network with a namespace: {reason}")
    proc = subprocess.run(
        ["unshare", "-rn", sys.executable, "-c", "from pipeline.cli.app import main; main()", "calls", "--help"],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        timeout=60,
    )
    assert proc.returncode == 0 and "Usage: lunasol calls" in proc.stdout, proc.stderr


def test_import_loads_no_litellm_and_changes_no_environment() -> None:
    """Importing lunasol (CLI and catalog included) loads neither litellm nor instructor (3+ s) and sets
    no env var: the offline switches wait for litellm's own load."""
    code = (
        "import os, sys; before = dict(os.environ); import pipeline.cli.app, pipeline.catalog, pipeline.models;"
        "print(sorted(m for m in ('litellm', 'instructor') if m in sys.modules), dict(os.environ) == before,"
        " 'LITELLM_OFFLINE_MODE' in os.environ)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(ROOT), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["[]", "True", "False"]


def test_the_cli_loads_no_stage_until_a_verb_runs() -> None:
    """`lunasol --help` stays fast: the verbs import the library (DuckDB, Arrow, the stages) when they run."""
    heavy = ("duckdb", "pyarrow", "jinja2", "yaml", "pipeline.run.runner", "pipeline.ir.export", "pipeline.report")
    code = f"import sys, pipeline.cli.app; print([m for m in {heavy!r} if m in sys.modules])"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(ROOT), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_litellm_is_loaded_with_the_offline_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.models.transport import load_litellm

    for var in ("LITELLM_OFFLINE_MODE", "LITELLM_LOCAL_MODEL_COST_MAP", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    load_litellm()
    assert (os.environ["LITELLM_OFFLINE_MODE"], os.environ["HF_HUB_OFFLINE"]) == ("true", "1")


LIVE_SCRIPT = r"""
import asyncio, json, sys
from pydantic import BaseModel
from pipeline.core.settings import ModelSettings
from pipeline.models import ModelClient

class F(BaseModel):
    summary: str
    event_ids: list[str]

async def main():
    settings = ModelSettings(model="openai/test-model", api_base=sys.argv[1], mode="live", timeout_s=5.0,
                             transport_retries=0, instructor_mode="tools")
    out = await ModelClient(settings, sys.argv[2]).call(
        role="t", cell_id="C1", context={"cell_id": "C1", "text": "x"}, response_model=F)
    import openai
    print(json.dumps({"value": out.value.model_dump(), "loaded": sorted(m for m in ("aiohttp", "httpx", "litellm")
                      if m in sys.modules), "marker": "openai._vendor.httpx_aiohttp" in sys.modules,
                      "aiohttp_client": openai.DefaultAioHttpClient.__name__}))
asyncio.run(main())
"""


def test_a_live_sdk_call_loads_neither_aiohttp_nor_httpx(
    tmp_path: Path, tiny_prompts: Path, fake_llm: FakeOpenAI
) -> None:
    """A live call to an OpenAI-compatible server imports the openai SDK without its aiohttp transport and
    sends through httpx2 (~0.3 CPU s of imports a one-cell rerun no longer pays); the answer is unchanged."""
    fake_llm.push_answer({"summary": "s", "event_ids": ["C1-e1"]})
    proc = subprocess.run(
        [sys.executable, "-c", LIVE_SCRIPT, fake_llm.base_url, str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env=_env(tiny_prompts),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["value"] == {"summary": "s", "event_ids": ["C1-e1"]}
    assert got["loaded"] == [] and got["marker"] is False
    assert got["aiohttp_client"] == "_MissingAioHttpClient"  # the SDK's own "no aiohttp extra" stand-in


def test_load_openai_keeps_the_aiohttp_transport_once_aiohttp_is_loaded() -> None:
    """With aiohttp already imported (litellm's path loads it), the SDK is imported as it is, transport and all."""
    code = (
        "import sys, aiohttp; from pipeline.models.transport import load_openai; openai = load_openai();"
        "print(openai.DefaultAioHttpClient.__name__, 'openai._vendor.httpx_aiohttp' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(ROOT), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["_InstalledAioHttpClient", "True"]
