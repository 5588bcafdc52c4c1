"""Coordinator: Luna's patterns grouped across cells in DuckDB SQL, all refs kept, incidents deduplicated."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.coordinator.groups import GROUPS_FILE, coordinate, run_coordinator, sql_files
from pipeline.core.errors import BadInput

if TYPE_CHECKING:
    from pipeline.core.context import RunContext

__all__ = ["GROUPS_FILE", "coordinate", "run_coordinator", "sql_files", "stage"]


def stage(ctx: RunContext) -> str:
    """Runner stage: group the run's patterns; one-line summary."""
    if not ctx.ir_path.is_file():
        raise BadInput(f"no IR at {ctx.ir_path}: export must run before the coordinator")
    if ctx.options.dry_run:
        return "dry run: nothing to coordinate"
    doc = run_coordinator(ctx.ir_path, ctx.run_dir)
    t = doc["totals"]
    line = (
        f"{t['groups']} pattern groups, {t['occurrences']} occurrences over {t['cells_with_patterns']}/"
        f"{t['eligible_cells']} cells ({t['cells_without_patterns']} with none"
    )
    if t["collapsed_lines"]:
        line += f"; {t['collapsed_lines']} duplicate controller lines collapsed"
    if t["cells_not_analysed"]:
        line += f"; NOT analysed: {', '.join(t['cells_not_analysed'])}"
    return line + ")"
