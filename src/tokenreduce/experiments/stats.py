"""The statistics every study's tables and verdicts use, written once.

    summarize        mean, sample standard deviation and n of a list of values
    t_cdf, t_ppf     Student's t distribution (through the regularized incomplete beta function:
                     no scipy), checked against tabulated values in the tests
    paired_t         the paired t-test on per-seed differences: t, df, one- and two-sided p-values
    bootstrap_ci     a percentile bootstrap interval of the mean, with a fixed seed (tables rebuild
                     byte-identical)
    verdict          "reproduced", "not reproduced", "contradicted" or "inconclusive", only from a
                     declared one-sided test at a declared level, with n and what the test can
                     resolve at that n (the smallest effect it detects)

Verdict rule for a claim "the paired difference d lies above ``margin``" (``direction=+1``; below
for ``-1``), at level alpha, with the effect the source reports (``effect``, optional):
    contradicted     the one-sided test against the claim rejects (d on the other side of margin);
    reproduced       the one-sided test for the claim rejects;
    not reproduced   neither rejects, but an effect of the reported size would have been detected
                     (|effect - margin| >= the smallest detectable effect at this n and spread);
    inconclusive     neither rejects and the test could not have seen the reported effect (or no
                     effect is reported), or n < 2: one paired value (one seed done) admits no test
                     at all, and its verdict says so instead of computing one.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

VERDICTS = ("reproduced", "not reproduced", "contradicted", "inconclusive")


@dataclass(frozen=True)
class Summary:
    """``mean`` and sample ``std`` (None for n < 2) of ``n`` values."""

    n: int
    mean: float | None
    std: float | None

    def text(self, fmt: str = "{:.2f}") -> str:
        """'mean ± std'; for one value the value and 'n = 1' (it has no spread, and a bare number would
        read as a mean over the planned seeds); '-' for none."""
        if self.mean is None:
            return "-"
        if self.std is None:
            return f"{fmt.format(self.mean)} (n = {self.n})"
        return f"{fmt.format(self.mean)} ± {fmt.format(self.std)}"


def summarize(values: Sequence[float]) -> Summary:
    values = list(values)
    if not values:
        return Summary(0, None, None)
    return Summary(len(values), statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None)


# ----------------------------------------------------------------------------- Student's t


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes 6.4)."""
    tiny, eps = 1e-300, 3e-16
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom: 1 - I_{df/(df+t^2)}(df/2, 1/2) / 2 for t > 0."""
    if df <= 0:
        raise ValueError(f"Student's t needs df > 0, got {df} (n = 1 admits no t-test)")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_ppf(q: float, df: float) -> float:
    """The ``q`` quantile of Student's t (bisection on :func:`t_cdf`; 0 < q < 1)."""
    lo, hi = -1e6, 1e6
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_cdf(mid, df) < q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class TTest:
    """A one-sample t-test of the mean of ``n`` paired differences against ``margin``: ``t`` (None when
    undefined: n < 2 or no spread), ``df``, ``p_greater`` (H1: mean > margin), ``p_less``, ``p_two``."""

    n: int
    mean: float | None
    std: float | None
    margin: float
    t: float | None
    df: int
    p_greater: float | None
    p_less: float | None
    p_two: float | None


def paired_t(diffs: Sequence[float], margin: float = 0.0) -> TTest:
    """The paired t-test on ``diffs`` (one per seed: arm minus its same-seed baseline)."""
    s = summarize(diffs)
    if s.n < 2 or s.mean is None:
        return TTest(s.n, s.mean, s.std, margin, None, max(0, s.n - 1), None, None, None)
    df = s.n - 1
    if not s.std:  # every seed gave the same difference: the sign is certain, the spread is zero
        t = math.inf if s.mean > margin else -math.inf if s.mean < margin else 0.0
    else:
        t = (s.mean - margin) / (s.std / math.sqrt(s.n))
    upper = 1.0 - t_cdf(t, df)
    lower = t_cdf(t, df)
    return TTest(s.n, s.mean, s.std, margin, t, df, upper, lower, min(1.0, 2 * min(upper, lower)))


