"""Throughput and latency of several specs on one model, measured in one interleaved run.

For every case (the unpatched model, always included, and each spec) one round times
    throughput  img_per_s  = B * iters / t      at batch B (default 32)
    latency     latency_ms = 1000 * t / iters   at batch 1
The rounds go round-robin over the cases, starting one case later each round, so machine drift
(thermal, other processes, frequency scaling) hits every case alike; warm-up rounds come first
and are discarded. Each result is the median over the timed rounds with its inter-quartile
range, and each ratio is the median of the per-round ratios against the unpatched model of the
same round (a paired estimate, so drift between rounds cancels):
    speedup         = img_per_s(spec) / img_per_s(unpatched)
    latency_speedup = latency_ms(unpatched) / latency_ms(spec)
Both are > 1 when the spec is faster. Everything runs under ``torch.inference_mode()`` in eval mode.
On CUDA each case also gets ``peak_mem_mib``: the most memory torch allocated during any of its timed
batch-B measurements (``torch.cuda.max_memory_allocated`` after a reset: weights, activations and the
method's own tensors).
``backend`` (bench/backends.py) runs every case, the unpatched model included, the same way:
eager, torch.compile'd, or exported to ONNX and run by onnxruntime; compiling and exporting happen
before the first round, so they are never timed.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..adapters import hosts
from ..core.errors import TokenReduceError
from ..core.method import Reducer, build_reducer, matched_spec
from .backends import Runner, get_backend
from .macs import input_shape
from .settings import SPEED


@dataclass(frozen=True)
class Case:
    """One thing to time: ``spec`` None is no reducer. ``model``: the case's own unpatched model when it is
    another architecture than the run's on the same input (a fine-tune with another stem: the stem is part
    of what the method costs); None: the run's model. The run's model without a reducer is the baseline."""

    label: str
    spec: str | None
    model: nn.Module | None = field(default=None, compare=False)

    @property
    def is_baseline(self) -> bool:
        return self.spec is None and self.model is None


@dataclass
class SpeedResult:
    """Medians over the timed rounds; ``*_runs`` hold the per-round values in round order."""

    label: str
    spec: str | None
    batch: int
    backend: str = "eager"
    img_per_s: float = math.nan
    img_per_s_iqr: float = math.nan
    latency_ms: float = math.nan
    latency_ms_iqr: float = math.nan
    speedup: float = math.nan
    latency_speedup: float = math.nan
    #: CUDA only (None elsewhere): peak allocated MiB over the timed batch-B measurements
    peak_mem_mib: float | None = None
    img_per_s_runs: list[float] = field(default_factory=list)
    latency_ms_runs: list[float] = field(default_factory=list)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def matched_random(model: nn.Module, spec: str | Reducer, seed: int = 0) -> str:
    """The spec of the random pruner with exactly the per-block token counts and ``where`` of
    ``spec`` on ``model`` (``core.method.matched_spec``): same shapes, no scoring cost - the speed
    limit of that schedule.

    The schedule is compiled the way ``apply`` compiles it (``reducer.bind(host)``), so ``model``
    is left untouched.
    """
    sched = build_reducer(spec).bind(hosts.check_host(model))
    return matched_spec(sched, seed)


def _median_iqr(values: Sequence[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    if len(values) < 2:
        return float(values[0]), 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return float(statistics.median(values)), float(q3 - q1)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(run: Callable[[Tensor], object], x: Tensor, iters: int) -> float:
    """Seconds for ``iters`` forwards of ``x``."""
    _sync(x.device)
    t0 = time.perf_counter()
    for _ in range(iters):
        run(x)
    _sync(x.device)
    return time.perf_counter() - t0


def measure_speed(
    model: nn.Module, cases: Sequence[Case], *, batch: int = SPEED["batch"], img_size: int | None = None,
    warmup: int = SPEED["warmup"], repeats: int = SPEED["repeats"], min_run_s: float = SPEED["min_run_s"],
    threads: int | None = None,
    seed: int = 0, backend: str = "eager", compile_mode: str = "default", progress: Callable[[str], None] | None = None,
) -> list[SpeedResult]:
    """Time every case (plus the unpatched model, added first if absent) in one interleaved run.

    Args:
        model: an unpatched ViT (any host), already on its device and dtype.
        cases: what to time; a spec is applied before its measurement and removed after, on the
            case's own model if it has one (moved to ``model``'s device and dtype).
        batch: batch size for throughput; latency is always at batch 1.
        warmup: untimed rounds before the ``repeats`` timed ones.
        min_run_s: each timed measurement repeats the forward until it lasts about this long
            (the count is fixed per case from the last warm-up round), so short forwards are not
            lost in timer resolution.
        threads: torch.set_num_threads for the run (restored afterwards; also onnxruntime's
            intra-op threads); None leaves it.
        backend: how every case runs (``backends.BACKENDS``): 'eager', 'compile', 'onnxruntime'.
        compile_mode: the 'compile' backend's torch.compile mode (``settings.COMPILE_MODES``).
        progress: called with one line per timed round.
    Returns:
        one SpeedResult per case, the unpatched model first, with ratios filled in.
    """
    if hosts.is_patched(model):
        raise TokenReduceError("measure_speed takes an unpatched model; pass the methods as specs")
    if batch < 1 or repeats < 1 or warmup < 0:
        raise TokenReduceError(f"need batch >= 1, repeats >= 1, warmup >= 0; got {batch}, {repeats}, {warmup}")
    runs_on = get_backend(backend, threads, compile_mode)
    cases = list(cases)
    if not any(c.is_baseline for c in cases):
        cases.insert(0, Case("unpatched", None))
    cases.sort(key=lambda c: not c.is_baseline)  # the baseline first; stable for the rest
    ref = next(model.parameters())
    models = [model if c.model is None else c.model.to(ref.device, ref.dtype) for c in cases]
    own = list({id(m): m for m in models}.values())
    for m in own:
        if hosts.is_patched(m):
            raise TokenReduceError("measure_speed takes unpatched models; pass the methods as specs")
        if input_shape(m, img_size) != input_shape(model, img_size):
            raise TokenReduceError(f"a case's own model takes input {input_shape(m, img_size)}, the run's "
                                   f"{input_shape(model, img_size)}; cases timed together share one input")
        runs_on.check(m)
    # Eager: one model instance for all cases, patched and unpatched in turn: every case runs on
    # the very same weights in the same memory, and the footprint stays one model however many
    # specs are timed (a deepcopy per spec would multiply memory and give each case its own
    # cache/NUMA placement). apply/remove only swap a bound method and compile a schedule, outside
    # the timer. A compiled or exported case holds its own copy (backends.py).
    # Reducers are built once so a learned one keeps the same parameters in every round.
    reducers = [None if c.spec is None else build_reducer(c.spec) for c in cases]
    for m, reducer in zip(models, reducers, strict=True):  # fail on a bad spec before any timing
        with hosts.patched(m, reducer):
            pass

    gen = torch.Generator().manual_seed(seed)
    x_big = torch.randn(batch, *input_shape(model, img_size), generator=gen).to(ref.device, ref.dtype)
    x_one = x_big[:1].clone()
    results = [SpeedResult(c.label, c.spec, batch, backend) for c in cases]
    iters = [[1, 1] for _ in cases]  # forwards per measurement: (batch B, batch 1)

    old_threads, was_training = torch.get_num_threads(), [m.training for m in own]
    if threads is not None:
        torch.set_num_threads(threads)
    for m in own:
        m.eval()
    try:
        with runs_on:
            runners = []
            for case, m, reducer in zip(cases, models, reducers, strict=True):
                if progress is not None and backend != "eager":
                    progress(f"{backend}: preparing {case.label} ({len(runners) + 1}/{len(cases)})")
                runners.append(runs_on.runner(m, reducer, [x_big, x_one], case.label))
            with torch.inference_mode():
                for rnd in range(warmup + repeats):
                    _round(rnd, warmup, runners, results, iters, x_big, x_one, min_run_s)
                    if progress is not None and rnd >= warmup:
                        progress(f"round {rnd + 1 - warmup}/{repeats}: "
                                 + ", ".join(f"{r.label} {r.img_per_s_runs[-1]:.1f} img/s" for r in results))
                    elif progress is not None:
                        progress(f"warm-up round {rnd + 1}/{warmup}")
    finally:
        torch.set_num_threads(old_threads)
        for m, training in zip(own, was_training, strict=True):
            m.train(training)

    base = results[0]
    for res in results:
        res.img_per_s, res.img_per_s_iqr = _median_iqr(res.img_per_s_runs)
        res.latency_ms, res.latency_ms_iqr = _median_iqr(res.latency_ms_runs)
        res.speedup = paired_ratio(res.img_per_s_runs, base.img_per_s_runs)
        res.latency_speedup = paired_ratio(base.latency_ms_runs, res.latency_ms_runs)
    return results


def _round(rnd: int, warmup: int, runners: Sequence[Runner], results: Sequence[SpeedResult],
           iters: list[list[int]], x_big: Tensor, x_one: Tensor, min_run_s: float) -> None:
    """One round over every case (``_round_order``); the last warm-up round fixes ``iters``."""
    for j in _round_order(len(runners), rnd):
        runners[j].enter()
        try:
            cuda = x_big.device.type == "cuda"
            if cuda:
                torch.cuda.reset_peak_memory_stats(x_big.device)
            t_big = _time(runners[j], x_big, iters[j][0])
            peak = torch.cuda.max_memory_allocated(x_big.device) / 2**20 if cuda else None
            t_one = _time(runners[j], x_one, iters[j][1])
        finally:
            runners[j].exit()
        if rnd < warmup:
            if rnd == warmup - 1:
                iters[j] = [max(1, math.ceil(min_run_s * n / t)) if t > 0 else 1
                            for n, t in zip(iters[j], (t_big, t_one), strict=True)]
            continue
        results[j].img_per_s_runs.append(x_big.shape[0] * iters[j][0] / t_big)
        if peak is not None:
            results[j].peak_mem_mib = max(peak, results[j].peak_mem_mib or 0.0)
        results[j].latency_ms_runs.append(1000.0 * t_one / iters[j][1])


def _round_order(n: int, rnd: int) -> list[int]:
    """Cases in round ``rnd``: round-robin, starting one case later each round."""
    start = rnd % n
    return list(range(start, n)) + list(range(start))


def paired_ratios(num: Sequence[float], den: Sequence[float]) -> list[float]:
    """num[k] / den[k] for every round k (values measured in the same round), rounds with den[k] <= 0 left out."""
    return [a / b for a, b in zip(num, den, strict=True) if b > 0]


def paired_ratio(num: Sequence[float], den: Sequence[float]) -> float:
    """Median over rounds of num[k] / den[k] (:func:`paired_ratios`)."""
    ratios = paired_ratios(num, den)
    return float(statistics.median(ratios)) if ratios else math.nan


def round_speedups(row: dict[str, Any], rows: list[dict[str, Any]]) -> np.ndarray | None:
    """``row``'s speed-up (batch B) in each timed round of the interleaved run of ``rows`` (a bench's results):
    its images/s over the unpatched model's in the same round (:func:`paired_ratios`); None without per-round
    timings."""
    base = next((r for r in rows if r.get("kind") == "unpatched" and r.get("img_per_s_runs")), None)
    mine = row.get("img_per_s_runs") or ()
    if base is None or row.get("kind") == "unpatched" or len(mine) != len(base["img_per_s_runs"]):
        return None
    return np.asarray(paired_ratios(mine, base["img_per_s_runs"]))


def timing_noise(rows: list[dict[str, Any]]) -> str:
    """The measured timing noise of one interleaved speed run, as a sentence: the spread of a row's per-round
    speed-up around its own median, pooled over the rows (sd), with what it means for a median shown."""
    per_row = [g for r in rows if (g := round_speedups(r, rows)) is not None]
    if not per_row or min(len(r) for r in per_row) < 2:
        return ""
    n = min(len(r) for r in per_row)
    sd = math.sqrt(statistics.fmean(float(np.var(r, ddof=1)) for r in per_row))
    return (f"Timing noise, measured: a row's speed-up moves from round to round with a pooled sd of {sd:.3f}x "
            f"({len(per_row)} rows, {n} interleaved rounds each); a median over {n} rounds has a standard error "
            f"near {1.2533 * sd / math.sqrt(n):.3f}x.")
