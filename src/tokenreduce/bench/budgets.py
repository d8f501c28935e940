"""Budgets: which spec of each method gives a target speed-up on a given model.

Users want a schedule for a target speed-up, not a guess. Every method declares a small *family* of
candidate specs ordered by strength, mildest first (``Reducer.budget_family(host)``, fitted to the
model's depth and patch count); this module drops those the model rejects and picks per target the
candidate closest to it. It knows no method: the families, and whether a method is ``learned``
(then it needs fine-tuning and has no training-free budgets), are the methods' own declarations.

The rule, for a target t (e.g. 1.5 or 2.0) and one method:
    macs_speedup(spec) = MACs(unpatched) / MACs(spec)       analytic, from the compiled schedule
    rule 'macs':     pick argmin |log macs_speedup(spec) - log t|
    rule 'measured': time a few (6) candidates per method spread over MACs speed-ups in
                     [min t / 1.1, 1.6 max t] (measured speed-ups fall below the MACs ratio: norms,
                     gathers and per-block overheads are not MACs), all methods in one interleaved
                     run (``measure_speed``); fit  measured = a * macs_speedup^b  per method in log
                     space (least squares, a <= 1: removing nothing cannot be faster than the
                     unreduced model; it averages out timing noise); pick
                     argmin |log(a * macs_speedup(spec)^b) - log t|. A method whose timings do not
                     rise with the MACs ratio (b <= 0) falls back to rule 'macs'.
Ties go to the milder spec. Both rules pick monotonically in t (nearest point on an increasing
axis). A pick whose expected speed-up is more than 15% away from its target (e.g. beyond the
family's strongest spec) is marked ``reached=False``; tables show a pick's expected speed-up, never
the target it was asked for. A target more than 15% beyond the strongest candidate of every method
(by MACs, before any timing) is refused: no method can reach it. Candidates with the same per-block
token counts as a milder one are kept once.

The default family (core.method): a config with ``keep`` and ``locs`` gets keep = 0.95, 0.90, ...,
0.20 at blocks (3, 6, 9) of 12 scaled to the depth (floor(l * depth / 12)); one with ``r`` gets
r = 1, 2, ...; a method may declare its own (a merging method's clipped r, an official schedule's
fractions raised to powers), or none ([]: give its specs with ``--spec``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass

from torch import nn

from ..adapters import hosts, timm_vit
from ..core.errors import TokenReduceError
from ..core.method import build_reducer, get_method, list_methods
from .macs import count_macs
from .settings import BUDGET_ROUNDS, SPEED
from .speed import Case, measure_speed

REACH_TOLERANCE = 1.15  # a pick within this factor of its target counts as reached


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
    expected_speedup: float  # what the rule expects: the MACs ratio, or the fitted measured speed-up
    measured_speedup: float | None  # its own timing in the budget run, if it was timed
    rule: str
    reached: bool

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


def _reached(value: float, target: float) -> bool:
    """Whether the pick's speed-up is within 15% of the target."""
    return abs(math.log(value) - math.log(target)) <= math.log(REACH_TOLERANCE)


def spread(cs: Sequence[Candidate], lo: float, hi: float, k: int) -> list[Candidate]:
    """Up to ``k`` candidates evenly spread (by rank) over those with a MACs speed-up in [lo, hi];
    the ones nearest to lo and hi when none lies inside."""
    window = [c for c in cs if lo <= c.macs_speedup <= hi]
    if len(window) < 2:
        ends = {nearest([c.macs_speedup for c in cs], x) for x in (lo, hi)}
        window = sorted({*window, *(cs[i] for i in ends)}, key=lambda c: c.macs_speedup)
    if len(window) <= k:
        return list(window)
    idx = sorted({round(i * (len(window) - 1) / (k - 1)) for i in range(k)}) if k > 1 else [0]
    return [window[i] for i in idx]


def fit_power(points: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """Least-squares fit of  measured = a * macs^b  in log space to (macs, measured) points, with
    a <= 1; None when it cannot say anything (fewer than 2 distinct points, or timings that do not
    rise with the MACs ratio: b <= 0).

    a is the curve's speed-up at MACs ratio 1, where nothing is removed: a reduction that removes
    nothing still pays its book-keeping, so a > 1 is noise (a short timing run of a small model
    moves by 10% and more) and extrapolates to speed-ups no spec has: a free fit on noisy timings
    once put a random pruner removing 12% of the MACs at 1.5x. Such a fit is redone through
    (1, 1): b = sum(x y) / sum(x^2) in logs.
    """
    xs = [math.log(m) for m, _ in points]
    ys = [math.log(v) for _, v in points]
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 1e-12:
        return None
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    if b <= 0:
        return None
    log_a = my - b * mx
    if log_a > 0:
        log_a, b = 0.0, sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)
    return (math.exp(log_a), b) if b > 0 else None


def find_budgets(
    model: nn.Module, methods: Sequence[str], targets: Sequence[float], *, rule: str = "macs",
    img_size: int | None = None, timed: int = 6, speed: dict | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[Pick]:
    """One spec per method and target (see the module docstring for the rule).

    Args:
        model: the unpatched timm ViT the specs are for.
        methods: registry ids (training-free ones; see :func:`training_free`).
        targets: speed-ups > 1, e.g. (1.5, 2.0).
        rule: 'macs' (analytic, instant) or 'measured' (times ``timed`` candidates per method).
        speed: keyword arguments for ``measure_speed`` (rule 'measured'), e.g. batch, repeats, threads.
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
    estimate = {name: [c.macs_speedup for c in cs] for name, cs in cands.items()}
    measured: dict[str, float] = {}
    if rule == "measured":
        shortlist = {name: spread(cs, min(targets) / 1.1, max(targets) * 1.6, timed) for name, cs in cands.items()}
        measured = _measure(model, {c.spec for cl in shortlist.values() for c in cl}, img_size, speed, progress)
        for name, cs in cands.items():
            fit = fit_power([(c.macs_speedup, measured[c.spec]) for c in shortlist[name]])
            if fit is None:
                if progress:
                    progress(f"{name}: timings do not rise with the MACs ratio; picking by MACs")
                continue
            a, b = fit
            estimate[name] = [a * c.macs_speedup**b for c in cs]
    picks, used = [], set()
    for name, cs in cands.items():
        for t in targets:
            i = nearest(estimate[name], t)
            if (name, cs[i].spec) in used:
                continue
            used.add((name, cs[i].spec))
            picks.append(Pick(name, t, cs[i].spec, cs[i].macs_speedup, estimate[name][i], measured.get(cs[i].spec),
                              rule, _reached(estimate[name][i], t)))
    return picks


def _measure(model: nn.Module, specs: set[str], img_size: int | None, speed: dict | None,
             progress: Callable[[str], None] | None) -> dict[str, float]:
    """Measured speed-up of every spec, in one interleaved run."""
    settings = {**SPEED, **BUDGET_ROUNDS} | dict(speed or {})
    results = measure_speed(model, [Case(s, s) for s in sorted(specs)], img_size=img_size, progress=progress,
                            **settings)
    # a NaN (no valid round) would poison the fit; a tiny positive value only weakens it
    return {r.spec: (r.speedup if r.speedup > 0 else 1e-6) for r in results if r.spec is not None}
