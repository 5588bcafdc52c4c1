"""An ask's counts: per outcome (successful vs failed side by side) and per task, rates with standard errors.

Outcomes are joined here, after the calls (the model never saw them), with the Coordinator's rule
for a successful cell (``lunasol_successful`` in ``pipeline/coordinator/sql/00_macros.sql``).
A failed cell is counted as failed, never as an answer; rates are over the answered cells.
"""

from __future__ import annotations

import math
from importlib import resources
from pathlib import Path
from typing import Any

from pipeline.artifacts.rundir import RunDir
from pipeline.core import duck
from pipeline.core.canonical import digest
from pipeline.core.errors import BadInput

_ROWS_SQL = """
SELECT a.cell_id, c.task_id, a.status, a.answer, a.evidence, a.explanation, a.reason, a.parts,
       CASE WHEN o.label IS NULL THEN 'unknown' WHEN lunasol_successful(o.label) THEN 'successful'
            ELSE 'failed' END AS outcome
FROM ask_answers a JOIN cells c USING (cell_id) LEFT JOIN outcomes o USING (cell_id)
WHERE a.ask_id = ? ORDER BY a.cell_id
"""


def _rate(k: int, n: int) -> tuple[float | None, float | None]:
    if not n:
        return None, None
    p = k / n
    return round(p, 4), round(math.sqrt(p * (1 - p) / n), 4)


def _group(rows: list[dict[str, Any]], kind: str, values: list[str]) -> dict[str, Any]:
    answered = [r for r in rows if r["status"] == "ok"]
    out: dict[str, Any] = {"cells": len(rows), "answered": len(answered), "failed": len(rows) - len(answered)}
    if kind == "number":
        xs = [float(r["answer"]) for r in answered]
        mean = sum(xs) / len(xs) if xs else None
        sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if mean is not None and len(xs) > 1 else None
        out["mean"] = None if mean is None else round(mean, 4)
        out["mean_se"] = None if sd is None else round(sd / math.sqrt(len(xs)), 4)
        return out
    counts = {v: sum(r["answer"] == v for r in answered) for v in values}
    out["counts"] = counts
    out["rates"] = {v: dict(zip(("rate", "se"), _rate(k, len(answered)), strict=True)) for v, k in counts.items()}
    return out


def summarise(run_dir: Path, ask_id: str | None = None) -> dict[str, Any]:
    """The ask's definition, overall and per-outcome and per-task counts, and every cell's answer with its events."""
    ir = RunDir(run_dir).ir
    con = duck.connect(ir, read_only=True)
    try:
        if not duck.has_table(con, "asks"):
            raise BadInput(f"no ask in {run_dir.name} yet (lunasol ask RUN QUESTION)")
        con.execute(resources.files("pipeline.coordinator").joinpath("sql", "00_macros.sql").read_text("utf-8"))
        spec = (
            con.execute("SELECT * FROM asks WHERE ask_id = ?", [ask_id]).fetchone()
            if ask_id
            else con.execute("SELECT * FROM asks ORDER BY ask_id LIMIT 1").fetchone()
        )
        if spec is None:
            raise BadInput(f"no ask {ask_id!r} in {run_dir.name}")
        names = [d[0] for d in con.description or []]
        ask = dict(zip(names, spec, strict=True))
        cur = con.execute(_ROWS_SQL, [ask["ask_id"]])
        cols = [d[0] for d in cur.description or []]
        rows = [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
    finally:
        con.close()
    kind = str(ask["answer_kind"])
    values = ["yes", "no"] if kind == "yes-no" else list(ask["choices"] or [])
    by_outcome = {o: _group([r for r in rows if r["outcome"] == o], kind, values) for o in ("successful", "failed")}
    unknown = [r for r in rows if r["outcome"] == "unknown"]
    if unknown:
        by_outcome["unknown"] = _group(unknown, kind, values)
    # One pass into (task, outcome) buckets: a scan of every row per task was quadratic (10,000 cells x 2,500 tasks).
    buckets: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        buckets.setdefault((str(r["task_id"]), str(r["outcome"])), []).append(r)
    tasks = sorted({t for t, _ in buckets})
    per_task = {t: {o: _group(buckets.get((t, o), []), kind, values) for o in by_outcome} for t in tasks}
    answers = [_answer_row(r) for r in rows]
    return {
        "ask": ask,
        # What a gate-1 receipt binds to: the ask's definition and every cell's answer and cited events.
        "digest": digest({"ask": {k: v for k, v in ask.items()}, "answers": answers}),
        "overall": _group(rows, kind, values),
        "by_outcome": by_outcome,
        "by_task": per_task,
        "answers": answers,
    }


def _answer_row(r: dict[str, Any]) -> dict[str, Any]:
    keys = ("cell_id", "task_id", "outcome", "status", "answer", "explanation", "reason", "parts")
    return {**{k: r[k] for k in keys}, "evidence": list(r["evidence"] or [])}


def ask_ids(run_dir: Path) -> list[str]:
    """The ids of the run's asks, in order (empty when none was asked)."""
    ir = RunDir(run_dir).ir
    if not ir.is_file():
        return []
    con = duck.connect(ir, read_only=True)
    try:
        if not duck.has_table(con, "asks"):
            return []
        return [str(r[0]) for r in con.execute("SELECT ask_id FROM asks ORDER BY ask_id").fetchall()]
    finally:
        con.close()


def headline(s: dict[str, Any]) -> dict[str, Any]:
    """One ask in a line's worth: id, question, card, cells answered and failed, the rate of each answer."""
    ask, overall = s["ask"], s["overall"]
    rates = {v: r["rate"] for v, r in overall.get("rates", {}).items()}
    return {
        "ask_id": ask["ask_id"],
        "question": ask["question"],
        "weakness_id": ask.get("weakness_id"),
        "answer_kind": ask["answer_kind"],
        "cells": overall["cells"],
        "answered": overall["answered"],
        "failed": overall["failed"],
        "pilot": None if ask.get("sample") is None else {"sample": ask["sample"], "seed": ask["seed"]},
        "counts": overall.get("counts"),
        "rates": rates or None,
        "mean": overall.get("mean"),
        "digest": s["digest"],
    }
