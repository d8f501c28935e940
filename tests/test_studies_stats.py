"""The studies' statistics (study/stats.py) on synthetic data with a known truth, and how the tables
(study/tables.py) map claims to tests, adjusted p-values and verdicts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tokenreduce.core.errors import SpecError
from tokenreduce.study import stats
from tokenreduce.study.declare import CONFIRMATORY


def test_the_t_interval_covers_the_true_mean_at_its_nominal_rate():
    rng = np.random.default_rng(0)
    for n, confidence in ((3, 0.95), (5, 0.90)):
        hits = 0
        for _ in range(2000):
            lo, hi = stats.paired_t_interval(rng.normal(1.5, 2.0, n).tolist(), confidence)
            hits += lo <= 1.5 <= hi
        assert abs(hits / 2000 - confidence) <= 0.02, (n, hits / 2000)


def test_the_paired_t_test_and_interval_agree_and_summarize():
    diffs = [-7.0, -5.0, -9.0]  # mean -7, sd 2
    lo, hi = stats.paired_t_interval(diffs, 0.95)
    assert (lo + hi) / 2 == pytest.approx(-7.0) and hi - lo == pytest.approx(2 * 4.302653 * 2 / math.sqrt(3), 1e-5)
    # the interval excludes a value exactly when the two-sided test at its level rejects it
    assert stats.paired_t_test(diffs, hi + 1e-6) < 0.05 < stats.paired_t_test(diffs, hi - 1e-6)
    assert stats.paired_t_test(diffs, 0, "less") == pytest.approx(stats.paired_t_test(diffs, 0) / 2)
    assert stats.paired_t_test([1.0]) is None and stats.paired_t_interval([1.0]) is None
    # no spread: the t statistic is undefined, so no p (never a 0 that claims certainty) and no interval
    assert stats.paired_t_test([2.0, 2.0, 2.0], 0, "greater") is None and stats.paired_t_interval([2.0, 2.0]) is None
    assert stats.summarize([1.0, 2.0, 3.0]).text() == "2.00 ± 1.00"
    assert stats.summarize([4.0]).text() == "4.00 (n = 1)" and stats.summarize([]).text() == "-"


def _holm_by_hand(p: list[float]) -> list[float]:
    order, m, out, running = sorted(range(len(p)), key=p.__getitem__), len(p), [0.0] * len(p), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


def _bh_by_hand(p: list[float]) -> list[float]:
    order, m, out, running = sorted(range(len(p)), key=p.__getitem__, reverse=True), len(p), [0.0] * len(p), 1.0
    for k, i in enumerate(order):
        running = min(running, p[i] * m / (m - k))
        out[i] = running
    return out


@pytest.mark.parametrize("seed", range(2))
def test_holm_and_benjamini_hochberg_match_the_step_procedures(seed: int):
    from statsmodels.stats.multitest import multipletests

    p = np.random.default_rng(seed).uniform(0, 0.2, 1 + 7 * seed).tolist()
    assert stats.adjust(p, "holm") == pytest.approx(_holm_by_hand(p))
    assert stats.adjust(p, "holm") == pytest.approx(multipletests(p, method="holm")[1])
    assert stats.adjust(p, "fdr_bh") == pytest.approx(_bh_by_hand(p))
    assert stats.adjust(p, "fdr_bh") == pytest.approx(multipletests(p, method="fdr_bh")[1])


def test_tost_finds_a_pinned_difference_equivalent_and_a_loose_one_not():
    pinned = [-0.05, 0.02, 0.08, -0.01, 0.03]  # within a few hundredths of 0
    loose = [-1.5, 1.2, 0.4, -0.9, 1.0]  # mean near 0 too, but spread over ±1.5
    assert stats.tost(pinned, -0.5, 0.5) < 0.025 < stats.tost(loose, -0.5, 0.5)
    v = stats.verdict(pinned, direction=1, delta=0.5)
    assert v.word == "equivalent" and v.label == "equivalent within ±0.5"
    assert stats.verdict(loose, direction=1, delta=0.5).word == "inconclusive"
    assert stats.verdict(pinned, direction=1).word == "inconclusive"  # no bound declared: no equivalence test
    assert stats.verdict(pinned, kind="equivalent", direction=1, margin=0.5).word == "reproduced"


def test_not_reproduced_only_from_a_test_that_rejects_the_published_effect():
    # d near 0 with a tight spread: the published +3 is rejected -> not reproduced
    tight = stats.verdict([0.1, -0.1, 0.05, -0.05], direction=1, effect=3.0)
    assert tight.word == "not reproduced" and tight.p("effect")[0] < 0.05
    # compatible with both 0 and the published +0.79 (ImagePiece in front of ToMe on Fashion-MNIST) -> inconclusive
    wide = stats.verdict([0.93, 0.05, 0.25], direction=1, effect=0.79)
    assert wide.word == "inconclusive" and wide.p("effect")[0] > 0.05
    assert stats.verdict([0.1, -0.1, 0.05, -0.05], direction=1).word == "inconclusive"  # no published size


def test_the_claims_test_decides_reproduced_and_contradicted_two_sided():
    assert stats.verdict([-3.1, -2.9, -3.3], direction=-1, effect=-3.0).word == "reproduced"
    assert stats.verdict([3.1, 2.9, 3.3], direction=-1, effect=-3.0).word == "contradicted"
    # one-sided p 0.034 (< 0.05, the previous rule's "reproduced"), two-sided 0.068: not at 0.05 two-sided
    v = stats.verdict([4.0, 3.9, 1.4], direction=1)
    assert 0.05 < v.p()[0] < 0.1 and v.word == "inconclusive"
    # a non-inferiority claim: a loss well inside the margin is non-inferior
    ni = stats.verdict([-0.1, 0.0, -0.05, -0.08], kind="noninferior", direction=1, margin=-0.5)
    assert ni.word == "reproduced" and ni.tests[0].text.startswith("non-inferiority")
    # the adjusted p decides, the raw one is kept
    adj = stats.verdict([-3.1, -2.9, -3.3], direction=-1, adjusted=[0.2])
    assert adj.word == "inconclusive" and adj.p()[1] == 0.2 and adj.p()[0] < 0.01
    with pytest.raises(ValueError):
        stats.verdict([1.0, 2.0], direction=0)


def test_one_paired_value_is_inconclusive_with_its_reason_and_no_nan():
    one = stats.verdict([2.5], direction=1, effect=3.0)
    assert one.word == "inconclusive" and one.why.startswith("n = 1: no test possible")
    assert one.n == 1 and one.tests == () and one.interval is None and one.p() is None


def _crossed(rng: np.random.Generator, sd_seed: float, sd_item: float, sd_res: float, n_seeds: int = 3,
             n_items: int = 10_000, mean: float = 0.02) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per-item values of two arms on the same items in every seed: the differences follow the crossed model
    mean + seed effect + item effect (shared by the seeds) + residual."""
    item = rng.normal(0.0, sd_item, n_items)
    base = [rng.random(n_items) for _ in range(n_seeds)]
    arm = [b + mean + rng.normal(0.0, sd_seed) + item + rng.normal(0.0, sd_res, n_items) for b in base]
    return arm, base


