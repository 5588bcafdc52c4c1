"""A scripted model for scale tests and benchmarks: valid Luna and Sol answers derived from each prompt.

Luna confirms every probe candidate it is shown (rejecting one that cannot be a valid pattern);
Sol turns the largest pattern group with failed cells into one weakness card, citing its
occurrences and a successful cell as counter-evidence. Answers are made up from the prompt, not
recorded: use them to exercise the pipeline's mechanics at size, never as findings.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

from pipeline.testing.openai_server import Reply, auto_answer, completion_body

_CANDIDATE = re.compile(r"^- (\S+-H\d+) · (\w+) · (.+?) · evidence (.+?)(?: · proves no change)?$", re.M)


def luna_answer(prompt: str) -> dict[str, Any]:
    """Confirm every probe candidate shown (rejected when it cannot be a valid pattern)."""
    patterns, rejected = [], []
    for hit_id, kind, key, evidence in _CANDIDATE.findall(prompt):
        ids = [e.strip() for e in evidence.split(",")]
        if kind == "repeated_exploration" and len(set(ids)) < 2:
            rejected.append({"candidate": hit_id, "observation": "only one event is cited", "state_changed": False})
            continue
        patterns.append(
            {"type": kind, "concerns": key, "observed": f"Events {', '.join(ids)} show the same step again.",
             "definition_fit": "The cited events match the probe's definition as shown in the log.",
             "evidence": ids, "state_changed": False, "candidates": [hit_id], "confidence": "medium"}
        )  # fmt: skip
    answer: dict[str, Any] = {"patterns": patterns, "rejected_candidates": rejected}
    if not patterns:  # "nothing found" is said, never left implicit (LunaAnswer refuses a bare empty list)
        answer["none_reason"] = "No probe candidate in this log is a repeat with nothing changed in between."
    return answer


Occurrence = tuple[str, str, bool]  # (cell, first event id, the cell failed)

_GROUP_LINE = re.compile(r"^(\S+) \S+ concerns=")
_OCC_LINE = re.compile(r"^  \S+-O\d+ (C\S+) \([^,]+, ([^)]+)\) · patterns .*? · events (\S+?-e\d+)")
NONE_REASON = "No pattern group shown here has an occurrence in a failed cell, so no failure is explained by one."


def _groups_from_json(prompt: str) -> dict[str, list[Occurrence]]:
    m = re.search(r"## Pattern groups[^\n]*\n(.*?)\n## ", prompt, re.S)
    try:
        groups = json.loads(m.group(1)) if m else []
    except ValueError:
        return {}
    if isinstance(groups, dict):
        groups = groups.get("groups", [])
    out: dict[str, list[Occurrence]] = {}
    for g in groups if isinstance(groups, list) else []:
        if isinstance(g, dict) and g.get("group_id"):
            out[g["group_id"]] = [
                (o["cell_id"], o["events"][0], not o.get("successful_cell"))
                for o in g.get("occurrences", [])
                if isinstance(o, dict) and o.get("events")
            ]
    return out


def _groups_from_text(prompt: str) -> dict[str, list[Occurrence]]:
    """Groups as Sol's prompts render them: a header line, then a line per occurrence (its evidence indented)."""
    out: dict[str, list[Occurrence]] = {}
    current: list[Occurrence] | None = None
    for line in prompt.splitlines():
        if (g := _GROUP_LINE.match(line)) is not None:
            current = out.setdefault(g[1], [])
        elif current is not None and (o := _OCC_LINE.match(line)) is not None:
            current.append((o[1], o[3], o[2] != "completed"))
        elif not line.startswith("  "):
            current = None
    return out


def _card(group: str, occ: list[Occurrence]) -> dict[str, Any]:
    failed = [o for o in occ if o[2]]
    refs = {cell: ev for cell, ev, _ in reversed(failed)}  # each cell's first occurrence shown
    cells = sorted(refs)
    ok = [o for o in occ if not o[2]][:2]
    return {
        "weakness_id": "W-01",
        "statement": f"Failed runs repeat one step ({group}) with nothing changed in between.",
        "first_divergence": {
            "where": {"stage": "review", "actor": "reviewer", "what": "first occurrence"},
            "cells": cells[:1],
            "event_refs": [refs[cells[0]]],
        },
        "harness_attribution": {"attributed": True, "why": "the controller lets the step repeat"},
        "support": {"cells": cells, "pattern_groups": [group], "event_refs": [refs[c] for c in cells]},
        "alternative_explanations": ["the model itself repeats steps"],
        "counter_evidence": {
            "items": [{"cell": c, "refs": [ev], "note": "completed despite it"} for c, ev, _ in ok],
            "none_reason": None if ok else "no successful cell shows this group here",
        },
        "counterfactual_prediction": "A new batch shows the same group in failed runs; its absence there refutes it.",
        "confidence": "low",
    }


