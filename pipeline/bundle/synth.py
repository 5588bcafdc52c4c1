"""Synthetic native bundles for tests and benchmarks (not the demo bundle: that one is curated).

Deterministic for a given seed: the same call writes the same bytes.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from pipeline.bundle.manifest import freeze
from pipeline.core.canonical import canonical_json, sha256_text, write_json

STAGES = ("proposal", "design", "implementation", "review")
TOOLS = ("read_file", "grep", "run_tests", "write_file")


def _ts(i: int) -> str:
    # One event per second from a fixed start: ISO-8601 UTC, lexically ordered.
    h, rem = divmod(i, 3600)
    m, s = divmod(rem, 60)
    day, h = divmod(h, 24)
    return f"2026-08-{9 + day:02d}T{h:02d}:{m:02d}:{s:02d}Z"


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(canonical_json(r) + "\n" for r in rows), encoding="utf-8")


def write_cell(cell_dir: Path, cell_id: str, events: int, rng: random.Random, output_chars: int = 120) -> int:
    """Write one cell with about ``events`` log lines over the four stages; return the lines written."""
    per_stage = max(4, events // len(STAGES))
    clock = 0
    controller: list[dict[str, Any]] = []
    written = 0
    for n, stage in enumerate(STAGES, 1):
        actor = "reviewer" if stage == "review" else "candidate"
        controller.append({"ts": _ts(clock), "event": "stage_started", "stage": stage, "actor": actor})
        controller.append(
            {"ts": _ts(clock), "event": "state", "state_digest": sha256_text(f"{cell_id}/{stage}"),
             "current_stage": stage, "confirmed": list(STAGES[: n - 1])}
        )  # fmt: skip
        clock += 1
        session = f"{cell_id}-{n:02d}"
        rows: list[dict[str, Any]] = [
            {"ts": _ts(clock), "session": session, "type": "message", "role": "operator", "content": f"Do {stage}."}
        ]
        clock += 1
        k = 0
        while len(rows) < per_stage - 2:
            tool = TOOLS[rng.randrange(len(TOOLS))]
            call_id = f"{session}-c{k}"
            path = f"src/mod{rng.randrange(20)}.py"
            rows.append(
                {"ts": _ts(clock), "session": session, "type": "tool_call", "call_id": call_id, "tool": tool,
                 "args": {"path": path, "limit": rng.randrange(1, 400)}}
            )  # fmt: skip
            clock += 1
            body = "".join(rng.choice("abcdefghij klmnop\n") for _ in range(output_chars))
            rows.append(
                {"ts": _ts(clock), "session": session, "type": "tool_result", "call_id": call_id, "tool": tool,
                 "output": body, "exit_code": 0 if rng.random() > 0.1 else 1}
            )  # fmt: skip
            clock += 1
            k += 1
        rows.append({"ts": _ts(clock), "session": session, "type": "message", "role": actor, "content": "Done."})
        clock += 1
        _jsonl(cell_dir / "sessions" / f"{n:02d}-{stage}-{actor}.jsonl", rows)
        written += len(rows)
        controller.append({"ts": _ts(clock), "event": "stage_accepted", "stage": stage, "by": "validator"})
        clock += 1
    controller.append({"ts": _ts(clock), "event": "workflow_finished", "status": "done", "note": "all stages accepted"})
    _jsonl(cell_dir / "controller.jsonl", controller)
    write_json(cell_dir / "cell.json", {"cell_id": cell_id, "harness": "H0", "workflow": list(STAGES)})
    return written + len(controller)


def write_bundle(
    root: Path,
    cells: int = 3,
    events_per_cell: int = 40,
    excluded: int = 1,
    seed: int = 7,
    output_chars: int = 120,
    freeze_it: bool = True,
) -> int:
    """Write a synthetic native bundle under ``root`` (and freeze it); return the number of log lines."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    tasks = [f"task-{i}" for i in range(max(1, min(cells, 8)))]
    cell_specs: list[dict[str, Any]] = []
    outcomes: list[dict[str, Any]] = []
    total = 0
    for i in range(cells + excluded):
        cell_id = f"C{i + 1:03d}"
        task = tasks[i % len(tasks)]
        spec = {"cell_id": cell_id, "task_id": task, "run_id": f"h0-{task}-r{i // len(tasks) + 1}",
                "eligibility": "valid_behavior" if i < cells else "excluded", "path": f"cells/{cell_id}"}  # fmt: skip
        cell_specs.append(spec)
        if i < cells:
            total += write_cell(root / spec["path"], cell_id, events_per_cell, rng, output_chars)
            outcomes.append(
                {"cell_id": cell_id, "label": "completed" if rng.random() > 0.3 else "workflow_failed",
                 "quality": round(rng.random(), 2), "completion": 1.0, "cost": round(rng.random() * 3, 2),
                 "stability": 0.9, "notes": "synthetic"}
            )  # fmt: skip
    request = {
        "schema_version": 1,
        "parent_harness": "H0",
        "generation": 0,
        "analysis_run_id": "synthetic-run",
        "tasks": [{"task_id": t, "summary": f"synthetic task {t}"} for t in tasks],
        "cells": cell_specs,
        "exclusions": [
            {"cell_id": s["cell_id"], "reason": "harness crashed before the first stage"}
            for s in cell_specs
            if s["eligibility"] == "excluded"
        ],
        "allowed_history": [],
    }
    write_json(root / "analysis-request.json", request)
    _jsonl(root / "sidecar" / "outcomes.jsonl", outcomes)
    if freeze_it:
        freeze(root)
    return total


