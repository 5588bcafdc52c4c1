"""Luna: behaviour patterns per cell (what happened, never why), checked against the IR and the probes."""

from __future__ import annotations

from pipeline.luna.merge import Conflict, Verdict, merge_cell
from pipeline.luna.patterns import (
    PATTERN_TYPES,
    CandidateRejection,
    LunaAnswer,
    LunaPattern,
    Pattern,
    check_answer,
    why_phrases,
)
from pipeline.luna.render import context_budget, load_cells, render_event, split_parts
from pipeline.luna.stage import PATTERNS_FILE, plan, run_luna, stage, write_outputs

__all__ = [
    "PATTERNS_FILE",
    "PATTERN_TYPES",
    "CandidateRejection",
    "Conflict",
    "LunaAnswer",
    "LunaPattern",
    "Pattern",
    "Verdict",
    "check_answer",
    "context_budget",
    "load_cells",
    "merge_cell",
    "plan",
    "render_event",
    "run_luna",
    "split_parts",
    "stage",
    "why_phrases",
    "write_outputs",
]
