"""Preflight: before any work, check that a live (or record) run can call its model at all.

Without it a missing key or a mistyped model surfaces only at the first model stage, after the
export and the probes, as retries and a block that suggests repeating the same command. Checked
here, each is one line and exit 2:

* the model resolves to a litellm provider, and litellm knows the model, unless an ``--api-base``
  (a server of your own, which names its models) or a context size (``context_tokens``) is given;
  an unknown model comes with the closest known name;
* the key env var the provider needs is set (not needed for an OpenAI-compatible ``--api-base``,
  which gets a dummy key);
* an ``--api-base`` accepts a TCP connection; for ``openai/<name>`` with an ``--api-base`` this is
  the whole check, made without importing litellm, plus, when no ``--mode`` is given, which
  structured-output modes that server accepts (:mod:`pipeline.models.servermodes`: three tiny
  requests, cached per server for a day), so the default mode is one it answers in.
"""

from __future__ import annotations

import difflib
import socket
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from pipeline.core.errors import BadInput
from pipeline.core.settings import ModelSettings
from pipeline.core.urls import shown_url
from pipeline.models import fleet, modelmap, servermodes
from pipeline.models.transport import load_litellm

CONNECT_TIMEOUT_S = 3.0


def preflight(settings: ModelSettings, log: Callable[[str], None] | None = None) -> None:
    """Raise :class:`BadInput` (one line) when a live or record run could not call its model; replay passes.

    ``log`` hears "loading model client (litellm)…" before litellm's first import (seconds).
    """
    if settings.effective_mode() == "replay" or not settings.model:
        return
    model = settings.model
    if fleet.is_fleet(settings.api_base):
        check_fleet(settings)
        if model.startswith(modelmap.PREFIX):
            return
    if model.startswith(modelmap.PREFIX) and settings.api_base:
        # An OpenAI-compatible server of your own: litellm's answer is fixed (provider openai, the
        # server names its models, a dummy key), so only reachability is checked, and a run whose
        # cells are all unchanged never pays litellm's import (seconds) for a call it will not make.
        check_reachable(settings.api_base)
        if settings.instructor_mode is None and servermodes.read(settings.api_base, model) is None:
            found = servermodes.probe(settings.api_base, model, settings.timeout_s)
            if log is not None:
                log(servermodes.describe(found))
        return
    litellm = load_litellm(announce=log)
    try:
        _, provider, _, _ = litellm.get_llm_provider(model=model, api_base=settings.api_base)
    except Exception:  # litellm raises BadRequestError-like errors for an unknown provider prefix
        raise BadInput(
            f"unknown model {model!r}: litellm knows no provider for it{_close_match(litellm, model)} "
            "(model strings are provider/model, e.g. openai/gpt-4o-mini)"
        ) from None
    known = _known(litellm, model, str(provider))
    if not known and not settings.api_base and not getattr(settings, "context_tokens", None):
        raise BadInput(
            f"unknown model {model!r}: not in litellm's model list{_close_match(litellm, model, str(provider))}; "
            "for a model served by your own server pass --api-base URL"
        )
    if settings.api_base and not fleet.is_fleet(settings.api_base):
        check_reachable(settings.api_base)
    if not (settings.api_base and provider == "openai"):  # a compatible server gets a dummy key
        missing = _missing_keys(litellm, model)
        if missing:
            raise BadInput(
                f"{' or '.join(missing)} is not set: provider {provider} needs it for {model} "
                f"(export {missing[0]}=..., never stored); or use --replay DIR"
            )


def check_fleet(settings: ModelSettings) -> None:
    """A fleet (several ``--api-base`` endpoints): every entry a URL, one at least reachable, no ``--batch``."""
    eps = fleet.endpoints(settings.api_base)
    if settings.batch:
        raise BadInput("--batch sends one provider batch to one endpoint: give a single --api-base with --batch")
    refused: list[str] = []
    for e in eps:
        try:
            check_reachable(e.url)
        except BadInput as exc:
            refused.append(str(exc))
    if len(refused) == len(eps):
        raise BadInput(f"no endpoint of --api-base is reachable: {refused[0]}")


def check_reachable(api_base: str) -> None:
    """One TCP connection to the ``--api-base`` host; refused or unresolvable is bad input."""
    parts = urlsplit(api_base)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise BadInput(
            f"--api-base {shown_url(api_base)} is not reachable ({exc.strerror or exc}); "
            "start the server or fix the URL"
        ) from None


def _known(litellm: Any, model: str, provider: str) -> bool:
    cost = getattr(litellm, "model_cost", {}) or {}
    bare = model.split("/", 1)[1] if "/" in model else model
    return model in cost or (bare in cost and cost[bare].get("litellm_provider", provider) == provider)


def _close_match(litellm: Any, model: str, provider: str | None = None) -> str:
    cost: dict[str, Any] = getattr(litellm, "model_cost", {}) or {}
    if provider:
        bare = model.split("/", 1)[1] if "/" in model else model
        names = [k for k, v in cost.items() if isinstance(v, dict) and v.get("litellm_provider") == provider]
        found = difflib.get_close_matches(bare, names, n=1, cutoff=0.75)
        return f" (did you mean {provider}/{found[0]}?)" if found else ""
    found = difflib.get_close_matches(model, list(cost), n=1, cutoff=0.75)
    return f" (did you mean {found[0]}?)" if found else ""


def _missing_keys(litellm: Any, model: str) -> list[str]:
    try:
        env = litellm.validate_environment(model=model)
    except Exception:  # litellm cannot tell for this provider: the first call will say
        return []
    if env.get("keys_in_environment", True):
        return []
    return [str(k) for k in env.get("missing_keys") or []]
