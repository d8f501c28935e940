"""Budgets: which spec of each method gives a target speed-up on a given model.

Users want a schedule for a target speed-up, not a guess. For every training-free method this
module builds a small *family* of candidate specs ordered by strength (mildest first) that fits the
model (depth, patch count), drops those the method rejects, and picks per target the candidate
closest to it.

The rule, for a target t (e.g. 1.5 or 2.0) and one method:
    macs_speedup(spec) = MACs(unpatched) / MACs(spec)       analytic, from the compiled schedule
    rule 'macs':     pick argmin |log macs_speedup(spec) - log t|
    rule 'measured': time a few (6) candidates per method spread over MACs speed-ups in
                     [min t / 1.1, 1.6 max t] (measured speed-ups fall below the MACs ratio: norms,
                     gathers and per-block overheads are not MACs), all methods in one interleaved
                     run (``measure_speed``); fit  measured = a * macs_speedup^b  per method in log
                     space (least squares; it averages out timing noise); pick
                     argmin |log(a * macs_speedup(spec)^b) - log t|. A method whose timings do not
                     rise with the MACs ratio (b <= 0) falls back to rule 'macs'.
Ties go to the milder spec. Both rules pick monotonically in t (nearest point on an increasing
axis). A pick whose expected speed-up is more than 15% away from its target (e.g. beyond the
family's strongest spec) is marked ``reached=False``.

Families (block positions scale with depth as floor(l * depth / 12), the published 12-block ones):
    keep + locs   'topk', 'evit', 'random' and any method whose config has keep and locs:
                  keep in 0.95, 0.90, ..., 0.20 at the blocks of EViT's (3, 6, 9)
    r             any method whose config has r: r = 1, 2, ... while the schedule is valid
    tome          r = 1, 2, ... removed per block, clipped to half the tokens left (official ToMe's
                  rule), written as a per-block list where the clip bites
    ctp           the official CTP schedule with each kept fraction raised to a power a:
                  counts round(N * f^a) for f in (98, 49, 12)/196 at the blocks of (3, 7, 9);
                  a = 1 is ``ctp()``, smaller is milder, larger stronger
A method with none of these gets no budgets (give its specs with ``--spec``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torch import nn

from ..adapters import timm_vit
from ..core.errors import TokenReduceError
from ..core.method import Host, build_reducer, get_method, list_methods
from .macs import count_macs

#: family(host) -> candidate specs, mildest first.
Family = Callable[[Host], list[str]]
_FAMILIES: dict[str, Family] = {}

KEEPS = tuple(round(0.95 - 0.05 * i, 2) for i in range(16))  # 0.95 ... 0.20
EVIT_LOCS = (3, 6, 9)  # of 12 blocks (EViT, DeiT-S)
CTP_LOCS = (3, 7, 9)  # of 12 blocks (EET's CTP)
CTP_FRACTIONS = (98 / 196, 49 / 196, 12 / 196)
REACH_TOLERANCE = 1.15  # a pick within this factor of its target counts as reached
CTP_POWERS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.2, 1.4, 1.7, 2.0)


def register_family(name: str) -> Callable[[Family], Family]:
    """Decorator: the candidate specs of method ``name`` (overrides the config-based default)."""

    def deco(fn: Family) -> Family:
        _FAMILIES[name] = fn
        return fn

    return deco


def scaled_locs(locs: Sequence[int], depth: int) -> tuple[int, ...]:
    """Blocks ``locs`` of a 12-block model moved to a ``depth``-block one (floor(l * depth / 12))."""
    return tuple(sorted({min(depth - 1, (loc * depth) // 12) for loc in locs}))


def _keep_family(name: str) -> Family:
    def family(host: Host) -> list[str]:
        locs = scaled_locs(EVIT_LOCS, host.depth)
        return [f"{name}(keep={k}, locs={locs})" for k in KEEPS]

    return family


def _r_family(name: str) -> Family:
    def family(host: Host) -> list[str]:
        return [f"{name}(r={r})" for r in range(1, host.num_patches)]  # invalid ones are dropped later

    return family


@register_family("tome")
def _tome_family(host: Host) -> list[str]:
    out = []
    for r in range(1, host.num_patches):
        rs, n = [], host.num_patches
        for _ in range(host.depth):
            rs.append(min(r, n // 2))  # official ToMe's clip: never more than half the tokens
            n -= rs[-1]
        out.append(f"tome(r={r})" if all(x == r for x in rs) else f"tome(r={tuple(rs)})")
        if n <= 1:
            break
    return out


@register_family("ctp")
def _ctp_family(host: Host) -> list[str]:
    locs = scaled_locs(CTP_LOCS, host.depth)
    out, seen = [], set()
    for a in CTP_POWERS:
        counts, prev = [], host.num_patches
        for f in CTP_FRACTIONS[: len(locs)]:
            prev = min(prev, max(1, round(host.num_patches * f**a)))
            counts.append(prev)
        if tuple(counts) not in seen:
            seen.add(tuple(counts))
            out.append(f"ctp(counts={tuple(counts)}, locs={locs})")
    return out


def family(name: str, host: Host) -> list[str]:
    """Candidate specs of method ``name`` for ``host``, mildest first (may hold invalid ones)."""
    if name in _FAMILIES:
        return _FAMILIES[name](host)
    fields = {f.name for f in dataclasses.fields(get_method(name).Config)}
    if {"keep", "locs"} <= fields:
        return _keep_family(name)(host)
    if "r" in fields:
        return _r_family(name)(host)
    return []


def is_learned(model: nn.Module, name: str) -> bool:
    """Whether method ``name`` has learned parameters on ``model`` (then it needs fine-tuning).

    Built with the method's zero-reduction (else example) parameters and bound to the model's host;
    ``model`` is left untouched. Raises TokenReduceError when neither fits the model.
    """
    cls = get_method(name)
    host = timm_vit.check_host(model)
    error = None
    for params in (cls.zero, cls.example):
        reducer = build_reducer(f"{name}({', '.join(f'{k}={v!r}' for k, v in params.items())})")
        try:
            reducer.bind(host)
        except TokenReduceError as e:
            error = e
            continue
        return any(True for _ in reducer.parameters())
    raise TokenReduceError(f"{name} cannot be applied to this model: {error}")


def training_free(model: nn.Module, methods: Sequence[str] | None = None) -> tuple[list[str], dict[str, str]]:
    """(training-free methods among ``methods`` (default: all registered), {skipped: reason})."""
    free, skipped = [], {}
    for name in methods if methods is not None else list_methods():
        try:
            learned = is_learned(model, name)
        except TokenReduceError as e:
            skipped[name] = str(e)
            continue
        if learned:
            skipped[name] = "learned parameters; fine-tune it first (tokenreduce train --spec ...)"
        elif not family(name, timm_vit.check_host(model)):
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
    if hasattr(model, timm_vit._ATTR):
        raise TokenReduceError("budgets need an unpatched model")
    host = timm_vit.check_host(model)
    base = count_macs(model, img_size).total
    out, seen = [], set()
    for spec in family(name, host):
        try:
            reducer = build_reducer(spec)
            reducer.bind(host)
        except TokenReduceError:
            continue
        timm_vit.apply(model, reducer)
        try:
            report = count_macs(model, img_size)
        finally:
            timm_vit.remove(model)
        key = tuple(report.tokens_per_block)
        if key in seen:  # same schedule as a milder spec: nothing new
            continue
        seen.add(key)
        out.append(Candidate(name, spec, report.total, base / report.total))
    return sorted(out, key=lambda c: c.macs_speedup)


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
    """Least-squares fit of  measured = a * macs^b  in log space to (macs, measured) points;
    None when it cannot say anything (fewer than 2 distinct points, or b <= 0)."""
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
    return math.exp(my - b * mx), b


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
    if not targets or any(not t > 1.0 for t in targets):
        raise TokenReduceError(f"target speed-ups must be > 1, got {list(targets)}")
    cands = {}
    for name in methods:
        cands[name] = candidates(model, name, img_size)
        if not cands[name]:
            raise TokenReduceError(f"{name}: no candidate spec is valid on this model")
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
    from .speed import Case, measure_speed

    settings = {"batch": 32, "warmup": 1, "repeats": 3, "min_run_s": 0.05} | dict(speed or {})
    results = measure_speed(model, [Case(s, s) for s in sorted(specs)], img_size=img_size, progress=progress,
                            **settings)
    # a NaN (no valid round) would poison the fit; a tiny positive value only weakens it
    return {r.spec: (r.speedup if r.speedup > 0 else 1e-6) for r in results if r.spec is not None}
