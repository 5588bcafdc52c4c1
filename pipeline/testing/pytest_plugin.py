"""pytest fixtures for model calls through a real local server (litellm -> HTTP -> 127.0.0.1).

* ``fake_llm``: a :class:`~pipeline.testing.openai_server.FakeOpenAI` shared by the session,
  reset (empty script, no handler, no recorded requests) for every test.
* ``model_settings``: a factory of :class:`~pipeline.core.settings.ModelSettings` pointing at ``fake_llm``
  (model ``openai/test-model``, short timeout, zero retry waits come from LUNASOL_TEST_NO_WAIT).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pipeline.core import offline
from pipeline.core.settings import ModelSettings
from pipeline.testing.openai_server import FakeOpenAI

offline.apply()  # the plugin loads before any test module imports litellm


@pytest.fixture(scope="session")
def _fake_llm_server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def fake_llm(_fake_llm_server: FakeOpenAI) -> Iterator[FakeOpenAI]:
    """The session's local OpenAI-compatible server with a fresh script for this test."""
    _fake_llm_server.reset()
    yield _fake_llm_server
    _fake_llm_server.reset()


@pytest.fixture
def model_settings(fake_llm: FakeOpenAI) -> Callable[..., ModelSettings]:
    """``model_settings(**overrides)``: settings that talk to ``fake_llm`` (override mode/store/budget...)."""

    def make(**overrides: Any) -> ModelSettings:
        base: dict[str, Any] = {
            "model": "openai/test-model",
            "api_base": fake_llm.base_url,
            "timeout_s": 5.0,
            "transport_retries": 4,
            "max_reasks": 2,
            # tests script tool calls; the automatic choice (json for a model litellm does not know) has its own tests
            "instructor_mode": "tools",
        }
        base.update(overrides)
        return ModelSettings(**base)

    return make


TINY_TEMPLATE = (
    "{% block system %}You extract facts from cell {{ cell_id }}.{% endblock %}\n"
    "{% block user %}Log of {{ cell_id }}:\n{{ text }}{% endblock %}\n"
)


@pytest.fixture
def tiny_prompts(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A prompts dir with role ``t`` (context: cell_id, text), selected via LUNASOL_PROMPTS_DIR."""
    d = tmp_path_factory.mktemp("prompts")
    (d / "t.j2").write_text(TINY_TEMPLATE, encoding="utf-8")
    monkeypatch.setenv("LUNASOL_PROMPTS_DIR", str(d))
    return d
