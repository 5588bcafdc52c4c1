"""Sol: root-cause mining over the whole batch, into a checked weakness shortlist.

Public API::

    from pipeline.sol import stage, mine, WeaknessCard, SolAnswer, check_card, find_prescriptions
    from pipeline.sol import read_shortlist, Shortlist
"""

from pipeline.sol.cards import Dropped, SolAnswer, WeaknessCard, WeaknessDraft
from pipeline.sol.checks import EvidenceIndex, check_answer, check_card, find_prescriptions, load_index
from pipeline.sol.shortlist import SHORTLIST_FILE, Shortlist, read_shortlist, write_shortlist
from pipeline.sol.stage import mine, plan, stage

__all__ = [
    "SHORTLIST_FILE",
    "Dropped",
    "EvidenceIndex",
    "Shortlist",
    "SolAnswer",
    "WeaknessCard",
    "WeaknessDraft",
    "check_answer",
    "check_card",
    "find_prescriptions",
    "load_index",
    "mine",
    "plan",
    "read_shortlist",
    "stage",
    "write_shortlist",
]