def is_reduce(prompt: str) -> bool:
    """A reduce call's prompt lists the map calls and their drafts (prompts/sol_reduce.j2)."""
    return "## Map calls (which call saw which cells)" in prompt


def sol_answer(prompt: str) -> dict[str, Any]:
    """One weakness from the pattern group with the most failed cells (none when no group has one).

    The one-call prompt shows groups as JSON, a map call's prompt as compact text; a reduce call
    merges every draft it is shown into one card (see :func:`reduce_answer`).
    """
    if is_reduce(prompt):
        return reduce_answer(prompt)
    groups = _groups_from_json(prompt) or _groups_from_text(prompt)
    scored = [(len({o[0] for o in occ if o[2]}), gid) for gid, occ in groups.items()]
    scored = [x for x in scored if x[0]]
    if not scored:
        return {"weaknesses": [], "none_reason": NONE_REASON}  # "no weakness" is said (SolAnswer requires it)
    _, best = max(scored, key=lambda x: (x[0], x[1]))
    return {"weaknesses": [_card(best, groups[best])]}


_SAMPLE = re.compile(r"^  \S+-O\d+ (C\S+) \([^)]+\): events (\S+?-e\d+)")


def reduce_answer(prompt: str) -> dict[str, Any]:
    """Merge every draft shown into W-01, citing the first batch-wide counter-evidence sample."""
    drafts = re.findall(r"^### (\S+/W-\d+) ", prompt, re.M)
    div = re.search(r"first divergence: .* - cells (C[^,;\s]+)[^;]*; refs (\S+?-e\d+)", prompt)
    if not drafts or div is None:
        return {"weaknesses": [], "none_reason": "No draft is shown to merge, so the batch has no weakness here."}
    card = _card("merged", [(div[1], div[2], True)])
    del card["support"]
    card["statement"] = "Failed runs repeat one step with nothing changed in between."
    card["merges"] = drafts
    sample = next((m for line in prompt.splitlines() if (m := _SAMPLE.match(line))), None)
    if sample is not None:
        card["counter_evidence"] = {
            "items": [{"cell": sample[1], "refs": [sample[2]], "note": "completed despite it"}],
            "none_reason": None,
        }
    return {"weaknesses": [card]}


class ScriptedModel:
    """A server handler answering Luna and Sol from the prompt; counts calls per role and the largest request."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: dict[str, int] = {}
        self.largest: dict[str, int] = {}

    def __call__(self, request: dict[str, Any]) -> Reply:
        """One answer: Luna's or Sol's from the prompt, a schema example for any other request."""
        name = request["tools"][0]["function"]["name"] if request.get("tools") else ""
        prompt = "\n".join(str(m.get("content") or "") for m in request.get("messages", []))
        # the role from the answer's schema, as a provider-side router would see it (prompts carry no test plumbing)
        role = {"LunaAnswer": "luna", "SolAnswer": "sol", "ReduceAnswer": "sol"}.get(name, "other")
        with self.lock:
            self.calls[role] = self.calls.get(role, 0) + 1
            self.largest[role] = max(self.largest.get(role, 0), len(prompt))
        if role == "luna":
            data: Any = luna_answer(prompt)
        elif role == "sol":
            data = sol_answer(prompt)
        else:
            return auto_answer(request)  # another request shape (e.g. Sol's map/reduce): a schema-valid example
        return Reply(body=completion_body(request, tool_arguments=json.dumps(data)))

    def take(self) -> tuple[dict[str, int], dict[str, int]]:
        """(calls per role, largest request in characters per role) since the last take; resets both."""
        with self.lock:
            out = (dict(self.calls), dict(self.largest))
            self.calls.clear()
            self.largest.clear()
        return out
