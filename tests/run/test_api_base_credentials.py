"""An ``--api-base`` with credentials in it (``https://user:pw@proxy/v1``) works, and no artifact keeps them.

run.json keeps the URL with the credential marked (pipeline.core.urls); the commands lunasol prints
take the whole URL from ``LUNASOL_API_BASE``; ``propose`` and ``status --poll`` read it from there too.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx2
import openai
import pytest

from pipeline.artifacts.run_info import run_command
from pipeline.core.canonical import read_json
from pipeline.core.context import RunOptions
from pipeline.core.errors import BadInput
from pipeline.core.settings import ModelSettings
from pipeline.core.urls import PASSWORD_MARK
from pipeline.models.batch_submit import BATCHES_NAME
from pipeline.models.preflight import check_reachable
from pipeline.models.transport import describe, refusal
from pipeline.proposals.proposer import run_model_settings
from pipeline.report.build import write_report
from pipeline.run import status as status_mod
from pipeline.run.runner import run
from pipeline.testing.openai_server import FakeOpenAI, recordings_handler
from tests.conftest import DEMO_BUNDLE, DEMO_RECORDINGS

SECRET = "s3cret-pw-4711"

pytestmark = pytest.mark.skipif(not any(DEMO_RECORDINGS.glob("*/*.json")), reason="demo recordings absent")


@pytest.fixture(scope="module")
def credentialed_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """The demo run live to gate 1 through ``http://lunasol:SECRET@127.0.0.1:PORT/v1``."""
    root = tmp_path_factory.mktemp("cred")
    with FakeOpenAI(recordings_handler(DEMO_RECORDINGS)) as srv:
        url = srv.base_url.replace("http://", f"http://lunasol:{SECRET}@", 1)
        models = ModelSettings(
            model="openai/fixture-model", api_base=url, mode="record", store=root / "rec", instructor_mode="tools"
        )
        result = run(RunOptions(bundle=DEMO_BUNDLE, runs_dir=root / "runs", models=models), log=lambda _m: None)
        assert srv.requests, "the run reached the server through the credentialed URL"
    yield result.ctx.run_dir, url


def test_no_file_of_the_run_or_its_recording_holds_the_credential(credentialed_run: tuple[Path, str]) -> None:
    run_dir, url = credentialed_run
    page, _ = write_report(run_dir)  # the page shows run.json's inputs: the marked URL, if any
    assert page.is_file()
    files = [p for d in (run_dir, run_dir.parent.parent / "rec") for p in d.rglob("*") if p.is_file()]
    assert len(files) > 10
    assert [p for p in files if SECRET.encode() in p.read_bytes()] == []
    kept = read_json(run_dir / "run.json")["inputs"]["models"]["api_base"]
    assert kept == url.replace(SECRET, PASSWORD_MARK)


def test_the_printed_command_takes_the_url_from_the_env(credentialed_run: tuple[Path, str]) -> None:
    run_dir, url = credentialed_run
    cmd = run_command(run_dir)
    assert SECRET not in cmd and "${LUNASOL_API_BASE:?" in cmd
    # what a shell passes for it: the env's URL, or nothing at all (it stops and says what to set)
    words = shlex.split(cmd)
    assert words[words.index("--api-base") + 1].startswith("${LUNASOL_API_BASE:?")
    echo = ["bash", "-c", "printf '%s\\n' " + cmd.removeprefix("lunasol ")]
    given = subprocess.run(echo, env={"LUNASOL_API_BASE": url}, capture_output=True, text=True, check=True)
    args = given.stdout.splitlines()
    assert args[args.index("--api-base") + 1] == url
    unset = subprocess.run(echo, env={}, capture_output=True, text=True)
    assert unset.returncode != 0 and "LUNASOL_API_BASE: set it to the --api-base of this run" in unset.stderr


def test_propose_takes_the_url_from_the_flag_or_the_env_never_the_kept_one(
    credentialed_run: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir, url = credentialed_run
    monkeypatch.delenv("LUNASOL_API_BASE", raising=False)
    with pytest.raises(BadInput, match=r"without its credentials .*pass --api-base URL or set LUNASOL_API_BASE"):
        run_model_settings(run_dir, mode="record", store=run_dir / "p-rec")
    assert run_model_settings(run_dir, api_base=url).api_base == url
    monkeypatch.setenv("LUNASOL_API_BASE", url)
    assert run_model_settings(run_dir).api_base == url
    monkeypatch.delenv("LUNASOL_API_BASE")
    assert run_model_settings(run_dir, mode="replay", store=DEMO_RECORDINGS).mode == "replay"  # no URL needed


def test_error_lines_name_the_url_without_its_credential() -> None:
    url = f"http://lunasol:{SECRET}@127.0.0.1:9/v1"  # the discard port: nothing listens on loopback
    with pytest.raises(BadInput) as unreachable:
        check_reachable(url)
    assert "is not reachable" in str(unreachable.value) and SECRET not in str(unreachable.value)
    response = httpx2.Response(401, request=httpx2.Request("POST", url), json={"error": {"message": "bad key"}})
    refused = refusal(openai.AuthenticationError("bad key", response=response, body=None), "openai/m", url)
    assert refused is not None and "refused the key" in str(refused)
    assert SECRET not in str(refused) and PASSWORD_MARK in str(refused)
    # a provider's own message naming the URL (litellm's connection errors do) is one line without it too
    line = describe(openai.APIConnectionError(message=f"Cannot connect to {url}", request=response.request))
    assert line.startswith("APIConnectionError: Cannot connect to http://lunasol:") and SECRET not in line
    # and a key the provider echoes back (some OpenAI-compatible servers do) is marked as in the logs
    key = "sk-proj-" + "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z" * 2
    echoed = describe(openai.AuthenticationError(f"Incorrect API key provided: {key}", response=response, body=None))
    assert key not in echoed and "[REDACTED:openai-key]" in echoed


def test_status_poll_asks_the_provider_at_the_env_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"https://lunasol:{SECRET}@proxy.example/v1"
    models = {"model": "openai/m", "api_base": url.replace(SECRET, PASSWORD_MARK)}
    (tmp_path / "run.json").write_text(json.dumps({"inputs": {"models": models}}), encoding="utf-8")
    batch = {"id": "batch_1", "keys": ["k1", "k2"], "status": "in_progress"}
    (tmp_path / BATCHES_NAME).write_text(json.dumps({"batches": [batch]}), encoding="utf-8")
    asked: list[str | None] = []

    class Endpoint:  # the provider's batch endpoint, as status uses it
        def __init__(self, model: str, *, api_base: str | None = None) -> None:
            asked.append(api_base)

        async def retrieve(self, batch_id: str) -> Any:
            return SimpleNamespace(status="in_progress", completed=1, total=2)

    monkeypatch.setattr(status_mod, "BatchEndpoint", Endpoint)
    monkeypatch.delenv("LUNASOL_API_BASE", raising=False)
    with pytest.raises(BadInput, match="without its credentials"):
        status_mod.batch_rows(tmp_path, poll=True)
    assert asked == []
    monkeypatch.setenv("LUNASOL_API_BASE", url)
    (row,) = status_mod.batch_rows(tmp_path, poll=True)
    assert asked == [url] and row["provider"] == {"status": "in_progress", "completed": 1, "total": 2}
