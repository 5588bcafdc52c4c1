"""``lunasol eval RUN --labels FILE.csv|.parquet``: score a run's findings against your own labels.

The file has one row per (cell, label): an id column (``cell``, ``cell_id``, ``source_id`` or
``run_id``: a cell id such as ``C004`` or the source run id the bundle gives it), a ``label``
column and an optional ``step`` column. A label names what the cell shows:

* a Luna pattern type (``repeated_exploration``) — scored against the cell's Luna patterns;
* a weakness card id of this run (``W-01``) — scored against the card's support cells;
* an ask of this run (``ask-2d347f43ec``: the answer is yes; ``ask-…=CHOICE`` for a choice
  question) — scored against the ask's answers (a failed cell counts as no and is listed);
* ``none`` (or an empty label) — the cell was reviewed and shows nothing: a negative for every
  label.

Every cell named in the file is a labelled cell; a cell not named is not scored. For each label
(and each pattern type or card that predicts anything on the labelled cells), over the labelled
cells: the confusion matrix (tp, fp, fn, tn), precision, recall, F1 and balanced accuracy, with
binomial standard errors for precision and recall. With a ``step``, a true positive's step is
also checked against the steps (``events.step_index``, the IR's numbering) of the events the
prediction cites: exact and within ±1.

Read with DuckDB (CSV sniffed, Parquet native); a bad file is one :class:`BadInput` line.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from pipeline.artifacts.rundir import RunDir
from pipeline.core import duck
from pipeline.core.errors import BadInput
from pipeline.eval.stats import binomial_se
from pipeline.luna.patterns import PATTERN_TYPES

ID_COLUMNS = ("cell", "cell_id", "source_id", "run_id")
NONE_LABELS = frozenset({"", "none", "-", "nothing"})
SUFFIXES = (".csv", ".parquet")


@dataclass(frozen=True)
class LabelRow:
    """One row of a label file, its id resolved to a cell of the run."""

    row: int  # 1-based data row of the file (for error lines)
    cell: str
    label: str | None  # None: reviewed, nothing to see
    step: int | None


def is_label_file(value: str) -> bool:
    """True when ``--labels`` names a file (by its suffix) rather than a public label format."""
    return value.lower().endswith(SUFFIXES)


def read_label_file(path: Path) -> list[dict[str, Any]]:
    """The rows of a CSV or Parquet file as dicts of strings (DuckDB); BadInput naming the file otherwise."""
    if path.suffix.lower() not in SUFFIXES:
        raise BadInput(f"--labels {path}: expected a .csv or .parquet file")
    if not path.is_file():
        raise BadInput(f"--labels {path}: file not found")
    con = duckdb.connect(":memory:")
    try:
        if path.suffix.lower() == ".csv":
            rel = con.execute("SELECT * FROM read_csv(?, header = true, all_varchar = true)", [str(path)])
        else:
            rel = con.execute("SELECT * FROM read_parquet(?)", [str(path)])
        cols = [d[0] for d in rel.description or []]
        rows = rel.fetchall()
    except duckdb.Error as exc:
        first = " ".join(str(exc).split("\nLINE ")[0].split())[:200]  # not DuckDB's echo of the query
        raise BadInput(f"--labels {path}: not a readable {path.suffix[1:]} file ({first})") from None
    finally:
        con.close()
    return [dict(zip([c.strip().lower() for c in cols], r, strict=True)) for r in rows]


def parse_labels(path: Path, raw: list[dict[str, Any]], ids: dict[str, str]) -> list[LabelRow]:
    """Resolve ids (cell id or source run id, ``ids`` maps both to the cell) and check every row."""
    if not raw:
        raise BadInput(f"--labels {path}: no rows")
    cols = set(raw[0])
    id_col = next((c for c in ID_COLUMNS if c in cols), None)
    if id_col is None or "label" not in cols:
        raise BadInput(
            f"--labels {path}: needs an id column ({', '.join(ID_COLUMNS)}) and a 'label' column; "
            f"has {', '.join(sorted(cols))}"
        )
    out: list[LabelRow] = []
    for n, r in enumerate(raw, start=1):
        key = "" if r[id_col] is None else str(r[id_col]).strip()
        cell = ids.get(key)
        if cell is None:
            raise BadInput(f"--labels {path}: row {n}: {key!r} is neither a cell id nor a source id of this run")
        label = "" if r["label"] is None else str(r["label"]).strip()
        step: int | None = None
        raw_step = r.get("step")
        if raw_step is not None and str(raw_step).strip() != "":
            text = str(raw_step).strip()
            if not text.lstrip("-").isdigit():
                raise BadInput(f"--labels {path}: row {n}: step {text!r} is not a whole number")
            step = int(text)
        out.append(LabelRow(n, cell, None if label.lower() in NONE_LABELS else label, step))
    return out


def confusion(tp: int, fp: int, fn: int, tn: int) -> dict[str, Any]:
    """Confusion matrix, precision, recall, F1 and balanced accuracy (None without a denominator)."""
    precision = tp / (tp + fp) if tp + fp else None
    recall = tp / (tp + fn) if tp + fn else None
    specificity = tn / (tn + fp) if tn + fp else None
    f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else None
    balanced = (recall + specificity) / 2 if recall is not None and specificity is not None else None

    def r(v: float | None) -> float | None:
        return None if v is None else round(v, 4)

    return {
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "tn": tn,
        "precision": r(precision),
        "precision_se": binomial_se(tp, tp + fp),
        "recall": r(recall),
        "recall_se": binomial_se(tp, tp + fn),
        "f1": r(f1),
        "balanced_accuracy": r(balanced),
    }


def _predictions(run_dir: Path) -> tuple[dict[str, dict[str, set[str]]], dict[str, dict[str, set[str]]], str, str]:
    """Per pattern type and per weakness card: cell -> the event ids it cites there; and each source's status."""
    arts = RunDir(run_dir).read(frozenset({"patterns", "shortlist"}))
    patterns: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for p in arts.patterns or []:
        ev = p.get("evidence")
        patterns[str(p.get("type"))][str(p.get("cell_id"))].update(str(e) for e in ev or [] if isinstance(e, str))
    cards: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for w in arts.weaknesses or []:
        sup = w.get("support") if isinstance(w.get("support"), dict) else {}
        assert isinstance(sup, dict)
        refs = [str(e) for e in sup.get("event_refs") or []]
        for cell in sup.get("cells") or []:
            cards[str(w.get("weakness_id"))][str(cell)].update(e for e in refs if e.startswith(f"{cell}-"))
    p_status = "no patterns.jsonl (Luna has not run)" if arts.patterns is None else f"{len(arts.patterns)} patterns"
    c_status = "no weakness shortlist (Sol has not run)" if arts.weaknesses is None else f"{len(cards)} cards"
    return patterns, cards, p_status, c_status


