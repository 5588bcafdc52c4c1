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
    return {"patterns": patterns, "rejected_candidates": rejected}


def sol_answer(prompt: str) -> dict[str, Any]:
    """One weakness from the largest pattern group of the prompt (none when it has no groups)."""
    m = re.search(r"## Pattern groups[^\n]*\n(.*?)\n## ", prompt, re.S)
    try:
        groups = json.loads(m.group(1)) if m else []
    except ValueError:
        groups = []
    if isinstance(groups, dict):
        groups = groups.get("groups", [])
    failed = [
        (g, [o for o in g.get("occurrences", []) if not o.get("successful_cell")])
        for g in groups
        if isinstance(g, dict)
    ]
    failed = [(g, occ) for g, occ in failed if occ]
    if not failed:
        return {"weaknesses": []}
    group, occ = max(failed, key=lambda x: len({o["cell_id"] for o in x[1]}))
    cells = sorted({o["cell_id"] for o in occ})
    refs = [o["events"][0] for o in occ if o.get("events")]
    ok = [o for o in group.get("occurrences", []) if o.get("successful_cell") and o.get("events")]
    counter = [{"cell": o["cell_id"], "refs": o["events"][:1], "note": "completed despite it"} for o in ok[:2]]
    none = None if counter else "no successful cell shows this group"
    return {
        "weaknesses": [
            {
                "weakness_id": "W-01",
                "statement": f"Failed runs repeat one step ({group['group_id']}) with nothing changed in between.",
                "first_divergence": {
                    "where": {"stage": "review", "actor": "reviewer", "what": "first occurrence"},
                    "cells": cells[:1],
                    "event_refs": refs[:1],
                },
                "harness_attribution": {"attributed": True, "why": "the controller lets the step repeat"},
                "support": {"cells": cells, "pattern_groups": [group["group_id"]], "event_refs": refs},
                "alternative_explanations": ["the model itself repeats steps"],
                "counter_evidence": {"items": counter, "none_reason": none},
                "counterfactual_prediction": "A new batch shows the same group in failed runs; its absence there "
                "refutes it.",
                "confidence": "low",
            }
        ]
    }


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
        role = "luna" if name == "LunaAnswer" else "sol" if name.startswith("Sol") else name or "other"
        with self.lock:
            self.calls[role] = self.calls.get(role, 0) + 1
            self.largest[role] = max(self.largest.get(role, 0), len(prompt))
        if name == "LunaAnswer":
            data: Any = luna_answer(prompt)
        elif name == "SolAnswer":
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
