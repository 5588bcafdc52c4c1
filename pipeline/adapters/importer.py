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
from pipeline.adapters.agentrx_labels import label_texts, outcome_of, read_label_file
from pipeline.adapters.base import Adapter, CellSource, joined_harnesses
from pipeline.bundle.manifest import freeze
from pipeline.bundle.request import REQUEST_FILE, AnalysisRequest, CellSpec, Exclusion, TaskSpec
from pipeline.core.canonical import sha256_file, write_json, write_jsonl
from pipeline.core.errors import BadInput

RAW_DIR = "raw"
MIXED = "mixed"  # a bundle whose cells come from several formats; each cell's block names its adapter
_COPY_DIRS = {"original", "originals", "orig", "backup", "backups", "old", "copy", "copies", "archive", "archived"}
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
    warnings: list[tuple[str, str]] = field(default_factory=list)  # (path, what of a run file was left out)
    formats: list[str] = field(default_factory=list)  # the adapters that read the cells (several: mixed)


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
    sniff: Callable[[Path, str], tuple[str | None, str]],
    before_rename: Callable[[Path], None] | None = None,
) -> ImportResult:
    """Import ``src`` (a file or folder) in format ``fmt`` (or ``auto``) into the new bundle ``dest``.

    ``auto`` on a folder reads each file with the adapter whose format it looks like (a folder of
    several formats is a ``mixed`` bundle, each cell naming its adapter) and copies only the files
    runs are read from (plus the outcome files the adapters read for the sidecar).
    ``before_rename`` is called with the finished, frozen bundle before it takes its place (an
    import from object storage writes its source record there).
    """
    if not src.exists():
        raise BadInput(f"source not found: {src}")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise BadInput(f"destination {dest} exists and is not empty; choose a new directory")
    if src.is_dir() and src.resolve() in (dest.resolve(), *dest.resolve().parents):
        raise BadInput(f"destination {dest} is inside the source {src}; put the bundle elsewhere")
    detected = fmt == "auto"
    per_file = detected and src.is_dir()
    if detected and not per_file:
        fmt = detect(src)
    if not per_file and fmt not in adapters:
        raise BadInput(f"unknown format {fmt!r}; known: auto, {', '.join(sorted(adapters))}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".import", dir=dest.parent))
    try:
        result = _build(None if per_file else fmt, adapters, sniff, src, tmp, dest)
        if before_rename is not None:
            before_rename(tmp)
        if dest.exists():
            dest.rmdir()  # empty (checked above)
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    result.detected = detected
    return result


def _in_copy_folder(rel: str) -> bool:
    # Folders that by name hold another copy of the data (MAST's original/): read last, so the
    # primary copy wins when both hold the same run.
    return any(part.lower() in _COPY_DIRS for part in rel.split("/")[1:-1])


def _preference(rel: str) -> tuple[bool, str]:
    return (_in_copy_folder(rel), rel)


def _label_files(tmp: Path, paths: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for rel in paths:
        entries = read_label_file(tmp / rel)
        if entries is not None:
            found[rel] = entries
    return found


def _duplicate_files(tmp: Path, paths: list[str]) -> dict[str, str]:
    """Each byte-identical copy mapped to the path it copies (the preferred copy is kept)."""
    first: dict[str, str] = {}
    dups: dict[str, str] = {}
    for rel in sorted(paths, key=_preference):
        h = sha256_file(tmp / rel)
        if h in first:
            dups[rel] = first[h]
        else:
            first[h] = rel
    return dups


@dataclass
class _Found:
    """Runs found by every adapter that took part, with what each left out."""

    cells: list[tuple[str, CellSource]] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    warnings: list[tuple[str, str]] = field(default_factory=list)
    aux: set[str] = field(default_factory=set)
    harness: dict[str, str | None] = field(default_factory=dict)


def _discover(
    fmt: str | None,
    adapters: dict[str, Adapter],
    sniff: Callable[[Path, str], tuple[str | None, str]],
    tmp: Path,
    paths: list[str],
) -> _Found:
    groups: dict[str, list[str]] = {}
    unclaimed: dict[str, str] = {}  # path -> why no format was chosen (the true skip reason)
    if fmt is not None:
        groups[fmt] = paths
    else:
        for rel in paths:
            name, why = sniff(tmp / rel, rel)
            if name is None:
                unclaimed[rel] = why
            else:
                groups.setdefault(name, []).append(rel)
    out = _Found()
    claimed: set[str] = set()
    for name in [a for a in adapters if a in groups]:
        # Files no format claims are offered to every adapter (a crosswalk, a log whose head says little).
        try:
            found = adapters[name].discover(tmp, sorted(groups[name] + list(unclaimed)))
        except RecursionError:  # JSON held in a string of a log, nested too deep (whole documents name the file)
            raise BadInput(f"{name} import: JSON nested too deeply to read") from None
        mine: set[str] = set()
        for c in found.cells:
            files = set(c.files or [c.path])
            if files & claimed:
                continue  # another format already read these files (one file holds several runs: fine)
            mine |= files
            out.cells.append((name, c))
        claimed |= mine
        for rel, why in found.skipped:
            # An unclaimed file keeps detection's reason: another format's "not a JSON file" is not
            # why. An adapter that says what the file is ("tmux pane capture, not a log") is kept.
            if rel in groups[name] or (rel in unclaimed and not why.startswith(("not ", "no "))):
                out.skipped[rel] = why
        out.warnings.extend(found.warnings)
        out.aux.update(found.aux)
        out.harness[name] = found.harness
    for rel, why in unclaimed.items():
        out.skipped.setdefault(rel, f"format not recognised: {why}")
    for rel in list(out.skipped):
        if rel in claimed or rel in out.aux:
            del out.skipped[rel]
    return out


def _dedupe(cells: list[tuple[str, CellSource]]) -> tuple[list[tuple[str, CellSource]], dict[str, str]]:
    """Cells minus runs found twice (same records; the preferred copy kept) and why each was dropped."""
    keep: dict[str, int] = {}
    for i, (_, c) in enumerate(cells):
        if c.content_key is None:
            continue
        j = keep.get(c.content_key)
        if j is None or _preference(c.path) < _preference(cells[j][1].path):
            keep[c.content_key] = i
    dropped: dict[str, str] = {}
    out: list[tuple[str, CellSource]] = []
    for i, (name, c) in enumerate(cells):
        if c.content_key is not None and keep[c.content_key] != i:
            winner = cells[keep[c.content_key]][1]
            dropped[c.path] = f"duplicate run (same records as {winner.path}{_where(winner)}); not imported twice"
            continue
        out.append((name, c))
    return out, dropped


def _where(c: CellSource) -> str:
    sel = c.selector.get("index", c.selector.get("pointer"))
    return "" if sel in (None, "") else f" {sel}"


def _join_labels(
    cells: list[tuple[str, CellSource]], labels: dict[str, dict[str, dict[str, Any]]]
) -> list[tuple[str, str]]:
    """Put AgentRx labels into the outcomes of the cells they name; warnings for what did not join."""
    warnings: list[tuple[str, str]] = []
    by_key: dict[str, list[CellSource]] = {}
    for _, c in cells:
        for k in dict.fromkeys(c.label_keys):
            by_key.setdefault(k, []).append(c)
    for rel, entries in labels.items():
        unmatched = 0
        for key, entry in entries.items():
            matches = by_key.get(key, [])
            if len(matches) != 1:
                unmatched += 1
                if len(matches) > 1:
                    warnings.append((rel, f"label {key} names {len(matches)} imported runs; joined to none"))
                continue
            c = matches[0]
            c.outcome["agentrx"] = outcome_of(entry, rel)
            c.label_texts.extend(label_texts(entry))
        if unmatched:
            warnings.append((rel, f"{unmatched} of {len(entries)} labels name no single imported run"))
    return warnings


def _prune(tmp: Path, paths: list[str], keep: set[str]) -> None:
    for rel in paths:
        if rel not in keep:
            (tmp / rel).unlink()
    for d in sorted((p for p in (tmp / RAW_DIR).rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        if not any(d.iterdir()):
            d.rmdir()


def _subsets(cells: list[tuple[str, CellSource]]) -> dict[int, str]:
    """Per cell, its top folder under raw/ when the import spans several (Who&When's two subsets)."""
    tops = [c.path.split("/")[1] if c.path.count("/") >= 2 else "" for _, c in cells]
    return {i: t for i, t in enumerate(tops)} if len(set(tops)) > 1 else {}


def _looks_like(
    fmt: str | None, sniff: Callable[[Path, str], tuple[str | None, str]], tmp: Path, paths: list[str]
) -> str:
    """For a named format that found nothing: what detection takes the files for, if anything."""
    if fmt is None:
        return ""
    seen: dict[str, int] = {}
    for rel in paths[:200]:
        name = sniff(tmp / rel, rel)[0]
        if name is not None and name != fmt:
            seen[name] = seen.get(name, 0) + 1
    if not seen:
        return ""
    shown = ", ".join(f"{n} ({k} file{'s' if k > 1 else ''})" for n, k in sorted(seen.items(), key=lambda kv: -kv[1]))
    return f"; the files look like {shown}: name that format, or use auto"


def _build(
    fmt: str | None,
    adapters: dict[str, Adapter],
    sniff: Callable[[Path, str], tuple[str | None, str]],
    src: Path,
    tmp: Path,
    dest: Path,
) -> ImportResult:
    _copy_source(src, tmp / RAW_DIR)
    paths = _raw_paths(tmp)
    labels = _label_files(tmp, paths)
    dups = _duplicate_files(tmp, [p for p in paths if p not in labels])
    readable = [p for p in paths if p not in labels and p not in dups]
    found = _discover(fmt, adapters, sniff, tmp, readable)
    if not found.cells:
        if fmt is None and not found.harness:
            reasons = [r.removeprefix("format not recognised: ") for r in found.skipped.values()]
            why = next((r for r in reasons if r.startswith("closest")), reasons[0] if reasons else "no file in it")
            raise BadInput(f"cannot tell the format of {src}; {why}; name it with FORMAT: {', '.join(adapters)}")
        name = fmt or ", ".join(found.harness)
        why = "; ".join(f"{p}: {r}" for p, r in list(found.skipped.items())[:3])
        raise BadInput(
            f"no {name} runs found in {src}" + (f" ({why})" if why else "") + _looks_like(fmt, sniff, tmp, readable)
        )
    found_cells, dropped = _dedupe(found.cells)
    warnings = found.warnings + _join_labels(found_cells, labels)
    skipped = dict(found.skipped)
    skipped.update({p: f"label file: labels joined into the sidecar, not copied into {RAW_DIR}/" for p in labels})
    skipped.update({p: f"byte-identical copy of {d}; not imported twice" for p, d in dups.items()})
    for p, why in dropped.items():
        skipped.setdefault(p, why)
    kept_files = {f for _, c in found_cells for f in (c.files or [c.path])}
    # Only run files (and the outcome files adapters read) stay: labels and copies never do; with
    # auto, no file that holds no run is copied either.
    keep = kept_files | found.aux | (set() if fmt is None else set(readable))
    _prune(tmp, paths, keep)
    used = {name for name, _ in found_cells}
    bundle_format = next(iter(used)) if len(used) == 1 else MIXED
    subsets = _subsets(found_cells)
    width = max(3, len(str(len(found_cells))))
    cells: list[CellSpec] = []
    exclusions: list[Exclusion] = []
    tasks: dict[str, str] = {}
    blocks: dict[str, dict[str, Any]] = {}
    outcomes: list[dict[str, Any]] = []
    label_map: dict[str, list[str]] = {}
    for n, (name, c) in enumerate(found_cells, start=1):
        cell_id = f"C{n:0{width}d}"
        if not tasks.get(c.task_id):
            tasks[c.task_id] = c.task_summary
        cells.append(
            CellSpec(cell_id=cell_id, task_id=c.task_id, run_id=c.run_id, eligibility=c.eligibility, path=c.path)
        )
        if c.eligibility == "excluded":
            exclusions.append(Exclusion(cell_id=cell_id, reason=c.exclusion_reason or "excluded by the source data"))
        blocks[cell_id] = {
            "adapter": name,
            "path": c.path,
            "files": c.files or [c.path],
            "selector": c.selector,
            "harness": c.harness,
            "subset": subsets.get(n - 1),
            "step_index_base": c.step_index_base,
            "source_steps": c.source_steps,
        }
        outcomes.append(_outcome_row(cell_id, c))
        label_map[cell_id] = c.label_texts
    if bundle_format == MIXED:
        harness = joined_harnesses([c for _, c in found_cells]) or MIXED
    else:
        harness = found.harness.get(bundle_format) or bundle_format
    skipped_list = sorted(skipped.items())
    request = AnalysisRequest(
        parent_harness=harness,
        generation=0,
        analysis_run_id=_safe_id(f"{dest.name}-{bundle_format}"),
        tasks=[TaskSpec(task_id=t, summary=s) for t, s in tasks.items()],
        cells=cells,
        exclusions=exclusions,
        format=bundle_format,
        source={
            "adapter": bundle_format,
            "adapters": sorted(used),
            "imported_by": f"lunasol {pipeline.__version__} bundle import",
            "source_name": src.name,
            "raw_dir": RAW_DIR,
            "cells": blocks,
            "skipped": [{"path": p, "reason": r} for p, r in skipped_list],
            "warnings": [{"path": p, "warning": w} for p, w in warnings],
        },
    )
    write_json(tmp / REQUEST_FILE, request.model_dump(mode="json"))
    write_jsonl(tmp / OUTCOMES_FILE, outcomes)
    manifest = freeze(tmp)
    return ImportResult(
        format=bundle_format,
        dest=dest,
        cells=len(cells),
        files=len(manifest.files),
        skipped=skipped_list,
        harness=harness,
        label_texts=label_map,
        warnings=warnings,
        formats=sorted(used),
    )