def test_the_crossed_interval_is_centred_on_the_mean_difference_and_leaves_out_missing_items():
    rng = np.random.default_rng(1)
    arm, base = _crossed(rng, 0.01, 0.05, 0.05, n_items=2000)
    arm[0][:10] = np.nan  # items without a value in any seed are left out of every seed
    lo, hi, centre = stats.crossed_interval(arm, base)
    keep = slice(10, None)
    mean = 100 * np.mean([np.mean(a[keep] - b[keep]) for a, b in zip(arm, base, strict=True)])
    assert centre == pytest.approx(mean) and lo < centre < hi
    assert stats.crossed_interval(arm, base) == (lo, hi, centre)  # no randomness: the same bytes
    noisy = stats.crossed_interval(*_crossed(np.random.default_rng(1), 0.01, 0.5, 0.05, n_items=2000))
    assert noisy[1] - noisy[0] > hi - lo  # item noise shared by the seeds widens it
    assert stats.crossed_interval(arm[:1], base[:1]) is None
    with pytest.raises(ValueError, match="not crossed"):
        stats.crossed_interval([arm[0], arm[1][:5]], [base[0], base[1][:5]])


@pytest.mark.parametrize("sd_seed", [0.0, 0.002, 0.01, 0.05])
def test_the_crossed_interval_covers_at_the_studies_n_from_negligible_to_dominant_seed_variance(sd_seed):
    """3 seeds x 10 000 items (the one-epoch runs), item and residual spread of per-item differences of
    correctness, seed spread from none to dominant (0.05: 5 points a seed against ~0.1 from the items)."""
    rng = np.random.default_rng(int(sd_seed * 1e4))
    reps, hits = 600, 0
    for _ in range(reps):
        arm, base = _crossed(rng, sd_seed, 0.3, 0.4)
        lo, hi, _ = stats.crossed_interval(arm, base)
        hits += lo <= 100 * 0.02 <= hi
    assert hits / reps >= 0.93


def test_power_before_running():
    n = stats.seeds_for_power(1.0, 1.0)  # detect 1 sd, one-sided at 0.025, 80%
    assert stats.power_paired_t(1.0, 1.0, n) >= 0.8 > stats.power_paired_t(1.0, 1.0, n - 1)
    assert n == 10
    assert stats.seeds_for_power(50.0, 1.0) == 2  # statsmodels' solver gives NaN this far out


# ----------------------------------------------------------------------------- claims -> tests -> verdicts


def _study(expect, arms=("a", "b", "c"), measures=(), name="synthetic"):
    from tokenreduce.study import Arm, Axis, Bed, Col, Study

    class Synthetic(Study):  # not registered: its tables read only the declarations and the runs given
        pass
    Synthetic.name = name
    Synthetic.expect = tuple(expect)
    Synthetic.beds = {"any": Bed(arms={a: Arm(f"({a})") for a in arms}, baseline=arms[0], evaluations=measures,
                                 grid=(Axis("seed", (0, 1, 2), "s"),),
                                 columns=(Col("m", "m"), Col("m", "Δ m", paired=True)))}
    return Synthetic()


def _runs(values: dict[str, list[float]], git: str = "0123abc") -> dict[str, dict]:
    return {f"{arm}-s{s}": {"id": f"{arm}-s{s}", "metrics": {"m": v}, "provenance": {"git": git}}
            for arm, vs in values.items() for s, v in enumerate(vs)}


