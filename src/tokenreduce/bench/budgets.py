"""Budgets: which spec of each method gives a target speed-up on a given model.

Users want a schedule for a target speed-up, not a guess. Every method declares a small *family* of
candidate specs ordered by strength, mildest first (``Reducer.budget_family(host)``, fitted to the
model's depth and patch count); this module drops those the model rejects and picks per target the
candidate closest to it. It knows no method: the families, and whether a method is ``learned``
(then it needs fine-tuning and has no training-free budgets), are the methods' own declarations.

The rule, for a target t (e.g. 1.5 or 2.0) and one method:
    macs_speedup(spec) = MACs(unpatched) / MACs(spec)       analytic, from the compiled schedule
    rule 'macs':     pick argmin |log macs_speedup(spec) - log t| (instant, no timing; measured
                     speed-ups fall below the MACs ratio: norms, gathers, scoring and per-block
                     overheads are not MACs)
    rule 'measured': a speed model per method, calibrated by timing, that no single noisy reading moves far:
      1. what is timed is chosen without timing: per method, its 'macs' picks for t and for t^2 (CPUs give
         from about the square root of the MACs ratio to the ratio itself, so the final picks lie among
         them: the fit interpolates), all methods in one interleaved run of BUDGET_ROUNDS paired rounds
         (``measure_speed``);
      2. a spec's speed-up in a round is its img/s over the unpatched model's in the same round (paired:
         drift between rounds cancels);
      3. per method, speed = macs_speedup^b through (1, 1) (removing nothing gains nothing), b the median
         over its timed specs and rounds of log speed-up / log macs_speedup, weighted by log macs_speedup
         (:func:`fit_exponent`, least absolute deviations: rounds that other work slowed are outliers a
         median ignores), 0 < b <= 1 (a reading faster than the MACs ratio is noise); the slopes'
         quartiles give the expected speed-up's range (``expected_low``, ``expected_high``: the stated
         uncertainty);
      4. pick argmin |log(macs_speedup(spec)^b) - log t|. A method whose timings do not rise with the
         MACs ratio (no b > 0) keeps its 'macs' picks.
Ties go to the milder spec. Both rules pick monotonically in t (nearest point on an increasing
axis). The declared band: a pick is on target when its speed-up is within BAND (0.25x) of t, half the
gap between adjacent targets (1.5x, 2x, 2.5x), so a pick on target is nearer its own target than any
other and the rows of two targets never overlap. ``reached`` says whether the expected speed-up is in
the band (a pick beyond the family's strongest spec is not); whoever times the picks again checks
the measured one (:func:`in_band`; bench/evaluation.py flags the rows outside it). Tables show a
pick's expected speed-up, never the target it was asked for. A target more than 15% beyond the
strongest candidate of every method (by MACs, before any timing) is refused: no method can reach it.
Candidates with the same per-block token counts as a milder one are kept once. A pick says the model
its schedule was searched for, when it is a published one (``Reducer.schedule_origin``).

The default family (core.method): a config with ``keep`` and ``locs`` gets keep = 0.95, 0.90, ...,
0.20 at blocks (3, 6, 9) of 12 scaled to the depth (floor(l * depth / 12)); one with ``r`` gets
r = 1, 2, ...; a method may declare its own (a merging method's clipped r, an official schedule's
fractions raised to powers), or none ([]: give its specs with ``--spec``).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import statistics
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial

from torch import nn

from ..adapters import hosts, timm_vit
from ..core.errors import TokenReduceError
from ..core.method import build_reducer, get_method, list_methods
from .macs import count_macs
from .settings import BAND, BUDGET_ROUNDS, SPEED
from .speed import Case, measure_speed, paired_ratios

REACH_TOLERANCE = 1.15  # a target this factor beyond every method's strongest candidate (by MACs) is refused
#: Rule 'measured' times, per method and target t, the 'macs' picks for t ** p for each p here.
CALIBRATION_POWERS = (1, 2)

#: The timing behind rule 'measured': specs -> per spec, its paired speed-ups, one per timed round (its
#: img/s over the unpatched model's in the same round). Tests inject a speed table.
Timer = Callable[[Sequence[str]], dict[str, list[float]]]


def training_free(model: nn.Module, methods: Sequence[str] | None = None) -> tuple[list[str], dict[str, str]]:
    """(training-free methods among ``methods`` (default: all registered), {skipped: reason}).

    Skipped: a ``learned`` method (fine-tune it first), one that needs a class token the model
    lacks, one that declares no budget family for the model.
    """
    host = timm_vit.check_host(model)
    free, skipped = [], {}
    for name in methods if methods is not None else list_methods():
        cls = get_method(name)
        if cls.learned:
            skipped[name] = "learned parameters; fine-tune it first (tokenreduce train --spec ...)"
        elif cls.needs_class_token and not host.has_class_token:
            skipped[name] = "scores tokens by class-token attention; this model has no class token"
        elif not cls.budget_family(host):
            skipped[name] = "no budget family; give its specs with --spec"
        else:
            free.append(name)
    return free, skipped


@dataclass(frozen=True)
class Candidate:
    """A valid spec of one method on the model, with its analytic cost."""

    method: str
    spec: str
    macs: int
    macs_speedup: float


@dataclass(frozen=True)
class Pick:
    """The spec chosen for one method and target."""

    method: str
    target: float
    spec: str
    macs_speedup: float
    expected_speedup: float  # what the rule expects: the MACs ratio, or the calibrated speed model's
    measured_speedup: float | None  # its own median paired speed-up in the calibration run, if it was timed
    rule: str
    reached: bool  # the expected speed-up is within BAND of the target
    expected_low: float | None = None  # the speed model's range (rule 'measured'): b's interquartile range
    expected_high: float | None = None
    schedule_origin: str | None = None  # the model a published schedule was searched for (``Reducer.schedule_origin``)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def candidates(model: nn.Module, name: str, img_size: int | None = None) -> list[Candidate]:
    """The valid members of ``name``'s family on ``model``, sorted by MACs speed-up (mildest first)."""
    if hosts.is_patched(model):
        raise TokenReduceError("budgets need an unpatched model")
    host = timm_vit.check_host(model)
    base = count_macs(model, img_size).total
    out, seen = [], set()
    for spec in get_method(name).budget_family(host):
        with ExitStack() as patched:
            try:
                patched.enter_context(hosts.patched(model, build_reducer(spec)))
            except TokenReduceError:  # the model rejects this member (e.g. too strong for its depth)
                continue
            report = count_macs(model, img_size)
        key = tuple(report.tokens_per_block)
        if key in seen:  # same schedule as a milder spec: nothing new
            continue
        seen.add(key)
        out.append(Candidate(name, spec, report.total, base / report.total))
    return sorted(out, key=lambda c: c.macs_speedup)


