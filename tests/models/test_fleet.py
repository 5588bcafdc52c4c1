"""A fleet of endpoints (``--api-base A,B``): litellm's Router spreads the calls; a dead endpoint loses no cell.

The demo runs live (record mode) against two local OpenAI-compatible servers answering from the
demo's recordings; one of them dies after a few requests (it stops listening and drops every open
connection). Every cell still finishes, both servers answered, and the recorded exchanges carry the
same keys as the demo's own recordings (which a single endpoint made): no key names an endpoint.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.context import RunOptions
from pipeline.core.errors import BadInput
from pipeline.core.settings import ModelSettings
from pipeline.core.urls import PASSWORD_MARK, shown_url
from pipeline.models.fleet import Endpoint, endpoints, is_fleet, total_concurrency
from pipeline.models.preflight import preflight
from pipeline.run.runner import run
from pipeline.testing.openai_server import FakeOpenAI, Reply, recordings_handler
from tests.conftest import DEMO_BUNDLE, DEMO_RECORDINGS


def test_endpoints_parse_a_comma_list_with_per_endpoint_bounds() -> None:
    got = endpoints("http://a:1/v1#3, https://b/v1")
    assert got == [Endpoint("http://a:1/v1", 3), Endpoint("https://b/v1", None)]
    assert is_fleet("http://a:1/v1,http://b/v1") and is_fleet("http://a/v1#2") and not is_fleet("http://a/v1")
    assert total_concurrency("http://a:1/v1#3,http://b/v1", 8) == 11
    with pytest.raises(BadInput, match="positive number"):
        endpoints("http://a/v1#0")
    with pytest.raises(BadInput, match="expected an http"):
        endpoints("http://a/v1,ftp://b")


def test_a_fleet_url_list_keeps_no_credential_of_any_endpoint() -> None:
    shown = shown_url("http://u:pw1@a/v1,http://v:pw2@b/v1")
    assert "pw1" not in shown and "pw2" not in shown and shown.count(PASSWORD_MARK) == 2


def test_preflight_needs_one_reachable_endpoint_and_no_batch() -> None:
    with FakeOpenAI() as srv:
        dead = "http://127.0.0.1:9/v1"  # discard port: nothing listens
        preflight(ModelSettings(model="openai/m", api_base=f"{dead},{srv.base_url}"))  # one is enough
        with pytest.raises(BadInput, match="--batch"):
            preflight(ModelSettings(model="openai/m", api_base=f"{dead},{srv.base_url}", batch=True))
    with pytest.raises(BadInput, match="no endpoint of --api-base is reachable"):
        preflight(ModelSettings(model="openai/m", api_base="http://127.0.0.1:9/v1,http://127.0.0.1:9/v2"))


class DiesAfter:
    """Answers from the demo's recordings, then, at its ``n``-th request, the server dies for good."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.served = 0
        self.server: FakeOpenAI | None = None
        self.lock = threading.Lock()
        self.inner = recordings_handler(DEMO_RECORDINGS)

    def __call__(self, request: dict[str, Any]) -> Reply:
        with self.lock:
            self.served += 1
            dead = self.served > self.n
            if self.served == self.n + 1 and self.server is not None:
                threading.Thread(target=self.server.stop, daemon=True).start()  # no new connection either
        return Reply(drop=True) if dead else self.inner(request)


@pytest.mark.skipif(not any(DEMO_RECORDINGS.glob("*/*.json")), reason="demo recordings absent")
def test_the_demo_survives_an_endpoint_dying_mid_run(tmp_path: Path) -> None:
    dies = DiesAfter(4)
    with FakeOpenAI(dies) as a, FakeOpenAI(recordings_handler(DEMO_RECORDINGS)) as b:
        dies.server = a
        models = ModelSettings(
            model="openai/fixture-model",
            api_base=f"{a.base_url}#2,{b.base_url}#4",
            mode="record",
            store=tmp_path / "rec",
            instructor_mode="tools",
        )
        result = run(RunOptions(bundle=DEMO_BUNDLE, runs_dir=tmp_path / "runs", models=models), log=lambda _m: None)
        answered_by_b = len(b.requests)
        hosts = [u.removeprefix("http://").removesuffix("/v1") for u in (a.base_url, b.base_url)]
    assert dies.served > dies.n, "the first endpoint died during the run"
    assert answered_by_b > 0
    assert a.max_in_flight <= 2 and b.max_in_flight <= 4  # each endpoint's own bound
    run_dir = result.ctx.run_dir
    assert (run_dir / "weakness-shortlist.json").is_file()  # Sol ran: gate 1 reached
    calls = (run_dir / "calls.jsonl").read_text(encoding="utf-8")
    assert '"failed"' not in calls and '"outcome": "error"' not in calls
    recorded = {p.relative_to(tmp_path / "rec").as_posix() for p in (tmp_path / "rec").glob("*/*.json")}
    demo = {p.relative_to(DEMO_RECORDINGS).as_posix() for p in DEMO_RECORDINGS.glob("*/*.json")}
    assert recorded and recorded <= demo  # the keys of a single endpoint's recording: none names an endpoint
    for path in (tmp_path / "rec").rglob("*.json"):  # nor does any recorded exchange
        text = path.read_text(encoding="utf-8")
        assert not [h for h in hosts if h in text], path
