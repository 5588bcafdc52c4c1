"""Follow a selected proposal into the next generation (``lunasol followup``): supported, rejected or inconclusive.

Public API: :func:`followup`, :func:`read_followup`, :func:`render_text`, :class:`Followup`,
and the statistics :func:`two_proportions`, :func:`two_means`, :func:`z_from_rates`.
"""

from __future__ import annotations

from pipeline.followup.render import render_text
from pipeline.followup.schema import FOLLOWUP_FILE, Followup
from pipeline.followup.stats import min_detectable_difference, two_means, two_proportions, z_from_rates
from pipeline.followup.verdict import FollowupResult, decide, followup, read_followup

__all__ = [
    "FOLLOWUP_FILE",
    "Followup",
    "FollowupResult",
    "decide",
    "followup",
    "min_detectable_difference",
    "read_followup",
    "render_text",
    "two_means",
    "two_proportions",
    "z_from_rates",
]