def test_a_study_with_one_seed_done_renders_its_tables_and_verdicts():
    from tokenreduce.study import Expect
    from tokenreduce.study.tables import summary, verdict_table

    study = _study([Expect("b above a", "synthetic", arm="b", baseline="a", metric="m", direction=1,
                           reported=(2.0, ""))])
    runs = {"a-s0": {"metrics": {"m": 1.0}}, "b-s0": {"metrics": {"m": 3.5}}}
    lines = verdict_table(study, runs)
    row = next(line for line in lines if line.startswith("| b above a"))
    assert "2.50 (n = 1)" in row and "**inconclusive**" in row and "| - | - |" in row  # no interval, no p
    assert any("n = 1: no test possible" in line for line in lines)
    text = summary(study, runs)
    assert "| (b) | 0 (1, 2 not run) | 3.50 (n = 1) | 2.50 (n = 1) |" in text
    assert "nan" not in text.lower() and "95% t-interval" in text and "seed-level only" in text


def test_a_record_without_a_column_metric_shows_in_that_cell_n():
    """The seeds cell lists the records; a column whose metric one of them lacks says over how many it is."""
    from tokenreduce.study.tables import summary

    study = _study([])
    runs = _runs({"a": [1.0, 2.0, 3.0], "b": [2.0, 4.0, 5.0]})
    del runs["b-s2"]["metrics"]["m"]
    del runs["b-s1"]["metrics"]["m"]
    row = next(line for line in summary(study, runs).splitlines() if line.startswith("| (b) |"))
    assert row == "| (b) | 0, 1, 2 | 2.00 (n = 1 of 3) | 1.00 (n = 1 of 3) |"
    del runs["a-s0"]
    row = next(line for line in summary(study, runs).splitlines() if line.startswith("| (b) |"))
    assert row == "| (b) | 0, 1, 2 | 2.00 (n = 1 of 3) | - |"


def test_verdicts_decide_on_holm_within_the_study_and_bh_over_the_report():
    from tokenreduce.study import Expect
    from tokenreduce.study.tables import judge

    one = _study([Expect("b above a", "s", arm="b", baseline="a", metric="m", direction=1),
                  Expect("c above a", "s", arm="c", baseline="a", metric="m", direction=1, reported=(5.0, ""))])
    other = _study([Expect("c above b", "s", arm="c", baseline="b", metric="m", direction=1)], name="other")
    runs = _runs({"a": [0, 0, 0], "b": [1.0, 1.1, 0.9], "c": [3.0, 1.0, 2.2]})
    judgement = judge([(one, runs), (other, runs)])
    mine, theirs = judgement.judged["synthetic/any"], judgement.judged["other/any"]
    raw_one = [h.p for j in mine for h in j.verdict.tests]  # b: its test; c: its test and the published effect's
    raw_other = [h.p for j in theirs for h in j.verdict.tests]
    bh = _bh_by_hand(raw_one + raw_other)
    holm = _holm_by_hand(raw_one) + _holm_by_hand(raw_other)
    shown = [a for j in (*mine, *theirs) for a in j.verdict.adjusted]
    assert shown == pytest.approx([max(h, b) for h, b in zip(holm, bh, strict=True)])
    assert judgement.holm == {"synthetic": 3, "other": 1} and judgement.bh == 4
    for j in (*mine, *theirs):  # the word follows the adjusted p of the claim's test; the raw p stays beside it
        raw, adjusted = j.verdict.p()
        assert raw <= adjusted and (j.verdict.word in ("reproduced", "contradicted")) == (adjusted < 0.05)
    assert mine[0].verdict.word == "reproduced" and mine[0].verdict.p()[0] < 0.05 / 3


def _own(claim: str, arm: str, **kw):
    """An exploratory claim: its source names the contrast as this project's own."""
    from tokenreduce.study import Expect
    from tokenreduce.study.declare import OWN

    return Expect(claim, f"synthetic, {OWN} reading", arm=arm, baseline="a", metric="m", **kw)


def test_an_exploratory_claim_shows_its_raw_p_and_interval_and_never_a_verdict_word():
    from tokenreduce.study import Expect
    from tokenreduce.study.tables import EXPLORATORY, judge, p_text, verdict_table, word

    up, down = _own("b above a", "b", direction=1), _own("c above a", "c", direction=1, reported=(5.0, ""))
    study = _study([up, down, Expect("d above a", "s", arm="b", baseline="a", metric="m", direction=1)])
    runs = _runs({"a": [0, 0, 0], "b": [4.0, 4.1, 3.9], "c": [-3.0, -3.2, -2.9]}, git="0123abc-dirty")
    judged = judge([(study, runs)]).judged[study.key]
    assert not up.confirmatory and judged[2].expect.confirmatory
    for j in judged[:2]:  # decided by their raw p these would read reproduced / contradicted (and provisional)
        raw = j.verdict.p()[0]
        assert raw < 0.001 and word(j) == EXPLORATORY and p_text(j) == f"{raw:.3g} / -"
        assert j.verdict.interval is not None and not any(w in j.why for w in ("reproduced", "contradicted",
                                                                               "provisional", "adjusted"))
    assert word(judged[2]) == "provisional (uncommitted code)"  # the confirmatory one, from the same records
    table = "\n".join(verdict_table(study, runs))
    assert table.count(f"**{EXPLORATORY}**") == 2 and "**reproduced**" not in table and "**contradicted**" not in table
    assert "Claims of study synthetic in this test bed: 1 confirmatory and 2 exploratory." in table