def smallest_detectable(std: float | None, n: int, level: float) -> float | None:
    """The smallest mean difference a one-sided paired t-test at ``level`` calls significant, given
    the observed spread ``std`` of ``n`` differences: t_{1-level, n-1} * std / sqrt(n)."""
    if std is None or n < 2:
        return None
    return t_ppf(1.0 - level, n - 1) * std / math.sqrt(n)


def bootstrap_ci(values: Sequence[float], level: float = 0.95, resamples: int = 2000,
                 seed: int = 0) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean of ``values`` (None for fewer than 2 values); a fixed
    ``seed`` makes it the same on every rebuild. With n values it takes at most C(2n-1, n) distinct
    resampled means (10 for n = 3): a coarse interval, reported beside the t-test, not instead of it."""
    values = list(values)
    if len(values) < 2:
        return None
    rng = random.Random(seed)
    n = len(values)
    means = sorted(statistics.fmean(rng.choices(values, k=n)) for _ in range(resamples))
    lo = means[int(math.floor((1 - level) / 2 * (resamples - 1)))]
    hi = means[int(math.ceil((1 + level) / 2 * (resamples - 1)))]
    return lo, hi


# ----------------------------------------------------------------------------- verdicts


@dataclass(frozen=True)
class Verdict:
    """The ``word`` (one of VERDICTS), the test behind it and a sentence saying what it rests on."""

    word: str
    test: TTest
    level: float
    direction: int
    detectable: float | None
    ci: tuple[float, float] | None
    why: str


def verdict(diffs: Sequence[float], *, direction: int, margin: float = 0.0, level: float = 0.05,
            effect: float | None = None) -> Verdict:
    """The verdict on the claim "the mean paired difference lies above ``margin``" (``direction=+1``;
    below it for ``-1``) from a one-sided paired t-test at ``level`` (module docstring)."""
    if direction not in (1, -1):
        raise ValueError(f"direction must be +1 or -1, got {direction}")
    test = paired_t(diffs, margin)
    ci = bootstrap_ci(diffs)
    side = "above" if direction > 0 else "below"
    if test.t is None:
        why = f"n = {test.n}: no test possible (a paired t-test needs at least 2 seeds)"
        return Verdict("inconclusive", test, level, direction, None, ci, why)
    p_for, p_against = (test.p_greater, test.p_less) if direction > 0 else (test.p_less, test.p_greater)
    detectable = smallest_detectable(test.std, test.n, level)
    tested = f"one-sided paired t-test, level {level:g}, n = {test.n} (df {test.df})"
    reach = f"the smallest difference it detects at this spread is {detectable:.2f}" if detectable is not None \
        else "the seeds agree exactly (no spread)"
    if p_against < level:
        return Verdict("contradicted", test, level, direction, detectable, ci,
                       f"{tested}: the difference lies significantly on the other side of {margin:g} "
                       f"(p = {p_against:.3g}; {reach})")
    if p_for < level:
        return Verdict("reproduced", test, level, direction, detectable, ci,
                       f"{tested}: the difference lies significantly {side} {margin:g} (p = {p_for:.3g}; {reach})")
    if effect is not None and detectable is not None and abs(effect - margin) >= detectable:
        return Verdict("not reproduced", test, level, direction, detectable, ci,
                       f"{tested}: no significant difference (p = {p_for:.3g}), though {reach} and the source "
                       f"reports {effect:+.2f}")
    gap = f"; the source reports {effect:+.2f}, below that" if effect is not None else "; the source reports no size"
    return Verdict("inconclusive", test, level, direction, detectable, ci,
                   f"{tested}: no significant difference (p = {p_for:.3g}); {reach}{gap}")