def _score(
    name: str,
    gold: dict[str, set[str]],
    steps: dict[tuple[str, str], int],
    predicted: dict[str, set[str]],
    step_of: dict[str, int | None],
) -> dict[str, Any]:
    tp = fp = fn = tn = 0
    step_exact = step_within_1 = step_known = 0
    for cell, labels in gold.items():
        truth, pred = name in labels, cell in predicted
        tp += truth and pred
        fp += pred and not truth
        fn += truth and not pred
        tn += not truth and not pred
        want = steps.get((cell, name))
        if truth and pred and want is not None:
            cited = [s for e in predicted[cell] if (s := step_of.get(e)) is not None]
            if cited:
                step_known += 1
                step_exact += want in cited
                step_within_1 += any(abs(s - want) <= 1 for s in cited)
    out = confusion(tp, fp, fn, tn)
    if any(label == name for (_c, label) in steps):
        out["steps"] = {"checked": step_known, "exact": step_exact, "within_1": step_within_1}
    return out


def evaluate_label_file(run_dir: Path, path: Path) -> dict[str, Any]:
    """Scores of Luna's patterns (by type) and of weakness-card membership against a label file."""
    ir = RunDir(run_dir).ir
    if not ir.is_file():
        raise BadInput(f"no IR in {run_dir} (run `lunasol export` first)")
    raw = read_label_file(path)
    con = duck.connect(ir, read_only=True)
    try:
        cells = con.execute("SELECT cell_id, run_id, eligibility FROM cells").fetchall()
        step_rows = con.execute("SELECT event_id, step_index FROM events WHERE step_index IS NOT NULL").fetchall()
        asks, ask_failed = _ask_predictions(con)
    finally:
        con.close()
    ids = {str(rid): str(c) for c, rid, _ in cells if rid is not None} | {str(c): str(c) for c, _, _ in cells}
    rows = parse_labels(path, raw, ids)
    eligible = {str(c) for c, _, elig in cells if elig == "valid_behavior"}
    excluded = sorted({r.cell for r in rows if r.cell not in eligible})
    gold: dict[str, set[str]] = {}
    steps: dict[tuple[str, str], int] = {}
    for r in rows:
        if r.cell not in eligible:
            continue
        labels = gold.setdefault(r.cell, set())
        if r.label is not None:
            labels.add(r.label)
            if r.step is not None:
                steps[(r.cell, r.label)] = r.step
    if not gold:
        raise BadInput(f"--labels {path}: no row names an eligible cell of {run_dir.name}")
    step_of: dict[str, int | None] = {str(e): s for e, s in step_rows}
    patterns, cards, p_status, c_status = _predictions(run_dir)
    label_names = {lab for ls in gold.values() for lab in ls}
    types = set(PATTERN_TYPES) | set(patterns)
    for r in rows:
        # A typo ("repeated-exploration") would silently score as "never labelled": say so instead.
        if r.label is not None and r.label not in types and r.label not in cards and r.label not in asks:
            known = ", ".join([*PATTERN_TYPES, *sorted(cards), *sorted(asks)])
            what = f"label {r.label!r} is not a pattern type, card id or ask ({known})"
            raise BadInput(f"--labels {path}: row {r.row}: {what}")
    on_labelled = {t for t, by in patterns.items() if set(by) & set(gold)}
    cards_on = {w for w, by in cards.items() if set(by) & set(gold)}
    report: dict[str, Any] = {
        "run": run_dir.name,
        "labels": str(path),
        "cells": len(eligible),
        "labelled_cells": len(gold),
        "rows": len(rows),
        "labelled_not_eligible": excluded,
        "sources": {
            "patterns": {
                "status": p_status,
                "types": {
                    t: _score(t, gold, steps, patterns.get(t, {}), step_of)
                    for t in sorted((label_names & types) | on_labelled)
                },
            },
            "weakness_cards": {
                "status": c_status,
                "cards": {
                    w: _score(w, gold, steps, cards.get(w, {}), step_of)
                    for w in sorted((label_names & set(cards)) | cards_on)
                },
            },
            # Only the asks the file labels: an ask is the user's own question, scored when they say so.
            "asks": {
                "status": f"{len({a.split('=', 1)[0] for a in asks})} asks in the run",
                "asks": {
                    a: {
                        **_score(a, gold, steps, asks.get(a, {}), step_of),
                        "failed_cells": sorted(ask_failed.get(a.split("=", 1)[0], set()) & set(gold)),
                    }
                    for a in sorted(label_names & set(asks))
                },
            },
        },
    }
    return report


