"""``runs/<id>/run.json``: what a run was made from (bundle, models, templates, versions).

Two writers share the file: the export (:mod:`pipeline.ir.export`: bundle, digest, IR counts) and
the runner (:mod:`pipeline.run.runner`: ``inputs``). Each updates its own keys and keeps the rest, so
the model allows extra keys; every known key is optional because a run directory may hold only
the export's part (``lunasol export``) or only the runner's.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from pipeline.artifacts.rundir import RUN, RunDir
from pipeline.artifacts.versions import VERSIONS
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


def _shell_quoted(text: str) -> str:
    # SQL holds single quotes: double quotes read better, and the shell takes them as they are
    if "'" in text and not any(c in text for c in '"$`\\!'):
        return f'"{text}"'
    return shlex.quote(text)


class Pilot(BaseModel):
    """A pilot run (``--where SQL`` and/or ``--sample N --seed S``): which cells it took, of how many.

    Everything counted over eligible cells in such a run (Luna's cells, coverage, Sol's denominator
    and support, the report's rates) is over the ``selected`` cells only; the rest of the IR is kept.
    """

    model_config = ConfigDict(extra="forbid")

    where: str | None = Field(default=None, description="--where: the SQL filter over the eligible cells")
    sample: int | None = Field(default=None, description="--sample: how many of the matching cells were drawn")
    seed: int | None = Field(default=None, description="--seed of the draw (with --sample)")
    eligible: int = Field(description="eligible cells of the bundle, before the selection")
    matched: int = Field(description="eligible cells the filter matched (all eligible without --where)")
    selected: int = Field(description="cells this pilot analysed: the denominator of every rate")
    note: str | None = Field(default=None, description="e.g. --sample larger than the matching cells: all taken")

    def flags(self) -> str:
        """The selection as ``lunasol run`` options."""
        bits = [f"--where {_shell_quoted(self.where)}"] if self.where is not None else []
        if self.sample is not None:
            bits.append(f"--sample {self.sample} --seed {self.seed if self.seed is not None else 0}")
        return " ".join(bits)

    def label(self) -> str:
        """One line that says what a pilot is, wherever its results are shown."""
        head = f"PILOT: {self.selected} of {self.eligible} eligible cells ({self.flags()})"
        if self.selected >= self.eligible:  # e.g. --sample larger than the batch: said, not hidden
            return f"{head}; that is every eligible cell"
        return f"{head}; every rate and Sol's support are over these {self.selected} cells, not the whole batch"


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
    pilot: Pilot | None = Field(default=None, description="a pilot run's selection (absent: every eligible cell)")


def read_run_info(run_dir: Path) -> RunInfo:
    """``run.json`` typed and migrated (empty when the run has none yet); a broken file is one BadInput line."""
    return RunDir(run_dir).load(RUN, RunInfo) or RunInfo()


def run_pilot(run_dir: Path) -> Pilot | None:
    """The run's pilot selection (None: a full run)."""
    return read_run_info(run_dir).pilot


def made_unredacted(run_dir: Path) -> bool:
    """Whether the run's IR was exported with ``--no-redact`` (run.json ``export.redacted`` is false)."""
    exported = read_run_info(run_dir).export
    return exported is not None and exported.redacted is False


def run_command(run_dir: Path, *, resume: bool = True) -> str:
    """The exact ``lunasol run`` command that continues this run (from run.json)."""
    info = read_run_info(run_dir)
    inputs = info.inputs or RunInputs()
    models = inputs.models or ModelInputs()
    bundle = "BUNDLE"
    given = inputs.bundle_path
    if given and Path(given).is_dir():
        bundle = str(given)  # as the user typed it, still valid from here
    elif info.bundle is not None:
        bundle = str((run_dir / info.bundle).resolve())  # export stores it relative to the run
    elif given:
        bundle = str(given)
    parts = ["lunasol", "run", bundle, "--run-id", run_dir.name, "--runs-dir", str(run_dir.parent)]
    if models.model:
        parts += ["--model", str(models.model)]
    if models.api_base:
        # kept without its credentials: the shell takes the whole URL from the env (pipeline.core.urls)
        parts += ["--api-base", _FROM_ENV if is_shown(models.api_base) else str(models.api_base)]
    if models.mode in ("replay", "record") and models.store:
        parts += [f"--{models.mode}", str(models.store)]
    if inputs.probes_dir:
        parts += ["--probes", str(inputs.probes_dir)]
    if models.context_tokens:
        parts += ["--context-tokens", str(models.context_tokens)]
    # The settings a local server needs and the replay key holds: a resume without them would send
    # other requests (mode, max_tokens: new keys, answers paid again) or time out (a CPU server).
    if models.instructor_mode and models.mode != "replay":  # replay: the store's mode
        parts += ["--mode", str(models.instructor_mode)]
    if models.max_tokens is not None:
        parts += ["--max-tokens", str(models.max_tokens)]
    if models.timeout_s:
        parts += ["--timeout", f"{float(models.timeout_s):g}"]
    if models.concurrency and models.concurrency != DEFAULT_CONCURRENCY:
        parts += ["--concurrency", str(models.concurrency)]
    if models.batch:
        parts.append("--batch")
    queue_tokens = (models.model_extra or {}).get("batch_queue_tokens")
    if queue_tokens:
        parts += ["--batch-queue-tokens", str(queue_tokens)]
    if info.pilot is not None:  # a pilot continues as the same pilot (the full run drops these options)
        if info.pilot.where is not None:
            parts += ["--where", info.pilot.where]
        if info.pilot.sample is not None:
            parts += ["--sample", str(info.pilot.sample), "--seed", str(info.pilot.seed or 0)]
    if info.export is not None and info.export.redacted is False:
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
    return read_run_info(run_dir).analysis_run_id or Path(run_dir).name
