"""The statistics behind every verdict, one place for each test (scipy.stats and statsmodels underneath).

Level and sidedness, as run: a claim declares ``level`` (0.05) and every test is run two-sided at it, i.e.
each one-sided test at ``level / 2``. A one-sided p-value is reported doubled (capped at 1), so every p
compares with ``level``: "reproduced" and "contradicted" together keep the declared two-sided level, and
the t-interval shown is the (1 - level) interval whose side decides them.

Verdict rule for a claim "the mean paired difference d lies above ``margin``" (``direction=+1``; below
it for ``-1``); ``kind`` "superior" or "noninferior" (the same test, the margin then on the losing side),
or "equivalent" (|d| < |margin|, by TOST):
    reproduced              the claim's test rejects toward the claim (for "equivalent": TOST rejects);
    contradicted            it rejects the other way (d significantly on the other side of the margin);
    equivalent within ±δ    the claim's test does not reject, and TOST at ±``delta`` (declared) does;
    not reproduced          the claim's test does not reject, and the test of H0: d = ``effect`` (the
                            published size) against the side of the null does;
    inconclusive            none of these rejects, or no test is possible: n < 2 (one seed), or the
                            differences have no spread (all equal: a t statistic is undefined, and a
                            p of 0 would claim certainty two equal draws cannot give).
The p-values deciding are the adjusted ones the caller passes (Holm within a study, Benjamini-Hochberg
over the report: study/tables.py); without them the raw ones.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as _scipy
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestPower

from .declare import EXPECT_KINDS as KINDS

#: a sample sd at or below this fraction of the differences' size (at least 1) counts as no spread
NO_SPREAD = 1e-9
#: the version of the statistics that decide the verdicts (this module and the judging in study/tables.py):
#: bump it with any change that can move a verdict, so the verdict history (study/history.py) says a verdict
#: moved because the statistics changed rather than because new runs arrived
STATS_VERSION = 1


@dataclass(frozen=True)
class Summary:
    """``mean`` and sample ``std`` (None for n < 2) of ``n`` values."""

    n: int
    mean: float | None
    std: float | None

    def text(self) -> str:
        """'mean ± std'; for one value the value and 'n = 1' (a bare number would read as a mean over the
        planned seeds); '-' for none."""
        if self.mean is None:
            return "-"
        return f"{self.mean:.2f} (n = {self.n})" if self.std is None else f"{self.mean:.2f} ± {self.std:.2f}"


def summarize(values: Iterable[float]) -> Summary:
    values = list(values)
    if not values:
        return Summary(0, None, None)
    return Summary(len(values), statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None)


# ----------------------------------------------------------------------------- tests and intervals


def testable(diffs: Sequence[float]) -> str | None:
    """None when a t-test of ``diffs`` is defined; else why not (n < 2, or no spread: equal differences)."""
    s = summarize(diffs)
    if s.n < 2:
        return f"n = {s.n}: no test possible (a paired t-test needs at least 2 seeds)"
    # a spread this far below the values is the rounding of equal differences (a - b per seed in float64), not
    # variance: a t statistic on it would be a huge number from noise
    if s.std <= NO_SPREAD * max(1.0, max(abs(d) for d in diffs)):
        return (f"n = {s.n}, no variance: every paired difference is {s.mean:+.4g}, so the t statistic is undefined "
                "and no test is possible (equal differences decide nothing)")
    return None


def paired_t_test(diffs: Sequence[float], null: float = 0.0, alternative: str = "two-sided") -> float | None:
    """The p-value of the paired t-test of the mean of ``diffs`` (arm minus baseline, one per seed)
    against ``null``: ``alternative`` "two-sided", "greater" or "less" (scipy.stats.ttest_1samp). None where
    the test is undefined: n < 2, or no spread (:func:`testable`)."""
    if testable(diffs) is not None:
        return None
    return float(_scipy.ttest_1samp(list(diffs), null, alternative=alternative).pvalue)


def paired_t_interval(diffs: Sequence[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """The two-sided paired t confidence interval of the mean of ``diffs`` (None where :func:`testable` says no)."""
    if testable(diffs) is not None:
        return None
    ci = _scipy.ttest_1samp(list(diffs), 0.0).confidence_interval(confidence)
    return float(ci.low), float(ci.high)


def tost(diffs: Sequence[float], low: float, high: float) -> float | None:
    """Two one-sided tests of equivalence, H0: mean <= low or mean >= high: the larger of the two one-sided
    p-values (it rejects at level a exactly when the (1 - 2a) t-interval lies inside (low, high))."""
    p_low, p_high = paired_t_test(diffs, low, "greater"), paired_t_test(diffs, high, "less")
    return None if p_low is None else max(p_low, p_high)


def welch_change(before: Sequence[float], after: Sequence[float],
                 confidence: float = 0.95) -> tuple[float, float, float, float] | None:
    """How much the mean of ``after`` differs from the mean of ``before``, two independent sets of values
    (e.g. a claim's paired differences at two fine-tune lengths: other runs, so the interaction of claim and
    length): (change, low, high, two-sided p) by Welch's t (scipy.stats.ttest_ind, unequal variances);
    None when either set has fewer than 2 values or neither has spread."""
    a, b = list(after), list(before)
    if len(a) < 2 or len(b) < 2 or not (statistics.stdev(a) or statistics.stdev(b)):
        return None
    res = _scipy.ttest_ind(a, b, equal_var=False)
    lo, hi = res.confidence_interval(confidence)
    return statistics.fmean(a) - statistics.fmean(b), float(lo), float(hi), float(res.pvalue)


def crossed_interval(arm: Sequence[np.ndarray], base: Sequence[np.ndarray],
                     confidence: float = 0.95) -> tuple[float, float, float] | None:
    """The (``confidence``) interval of the mean paired difference (x 100: points) when seeds and test items
    cross: seed s's per-item values ``arm[s]``, ``base[s]`` of the two arms on the same I test items, and
    every seed scored on the same items. Returns (low, high, mean); None for fewer than 2 seeds.

    The per-item differences d_si (S seeds x I items) follow the two-way random-effects model
    d_si = mu + a_s + b_i + e_si: a_s ~ (0, sa^2) the seed's effect, b_i ~ (0, sb^2) the item's, shared by every
    seed (what a seed t-interval and a nested resampling of items within seeds both miss), e_si ~ (0, se^2).
    The grand mean m has Var(m) = sa^2 / S + sb^2 / I + se^2 / (S I); with the two-way table's mean squares

        MS_s = I sum_s (r_s - m)^2 / (S - 1),  MS_i = S sum_i (c_i - m)^2 / (I - 1),
        MS_e = sum_si (d_si - r_s - c_i + m)^2 / ((S - 1)(I - 1))          (r_s, c_i: seed and item means)

    E[MS_s] = I sa^2 + se^2 and E[MS_i - MS_e] = S sb^2, so Var(m) = A + B with the seeds' part
    A = MS_s / (S I) (S - 1 df) and the items' part B = max(0, MS_i - MS_e) / (S I) (I - 1 df). The half-width
    sqrt(t(S - 1)^2 A + t(I - 1)^2 B) takes each part with its own t quantile: conservative between the two
    extremes, where Satterthwaite's pooled df from 3 seeds covers about 0.92 (tests/test_studies_stats.py).
    Items missing (NaN) in any seed of either arm are left out, so the table stays balanced."""
    if len(arm) != len(base) or len(arm) < 2:
        return None
    shapes = {np.shape(x) for x in (*arm, *base)}
    if len(shapes) > 1:
        raise ValueError(f"per-item values of shapes {sorted(shapes)} across the seeds and arms (not crossed)")
    d = 100.0 * (np.asarray(arm, dtype=np.float64) - np.asarray(base, dtype=np.float64))  # (S, I)
    d = d[:, ~np.isnan(d).any(axis=0)]
    n_s, n_i = d.shape
    if n_i < 2:
        return None
    m = float(d.mean())
    r, c = d.mean(axis=1), d.mean(axis=0)
    ms_s = n_i * float(((r - m) ** 2).sum()) / (n_s - 1)
    ms_i = n_s * float(((c - m) ** 2).sum()) / (n_i - 1)
    ms_e = float(((d - r[:, None] - c[None, :] + m) ** 2).sum()) / ((n_s - 1) * (n_i - 1))
    q = 0.5 + confidence / 2
    half = math.sqrt((_scipy.t.ppf(q, n_s - 1) ** 2 * ms_s + _scipy.t.ppf(q, n_i - 1) ** 2 * max(0.0, ms_i - ms_e))
                     / (n_s * n_i))
    return m - half, m + half, m


# ----------------------------------------------------------------------------- multiplicity


def adjust(pvalues: Sequence[float], method: str) -> list[float]:
    """``pvalues`` adjusted by statsmodels' ``method``: "holm" (Holm's step-down: controls the family-wise
    error rate) or "fdr_bh" (Benjamini-Hochberg: controls the false discovery rate)."""
    return [float(p) for p in multipletests(list(pvalues), method=method)[1]] if len(pvalues) else []


# ----------------------------------------------------------------------------- power


def power_paired_t(effect: float, sd: float, n: int, level: float = 0.05) -> float:
    """The power of the paired t-test, one-sided at ``level / 2`` (as the verdicts run it), to detect a
    mean difference ``effect`` (> 0, toward the claim) at a per-seed spread ``sd`` with n seeds."""
    return float(TTestPower().power(effect_size=effect / sd, nobs=n, alpha=level / 2, alternative="larger"))


def seeds_for_power(effect: float, sd: float, power: float = 0.8, level: float = 0.05) -> int:
    """The smallest n of seeds at which :func:`power_paired_t` reaches ``power`` (2, the least a test needs,
    when two already do: statsmodels' root finder returns NaN for such large effects)."""
    if power_paired_t(effect, sd, 2, level) >= power:
        return 2
    n = TTestPower().solve_power(effect_size=effect / sd, alpha=level / 2, power=power, alternative="larger")
    return max(2, math.ceil(float(n)))


# ----------------------------------------------------------------------------- verdicts


@dataclass(frozen=True)
class Hypothesis:
    """One null hypothesis a verdict may come from: ``role`` "claim" (the declared test), "equivalence"
    (TOST at ±delta) or "effect" (the published size); ``text`` says what was tested how; ``p``: its
    p-value as a two-sided level compares it (a one-sided p doubled)."""

    role: str
    text: str
    p: float


def doubled(p: float) -> float:
    """A one-sided p as a two-sided level compares it."""
    return min(1.0, 2.0 * p)


def hypotheses(diffs: Sequence[float], *, kind: str = "superior", direction: int, margin: float = 0.0,
               level: float = 0.05, effect: float | None = None, delta: float | None = None) -> list[Hypothesis]:
    """The tests a claim declares (module docstring), on its paired differences; none where no test is
    possible (:func:`testable`)."""
    if direction not in (1, -1):
        raise ValueError(f"direction must be +1 or -1, got {direction}")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if testable(diffs) is not None:
        return []
    def equivalence(role: str, bound: float) -> Hypothesis:
        return Hypothesis(role, f"TOST within ±{bound:g}, each side one-sided at {level / 2:g}",
                          doubled(tost(diffs, -bound, bound)))

    if kind == "equivalent":
        return [equivalence("claim", abs(margin))]
    name = "non-inferiority" if kind == "noninferior" else "superiority"
    out = [Hypothesis("claim", f"{name}: paired t-test of H0 Δ = {margin:g}, two-sided at {level:g}",
                      paired_t_test(diffs, margin))]
    if delta is not None:
        out.append(equivalence("equivalence", delta))
    if effect is not None:
        side = "<" if direction > 0 else ">"
        out.append(Hypothesis("effect", f"the published size: H0 Δ = {effect:+.2f} against Δ {side} {effect:+.2f}, "
                                        f"one-sided at {level / 2:g}",
                              doubled(paired_t_test(diffs, effect, "less" if direction > 0 else "greater"))))
    return out


@dataclass(frozen=True)
class Verdict:
    """The ``word`` (module docstring; "equivalent" printed with its bound), the tests with their raw and
    adjusted p-values, the t-interval at ``1 - level`` and a sentence saying what the verdict rests on."""

    word: str
    n: int
    mean: float | None
    std: float | None
    level: float
    tests: tuple[Hypothesis, ...]
    adjusted: tuple[float, ...]
    interval: tuple[float, float] | None
    why: str
    delta: float | None = None

    @property
    def label(self) -> str:
        return f"equivalent within ±{self.delta:g}" if self.word == "equivalent" else self.word

    def p(self, role: str = "claim") -> tuple[float, float] | None:
        """(raw, adjusted) p of the test of ``role``; None when the claim has none."""
        return next(((h.p, a) for h, a in zip(self.tests, self.adjusted, strict=True) if h.role == role), None)


def verdict(diffs: Sequence[float], *, kind: str = "superior", direction: int, margin: float = 0.0,
            level: float = 0.05, effect: float | None = None, delta: float | None = None,
            adjusted: Sequence[float] | None = None) -> Verdict:
    """The verdict on a claim (module docstring) from its :func:`hypotheses`, deciding on ``adjusted``
    p-values (one per hypothesis, in order; default: the raw ones)."""
    tests = tuple(hypotheses(diffs, kind=kind, direction=direction, margin=margin, level=level, effect=effect,
                             delta=delta))
    s = summarize(diffs)
    interval = paired_t_interval(diffs, 1.0 - level)
    if not tests:
        return Verdict("inconclusive", s.n, s.mean, s.std, level, (), (), None, testable(diffs) or "", delta)
    adjusted = tuple(adjusted) if adjusted is not None else tuple(h.p for h in tests)
    if len(adjusted) != len(tests):
        raise ValueError(f"{len(adjusted)} adjusted p-values for {len(tests)} tests")
    rejects = {h.role: a < level for h, a in zip(tests, adjusted, strict=True)}
    claimed = kind == "equivalent" or (s.mean - margin) * direction > 0  # an equivalence claim has one test
    word = ("reproduced" if claimed else "contradicted") if rejects["claim"] else "equivalent" \
        if rejects.get("equivalence") else "not reproduced" if rejects.get("effect") else "inconclusive"
    said = "; ".join(f"{h.text} (p = {h.p:.3g}, adjusted {a:.3g})" for h, a in zip(tests, adjusted, strict=True))
    return Verdict(word, s.n, s.mean, s.std, level, tests, adjusted, interval, f"n = {s.n} (df {s.n - 1}): {said}",
                   delta)