def test_adding_or_removing_an_exploratory_claim_leaves_every_confirmatory_adjusted_p_as_it_was():
    from tokenreduce.study import Expect
    from tokenreduce.study.tables import judge

    confirmed = [Expect("b above a", "s", arm="b", baseline="a", metric="m", direction=1),
                 Expect("c above a", "s", arm="c", baseline="a", metric="m", direction=1, reported=(5.0, ""))]
    other = _study([Expect("c above b", "s", arm="c", baseline="b", metric="m", direction=1)], name="other")
    runs = _runs({"a": [0, 0, 0], "b": [1.0, 1.1, 0.9], "c": [3.0, 1.0, 2.2]})

    def adjusted(own: list) -> dict:
        judgement = judge([(_study([*own[:1], *confirmed, *own[1:]]), runs), (other, runs)])
        return {(key, j.claim): j.verdict.adjusted for key, js in judgement.judged.items() for j in js
                if j.expect.confirmatory}

    alone = adjusted([])
    assert len(alone) == 3 and max(a for v in alone.values() for a in v) < 1  # the families adjust something
    for own in ([_own("b below a", "b", direction=-1)],  # decided alone by its raw p (0.001), before and after
                [_own("b below a", "b", direction=-1), _own("c above b", "c", direction=1, reported=(1.0, ""))]):
        assert adjusted(own) == alone


def test_the_family_sizes_equal_the_confirmatory_tests():
    from tokenreduce.study import Expect
    from tokenreduce.study.tables import judge

    one = _study([Expect("b above a", "s", arm="b", baseline="a", metric="m", direction=1),
                  Expect("c above a", "s", arm="c", baseline="a", metric="m", direction=1, reported=(5.0, "")),
                  _own("c below b", "c", direction=-1), _own("c above a, own", "c", direction=1, reported=(1.0, ""))])
    other = _study([_own("c above b", "c", direction=1)], name="other")  # exploratory only: no family
    runs = _runs({"a": [0, 0, 0], "b": [1.0, 1.1, 0.9]})  # c not run: its confirmatory tests wait at p = 1
    judgement = judge([(one, runs), (other, runs)])
    assert judgement.holm == {"synthetic": 3} and judgement.bh == 3 and judgement.waiting == {"synthetic": 2}


def test_the_studies_declare_exploratory_exactly_their_own_contrasts():
    """The designation, read from each claim's source: this project's readings of ImagePiece and its random
    floors where the paper has none (PiToMe, SAINT, the representation shift) are exploratory, the rest
    confirmatory."""
    from collections import Counter

    from tokenreduce.study.declare import get_study, list_studies

    own = Counter(name for name in list_studies() for e in get_study(name).expect if not e.confirmatory)
    assert own == {"imagepiece": 3, "pitome": 2, "saint": 7}
    texts = [e.claim for name in list_studies() for e in get_study(name).expect if not e.confirmatory]
    assert [t for t in texts if "beats the random pruner" not in t and "than by the random pruner" not in t] == \
        ["proportional attention helps ImagePiece", "spatial A/B order beats order by score",
         "spatial A/B order beats a random order"]


def test_a_family_claim_pools_its_members_per_seed():
    from tokenreduce.study import Expect
    from tokenreduce.study.tables import verdict_table, verdicts

    fam = "every arm above a"
    study = _study([Expect("b above a", "s", arm="b", baseline="a", metric="m", direction=1, family=fam),
                    Expect("c above a", "s", arm="c", baseline="a", metric="m", direction=1, family=fam)])
    runs = _runs({"a": [0, 0, 0], "b": [1.0, 2.0, 0.5], "c": [3.0, 1.0, 2.5]})
    judged = verdicts(study, runs)
    family = next(j for j in judged if j.members)
    assert family.claim == fam and family.members == 2 and family.diffs == pytest.approx([2.0, 1.5, 1.5])
    assert any("a family claim" in line for line in verdict_table(study, runs))
    with pytest.raises(SpecError, match="mixes"):
        verdicts(_study([Expect("b", "s", arm="b", baseline="a", metric="m", direction=1, family=fam),
                         Expect("c", "s", arm="c", baseline="a", metric="m", direction=-1, family=fam)]), runs)


