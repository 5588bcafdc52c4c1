"""What a stage sees: the options of ``lunasol run`` and where the bundle and the run live.

It sits in the core so that every stage can take a :class:`RunContext` without importing the
runner that calls it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.settings import ModelSettings


@dataclass
class RunOptions:
    """Everything ``lunasol run`` was asked to do."""

    bundle: Path
    run_id: str | None = None
    runs_dir: Path = Path("runs")
    resume: bool = False
    dry_run: bool = False
    models: ModelSettings = field(default_factory=ModelSettings)
    probes_dir: Path | None = None  # --probes: a folder of the user's own probe files, run beside the shipped
    redact: bool = True  # False only with --no-redact: secrets stay in the IR's text, hence in prompts and reports
    supersede: bool = False  # --supersede: rerun into a run id whose gates hold decisions (they may be voided)
    where: str | None = None  # --where SQL: a pilot on the eligible cells matching it (pipeline.ir.selection)
    sample: int | None = None  # --sample N: a pilot on a seeded draw of N of them
    seed: int = 0  # --seed of the draw

    @property
    def pilot(self) -> bool:
        """Whether this run analyses a subset of the eligible cells (``--where`` / ``--sample``)."""
        return self.where is not None or self.sample is not None


@dataclass
class RunContext:
    """What a stage sees: where the bundle and the run live, and the options."""

    options: RunOptions
    run_dir: Path
    log: Callable[[str], None] = print
    incomplete: list[str] = field(default_factory=list)
    """Why the running stage cannot be verified yet (e.g. cells that failed): the runner leaves it pending."""

    @property
    def bundle(self) -> Path:
        """The frozen bundle (read-only)."""
        return self.options.bundle

    @property
    def ir_path(self) -> Path:
        """The run's DuckDB IR (the core sits below RunDir: a test checks this agrees with ``RunDir.ir``)."""
        return self.run_dir / "ir.duckdb"
