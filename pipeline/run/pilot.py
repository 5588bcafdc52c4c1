"""The ``select`` stage of ``lunasol run``: a pilot on a subset of the cells (``--where``, ``--sample --seed``).

It runs right after the export, so the IR stays whole; the cells the pilot leaves out are marked
excluded in the run's IR (:mod:`pipeline.ir.selection`), and every later stage, Luna, the
Coordinator and Sol, sees only the selected cells: each rate and Sol's support are over them.
``run.json`` records the selection (:class:`~pipeline.artifacts.run_info.Pilot`); the shortlist,
``status``, ``show``, the report and gate 1's receipt carry it from there. A full run (no
``--where``/``--sample``) puts the left-out cells back and drops the record.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from pipeline.artifacts.run_info import Pilot
from pipeline.artifacts.rundir import RunDir
from pipeline.artifacts.schemas import load_document
from pipeline.core import duck
from pipeline.core.canonical import write_json
from pipeline.core.errors import BadInput
from pipeline.ir.selection import (
    PILOT_REASON,
    apply_pilot,
    bundle_matching,
    check_where,
    clear_pilot,
    matching,
    none_match,
    sample_cells,
)

if TYPE_CHECKING:
    from pipeline.core.context import RunContext, RunOptions


def choose(con: Any, options: RunOptions) -> tuple[Pilot, list[str]]:
    """The pilot's cells and counts on an IR whose earlier pilot (if any) was cleared; BadInput when none match."""
    eligible = matching(con, None)
    matched = matching(con, options.where) if options.where is not None else eligible
    if not matched:
        raise BadInput(none_match(options.where))
    selected = sample_cells(matched, options.sample, options.seed)
    note = None
    if options.sample is not None and options.sample > len(matched):
        what = "matching cells" if options.where is not None else "eligible cells"
        note = f"--sample {options.sample} is more than the {len(matched)} {what}: all {len(matched)} taken"
    return Pilot(
        where=options.where,
        sample=options.sample,
        seed=options.seed if options.sample is not None else None,
        eligible=len(eligible),
        matched=len(matched),
        selected=len(selected),
        note=note,
    ), selected


def precheck(ir_path: Path, options: RunOptions) -> None:
    """Refuse a bad pilot before anything is written.

    A filter that is not SQL over the cell columns, or one that matches no cell: of the run's IR when it
    has one, else of the bundle (its request and outcome sidecar), read without writing anything.
    """
    check_where(options.where)
    if options.where is None:
        return
    if not ir_path.is_file():
        # a new run: the filter is evaluated on the bundle's own cells and outcomes before the export
        if not bundle_matching(options.bundle, options.where):
            raise BadInput(none_match(options.where))
        return
    try:
        con = duck.connect(ir_path, read_only=True)
    except duckdb.Error:
        return  # held by another process right now: the select stage checks it (the run lock refuses first)
    try:
        matched = matching(con, options.where, with_left_out=True)
    finally:
        con.close()
    if not matched:
        raise BadInput(none_match(options.where))


def stage(ctx: RunContext) -> str:
    """Runner stage: apply (or undo) the pilot's selection in the run's IR and record it in run.json."""
    options = ctx.options
    con = duck.connect(ctx.ir_path)
    try:
        con.execute("BEGIN")
        try:
            restored = clear_pilot(con)
            pilot: Pilot | None = None
            if options.pilot:
                pilot, selected = choose(con, options)
                apply_pilot(con, selected, f"{PILOT_REASON} ({pilot.flags()})")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    finally:
        con.close()
    record_pilot(ctx.run_dir, pilot)
    if pilot is None:
        back = f"; the {restored} cell(s) an earlier pilot left out are back" if restored else ""
        return f"every eligible cell (no pilot){back}"
    if pilot.note:
        ctx.log(f"[select] {pilot.note}")
    return pilot.label()


def record_pilot(run_dir: Path, pilot: Pilot | None) -> None:
    """Write (or, for a full run, remove) ``pilot`` in run.json, keeping every other key."""
    path = RunDir(run_dir).run_json
    data: dict[str, Any] = load_document(path, "run")[0] if path.is_file() else {}
    if pilot is None and "pilot" not in data:
        return
    if pilot is None:
        data.pop("pilot")
    else:
        data["pilot"] = pilot.model_dump(mode="json")
    write_json(path, data)
