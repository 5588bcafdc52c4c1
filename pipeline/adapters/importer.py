"""``lunasol bundle import``: copy foreign logs byte-for-byte into a new frozen bundle.

DEST gets ``raw/`` (the source files, copied, never rewritten), ``analysis-request.json``
(format, harness, one cell per run, and in ``source`` where each cell's records are),
``sidecar/outcomes.jsonl`` (every label field of the data; never shown to Luna) and the frozen
``manifest.json``. The bundle is assembled in a temporary sibling directory and renamed into
place, so a failed import leaves nothing behind.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pipeline
from pipeline.adapters.base import Adapter, CellSource
from pipeline.bundle.manifest import freeze
from pipeline.bundle.request import REQUEST_FILE, AnalysisRequest, CellSpec, Exclusion, TaskSpec
from pipeline.core.canonical import write_json, write_jsonl
from pipeline.core.errors import BadInput

RAW_DIR = "raw"
OUTCOMES_FILE = "sidecar/outcomes.jsonl"
_OUTCOME_KEYS = ("label", "quality", "completion", "cost", "stability")


@dataclass
class ImportResult:
    """What an import produced (for the CLI's summary line and for tests)."""

    format: str
    dest: Path
    cells: int
    files: int
    skipped: list[tuple[str, str]] = field(default_factory=list)
    harness: str = ""
    detected: bool = False
    label_texts: dict[str, list[str]] = field(default_factory=dict)  # cell_id -> label values (tests)


def _safe_id(text: str) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.") or "bundle"
    return s[:100]


def _copy_source(src: Path, raw: Path) -> None:
    if src.is_file():
        raw.mkdir(parents=True)
        shutil.copyfile(src, raw / src.name)
        return

    # Regular files and folders only, bytes copied as they are; symlinks, sockets and fifos are left out.
    def _ignore(directory: str, names: list[str]) -> list[str]:
        paths = [(n, Path(directory) / n) for n in names]
        return [n for n, p in paths if p.is_symlink() or not (p.is_file() or p.is_dir())]

    shutil.copytree(src, raw, symlinks=False, ignore=_ignore, copy_function=shutil.copyfile)


def _raw_paths(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in (root / RAW_DIR).rglob("*") if p.is_file())


def _outcome_row(cell_id: str, c: CellSource) -> dict[str, Any]:
    row: dict[str, Any] = {"cell_id": cell_id}
    for k in _OUTCOME_KEYS:
        row[k] = c.outcome.get(k)
    row.update({k: v for k, v in c.outcome.items() if k not in _OUTCOME_KEYS and k != "cell_id"})
    return row


def import_bundle(
    fmt: str,
    src: Path,
    dest: Path,
    *,
    adapters: dict[str, Adapter],
    detect: Callable[[Path], str],
) -> ImportResult:
    """Import ``src`` (a file or folder) in format ``fmt`` (or ``auto``) into the new bundle ``dest``."""
    if not src.exists():
        raise BadInput(f"source not found: {src}")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise BadInput(f"destination {dest} exists and is not empty; choose a new directory")
    if src.is_dir() and src.resolve() in (dest.resolve(), *dest.resolve().parents):
        raise BadInput(f"destination {dest} is inside the source {src}; put the bundle elsewhere")
    detected = fmt == "auto"
    if detected:
        fmt = detect(src)
    adapter = adapters.get(fmt)
    if adapter is None:
        raise BadInput(f"unknown format {fmt!r}; known: auto, {', '.join(sorted(adapters))}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".import", dir=dest.parent))
    try:
        result = _build(adapter, src, tmp, dest)
        if dest.exists():
            dest.rmdir()  # empty (checked above)
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    result.detected = detected
    return result


def _build(adapter: Adapter, src: Path, tmp: Path, dest: Path) -> ImportResult:
    _copy_source(src, tmp / RAW_DIR)
    paths = _raw_paths(tmp)
    try:
        found = adapter.discover(tmp, paths)
    except RecursionError:  # JSON inside a string of the log nested too deep (whole documents say which file)
        raise BadInput(f"{src}: JSON nested too deeply to read") from None
    if not found.cells:
        why = "; ".join(f"{p}: {r}" for p, r in found.skipped[:3])
        raise BadInput(f"no {adapter.name} runs found in {src}" + (f" ({why})" if why else ""))
    width = max(3, len(str(len(found.cells))))
    cells: list[CellSpec] = []
    exclusions: list[Exclusion] = []
    tasks: dict[str, str] = {}
    blocks: dict[str, dict[str, Any]] = {}
    outcomes: list[dict[str, Any]] = []
    label_texts: dict[str, list[str]] = {}
    for n, c in enumerate(found.cells, start=1):
        cell_id = f"C{n:0{width}d}"
        if not tasks.get(c.task_id):
            tasks[c.task_id] = c.task_summary
        cells.append(
            CellSpec(cell_id=cell_id, task_id=c.task_id, run_id=c.run_id, eligibility=c.eligibility, path=c.path)
        )
        if c.eligibility == "excluded":
            exclusions.append(Exclusion(cell_id=cell_id, reason=c.exclusion_reason or "excluded by the source data"))
        blocks[cell_id] = {
            "path": c.path,
            "files": c.files or [c.path],
            "selector": c.selector,
            "harness": c.harness,
            "step_index_base": c.step_index_base,
            "source_steps": c.source_steps,
        }
        outcomes.append(_outcome_row(cell_id, c))
        label_texts[cell_id] = c.label_texts
    harness = found.harness or adapter.name
    request = AnalysisRequest(
        parent_harness=harness,
        generation=0,
        analysis_run_id=_safe_id(f"{dest.name}-{adapter.name}"),
        tasks=[TaskSpec(task_id=t, summary=s) for t, s in tasks.items()],
        cells=cells,
        exclusions=exclusions,
        format=adapter.name,
        source={
            "adapter": adapter.name,
            "imported_by": f"lunasol {pipeline.__version__} bundle import",
            "source_name": src.name,
            "raw_dir": RAW_DIR,
            "cells": blocks,
            "skipped": [{"path": p, "reason": r} for p, r in found.skipped],
        },
    )
    write_json(tmp / REQUEST_FILE, request.model_dump(mode="json"))
    write_jsonl(tmp / OUTCOMES_FILE, outcomes)
    manifest = freeze(tmp)
    return ImportResult(
        format=adapter.name,
        dest=dest,
        cells=len(cells),
        files=len(manifest.files),
        skipped=found.skipped,
        harness=harness,
        label_texts=label_texts,
    )