def clone_bundle(src: Path, dest: Path, cells: int) -> Path:
    """A native bundle's eligible cells cloned to ``cells`` cells (plus its excluded ones), frozen.

    Clone ``i`` copies eligible cell ``i mod n`` byte for byte under a new cell id and run id,
    with its outcome; for scale tests and benchmarks (the demo cloned to 100 or 1,000 cells).
    """
    import json
    import shutil

    req = json.loads((src / "analysis-request.json").read_text(encoding="utf-8"))
    lines = (src / "sidecar" / "outcomes.jsonl").read_text(encoding="utf-8").splitlines()
    outcomes = {row["cell_id"]: row for row in (json.loads(line) for line in lines if line.strip())}
    eligible = [c for c in req["cells"] if c["eligibility"] == "valid_behavior"]
    excluded = [c for c in req["cells"] if c["eligibility"] != "valid_behavior"]
    dest.mkdir(parents=True)
    specs: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for i in range(cells):
        orig = eligible[i % len(eligible)]
        cell_id = f"C{i + 1:05d}"
        shutil.copytree(src / orig["path"], dest / "cells" / cell_id)
        meta = json.loads((dest / "cells" / cell_id / "cell.json").read_text(encoding="utf-8"))
        meta.update(cell_id=cell_id, run_id=f"{orig['run_id']}-x{i // len(eligible)}")
        (dest / "cells" / cell_id / "cell.json").write_text(json.dumps(meta), encoding="utf-8")
        specs.append({**orig, "cell_id": cell_id, "run_id": meta["run_id"], "path": f"cells/{cell_id}"})
        if orig["cell_id"] in outcomes:
            rows.append({**outcomes[orig["cell_id"]], "cell_id": cell_id})
    for c in excluded:
        shutil.copytree(src / c["path"], dest / c["path"])
        specs.append(c)
        if c["cell_id"] in outcomes:
            rows.append(outcomes[c["cell_id"]])
    req["cells"] = specs
    req["analysis_run_id"] = f"{req['analysis_run_id']}-x{cells}"
    (dest / "analysis-request.json").write_text(json.dumps(req, indent=1), encoding="utf-8")
    (dest / "sidecar").mkdir()
    (dest / "sidecar" / "outcomes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    freeze(dest)
    return dest


def tree_snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (files hashed, directories and links named): to prove nothing changed."""
    import hashlib
    import os

    snap: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        for name in dirnames:
            p = here / name
            snap[p.relative_to(root).as_posix() + "/"] = "link:" + os.readlink(p) if p.is_symlink() else "dir"
        for name in filenames:
            p = here / name
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                snap[rel] = "link:" + os.readlink(p)
            else:
                snap[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return snap


FAILURE_RATES = (0.0, 0.0, 0.1, 0.25, 0.5, 0.75, 1.0)
"""Per-task failure rates drawn for a diverse clone: tasks that never fail, always fail, and mixes."""

LENGTH_FACTORS = (1.0, 1.0, 0.8, 0.6, 0.4)
"""Share of each session file's lines a diverse clone keeps (its cells vary in length)."""


def clone_diverse(src: Path, dest: Path, cells: int, tasks: int, seed: int = 33) -> Path:
    """The demo's eligible cells cloned to ``cells`` cells over ``tasks`` distinct tasks, frozen.

    Unlike :func:`clone_bundle` (which keeps the demo's 8 tasks), tasks get distinct ids grouped in
    families by name (``f003-ripgrep-glob-case-00042``: family ``f003-ripgrep-glob-case``, about
    √tasks families), each task its own failure rate (from :data:`FAILURE_RATES`), and each cell
    is copied from a demo cell with the outcome its task drew (so logs and outcome agree), its
    session files cut to a share of their lines (:data:`LENGTH_FACTORS`). Cells go to tasks round
    robin, so ``cells == tasks`` is one run per task. Deterministic for a given seed.
    """
    import json
    import math
    import shutil

    if cells < 1 or not 1 <= tasks <= cells:
        raise ValueError(f"need 1 <= tasks <= cells, got {tasks} tasks for {cells} cells")
    rng = random.Random(seed)
    req = json.loads((src / "analysis-request.json").read_text(encoding="utf-8"))
    lines = (src / "sidecar" / "outcomes.jsonl").read_text(encoding="utf-8").splitlines()
    outcomes = {row["cell_id"]: row for row in (json.loads(line) for line in lines if line.strip())}
    eligible = [c for c in req["cells"] if c["eligibility"] == "valid_behavior"]
    excluded = [c for c in req["cells"] if c["eligibility"] != "valid_behavior"]
    failed = [c for c in eligible if outcomes.get(c["cell_id"], {}).get("label") != "completed"]
    passed = [c for c in eligible if c not in failed]
    stems = [t["task_id"] for t in req["tasks"]]
    families = [f"f{f:03d}-{stems[f % len(stems)]}" for f in range(max(1, math.isqrt(tasks)))]
    task_ids = [f"{families[k % len(families)]}-{k:05d}" for k in range(tasks)]
    rates = [rng.choice(FAILURE_RATES) for _ in task_ids]
    dest.mkdir(parents=True)
    specs: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for i in range(cells):
        k = i % tasks
        pool = failed if (rng.random() < rates[k] and failed) or not passed else passed
        orig = pool[rng.randrange(len(pool))]
        cell_id = f"C{i + 1:05d}"
        run_id = f"h0-{task_ids[k]}-r{i // tasks + 1}"
        out = dest / "cells" / cell_id
        shutil.copytree(src / orig["path"], out)
        factor = rng.choice(LENGTH_FACTORS)
        if factor < 1.0:
            for session in sorted((out / "sessions").glob("*.jsonl")):
                kept = session.read_text(encoding="utf-8").splitlines(keepends=True)
                session.write_text("".join(kept[: max(1, math.ceil(len(kept) * factor))]), encoding="utf-8")
        meta = json.loads((out / "cell.json").read_text(encoding="utf-8"))
        meta.update(cell_id=cell_id, run_id=run_id, task_id=task_ids[k])
        (out / "cell.json").write_text(json.dumps(meta), encoding="utf-8")
        specs.append({**orig, "cell_id": cell_id, "task_id": task_ids[k], "run_id": run_id, "path": f"cells/{cell_id}"})
        if orig["cell_id"] in outcomes:
            rows.append({**outcomes[orig["cell_id"]], "cell_id": cell_id})
    for c in excluded:
        shutil.copytree(src / c["path"], dest / c["path"])
        specs.append({**c, "task_id": task_ids[0]})
        if c["cell_id"] in outcomes:
            rows.append(outcomes[c["cell_id"]])
    summaries = {t["task_id"]: t["summary"] for t in req["tasks"]}
    req["tasks"] = [
        {"task_id": t, "summary": f"family {t.rsplit('-', 1)[0]}, variant {t.rsplit('-', 1)[1]}: "
         + summaries[stems[(k % len(families)) % len(stems)]]}
        for k, t in enumerate(task_ids)
    ]  # fmt: skip
    req["cells"] = specs
    req["analysis_run_id"] = f"{req['analysis_run_id']}-x{cells}-t{tasks}"
    (dest / "analysis-request.json").write_text(json.dumps(req, indent=1), encoding="utf-8")
    (dest / "sidecar").mkdir()
    (dest / "sidecar" / "outcomes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    freeze(dest)
    return dest
