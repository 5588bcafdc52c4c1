"""How the answer is asked for (the instructor mode), chosen from what the provider can do.

The mode is part of every replay key, so it is resolved once per client: ``--mode`` /
``LUNASOL_INSTRUCTOR_MODE`` when given; in replay, the mode the store was recorded with; else
from litellm's capability map: tool calls when the model supports function calling, else
``json_schema`` when it supports response schemas, else plain ``json`` (a JSON object asked for in
the prompt, which every OpenAI-compatible server can answer: Ollama, vLLM, llama.cpp). For
``openai/<name>`` with an ``--api-base`` the server's own answer comes first: the mode a probe of
that server chose (:mod:`pipeline.models.servermodes`, cached by the preflight of a live run).
"""

from __future__ import annotations

from pipeline.core.errors import BadInput
from pipeline.core.settings import ModelSettings
from pipeline.models import modelmap, servermodes
from pipeline.models.store import RecordingStore
from pipeline.models.transport import load_litellm

INSTRUCTOR_MODES = {"tools": "TOOLS", "json": "JSON", "md_json": "MD_JSON", "json_schema": "JSON_SCHEMA"}
"""Our mode names -> instructor.Mode member names."""


def recorded_modes(store: RecordingStore) -> set[str]:
    """The instructor modes found in a store's recordings."""
    return store.instructor_modes()


def capability_mode(model: str) -> str:
    """The mode litellm's capability map suggests for ``model`` (json when it knows nothing)."""
    if modelmap.lookup(model) is None:
        return "json"  # a model litellm's map does not know claims no capability (asked without importing it)
    litellm = load_litellm()
    for mode, probe in (("tools", "supports_function_calling"), ("json_schema", "supports_response_schema")):
        try:
            if getattr(litellm, probe)(model=model):
                return mode
        except Exception:  # litellm raises for a model it does not know: no capability claimed
            continue
    return "json"


def resolve_mode(settings: ModelSettings, model: str | None, store: RecordingStore | None) -> str:
    """The instructor mode of a client (see the module docstring)."""
    if settings.instructor_mode:
        return settings.instructor_mode
    if store is not None and store.mode == "replay":
        modes = recorded_modes(store)
        if len(modes) > 1:
            raise BadInput(f"replay store {store.root} holds several instructor modes ({', '.join(sorted(modes))})")
        return next(iter(modes)) if modes else "tools"
    if model and settings.api_base and model.startswith(modelmap.PREFIX):
        probed = servermodes.chosen(settings.api_base, model)
        if probed is not None:
            return probed
    return capability_mode(model) if model else "tools"