def test_equal_measured_speed_is_an_equivalence_test_on_the_interleaved_rounds():
    from tokenreduce.bench.speed import timing_noise
    from tokenreduce.study import Expect, Timing
    from tokenreduce.study.tables import claim_text

    study = _study([Expect("b beats c {at_speed}", "s", arm="b", baseline="c", metric="m", direction=1,
                           speed=("speed", 0.1))],
                   measures=(Timing("speed", at={"seed": 0}, finetuned=("b", "c")),))
    rng = np.random.default_rng(0)
    base = 100.0 + rng.normal(0, 10, 10)  # images/s of the unpatched model, round by round (drift shared)

    def record(b: float, c: float, noise: float) -> dict:
        rows = [{"kind": "fine-tuned", "speedup": v, "runs": [{"run": f"{arm}-s0"}],
                 "img_per_s_runs": (base * (v + rng.normal(0, noise, 10))).tolist()} for arm, v in (("b", b), ("c", c))]
        unpatched = {"kind": "unpatched", "speedup": 1.0, "runs": [], "img_per_s_runs": base.tolist()}
        return {"speed": {"result": {"results": [unpatched, *rows]}}}

    e = study.expect[0]
    assert claim_text(study, record(1.44, 1.47, 0.01), e).startswith(
        "b beats c at equal measured speed (1.44x and 1.47x; TOST within ±0.1x over 10 interleaved rounds: p = ")
    # close medians, but rounds too noisy to show them within the margin: not "equal"
    assert claim_text(study, record(1.44, 1.47, 0.3), e).startswith(
        "b beats c at its own pick (1.44x against 1.47x measured; not shown equal, TOST within ±0.1x")
    # rounds that differ by more than the margin
    assert claim_text(study, record(1.30, 1.47, 0.01), e).startswith("b beats c at its own pick (1.30x against 1.47x")
    assert "no per-round timings" in claim_text(study, {}, e)
    noise = timing_noise(record(1.44, 1.47, 0.05)["speed"]["result"]["results"])
    assert noise.startswith("Timing noise, measured: a row's speed-up moves from round to round with a pooled sd of")
    assert "sd of 0.05" in noise or "sd of 0.04" in noise
    with pytest.raises(SpecError, match="at_speed"):
        Expect("b beats c at equal speed", "s", arm="b", baseline="c", metric="m", direction=1, speed=("speed", 0.1))


def test_margins_and_power_plans_are_declared_with_their_reasons():
    from tokenreduce.study import Expect
    from tokenreduce.study.tables import verdicts

    with pytest.raises(SpecError, match="losing side"):
        Expect("costs nothing", "s", arm="b", baseline="a", metric="m", direction=1, kind="noninferior", margin=0.5,
               why="x")
    with pytest.raises(SpecError, match="why"):
        Expect("costs nothing", "s", arm="b", baseline="a", metric="m", direction=1, kind="noninferior", margin=-0.5)
    with pytest.raises(SpecError, match="a power plan's effect is positive"):
        Expect("b above a", "s", arm="b", baseline="a", metric="m", direction=1, power=-1.0)
    study = _study([Expect("c above a", "s", arm="c", baseline="a", metric="m", direction=1, reported=(2.0, ""))])
    judged = verdicts(study, _runs({"a": [0, 0, 0], "c": [3.0, 1.0, 2.5]}))
    assert stats.seeds_for_power(1.0, 1.0) == 10 and stats.seeds_for_power(1.0, 1.0, level=0.05 / 3) == 14
    assert "no power plan was declared before the runs; post hoc" in judged[0].why


def test_a_power_plan_on_a_longer_fine_tune_reads_its_pilot_from_the_records_and_shows_before_its_runs():
    """The one-epoch claims' plans: the pilot sd is the same contrast's at 100 steps, read from the stored
    records (no number typed twice), and the plan is in the report before any of the claim's runs exist."""
    import statistics
    from pathlib import Path

    from tokenreduce.studies.beds import at_longer
    from tokenreduce.study import Expect
    from tokenreduce.study.declare import get_study
    from tokenreduce.study.plan import Layout
    from tokenreduce.study.records import load_runs
    from tokenreduce.study.tables import judge, paired_by_seed, verdicts

    study = get_study("bspf")("scenes")
    root = Path(__file__).resolve().parents[1] / "results" / study.key
    runs = load_runs(Layout(root, root), study)
    claim = "W_q = W_k costs no accuracy from a fair start"
    j = next(j for j in verdicts(study, runs) if j.claim.startswith(claim) and j.expect.at == {"steps": 937})
    sd = statistics.stdev(paired_by_seed(study, runs, "bspf_tied2", "bspf_untied2", "top1", {"steps": 100}).values())
    family = judge([(study, runs)]).holm["bspf"]  # every test the bed declares, run or not
    n = stats.seeds_for_power(0.5, sd, 0.8, 0.05 / family)
    assert n > stats.seeds_for_power(0.5, sd, 0.8, 0.05)  # the deciding level asks for more seeds
    assert f"n = {n} seeds give 80% power to detect Δ = 0.5 at the pilot sd {sd:.2g}" in j.why
    assert "the same contrast at steps 100, n = 3" in j.why and "post hoc" not in j.why
    assert ("not run yet" in j.why) == (j.verdict is None)
    pending = {k: v for k, v in runs.items() if "t937" not in k and "tied2" not in k}  # neither pilot nor runs
    j = next(j for j in verdicts(study, pending) if j.claim.startswith(claim) and j.expect.at == {"steps": 937})
    assert "its pilot (the same contrast at steps 100, n = 0) not stored; not run yet" in j.why
    e = Expect("b above a", "s", arm="b", baseline="a", metric="m", direction=1)
    with pytest.raises(SpecError, match="not declared"):
        at_longer((e,), ("a", "b"), plans={"c above a": 1.0})


def test_the_provenance_note_names_uncommitted_and_unrecorded_code():
    from tokenreduce.study.page import provenance_note

    runs = {"a-s0": {"provenance": {"git": "abc-dirty"}}, "a-s1": {"provenance": {"git": "abc"}},
            "a-s2": {"metrics": {"provenance": {"git": "def-dirty"}}}, "a-s3": {"run": {}}}
    note = provenance_note(runs)
    assert "2 of its 4 runs were made from uncommitted code" in note and "1 of its 4 runs record no git" in note
    assert provenance_note({"a-s1": {"provenance": {"git": "abc"}}}) == ""


