"""The judge reads every occurrence of the groups it judges: listed whole, never a sample."""

from __future__ import annotations

from typing import Any

from pipeline.followup.judge import groups_text


def _group(n: int) -> dict[str, Any]:
    occ = [
        {"occurrence_id": f"G001-O{i:02d}", "cell_id": f"C{i:03d}",
         "events": [f"C{i:03d}-e{j:04d}" for j in range(6)],
         "refs": [f"cells/C{i:03d}/s.jsonl#L{j}-L{j}" for j in range(6)]}
        for i in range(1, n + 1)
    ]  # fmt: skip
    return {"group_id": "G001", "type": "repeated_exploration", "concerns": "target:x", "occurrences": occ,
            "support": {"n_cells": n, "tasks": ["t"]}}  # fmt: skip


def test_every_occurrence_with_every_event_and_ref_is_listed() -> None:
    group = _group(12)  # more than the 8 a group the judge was shown before
    text = groups_text([group])
    for o in group["occurrences"]:
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(o["occurrence_id"] + " "))
        assert all(e in line for e in o["events"]) and all(r in line for r in o["refs"])
    assert "more occurrence" not in text


def test_tighter_views_still_name_every_occurrence_and_say_what_was_left_out() -> None:
    group = _group(12)
    events = groups_text([group], "events")
    assert "refs" not in events
    assert all(e in events for o in group["occurrences"] for e in o["events"])
    ids = groups_text([group], "ids")
    assert "left out for this request's token budget" in ids
    assert all(o["occurrence_id"] in ids for o in group["occurrences"])
