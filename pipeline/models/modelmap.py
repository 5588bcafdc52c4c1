"""litellm's bundled model map and token counter, read without importing litellm (replay start-up).

Importing litellm costs seconds; a replay needs from it only a model's context limits, its price
and a token count. This module answers those from the same data litellm uses offline: its bundled
``model_prices_and_context_window_backup.json`` (found through the installed distribution's
metadata, never by importing it) and tiktoken's ``cl100k_base`` from litellm's bundled tokenizer
folder. It answers only where the answer is plainly litellm's: models named ``openai/<name>``
(OpenAI and every OpenAI-compatible server), looked up by exact key, priced when the entry has
plain per-token rates, and "unknown" when no key of the map shares the name's first word.
Anything else returns :data:`ASK`, and the caller asks litellm itself.
``tests/models/test_models_modelmap.py`` compares every answer with litellm's, entry by entry.
"""

from __future__ import annotations

import functools
import json
import os
import re
from importlib import metadata
from pathlib import Path
from typing import Any, Final

from pipeline.core import offline

ASK: Final = "ask litellm"
"""Returned when this module cannot be sure of litellm's answer."""

PREFIX = "openai/"
_MAP_FILE = "litellm/model_prices_and_context_window_backup.json"
_TOKENIZERS = "litellm/litellm_core_utils/tokenizers"
_PLAIN_COSTS = frozenset({"input_cost_per_token", "output_cost_per_token"})
# Cost keys that do not change a price computed from prompt and completion tokens alone.
_UNUSED_COSTS = re.compile(r"^(cache_(read|creation)_input(_audio)?_token_cost|.*_batches|.*_flex|.*_priority)$")
_WORD = re.compile(r"[A-Za-z]+|\d+")


def _litellm_file(relative: str) -> Path | None:
    try:
        path = Path(str(metadata.distribution("litellm").locate_file(relative)))
    except metadata.PackageNotFoundError:  # pragma: no cover - litellm is a dependency
        return None
    return path if path.exists() else None


@functools.cache
def bundled_map() -> dict[str, Any]:
    """The bundled model map of litellm (empty when it cannot be found: then every answer is :data:`ASK`)."""
    offline.apply()  # the switches that make litellm read this bundled map, as load_litellm sets them
    path = _litellm_file(_MAP_FILE)
    local = os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP", "").lower() == "true"
    if path is None or not (local or os.environ.get("LITELLM_OFFLINE_MODE", "").lower() == "true"):
        return {}  # litellm would read another map (a remote one): only litellm knows its answer
    data = json.loads(path.read_bytes())
    return data if isinstance(data, dict) else {}


@functools.cache
def _first_words() -> frozenset[str]:
    words = set()
    for key in bundled_map():
        for part in key.lower().split("/"):
            m = _WORD.match(part)
            if m:
                words.add(m.group(0))
    return frozenset(words)


def lookup(model: str) -> dict[str, Any] | str | None:
    """The map's entry for ``model``, None when litellm does not know it, or :data:`ASK`."""
    table = bundled_map()
    if not table or not model.startswith(PREFIX):
        return ASK
    name = model[len(PREFIX) :]
    entry = table.get(model)
    if not isinstance(entry, dict):
        entry = table.get(name)
        if not (isinstance(entry, dict) and entry.get("litellm_provider") == "openai"):
            entry = None
    if entry is not None:
        return entry if entry.get("mode") in (None, "chat", "responses") else ASK
    first = _WORD.match(name.lower())
    # litellm also resolves aliases, dated versions and wildcards: a name sharing a first word
    # with any key of the map might be one of them.
    if first is None or first.group(0) in _first_words():
        return ASK
    return None


def limits(model: str) -> tuple[int | None, int | None, str | None] | str:
    """(max input tokens, max output tokens, litellm provider) as litellm's ``get_model_info`` gives them."""
    entry = lookup(model)
    if not isinstance(entry, dict):
        return (None, None, None) if entry is None else ASK
    max_in = entry.get("max_input_tokens") or entry.get("max_tokens")
    max_out = entry.get("max_output_tokens")
    return (
        int(max_in) if max_in else None,
        int(max_out) if max_out else None,
        str(entry.get("litellm_provider") or "") or None,
    )


def price(model: str, prompt_tokens: int, completion_tokens: int) -> float | str | None:
    """USD for these tokens as litellm's ``cost_per_token`` sums them, None when it has no price, or :data:`ASK`."""
    entry = lookup(model)
    if not isinstance(entry, dict):
        return None if entry is None else ASK
    costs = {k for k in entry if "cost" in k}
    if not costs >= _PLAIN_COSTS or any(not _UNUSED_COSTS.match(k) for k in costs - _PLAIN_COSTS):
        return ASK  # tiers, images, audio...: litellm's own arithmetic
    prompt = prompt_tokens * float(entry["input_cost_per_token"])
    completion = completion_tokens * float(entry["output_cost_per_token"])
    return prompt + completion


@functools.cache
def _encoding() -> Any:
    # tiktoken loads only to count a request too large for the byte bound (see budget.request_tokens).
    folder = os.environ.get("CUSTOM_TIKTOKEN_CACHE_DIR") or _litellm_file(_TOKENIZERS)
    if folder is not None:
        # litellm points tiktoken at its bundled files the same way: no download, ever.
        os.environ["TIKTOKEN_CACHE_DIR"] = str(folder)
    from pipeline.models import tokenizer  # tiktoken with it: only when a count needs it

    return tokenizer.encoding(Path(folder) if folder is not None else None)


def count_tokens(text: str) -> int:
    """Tokens of ``text`` as ``litellm.encode(model="gpt-4o", text=...)`` counts them (cl100k_base)."""
    return len(_encoding().encode(text, disallowed_special=()))