def check_targets(targets: Sequence[float]) -> list[float]:
    """``targets`` as a list after checking that there is one and each is a finite speed-up > 1."""
    bad = [t for t in targets if not (t > 1.0 and math.isfinite(t))]
    if not targets or bad:
        got = ", ".join(f"{t:g}" for t in targets) or "none"
        raise TokenReduceError(f"budget targets (--budgets) must be > 1 (speed-ups such as 1.5,2); got {got}")
    return list(targets)


def _check_reach(cands: dict[str, list[Candidate]], targets: Sequence[float]) -> None:
    """Refuse targets beyond reach of every method: more than REACH_TOLERANCE past the strongest
    candidate's MACs speed-up (measured speed-ups stay below the MACs ratio in practice)."""
    strongest = max((c for cs in cands.values() for c in cs), key=lambda c: c.macs_speedup)
    reach = strongest.macs_speedup * REACH_TOLERANCE
    far = [t for t in targets if t > reach]
    if far:
        raise TokenReduceError(
            f"no training-free method reaches {', '.join(f'{t:g}x' for t in far)} on this model: the strongest "
            f"candidate, {strongest.spec}, cuts the MACs {strongest.macs_speedup:.2f}x; choose --budgets up to "
            f"{math.floor(reach * 100) / 100:g}"
        )


def nearest(values: Sequence[float], target: float) -> int:
    """Index of the value closest to ``target`` in log scale; the first one on ties."""
    if not values:
        raise TokenReduceError("no candidates to choose from")
    dist = [abs(math.log(v) - math.log(target)) for v in values]
    return min(range(len(values)), key=lambda i: (round(dist[i], 12), i))


def in_band(speedup: float | None, target: float) -> bool:
    """Whether ``speedup`` lies within BAND of ``target`` (False for a missing or non-finite one)."""
    return speedup is not None and math.isfinite(speedup) and abs(speedup - target) <= BAND


def fit_exponent(points: Sequence[tuple[float, float]]) -> tuple[float, float, float] | None:
    """b of  speed = macs^b  through (1, 1) from (macs speed-up, measured speed-up) points, one per timed
    round of a spec: the least-absolute-deviations fit in logs, log measured = b log macs, which is the
    median of the points' slopes log measured / log macs weighted by log macs; with the weighted first
    and third quartiles of the slopes as its range: (low, b, high), each at most 1. None when it cannot
    say anything: no point removes MACs (macs <= 1), or b <= 0 (timings that do not rise with the MACs
    ratio).

    Through (1, 1): a reduction that removes nothing gains nothing, and a free intercept is what a few
    noisy timings move most (a least-squares fit once put a random pruner removing 12% of the MACs at
    1.5x). Absolute deviations: rounds that other work slowed are outliers it ignores while they are
    fewer than half; the weights, because a slope's noise is the reading's divided by log macs. At most
    1: a reading faster than the MACs ratio is noise (the norms, gathers and scoring that MACs leave out
    only add time). Non-positive or non-finite readings (no valid round) are left out.
    """
    pts = [(math.log(v) / math.log(m), math.log(m)) for m, v in points if m > 1 and v > 0 and math.isfinite(v)]
    if not pts:
        return None
    pts.sort()
    total, cum = sum(w for _, w in pts), list(itertools.accumulate(w for _, w in pts))

    def quantile(q: float) -> float:  # the first slope whose cumulative weight reaches q (less a rounding hair)
        return min(pts[bisect.bisect_left(cum, q * total * (1 - 1e-12))][0], 1.0)

    low, mid, high = quantile(0.25), quantile(0.5), quantile(0.75)
    return (low, mid, high) if mid > 0 else None