@pytest.mark.slow
@pytest.mark.parametrize("gap", ["dirty", "none"])
def test_a_record_from_uncommitted_or_unrecorded_code_makes_the_claims_reading_it_provisional(gap: str):
    from tokenreduce.study import Expect
    from tokenreduce.study.tables import PROVISIONAL, verdict_table, verdicts, word

    study = _study([Expect("b above a", "s", arm="b", baseline="a", metric="m", direction=1),
                    Expect("c above a", "s", arm="c", baseline="a", metric="m", direction=1)])
    runs = _runs({"a": [0, 0, 0], "b": [1.0, 1.1, 0.9], "c": [3.0, 2.9, 3.1]})
    assert [word(j) for j in verdicts(study, runs)] == ["reproduced", "reproduced"]
    if gap == "dirty":
        runs["c-s1"]["provenance"]["git"] += "-dirty"
    else:
        del runs["c-s1"]["provenance"]
    b, c = verdicts(study, runs)
    assert word(b) == "reproduced" and c.verdict.word == "reproduced" and word(c) == PROVISIONAL
    assert c.uncommitted == ("c-s1",) and "provisional: as run it reads reproduced" in c.why
    assert f"**{PROVISIONAL}**" in "\n".join(verdict_table(study, runs))
    runs["b-s0"]["provenance"]["git"] += "-dirty"  # an inconclusive word stays what it is
    runs.update(_runs({"b": [1.0, -1.0, 0.5]}, git="0123abc-dirty"))
    assert word(verdicts(study, runs)[0]) == "inconclusive"


def test_a_claim_over_lengths_says_when_its_difference_reverses_though_its_verdict_does_not():
    from tokenreduce.study.declare import Expect
    from tokenreduce.study.lengths import stated
    from tokenreduce.study.tables import Judged

    e = Expect("a beats b", "src", arm="a", baseline="b", metric="top1", direction=1)

    def judged(diffs: list[float], adjusted: float = 0.3) -> Judged:
        v = stats.verdict(diffs, direction=1)
        return Judged(e, diffs, stats.verdict(diffs, direction=1, adjusted=[adjusted] * len(v.tests)), "")

    short, long = judged([-2.0, -1.5, -2.4]), judged([1.0, 1.3, 0.9])  # both inconclusive after adjustment
    text = stated([(100, short), (937, long)])
    change = stats.welch_change([-2.0, -1.5, -2.4], [1.0, 1.3, 0.9])
    assert change[0] == pytest.approx(3.0333, abs=1e-3) and change[1] < change[0] < change[2]
    # the dose-response is the change of effect, tested (Welch), not the two words compared
    assert text.startswith(f"**inconclusive** at 937 steps; from 100 steps its Δ changes by +3.03 "
                           f"[{change[1]:+.2f}, {change[2]:+.2f}], Welch p = {change[3]:.2g} (the interaction")
    assert stats.welch_change([1.0], [1.0, 2.0]) is None and stats.welch_change([1.0, 1.0], [2.0, 2.0]) is None
    assert "the difference reverses: its t-interval lies below 0 at 100 steps, above 0 at 937 steps (before" in text
    assert "reverses" not in stated([(100, judged([-0.5, 0.4, 0.1])), (937, long)])  # 0 inside at 100: no reversal


def test_a_length_with_one_seed_is_not_stated_as_a_change_of_verdict():
    from tokenreduce.study.declare import Expect
    from tokenreduce.study.lengths import stated
    from tokenreduce.study.tables import Judged

    e = Expect("a beats b", "src", arm="a", baseline="b", metric="top1", direction=1)
    short = Judged(e, [-8.0, -7.5, -8.1], stats.verdict([-8.0, -7.5, -8.1], direction=1), "")
    one = Judged(e, [-3.4], stats.verdict([-3.4], direction=1), "")
    assert stated([(100, short), (937, one)]) == \
        "**contradicted** at 100 steps; at 937 steps one seed so far, no test yet"
    assert stated([(937, one)]) == "**inconclusive** at 937 steps (one seed so far, no test yet)"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bspf", "eet"])
