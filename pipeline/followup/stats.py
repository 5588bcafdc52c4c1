"""The statistics of a follow-up: two proportions (and two means) compared, with the power to see a change.

Everything here is a pure function of counts or values, so the verdict can be recomputed by hand:

- :func:`two_proportions`: the pooled two-proportion z-test (the usual ruler for two pass rates), Fisher's exact
  test on the 2x2 table, the difference with its 95% (Wald) interval, and the minimum difference this
  sample could detect with 80% power at alpha 0.05 in the predicted direction.
- :func:`two_means`: Welch's t-test for a continuous outcome (cost, stability), reported the same way.

scipy supplies the distributions and Fisher's hypergeometric sum (one well-tested implementation
instead of a hand-written one); it is imported inside the functions because ``import scipy.stats``
costs a noticeable fraction of a second and most verbs never need it.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

ALPHA = 0.05
POWER = 0.80
Direction = Literal["down", "up"]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProportionTest(_Frozen):
    """Two proportions compared: parent (a) vs child (b)."""

    a_hits: int
    a_n: int
    b_hits: int
    b_n: int
    a_rate: float | None
    b_rate: float | None
    difference: float | None = Field(description="b_rate - a_rate (negative: fewer in the child)")
    ci95: tuple[float, float] | None = Field(description="Wald 95% interval of the difference")
    z: float | None = Field(description="pooled two-proportion z (None when undefined: no variance)")
    p_z: float | None = Field(description="two-sided p-value of z")
    p_fisher: float | None = Field(description="two-sided p-value of Fisher's exact test")
    significant: bool = Field(description="Fisher's p < alpha (the exact test decides; z is the ruler)")
    predicted: Direction | None = None
    mdd: float | None = Field(
        description="smallest change in the predicted direction detectable with 80% power (None: none is)"
    )
    power_at_full_change: float | None = Field(
        description="power to detect the largest change possible in the predicted direction (to 0 or to 1)"
    )
    powered: bool = Field(description="the sample could detect the predicted change (mdd exists)")


class MeanTest(_Frozen):
    """Two means compared (Welch): parent (a) vs child (b)."""

    a_n: int
    b_n: int
    a_mean: float | None
    b_mean: float | None
    difference: float | None
    ci95: tuple[float, float] | None
    t: float | None
    p: float | None
    significant: bool
    mdd: float | None = Field(description="smallest difference of means detectable with 80% power (normal approx.)")


def _r(x: float | None, nd: int = 6) -> float | None:
    # Rounded so the artifact is stable across platforms' last-bit float differences.
    return None if x is None or math.isnan(x) else round(x, nd)


def _p(x: float | None) -> float | None:
    # p-values keep 4 significant digits (a tiny p must not print as 0).
    return None if x is None or math.isnan(x) else float(f"{x:.4g}")


def z_pooled(a_hits: int, a_n: int, b_hits: int, b_n: int) -> float | None:
    """The pooled two-proportion z of (b - a); None when both rates are 0 or both 1 (no variance)."""
    if a_n <= 0 or b_n <= 0:
        return None
    pa, pb = a_hits / a_n, b_hits / b_n
    pooled = (a_hits + b_hits) / (a_n + b_n)
    se = math.sqrt(pooled * (1 - pooled) * (1 / a_n + 1 / b_n))
    return None if se == 0 else (pb - pa) / se


def z_from_rates(pa: float, pb: float, n: int) -> float:
    """The textbook form for two equal samples given as rates: (pb-pa) / sqrt(p̄(1-p̄)·2/n)."""
    pbar = (pa + pb) / 2
    return (pb - pa) / math.sqrt(pbar * (1 - pbar) * 2 / n)


def _power(pa: float, pb: float, a_n: int, b_n: int) -> float:
    """Power of the two-sided pooled z-test at alpha to detect rates pa -> pb (normal approximation)."""
    from scipy.stats import norm

    z_crit = float(norm.ppf(1 - ALPHA / 2))
    pooled = (pa * a_n + pb * b_n) / (a_n + b_n)
    se0 = math.sqrt(pooled * (1 - pooled) * (1 / a_n + 1 / b_n))
    se1 = math.sqrt(pa * (1 - pa) / a_n + pb * (1 - pb) / b_n)
    if se1 == 0:
        return 1.0 if pa != pb else 0.0
    d = abs(pb - pa)
    return float(norm.cdf((d - z_crit * se0) / se1) + norm.cdf((-d - z_crit * se0) / se1))


def min_detectable_difference(pa: float, a_n: int, b_n: int, direction: Direction) -> tuple[float | None, float]:
    """(MDD, power at the largest possible change) for a change of ``pa`` in ``direction``.

    The MDD is the smallest |pb - pa| the test detects with 80% power; None when even the largest
    possible change (pa -> 0 when ``down``, pa -> 1 when ``up``) stays below 80% power.
    """
    room = pa if direction == "down" else 1 - pa
    sign = -1 if direction == "down" else 1
    full = _power(pa, pa + sign * room, a_n, b_n) if room > 0 else 0.0
    if room <= 0 or full < POWER:
        return None, full
    lo, hi = 0.0, room
    for _ in range(60):  # bisection: power grows with the difference on this side
        mid = (lo + hi) / 2
        if _power(pa, pa + sign * mid, a_n, b_n) >= POWER:
            hi = mid
        else:
            lo = mid
    return hi, full


def two_proportions(a_hits: int, a_n: int, b_hits: int, b_n: int, predicted: Direction | None = None) -> ProportionTest:
    """Compare a_hits/a_n (parent) with b_hits/b_n (child); see the module docstring."""
    from scipy.stats import fisher_exact, norm

    if not (0 <= a_hits <= a_n and 0 <= b_hits <= b_n):
        raise ValueError(f"counts out of range: {a_hits}/{a_n}, {b_hits}/{b_n}")
    if a_n == 0 or b_n == 0:
        return ProportionTest(
            a_hits=a_hits, a_n=a_n, b_hits=b_hits, b_n=b_n, a_rate=None, b_rate=None, difference=None,
            ci95=None, z=None, p_z=None, p_fisher=None, significant=False, predicted=predicted, mdd=None,
            power_at_full_change=None, powered=False,
        )  # fmt: skip
    pa, pb = a_hits / a_n, b_hits / b_n
    diff = pb - pa
    z = z_pooled(a_hits, a_n, b_hits, b_n)
    p_z = None if z is None else float(2 * norm.sf(abs(z)))
    _, p_f = fisher_exact([[a_hits, a_n - a_hits], [b_hits, b_n - b_hits]], alternative="two-sided")
    p_fisher = min(1.0, float(p_f))
    se = math.sqrt(pa * (1 - pa) / a_n + pb * (1 - pb) / b_n)
    half = float(norm.ppf(1 - ALPHA / 2)) * se
    mdd, full = (None, None) if predicted is None else min_detectable_difference(pa, a_n, b_n, predicted)
    ci = (max(-1.0, diff - half), min(1.0, diff + half))
    return ProportionTest(
        a_hits=a_hits, a_n=a_n, b_hits=b_hits, b_n=b_n, a_rate=_r(pa), b_rate=_r(pb), difference=_r(diff),
        ci95=(_r(ci[0]) or 0.0, _r(ci[1]) or 0.0), z=_r(z, 4), p_z=_p(p_z), p_fisher=_p(p_fisher),
        significant=p_fisher < ALPHA, predicted=predicted, mdd=_r(mdd, 4), power_at_full_change=_r(full, 4),
        powered=mdd is not None,
    )  # fmt: skip


def two_means(a: list[float], b: list[float]) -> MeanTest:
    """Welch's t-test of mean(b) - mean(a), its 95% interval, and the MDD at 80% power."""
    from scipy.stats import norm
    from scipy.stats import t as t_dist

    na, nb = len(a), len(b)
    ma = sum(a) / na if na else None
    mb = sum(b) / nb if nb else None
    if na < 2 or nb < 2 or ma is None or mb is None:
        diff = None if ma is None or mb is None else mb - ma
        return MeanTest(a_n=na, b_n=nb, a_mean=_r(ma), b_mean=_r(mb), difference=_r(diff), ci95=None, t=None,
                        p=None, significant=False, mdd=None)  # fmt: skip
    va = sum((x - ma) ** 2 for x in a) / (na - 1)
    vb = sum((x - mb) ** 2 for x in b) / (nb - 1)
    se = math.sqrt(va / na + vb / nb)
    diff = mb - ma
    if se == 0:
        return MeanTest(a_n=na, b_n=nb, a_mean=_r(ma), b_mean=_r(mb), difference=_r(diff), ci95=(_r(diff) or 0.0,
                        _r(diff) or 0.0), t=None, p=None, significant=False, mdd=0.0)  # fmt: skip
    # Welch-Satterthwaite degrees of freedom; computed here rather than by scipy's ttest_ind, which warns
    # (and loses precision) when one side has no variance, as a metric that every child cell shares does.
    dof = (va / na + vb / nb) ** 2 / ((va / na) ** 2 / (na - 1) + (vb / nb) ** 2 / (nb - 1))
    t_stat = diff / se
    half = float(t_dist.ppf(1 - ALPHA / 2, dof)) * se
    mdd = (float(norm.ppf(1 - ALPHA / 2)) + float(norm.ppf(POWER))) * se
    p = float(2 * t_dist.sf(abs(t_stat), dof))
    return MeanTest(
        a_n=na, b_n=nb, a_mean=_r(ma), b_mean=_r(mb), difference=_r(diff),
        ci95=(_r(diff - half) or 0.0, _r(diff + half) or 0.0), t=_r(t_stat, 4), p=_p(p),
        significant=p < ALPHA, mdd=_r(mdd, 4),
    )  # fmt: skip
