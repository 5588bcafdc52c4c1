"""``lunasol run``: the stages of one analysis run, in order, up to the first human gate.

Each stage is a function ``stage(ctx) -> str`` (a one-line summary) in its own module.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.errors import BadInput
from pipeline.settings import ModelSettings

# (name, "module:function"). The order is the flow of DESIGN.md.
STAGES: list[tuple[str, str]] = [
    ("export", "pipeline.ir.export:stage"),
]


@dataclass
class RunOptions:
    """Everything ``lunasol run`` was asked to do."""

    bundle: Path
    run_id: str | None = None
    runs_dir: Path = Path("runs")
    resume: bool = False
    dry_run: bool = False
    models: ModelSettings = field(default_factory=ModelSettings)


@dataclass
class RunContext:
    """What a stage sees: where the bundle and the run live, and the options."""

    options: RunOptions
    run_dir: Path
    log: Callable[[str], None] = print

    @property
    def bundle(self) -> Path:
        """The frozen bundle (read-only)."""
        return self.options.bundle

    @property
    def ir_path(self) -> Path:
        """The run's DuckDB IR."""
        return self.run_dir / "ir.duckdb"


def _load(target: str) -> Callable[[RunContext], str]:
    module, func = target.split(":")
    fn: Callable[[RunContext], str] = getattr(importlib.import_module(module), func)
    return fn


def run(options: RunOptions, log: Callable[[str], None] = print) -> RunContext:
    """Run every stage in order; each logs one line saying what it did."""
    if not options.bundle.is_dir():
        raise BadInput(f"bundle not found: {options.bundle}")
    run_id = options.run_id or options.bundle.resolve().name
    ctx = RunContext(options=options, run_dir=options.runs_dir / run_id, log=log)
    for name, target in STAGES:
        summary = _load(target)(ctx)
        log(f"[{name}] {summary}")
    return ctx
