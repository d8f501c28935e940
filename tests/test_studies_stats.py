"""The studies' statistics (experiments/stats.py): Student's t against closed forms and tables, the paired
t-test, the bootstrap interval and the verdict rule on synthetic results."""

from __future__ import annotations

import math

import pytest

from tokenreduce.experiments import stats


@pytest.mark.parametrize("t", [-3.0, -0.4, 0.0, 0.7, 2.5, 12.0])
def test_t_cdf_matches_closed_forms(t: float):
    assert stats.t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)  # Cauchy
    assert stats.t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)


@pytest.mark.parametrize(("q", "df", "expected"), [
    (0.95, 2, 2.919985580), (0.975, 10, 2.228138852), (0.995, 30, 2.749995654), (0.9, 5, 1.475884049),
])
def test_t_quantiles_match_the_tables(q: float, df: int, expected: float):
    assert stats.t_ppf(q, df) == pytest.approx(expected, abs=1e-6)
    assert stats.t_cdf(expected, df) == pytest.approx(q, abs=1e-9)


def test_incomplete_beta_known_values():
    assert stats.betainc(2, 3, 0.4) == pytest.approx(0.5248, abs=1e-12)  # 1 - (1-x)^4 - 4x(1-x)^3
    assert stats.betainc(1, 1, 0.3) == pytest.approx(0.3, abs=1e-12)
    assert stats.betainc(0.5, 0.5, 0.5) == pytest.approx(0.5, abs=1e-12)


def test_paired_t_and_summary():
    diffs = [-7.0, -5.0, -9.0]  # mean -7, sd 2, t = -7 / (2 / sqrt 3)
    test = stats.paired_t(diffs)
    assert test.t == pytest.approx(-7 / (2 / math.sqrt(3)))
    assert test.df == 2 and test.p_less == pytest.approx(stats.t_cdf(test.t, 2))
    assert test.p_two == pytest.approx(2 * test.p_less)
    assert stats.summarize([1.0, 2.0, 3.0]).text() == "2.00 ± 1.00"
    assert stats.summarize([4.0]).text() == "4.00 (n = 1)" and stats.summarize([]).text() == "-"
    assert stats.paired_t([1.0]).t is None


def test_bootstrap_ci_is_fixed_and_brackets_the_mean():
    values = [1.0, 2.0, 4.0, 3.5, 2.2]
    lo, hi = stats.bootstrap_ci(values)
    assert lo < sum(values) / len(values) < hi
    assert stats.bootstrap_ci(values) == (lo, hi)  # a fixed seed: rebuilt tables are identical
    assert stats.bootstrap_ci([1.0]) is None


def test_verdicts_on_synthetic_results():
    # the claim: the arm lowers the metric (direction -1), published effect -3
    reproduced = stats.verdict([-3.1, -2.9, -3.3], direction=-1, effect=-3.0)
    assert reproduced.word == "reproduced" and "n = 3" in reproduced.why
    contradicted = stats.verdict([3.1, 2.9, 3.3], direction=-1, effect=-3.0)
    assert contradicted.word == "contradicted"
    # no significant difference, yet a difference of 3 would have been seen at this spread: not reproduced
    not_reproduced = stats.verdict([0.1, -0.1, 0.05, -0.05], direction=-1, effect=-3.0)
    assert not_reproduced.word == "not reproduced" and not_reproduced.detectable < 3.0
    # the same null result with a spread too large to see an effect of 3: inconclusive, saying why
    noisy = stats.verdict([4.0, -5.0, 1.0], direction=-1, effect=-3.0)
    assert noisy.word == "inconclusive" and noisy.detectable > 3.0 and "smallest difference" in noisy.why
    assert stats.verdict([1.0], direction=1).word == "inconclusive"
    assert stats.verdict([0.1, -0.1, 0.05], direction=1).word == "inconclusive"  # no published size
    with pytest.raises(ValueError):
        stats.verdict([1.0, 2.0], direction=0)


def test_smallest_detectable_effect():
    # t_{0.95, 2} sd / sqrt(3): the difference a 3-seed one-sided test at 0.05 needs
    assert stats.smallest_detectable(1.0, 3, 0.05) == pytest.approx(2.919985580 / math.sqrt(3), abs=1e-6)
    assert stats.smallest_detectable(None, 1, 0.05) is None


def test_one_paired_value_is_inconclusive_with_its_reason_and_no_nan():
    one = stats.verdict([2.5], direction=1, effect=3.0)
    assert one.word == "inconclusive" and one.why.startswith("n = 1: no test possible")
    assert one.test.n == 1 and one.test.t is None and one.detectable is None and one.ci is None
    assert stats.summarize([2.5]).text() == "2.50 (n = 1)"
    with pytest.raises(ValueError, match="df > 0"):  # no t distribution with 0 degrees of freedom
        stats.t_ppf(0.95, 0)


def _one_seed_study():
    from tokenreduce.experiments import Arm, Axis, Bed, Col, Expect, Study

    class OneSeed(Study):  # not registered: its tables read only the declarations and the runs given
        name = "one_seed"
        beds = {"any": Bed(arms={"a": Arm("(a)"), "b": Arm("(b)")}, baseline="a", grid=(Axis("seed", (0, 1, 2), "s"),),
                           columns=(Col("m", "m"), Col("m", "Δ m", paired=True)))}
        expect = (Expect("b above a", "synthetic", arm="b", baseline="a", metric="m", direction=1, effect=2.0),)

    return OneSeed()


def test_a_study_with_one_seed_done_renders_its_tables_and_verdicts():
    from tokenreduce.experiments.tables import summary, verdict_table

    study = _one_seed_study()
    runs = {"a-s0": {"metrics": {"m": 1.0}}, "b-s0": {"metrics": {"m": 3.5}}}
    lines = verdict_table(study, runs)  # divided by zero in Student's t at df 0 before
    row = next(line for line in lines if line.startswith("| b above a"))
    assert "2.50 (n = 1)" in row and "**inconclusive**" in row and "| - |" in row  # no bootstrap interval
    assert any("n = 1: no test possible" in line for line in lines)
    assert not any("degree(s) of freedom" in line for line in lines)  # no t-test to explain
    text = summary(study, runs)
    assert "| (b) | 0 (1, 2 not run) | 3.50 (n = 1) | 2.50 (n = 1) |" in text
    assert "nan" not in text.lower() and " ± " not in text.replace("(mean ± std)", "")