def test_a_run_that_arrives_never_weakens_another_claims_verdict(name: str):
    """The families are the declared tests (an unrun one at p = 1): over random orders of arrival of the
    committed records, a claim whose own differences did not change keeps every test it rejected, so a decided
    word never turns inconclusive (it may only sharpen, e.g. "not reproduced" to "contradicted" once the
    claim's own test rejects too)."""
    import random
    from pathlib import Path

    from tokenreduce.study.page import judged_results
    from tokenreduce.study.tables import judge

    def state(j) -> tuple:
        v = j.verdict
        rejected = frozenset(h.role for h, a in zip(v.tests, v.adjusted, strict=True) if a < v.level) if v else None
        return tuple(j.diffs), (v.word if v else None), rejected

    studies, _ = judged_results(Path(__file__).resolve().parents[1] / "results", [name])
    ids = [(k, rid) for k, (_, runs) in enumerate(studies) for rid in runs]
    rng = random.Random(0)
    for _ in range(2):
        rng.shuffle(ids)
        before: dict[tuple, tuple] = {}
        for cut in range(0, len(ids) + 1, max(1, len(ids) // 5)):
            have = set(ids[:cut])
            subset = [(s, {r: d for r, d in runs.items() if (k, r) in have}) for k, (s, runs) in enumerate(studies)]
            now = {(key, j.claim, str(j.expect.at)): state(j) for key, js in judge(subset).judged.items() for j in js}
            for claim, (diffs, word, rejected) in before.items():
                if now[claim][0] == diffs and word is not None:
                    assert rejected <= now[claim][2], (claim, rejected, now[claim][2], cut)
                    assert word == "inconclusive" or now[claim][1] != "inconclusive", (claim, word, cut)
            before = now


def test_the_length_section_says_what_else_differs_between_lengths_and_the_front_matter_the_papers_schedules(
        tmp_path):
    from pathlib import Path

    from tokenreduce.studies.beds import EPOCH_STEPS, TEN_EPOCHS
    from tokenreduce.study.declare import get_study
    from tokenreduce.study.lengths import section
    from tokenreduce.study.page import judged_results, methods

    studies, judgement = judged_results(Path(__file__).resolve().parents[1] / "results", ["baselines", "eet"])
    study, runs = next((s, r) for s, r in studies if s.bed_name == "scenes")
    (tmp_path / "figures").mkdir()
    lines = section(study, runs, judgement.judged[study.key], tmp_path, "baselines-scenes")
    assert ("Besides the steps, the lengths differ in what they train on and are scored on: 100 steps: 6400 "
            f"training scenes, scored on 2000 test scenes; {EPOCH_STEPS} steps: all training scenes, scored on "
            "10000 test scenes.") in lines
    front = methods(studies)
    short, long = get_study("baselines").paper_epochs, get_study("eet").paper_epochs  # 30-epoch fine-tunes; 300
    assert f"against the papers' {short}-{long} epochs" in front
    assert f"--where steps={TEN_EPOCHS} --device cuda" in front


def test_the_front_matter_counts_the_training_records_that_store_per_item_results():
    """Read from the records, not written in prose: a sentence naming which runs hold per-item results went stale
    as soon as other runs stored them."""
    from tokenreduce.study.page import methods

    runs = {f"r{k}": {"kind": "train", "metrics": {"m": 1.0, **({"items": {"m": "..."}} if k < 2 else {})}}
            for k in range(5)}
    runs["probe"] = {"kind": "probe", "metrics": {"items": {"m": "..."}}}
    assert "Per-item results: 2 of the 5 training records store them;" in methods([(_study([]), runs)])


# ----------------------------------------------------------------------------- the verdict history


def _published(tmp_path, study, runs):
    """One report build's history step: record what ``runs`` judge to, return (update, claims, What changed)."""
    from tokenreduce.study import history
    from tokenreduce.study.tables import judge

    studies = [(study, runs)]
    judgement = judge(studies)
    update, claims = history.record(tmp_path / history.FILE, studies, judgement)
    return update, claims, "\n".join(history.what_changed(update, claims, studies, judgement))


def _rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("| synthetic |")]


def test_a_rebuild_with_nothing_new_rewrites_the_history_byte_for_byte(tmp_path):
    from tokenreduce.study import Expect

    study = _study([Expect("b above a", "s", arm="b", baseline="a", metric="m", direction=1)])
    runs = _runs({"a": [0, 0, 0], "b": [4.0, 4.1, 3.9]})
    update, claims, text = _published(tmp_path, study, runs)
    first = (tmp_path / "verdicts.json").read_bytes()
    assert update == 1 and [e["verdict"] for e in claims["synthetic/any | b above a | -"]] == ["reproduced"]
    assert "- new: synthetic (any): b above a (all)" in text and "No published verdict moved." in text
    assert _published(tmp_path, study, runs)[0] == 1 and (tmp_path / "verdicts.json").read_bytes() == first


def test_a_new_record_that_flips_a_verdict_appends_one_entry_for_new_runs(tmp_path):
    from tokenreduce.study import Expect

    study = _study([Expect("b above a", "s", arm="b", baseline="a", metric="m", direction=1)])
    _published(tmp_path, study, _runs({"a": [0], "b": [4.0]}))  # one seed: inconclusive
    update, claims, text = _published(tmp_path, study, _runs({"a": [0, 0, 0], "b": [4.0, 4.1, 3.9]}))
    assert update == 2 and [e["verdict"] for e in claims["synthetic/any | b above a | -"]] == \
        ["inconclusive", "reproduced"]
    [row] = _rows(text)
    assert "| inconclusive (adjusted p -) | **reproduced** (adjusted p" in row and row.endswith("| new runs |")
    assert "new:" not in text


def test_a_bumped_statistics_version_with_the_same_records_is_said_as_such(tmp_path, monkeypatch):
    from dataclasses import replace

    from tokenreduce.study import Expect

    study = _study([Expect("b above a", "s", arm="b", baseline="a", metric="m", direction=1)])
    runs = _runs({"a": [0, 0, 0], "b": [4.0, 4.1, 3.9]})
    with monkeypatch.context() as m:  # the old statistics: never decided
        verdict = stats.verdict
        m.setattr(stats, "verdict", lambda *a, **k: replace(verdict(*a, **k), word="inconclusive"))
        _published(tmp_path, study, runs)
    monkeypatch.setattr(stats, "STATS_VERSION", 2)
    update, claims, text = _published(tmp_path, study, runs)
    assert update == 2 and [e["statistics"] for e in claims["synthetic/any | b above a | -"]] == [1, 2]
    [row] = _rows(text)
    assert row.endswith("| the statistics changed (version 1 -> 2) |") and "new runs" not in row


def test_a_claim_first_published_is_listed_as_new(tmp_path):
    from tokenreduce.study import Expect

    first = Expect("b above a", "s", arm="b", baseline="a", metric="m", direction=1)
    runs = _runs({"a": [0, 0, 0], "b": [4.0, 4.1, 3.9], "c": [1.0, -1.0, 0.5]})
    _published(tmp_path, _study([first]), runs)
    study = _study([first, Expect("c above a", "s", arm="c", baseline="a", metric="m", direction=1)])
    update, claims, text = _published(tmp_path, study, runs)
    assert update == 2 and len(claims["synthetic/any | b above a | -"]) == 1
    assert "- new: synthetic (any): c above a (all)" in text and "b above a (all)" not in text and not _rows(text)


@pytest.mark.parametrize("damage", ["edited", "malformed", "truncated"])
def test_an_edited_or_malformed_history_is_refused_in_one_line(tmp_path, damage):
    import json

    from tokenreduce.study import Expect, history
    from tokenreduce.study.records import RecordError

    study = _study([Expect("b above a", "s", arm="b", baseline="a", metric="m", direction=1)])
    runs = _runs({"a": [0, 0, 0], "b": [4.0, 4.1, 3.9]})
    _published(tmp_path, study, runs)
    path = tmp_path / history.FILE
    doc = json.loads(path.read_text())
    entry = doc["claims"]["synthetic/any | b above a | -"][0]
    if damage == "edited":
        entry["verdict"] = "contradicted"
    elif damage == "malformed":
        del entry["records"]
    text = json.dumps(doc) if damage != "truncated" else path.read_text()[:40]
    path.write_text(text)
    with pytest.raises(RecordError, match=r"verdicts\.json: .*written only by tokenreduce report") as e:
        history.load(path)
    assert "\n" not in str(e.value)
    assert {"edited": "digest", "malformed": "malformed entry", "truncated": "JSON"}[damage] in str(e.value)


def test_a_broken_history_stops_the_report_before_it_writes_anything(tmp_path):
    from tokenreduce.studies.readme import headline
    from tokenreduce.study.page import HEADLINE, build_report
    from tokenreduce.study.records import RecordError

    (tmp_path / "verdicts.json").write_text('{"update": 1')
    readme = tmp_path / "README.md"
    readme.write_text(f"{HEADLINE[0]}\nold\n{HEADLINE[1]}\n")
    with pytest.raises(RecordError, match="verdicts.json: not a readable JSON file"):
        build_report(tmp_path, names=["eet"], readme=(readme, headline))
    assert readme.read_text() == f"{HEADLINE[0]}\nold\n{HEADLINE[1]}\n" and not (tmp_path / "REPORT.md").exists()


def test_a_verdict_moved_by_its_family_alone_says_so(tmp_path):
    """Its own records unchanged, a claim turns decided when another claim of its Holm family runs (its p
    stops counting as 1): neither digest moved, so the cause is the family."""
    from tokenreduce.study import Expect

    study = _study([Expect("b above a", "s", arm="b", baseline="a", metric="m", direction=1),
                    Expect("c above a", "s", arm="c", baseline="a", metric="m", direction=1)])
    before = _published(tmp_path, study, _runs({"a": [0, 0, 0], "b": [3.0, 2.0, 1.5]}))[1]
    update, claims, text = _published(tmp_path, study, _runs({"a": [0, 0, 0], "b": [3.0, 2.0, 1.5],
                                                               "c": [4.0, 4.1, 3.9]}))
    b = claims["synthetic/any | b above a | -"]
    assert [e["verdict"] for e in b] == ["inconclusive", "reproduced"] and b[0]["records"] == b[1]["records"]
    assert "synthetic/any | c above a | -" not in before and "- new: synthetic (any): c above a (all)" in text
    [row] = _rows(text)
    assert row.endswith("| the other tests of its multiplicity family (its own records unchanged) |")


def test_an_exploratory_claim_never_enters_the_history_as_a_verdict(tmp_path):
    """A new exploratory claim gets no entry, whatever its data; one published before as confirmatory gets one
    entry saying it left the families, and none after, though its records change."""
    from tokenreduce.study import Expect

    mine = Expect("b above a", "s", arm="b", baseline="a", metric="m", direction=1)
    study = _study([mine, _own("c above a", "c", direction=1)])
    runs = _runs({"a": [0, 0, 0], "b": [4.0, 4.1, 3.9], "c": [4.0, 4.1, 3.9]})
    claims = _published(tmp_path, study, runs)[1]
    assert "synthetic/any | c above a | -" not in claims and len(claims["synthetic/any | b above a | -"]) == 1
    update, claims, text = _published(tmp_path, _study([_own("b above a", "b", direction=1)]), runs)
    assert [(e["verdict"], e["p"]) for e in claims["synthetic/any | b above a | -"]] == \
        [("reproduced", claims["synthetic/any | b above a | -"][0]["p"]), ("exploratory", "-")]
    [row] = _rows(text)
    assert row.endswith(f"| declared exploratory (not {CONFIRMATORY}): it left the families |")
    runs.update(_runs({"b": [-4.0, -4.1, -3.9]}))
    assert _published(tmp_path, _study([_own("b above a", "b", direction=1)]), runs)[0] == update
