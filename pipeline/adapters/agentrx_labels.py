"""AgentRx ground-truth files: labels for runs that sit in other files, never runs themselves.

A ground-truth file is a JSON list of ``{trajectory_id, failures: [{failure_id, step_number,
step_reason, failure_category, category_reason, failed_agent}], root_cause: {failure_id,
reason_for_root_cause}, failure_summary}``: every failure step a human marked, its category (the
AgentRx taxonomy) and agent, and which failure is the root cause. ``trajectory_id`` is the run's
id in its own format (the tau-bench ``task_id``, the Magentic-One file name).

Import reads such a file, joins its entries to the imported cells by id (an id that matches
several different runs joins none and is reported), puts them in the sidecar under ``agentrx``
and does not copy the file into ``raw/``: labels live only in the sidecar.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.adapters.base import load_json


def _is_entry(e: Any) -> bool:
    return isinstance(e, dict) and "trajectory_id" in e and isinstance(e.get("failures"), list)


def read_label_file(path: Path) -> dict[str, dict[str, Any]] | None:
    """{trajectory id: entry} of an AgentRx ground-truth file; None when the file is not one."""
    if path.suffix != ".json":
        return None
    try:
        with path.open("rb") as fh:
            head = fh.read(4096).decode("utf-8", errors="replace")
        if '"trajectory_id"' not in head or '"failures"' not in head:
            return None
        doc = load_json(path, 1).docs[0][1]
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not (isinstance(doc, list) and doc and all(_is_entry(e) for e in doc)):
        return None
    return {str(e["trajectory_id"]): e for e in doc}


def outcome_of(entry: dict[str, Any], source: str) -> dict[str, Any]:
    """The sidecar block of one labelled run: failures, root cause and where the labels came from."""
    failures = [f for f in entry.get("failures") or [] if isinstance(f, dict)]
    root = entry.get("root_cause") if isinstance(entry.get("root_cause"), dict) else {}
    return {
        "failures": failures,
        "root_cause": root,
        "failure_summary": entry.get("failure_summary"),
        "label_file": source,
    }


def label_texts(entry: dict[str, Any]) -> list[str]:
    """Label sentences that must never reach an event or a prompt."""
    texts = [str(entry.get("failure_summary") or "")]
    for f in entry.get("failures") or []:
        if isinstance(f, dict):
            texts += [str(f.get("step_reason") or ""), str(f.get("category_reason") or "")]
    root = entry.get("root_cause")
    if isinstance(root, dict):
        texts.append(str(root.get("reason_for_root_cause") or ""))
    return [t for t in texts if len(t) > 20]
