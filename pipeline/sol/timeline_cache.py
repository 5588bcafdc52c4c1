"""Sol's per-cell timelines kept across reruns: a cell whose IR content is unchanged takes its lines again.

A cell's controller-level timeline (:mod:`pipeline.sol.timeline`) depends on that cell alone: its
row in ``cells`` and its events (even the main worker is found per cell). The export stores each
cell's content digest in ``cell_digests`` (its cell row and every column of its events, in order;
the ledger's IR digest is made of the same digests), so lines stored under a cell's digest are the
lines the query would give again, as long as the code that makes them is the same: the file is
only read under the digest of ``timeline.py``'s source and lunasol's, DuckDB's and Python's
versions. At 1,000 cells the query reads ~55,000 events (about 0.25 CPU s); with one changed cell
it reads that cell's alone.

Kept in ``runs/<id>/sol_map/timelines.json`` only for batches Sol maps and reduces (a batch that
fits one call reads its timelines in milliseconds), rewritten whole (atomically) when a cell's
lines were read again.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import orjson

import pipeline
from pipeline.artifacts import rundir
from pipeline.core import duck
from pipeline.core.canonical import atomic_write_bytes, digest, sha256_bytes
from pipeline.ir.digests import content_digests
from pipeline.sol import timeline
from pipeline.sol.timeline import read_timelines

TIMELINES_FILE = rundir.TIMELINES_FILE
Lines = list[tuple[str, str]]


@functools.cache
def made_with() -> str:
    """Digest of what a stored timeline depends on besides its cell: the code and the libraries that make it."""
    return digest(
        {
            "timeline.py": sha256_bytes(Path(timeline.__file__).read_bytes()),
            "lunasol": pipeline.__version__,
            "duckdb": duckdb.__version__,
            "python": sys.version,
        }
    )


@dataclass
class Timelines:
    """Every eligible cell's timeline lines, and what the store must learn of them."""

    lines: dict[str, Lines]
    digests: dict[str, str] | None  # cell -> its stored content digest; None: the IR stores none
    read: list[str] = field(default_factory=list)  # cells read from the IR (not taken from the store)
    stale: bool = False  # the store holds other cells, or another way of making them


def _path(run_dir: Path) -> Path:
    return run_dir / rundir.SOL_MAP_DIR / TIMELINES_FILE


def _stored(run_dir: Path) -> dict[str, Any]:
    path = _path(run_dir)
    try:
        raw = orjson.loads(path.read_bytes()) if path.is_file() else None
    except orjson.JSONDecodeError:  # never trust a file that does not parse: read the IR again
        return {}
    if not isinstance(raw, dict) or raw.get("made_with") != made_with() or not isinstance(raw.get("cells"), dict):
        return {}
    cells: dict[str, Any] = raw["cells"]
    return cells


def _cell_digests(con: Any) -> dict[str, str] | None:
    stored = content_digests(con)
    return None if stored is None else {c: d for c, d in stored.items() if d}


def load_timelines(con: Any, run_dir: Path, eligible: list[str]) -> Timelines:
    """The timelines of the ``eligible`` cells (in that order): stored lines where the cell's digest is unchanged."""
    digests = _cell_digests(con)
    if digests is None:  # an IR without stored digests: nothing to key lines by
        return Timelines(lines=read_timelines(con), digests=None, read=list(eligible))
    stored = _stored(run_dir)
    reuse: dict[str, Lines] = {}
    details: dict[str, str] = {}  # each detail kept once
    todo: list[str] = []
    for cell in eligible:
        entry = stored.get(cell)
        if (
            isinstance(entry, list)
            and len(entry) == 3
            and entry[0] == digests.get(cell)
            and isinstance(entry[1], list)
            and isinstance(entry[2], list)
            and len(entry[1]) == len(entry[2])
        ):
            reuse[cell] = [(details.setdefault(k, k), line) for k, line in zip(entry[1], entry[2], strict=True)]
        else:
            todo.append(cell)
    if len(todo) == len(eligible):
        fresh = read_timelines(con)
    else:
        fresh = read_timelines(con, f"e.cell_id IN ({duck.literals(todo)})") if todo else {}
    lines: dict[str, Lines] = {}
    for cell in eligible:  # the query's order (by cell id); a cell without controller-level events is left out
        got = reuse[cell] if cell in reuse else fresh.get(cell, [])
        if got:
            lines[cell] = got
    return Timelines(lines=lines, digests=digests, read=todo, stale=len(stored) != len(eligible) - len(todo))


def save_timelines(run_dir: Path, eligible: list[str], found: Timelines) -> None:
    """Keep the eligible cells' lines under their digests for the next run (only when something changed)."""
    if found.digests is None or not (found.read or found.stale):
        return
    cells: dict[str, list[Any]] = {}
    for cell in eligible:
        cell_digest = found.digests.get(cell)
        if cell_digest:
            got = found.lines.get(cell, [])
            cells[cell] = [cell_digest, [k for k, _ in got], [ln for _, ln in got]]
    path = _path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, orjson.dumps({"made_with": made_with(), "cells": cells}))
