"""``runs/<id>/run.json``: what a run was made from (bundle, models, templates, versions).

Two writers share the file: the export (:mod:`pipeline.ir.export`: bundle, digest, IR counts) and
the runner (:mod:`pipeline.run.runner`: ``inputs``). Each updates its own keys and keeps the rest, so
the model allows extra keys; every known key is optional because a run directory may hold only
the export's part (``lunasol export``) or only the runner's.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

RUN_SCHEMA_VERSION = 1


class ExportSummary(BaseModel):
    """What the export stage wrote."""

    model_config = ConfigDict(extra="allow")

    cells_in: int | None = None
    cells_excluded: int | None = None
    events: int | None = None
    ir: str | None = Field(default=None, description="the IR file, relative to the run")
    ir_schema_version: int | None = None


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


class RunInputs(BaseModel):
    """Everything a run's answers depend on."""

    model_config = ConfigDict(extra="allow")

    bundle_path: str | None = Field(default=None, description="the bundle as the user typed it")
    bundle_digest: str | None = None
    models: ModelInputs | None = None
    templates: dict[str, str | None] = Field(default_factory=dict, description="role -> template hash")
    versions: dict[str, str] = Field(default_factory=dict, description="library -> version")


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