def _ask_predictions(con: duckdb.DuckDBPyConnection) -> tuple[dict[str, dict[str, set[str]]], dict[str, set[str]]]:
    """Per ask label (``ask-…`` for a yes-no ask's "yes", ``ask-…=CHOICE`` for a choice): cell -> cited events.

    A failed cell answered nothing: it is not a prediction (it counts as a "no") and is listed.
    """
    out: dict[str, dict[str, set[str]]] = {}
    failed: dict[str, set[str]] = defaultdict(set)
    if not duck.has_table(con, "asks"):
        return out, failed
    for ask_id, kind, choices in con.execute("SELECT ask_id, answer_kind, choices FROM asks").fetchall():
        if kind == "yes-no":
            out[str(ask_id)] = {}
        elif kind == "choice":
            out.update({f"{ask_id}={c}": {} for c in choices or []})
    rows = con.execute(
        "SELECT a.ask_id, a.cell_id, a.status, a.answer, a.evidence, k.answer_kind FROM ask_answers a "
        "JOIN asks k USING (ask_id)"
    ).fetchall()
    for ask_id, cell, status, answer, evidence, kind in rows:
        if status != "ok":
            failed[str(ask_id)].add(str(cell))
            continue
        name = f"{ask_id}={answer}" if kind == "choice" else str(ask_id) if answer == "yes" else None
        if name is not None and name in out:
            out[name][str(cell)] = {str(e) for e in evidence or []}
    return out, failed