def find_budgets(
    model: nn.Module, methods: Sequence[str], targets: Sequence[float], *, rule: str = "macs",
    img_size: int | None = None, speed: dict | None = None, progress: Callable[[str], None] | None = None,
    timer: Timer | None = None,
) -> list[Pick]:
    """One spec per method and target (see the module docstring for the rule).

    Args:
        model: the unpatched timm ViT the specs are for.
        methods: registry ids (training-free ones; see :func:`training_free`).
        targets: speed-ups > 1, e.g. (1.5, 2.0).
        rule: 'macs' (analytic, instant) or 'measured' (a speed model per method, calibrated by timing).
        speed: keyword arguments for ``measure_speed`` (rule 'measured'), e.g. batch, repeats, threads.
        timer: what times the calibration specs (:data:`Timer`); default ``measure_speed`` in one
            interleaved run with ``speed``.
    Returns:
        picks in the order method, then target; picks of one method that coincide are kept once.
    """
    if rule not in ("macs", "measured"):
        raise TokenReduceError(f"budget rule must be 'macs' or 'measured', got {rule!r}")
    targets = check_targets(targets)
    cands = {}
    for name in methods:
        cands[name] = candidates(model, name, img_size)
        if not cands[name]:
            raise TokenReduceError(f"{name}: no candidate spec is valid on this model")
    if cands:
        _check_reach(cands, targets)
    models = {name: _SpeedModel.macs() for name in cands}
    rounds: dict[str, list[float]] = {}
    if rule == "measured":
        timed = {name: _calibration_specs(cs, targets) for name, cs in cands.items()}
        timer = timer or partial(_paired_rounds, model, img_size=img_size, speed=speed, progress=progress)
        rounds = timer(sorted({c.spec for cs in timed.values() for c in cs}))
        for name, cs in timed.items():
            fitted = _SpeedModel.fit([(c.macs_speedup, rounds[c.spec]) for c in cs])
            if fitted is None and progress:
                progress(f"{name}: timings do not rise with the MACs ratio; picking by MACs")
            models[name] = fitted or models[name]
    picks, used = [], set()
    for name, cs in cands.items():
        sm = models[name]
        for t in targets:
            c = cs[nearest([sm.expect(c.macs_speedup) for c in cs], t)]
            if (name, c.spec) in used:
                continue
            used.add((name, c.spec))
            expected = sm.expect(c.macs_speedup)
            low, high = (sm.expect(c.macs_speedup, sm.b_low), sm.expect(c.macs_speedup, sm.b_high)) if sm.timed \
                else (None, None)
            measured = statistics.median(rounds[c.spec]) if rounds.get(c.spec) else None
            picks.append(Pick(name, t, c.spec, c.macs_speedup, expected, measured, rule, in_band(expected, t),
                              low, high, build_reducer(c.spec).schedule_origin()))
    return picks


@dataclass(frozen=True)
class _SpeedModel:
    """speed = macs_speedup^b, b_low and b_high bounding b's interquartile range; b = 1 untimed (rule 'macs')."""

    b: float
    b_low: float
    b_high: float
    timed: bool

    @classmethod
    def macs(cls) -> _SpeedModel:
        return cls(1.0, 1.0, 1.0, False)

    @classmethod
    def fit(cls, timed: Sequence[tuple[float, list[float]]]) -> _SpeedModel | None:
        """From (macs speed-up, per-round paired speed-ups) of one method's timed specs (:func:`fit_exponent`
        over every round); None when the timings do not rise with the MACs ratio."""
        fitted = fit_exponent([(m, v) for m, rounds in timed for v in rounds])
        if fitted is None:
            return None
        low, mid, high = fitted
        return cls(mid, low, high, True)

    def expect(self, macs_speedup: float, b: float | None = None) -> float:
        return macs_speedup ** (self.b if b is None else b)


def _calibration_specs(cs: Sequence[Candidate], targets: Sequence[float]) -> list[Candidate]:
    """The candidates rule 'measured' times: the 'macs' picks for t ** p, p in CALIBRATION_POWERS (once each)."""
    ratios = [c.macs_speedup for c in cs]
    return [cs[i] for i in sorted({nearest(ratios, t**p) for t in targets for p in CALIBRATION_POWERS})]


def _paired_rounds(model: nn.Module, specs: Sequence[str], *, img_size: int | None, speed: dict | None,
                   progress: Callable[[str], None] | None) -> dict[str, list[float]]:
    """Per spec, its speed-up in each round of one interleaved run (``measure_speed``): its img/s over
    the unpatched model's in the same round."""
    settings = {**SPEED, **BUDGET_ROUNDS} | dict(speed or {})
    results = measure_speed(model, [Case(s, s) for s in specs], img_size=img_size, progress=progress, **settings)
    return {r.spec: paired_ratios(r.img_per_s_runs, results[0].img_per_s_runs) for r in results if r.spec is not None}
