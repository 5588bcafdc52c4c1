"""``runs/<id>/run.json``: what a run was made from (bundle, models, templates, versions).

Two writers share the file: the export (:mod:`pipeline.ir.export`: bundle, digest, IR counts) and
the runner (:mod:`pipeline.run.runner`: ``inputs``). Each updates its own keys and keeps the rest, so
the model allows extra keys; every known key is optional because a run directory may hold only
the export's part (``lunasol export``) or only the runner's.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from pipeline.artifacts.versions import VERSIONS
from pipeline.core.canonical import read_json
from pipeline.core.settings import ModelSettings
from pipeline.core.urls import RESUME_API_BASE, is_shown

RUN_SCHEMA_VERSION = VERSIONS["run"]
DEFAULT_CONCURRENCY = ModelSettings.model_fields["concurrency"].default
_FROM_ENV = "\x00api-base-from-env"  # placeholder swapped for RESUME_API_BASE after quoting


class ExportSummary(BaseModel):
    """What the export stage wrote."""

    model_config = ConfigDict(extra="allow")

    cells_in: int | None = None
    cells_excluded: int | None = None
    events: int | None = None
    ir: str | None = Field(default=None, description="the IR file, relative to the run")
    ir_schema_version: int | None = None
    redacted: bool | None = Field(
        default=None, description="false: exported with --no-redact, secrets left in the IR's text (absent: redacted)"
    )


class ModelInputs(BaseModel):
    """The model settings of the run (never a key: providers read those from env)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    api_base: str | None = None
    mode: str | None = Field(default=None, description="live, record or replay")
    store: str | None = Field(default=None, description="the recording store (record / replay)")
    temperature: float | None = None
    max_reasks: int | None = None
    concurrency: int | None = None
    budget_usd: float | None = None
    instructor_mode: str | None = Field(default=None, description="tools, json_schema, json, md_json (None: auto)")
    max_tokens: int | None = Field(default=None, description="answer bound for every role (None: per-role default)")
    context_tokens: int | None = Field(default=None, description="--context-tokens / LUNASOL_CONTEXT_TOKENS")
    batch: bool | None = Field(default=None, description="--batch / LUNASOL_BATCH (absent when off)")
    timeout_s: float | None = Field(default=None, description="--timeout / LUNASOL_TIMEOUT_S (absent when the default)")


class RunInputs(BaseModel):
    """Everything a run's answers depend on."""

    model_config = ConfigDict(extra="allow")

    bundle_path: str | None = Field(default=None, description="the bundle as the user typed it")
    bundle_digest: str | None = None
    models: ModelInputs | None = None
    templates: dict[str, str | None] = Field(default_factory=dict, description="role -> template hash")
    versions: dict[str, str] = Field(default_factory=dict, description="library -> version")
    probes_dir: str | None = Field(default=None, description="--probes: the folder of the user's probes")
    probes: list[dict[str, str]] | None = Field(
        default=None, description="the user's probes (--probes): probe_id, path and sha256 of each file"
    )


class RunInfo(BaseModel):
    """The whole ``run.json``."""

    model_config = ConfigDict(extra="allow")

    schema_version: int = RUN_SCHEMA_VERSION
    run_id: str | None = None
    bundle: str | None = Field(default=None, description="the bundle, relative to the run directory")
    bundle_digest: str | None = Field(default=None, description="sha256 of the bundle's manifest.json")
    analysis_run_id: str | None = None
    parent_harness: str | None = None
    lunasol_version: str | None = None
    export: ExportSummary | None = None
    inputs: RunInputs | None = None


def made_unredacted(run_dir: Path) -> bool:
    """Whether the run's IR was exported with ``--no-redact`` (run.json ``export.redacted`` is false)."""
    path = Path(run_dir) / "run.json"
    raw = read_json(path) if path.is_file() else None
    exported = raw.get("export") if isinstance(raw, dict) else None
    return isinstance(exported, dict) and exported.get("redacted") is False


def run_command(run_dir: Path, *, resume: bool = True) -> str:
    """The exact ``lunasol run`` command that continues this run (from run.json)."""
    bundle = "BUNDLE"
    models: dict[str, Any] = {}
    inputs: dict[str, Any] = {}
    run_json = run_dir / "run.json"
    if run_json.is_file():
        raw = read_json(run_json)
        if isinstance(raw, dict):
            inputs = raw.get("inputs", {})
            given = inputs.get("bundle_path")
            if given and Path(given).is_dir():
                bundle = str(given)  # as the user typed it, still valid from here
            elif isinstance(raw.get("bundle"), str):
                bundle = str((run_dir / raw["bundle"]).resolve())  # export stores it relative to the run
            elif given:
                bundle = str(given)
            models = inputs.get("models") or {}
    parts = ["lunasol", "run", bundle, "--run-id", run_dir.name, "--runs-dir", str(run_dir.parent)]
    if models.get("model"):
        parts += ["--model", str(models["model"])]
    api_base = models.get("api_base")
    if api_base:
        # kept without its credentials: the shell takes the whole URL from the env (pipeline.core.urls)
        parts += ["--api-base", _FROM_ENV if is_shown(api_base) else str(api_base)]
    if models.get("mode") in ("replay", "record") and models.get("store"):
        parts += [f"--{models['mode']}", str(models["store"])]
    if inputs.get("probes_dir"):
        parts += ["--probes", str(inputs["probes_dir"])]
    if models.get("context_tokens"):
        parts += ["--context-tokens", str(models["context_tokens"])]
    # The settings a local server needs and the replay key holds: a resume without them would send
    # other requests (mode, max_tokens: new keys, answers paid again) or time out (a CPU server).
    if models.get("instructor_mode") and models.get("mode") != "replay":  # replay: the store's mode
        parts += ["--mode", str(models["instructor_mode"])]
    if models.get("max_tokens") is not None:
        parts += ["--max-tokens", str(models["max_tokens"])]
    if models.get("timeout_s"):
        parts += ["--timeout", f"{float(models['timeout_s']):g}"]
    if models.get("concurrency") and models["concurrency"] != DEFAULT_CONCURRENCY:
        parts += ["--concurrency", str(models["concurrency"])]
    if models.get("batch"):
        parts.append("--batch")
    if models.get("batch_queue_tokens"):
        parts += ["--batch-queue-tokens", str(models["batch_queue_tokens"])]
    if made_unredacted(run_dir):
        parts.append("--no-redact")  # continuing without it would re-export the run redacted
    if resume:
        parts.append("--resume")
    return shlex.join(parts).replace(shlex.quote(_FROM_ENV), RESUME_API_BASE)


def analysis_run_id(run_dir: Path) -> str:
    """The analysis run id frozen in the bundle's request (run.json ``analysis_run_id``, written by export).

    Prompts and artifacts name this id, never the run directory: the folder is the user's choice
    (``--run-id``, ``--runs-dir``) and must not change a replay key or an artifact's bytes. A run
    without one (an IR made elsewhere) falls back to the directory name.
    """
    path = Path(run_dir) / "run.json"
    raw = read_json(path) if path.is_file() else None
    value = raw.get("analysis_run_id") if isinstance(raw, dict) else None
    return value if isinstance(value, str) and value else Path(run_dir).name
