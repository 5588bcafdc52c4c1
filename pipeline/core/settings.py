"""Run and model settings: flags override env vars (LUNASOL_*), which override config files, then defaults.

Config files: see :mod:`pipeline.core.config` (``lunasol.toml``, ``[tool.lunasol]`` in ``pyproject.toml``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.core import config, roles
from pipeline.core.errors import BadInput

Mode = Literal["live", "record", "replay"]
InstructorMode = Literal["tools", "json_schema", "json", "md_json"]
Client = Literal["auto", "litellm"]

FLAGS = {"timeout_s": "--timeout", "instructor_mode": "--mode"}  # fields whose flag is not --<field>


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
    context_tokens: int | None = Field(
        default=None, gt=0, description="the model's input limit in tokens (local / unknown models); default: litellm's"
    )
    temperature: float = 0.0
    max_reasks: int = Field(default=2, ge=0, description="validation re-asks after the first answer")
    transport_retries: int = Field(default=4, ge=0, description="retries of rate limits, timeouts, 5xx")
    timeout_s: float = Field(default=120.0, gt=0, description="per HTTP request (--timeout, LUNASOL_TIMEOUT_S)")
    max_tokens: int | None = Field(
        default=None, ge=0, description="answer bound for every role (None: per-role default; 0: send none)"
    )
    instructor_mode: InstructorMode | None = Field(
        default=None, description="how the answer is asked for; None: from the provider's capabilities (or the store)"
    )
    max_consecutive_failures: int = Field(
        default=3, ge=1, description="cells failing on transport in a row before the run blocks (provider down)"
    )
    batch: bool = Field(default=False, description="send Luna's per-cell calls as one provider batch (--batch)")
    batch_queue_tokens: int | None = Field(
        default=None,
        gt=0,
        description="the model's batch queue limit in tokens (OpenAI's enqueued-token limit of your tier): "
        "--batch keeps at most this many enqueued; default: learned from the first batch the provider refuses as full",
    )
    client: Client = Field(
        default="auto",
        description="library that sends live calls: auto = the openai SDK for openai/<name> with --api-base "
        "(an OpenAI-compatible server; no litellm import), litellm for every other model; litellm = always litellm",
    )

    @classmethod
    def from_env(cls, **overrides: object) -> ModelSettings:
        """Build settings from the config files, then LUNASOL_* env vars, then non-None overrides (flags)."""
        return cls.resolve(None, **overrides)[0]

    @classmethod
    def resolve(cls, cwd: Path | None = None, **overrides: object) -> tuple[ModelSettings, dict[str, str]]:
        """The effective settings and, per field, where its value came from (flag, env var, file, default)."""
        fields = set(cls.model_fields)
        merged, source = config.file_values(fields, cwd)
        env, env_source = config.env_values(fields)
        merged.update(env)
        source.update(env_source)
        given = {k: v for k, v in overrides.items() if v is not None}
        merged.update(given)
        source.update({k: FLAGS.get(k, "--" + k.replace("_", "-")) for k in given})
        try:
            settings = cls.model_validate(merged)
        except ValidationError as exc:
            # A flag, env var or file value out of range is bad input: one line naming it, never a traceback.
            e = exc.errors()[0]
            field = str(e["loc"][0]) if e.get("loc") else "settings"
            where = source.get(field, field)
            what = f"{field} in {where}" if where.endswith(("toml", "]")) else where
            raise BadInput(f"invalid {what}: {e['msg']} (got {e.get('input')!r})") from None
        _check_consistent(settings, source)
        return settings, {f: source.get(f, "default") for f in sorted(fields)}

    def effective_mode(self) -> Mode:
        """Live when a model is given and no mode was chosen."""
        return self.mode or "live"

    def max_tokens_for(self, role: str) -> int | None:
        """``max_tokens`` sent for a role (None: send none)."""
        if self.max_tokens is not None:
            return self.max_tokens or None
        spec = roles.BY_NAME.get(role)
        return spec.max_tokens if spec else roles.DEFAULT_MAX_TOKENS


def _check_consistent(settings: ModelSettings, source: dict[str, str]) -> None:
    # Without it a typo in the URL surfaces as a block after every retry of every cell.
    if settings.api_base and not settings.api_base.startswith(("http://", "https://")):
        flag = source.get("api_base", "--api-base")
        raise BadInput(f"invalid {flag}: expected an http:// or https:// URL, got {settings.api_base!r}")
