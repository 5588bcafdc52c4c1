"""Follow a selected proposal into the next generation (``lunasol followup``): supported, rejected or inconclusive.

Public API: :func:`followup`, :func:`read_followup`, :func:`render_text`, :class:`Followup`,
and the statistics :func:`two_proportions`, :func:`two_means`, :func:`z_from_rates`.
"""

from __future__ import annotations

from pipeline.followup.core import FollowupResult, decide, followup, read_followup
from pipeline.followup.model import FOLLOWUP_FILE, Followup
from pipeline.followup.render import render_text
from pipeline.followup.stats import min_detectable_difference, two_means, two_proportions, z_from_rates

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
