"""Small statistics every eval report carries: rates with their binomial standard error.

With 40 labelled cells an accuracy of 0.125 has a standard error of about 0.05, so two sources
0.05 apart are not told apart; each rate is reported with ``sqrt(p (1 - p) / n)`` and its ``n``.
"""

from __future__ import annotations

import math
from typing import Any


def rate(k: int, n: int) -> float | None:
    """``k / n`` rounded to 4 places (None when ``n`` is 0)."""
    return round(k / n, 4) if n else None


def binomial_se(k: int, n: int) -> float | None:
    """Standard error of the rate ``k / n`` under a binomial model (None when ``n`` is 0)."""
    if not n:
        return None
    p = k / n
    return round(math.sqrt(p * (1 - p) / n), 4)


def with_rates(counts: dict[str, int], n: int) -> dict[str, float | None]:
    """``<name>_acc`` and ``<name>_se`` for every count, over ``n`` labelled cells."""
    out: dict[str, float | None] = {}
    for name, k in counts.items():
        out[f"{name}_acc"] = rate(k, n)
        out[f"{name}_se"] = binomial_se(k, n)
    return out


def precision_recall(tp: int, fp: int, fn: int) -> dict[str, Any]:
    """Counts, precision and recall (4 decimals, None without a denominator) with their standard errors."""
    return {
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "precision": round(tp / (tp + fp), 4) if tp + fp else None,
        "precision_se": binomial_se(tp, tp + fp),
        "recall": round(tp / (tp + fn), 4) if tp + fn else None,
        "recall_se": binomial_se(tp, tp + fn),
    }
