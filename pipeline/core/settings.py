"""Run and model settings: flags override env vars (LUNASOL_*), which override defaults."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.core.errors import BadInput

Mode = Literal["live", "record", "replay"]


class ModelSettings(BaseModel):
    """How model calls are made. Provider keys come from the providers' usual env vars, never from here."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(default=None, description="litellm model string, e.g. openai/gpt-4o-mini")
    api_base: str | None = Field(default=None, description="OpenAI-compatible base URL")
    mode: Mode | None = Field(default=None, description="live, record or replay; None = live when a model is set")
    store: Path | None = Field(default=None, description="recording directory for record / replay")
    concurrency: int = Field(default=8, ge=1)
    budget_usd: float | None = Field(default=None, ge=0)
    budget_tokens: int | None = Field(default=None, ge=0)
    temperature: float = 0.0
    max_reasks: int = Field(default=2, ge=0, description="validation re-asks after the first answer")
    transport_retries: int = Field(default=4, ge=0, description="retries of rate limits, timeouts, 5xx")
    timeout_s: float = Field(default=120.0, gt=0)

    @classmethod
    def from_env(cls, **overrides: object) -> ModelSettings:
        """Build settings from LUNASOL_* env vars, then non-None overrides (flags)."""
        env: dict[str, object] = {}
        for field, var in (
            ("model", "LUNASOL_MODEL"),
            ("api_base", "LUNASOL_API_BASE"),
            ("concurrency", "LUNASOL_CONCURRENCY"),
            ("budget_usd", "LUNASOL_BUDGET_USD"),
            ("budget_tokens", "LUNASOL_BUDGET_TOKENS"),
        ):
            if os.environ.get(var):
                env[field] = os.environ[var]
        given = {k: v for k, v in overrides.items() if v is not None}
        source = {k: f"LUNASOL_{k.upper()}" for k in env}
        source.update({k: "--" + k.replace("_", "-") for k in given})
        env.update(given)
        try:
            settings = cls.model_validate(env)
        except ValidationError as exc:
            # A flag or env var out of range is bad input: one line naming it, never a traceback.
            e = exc.errors()[0]
            field = str(e["loc"][0]) if e.get("loc") else "settings"
            raise BadInput(f"invalid {source.get(field, field)}: {e['msg']} (got {e.get('input')!r})") from None
        _check_consistent(settings, source)
        return settings

    def effective_mode(self) -> Mode:
        """Live when a model is given and no mode was chosen."""
        return self.mode or "live"


def _check_consistent(settings: ModelSettings, source: dict[str, str]) -> None:
    # Without it a typo in the URL surfaces as a block after every retry of every cell.
    if settings.api_base and not settings.api_base.startswith(("http://", "https://")):
        flag = source.get("api_base", "--api-base")
        raise BadInput(f"invalid {flag}: expected an http:// or https:// URL, got {settings.api_base!r}")
