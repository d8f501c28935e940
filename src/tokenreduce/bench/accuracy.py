"""Accuracy, MACs and measured speed of several specs on one model, in one run.

For a reference model (unpatched), an evaluation set and a list of :class:`EvalCase` this gives one
row per case with

    top1            mean top-1 (percent) over the case's runs
    top1_std        sample standard deviation over the runs (None for a single run)
    top1_drop       top1(unpatched) - top1, in points (> 0: accuracy lost); 0 for the unpatched row
    macs, gmacs     analytic MACs per image (count_macs, from the compiled schedule)
    macs_speedup    MACs(unpatched) / MACs
    img_per_s, latency_ms, speedup, latency_speedup
                    from ONE interleaved measure_speed run over every case (the unpatched model first)
    tokens_per_block  tokens (prefix included) leaving each block

Runs: a stochastic method (its config has a ``seed`` field, e.g. ``random``) is evaluated once per
seed, its spec's seed replaced; a deterministic one once; a trained case once per checkpoint
(checkpoints of one spec, e.g. fine-tuned with different seeds, make one row). A trained case is
timed as its spec on the reference model: weights do not change the shapes, so the speed is the same.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from ..adapters import timm_vit
from ..core.errors import TokenReduceError
from ..core.method import build_reducer, get_method, parse_spec
from .macs import count_macs
from .speed import Case, measure_speed

Progress = Callable[[str], None]


@dataclass(frozen=True)
class EvalCase:
    """One row to produce.

    Attributes:
        label: unique name in tables and plots (the spec as given, or the checkpoint).
        spec: reducer spec; None for the unpatched model.
        kind: 'unpatched', 'training-free' or 'fine-tuned'.
        budget: the target speed-up the spec was chosen for, if any.
        checkpoints: for 'fine-tuned': the checkpoints to evaluate (one run each).
    """

    label: str
    spec: str | None
    kind: str = "training-free"
    budget: float | None = None
    checkpoints: tuple[str, ...] = ()

    @property
    def method(self) -> str:
        return parse_spec(self.spec)[0] if self.spec else "unpatched"


def is_stochastic(spec: str) -> bool:
    """Whether ``spec``'s method draws random numbers that a ``seed`` parameter fixes."""
    name, _ = parse_spec(spec)
    return "seed" in {f.name for f in dataclasses.fields(get_method(name).Config)}


def with_seed(spec: str, seed: int) -> str:
    """``spec`` with its ``seed`` parameter set to ``seed``."""
    name, params = parse_spec(spec)
    params["seed"] = seed
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in params.items())})"


def materialize(dataset: Dataset, progress: Progress | None = None) -> TensorDataset:
    """The dataset as tensors (N, C, H, W) and (N,), decoded and transformed once for every run."""
    if len(dataset) == 0:
        raise TokenReduceError("the evaluation set is empty")
    images, labels = [], []
    for i in range(len(dataset)):
        x, y = dataset[i]
        images.append(x)
        labels.append(int(y))
    if progress:
        progress(f"loaded {len(images)} evaluation images")
    return TensorDataset(torch.stack(images), torch.tensor(labels))


def _top1(model: nn.Module, data: TensorDataset, batch: int) -> float:
    from ..train.loop import evaluate

    return evaluate(model, DataLoader(data, batch_size=batch))["top1"]


def _stats(values: Sequence[float]) -> tuple[float, float | None]:
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else None)


@dataclass
class _Row:
    case: EvalCase
    runs: list[dict[str, Any]] = field(default_factory=list)
    macs: Any = None


def _evaluate_case(model: nn.Module, case: EvalCase, data: TensorDataset, seeds: Sequence[int], batch: int,
                   img_size: int | None, progress: Progress | None) -> _Row:
    from ..train.checkpoint import load_model

    row = _Row(case)
    if case.kind == "fine-tuned":
        for path in case.checkpoints:
            trained, meta = load_model(path)
            row.runs.append({"checkpoint": str(path), "seed": (meta.get("config") or {}).get("seed"),
                             "top1": _top1(trained, data, batch)})
            row.macs = count_macs(trained, img_size)
            if progress:
                progress(f"{case.label} [{path}]: top1 {row.runs[-1]['top1']:.2f}")
        return row
    variants = [(None, case.spec)]
    if case.spec is not None and is_stochastic(case.spec):
        variants = [(s, with_seed(case.spec, s)) for s in seeds]
    for seed, spec in variants:
        if spec is not None:
            timm_vit.apply(model, spec)
        try:
            row.runs.append({"seed": seed, "spec": spec, "top1": _top1(model, data, batch)})
            row.macs = count_macs(model, img_size)
        finally:
            if spec is not None:
                timm_vit.remove(model)
        if progress:
            progress(f"{case.label}{'' if seed is None else f' seed {seed}'}: top1 {row.runs[-1]['top1']:.2f}")
    return row


def check_cases(model: nn.Module, cases: Sequence[EvalCase]) -> None:
    """Fail fast on a bad spec, a duplicate label or a learned spec without its trained weights."""
    labels = [c.label for c in cases]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise TokenReduceError(f"two cases share the label {dup[0]!r}")
    host = timm_vit.check_host(model)
    for c in cases:
        if c.spec is None:
            continue
        reducer = build_reducer(c.spec)
        reducer.bind(host)  # raises SpecError for a spec that does not fit the model
        if c.kind != "fine-tuned" and any(True for _ in reducer.parameters()):
            raise TokenReduceError(
                f"{c.spec} has learned parameters that this checkpoint does not hold; fine-tune it "
                f"(tokenreduce train --init CKPT --spec {c.spec!r}) and pass the result with --checkpoint"
            )


def evaluate_cases(
    model: nn.Module, data: TensorDataset, cases: Sequence[EvalCase], *, seeds: Sequence[int] = (0, 1, 2),
    eval_batch: int = 250, img_size: int | None = None, speed: dict[str, Any] | None = None,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """Rows (see the module docstring) for ``cases`` on ``model``, the unpatched row first.

    Args:
        model: the unpatched reference model (eval mode, CPU or its device).
        data: evaluation images (N, C, H, W) and labels (N,) (:func:`materialize`).
        cases: what to evaluate; an unpatched case is added first when absent.
        seeds: seeds of stochastic methods' runs.
        speed: keyword arguments for ``measure_speed`` (batch, warmup, repeats, min_run_s, threads).
    """
    if hasattr(model, timm_vit._ATTR):
        raise TokenReduceError("evaluate_cases takes the unpatched reference model; pass methods as cases")
    cases = list(cases)
    if not any(c.kind == "unpatched" for c in cases):
        cases.insert(0, EvalCase("unpatched", None, "unpatched"))
    cases.sort(key=lambda c: c.kind != "unpatched")
    check_cases(model, cases)
    if not seeds:
        raise TokenReduceError("give at least one seed")
    model.eval()
    rows = [_evaluate_case(model, c, data, seeds, eval_batch, img_size, progress) for c in cases]

    timed: dict[str | None, str] = {}  # canonical spec -> label timed for it
    for c in cases:
        key = None if c.spec is None else build_reducer(c.spec).spec()
        timed.setdefault(key, c.label)
    if progress:
        progress(f"timing {len(timed)} cases in one interleaved run")
    results = measure_speed(model, [Case(label, None if key is None else key) for key, label in timed.items()],
                            img_size=img_size, progress=progress, **(speed or {}))
    by_key = {r.spec: r for r in results}
    return [_finish(r, by_key, rows[0]) for r in rows]


def _finish(row: _Row, speed: dict, base: _Row) -> dict[str, Any]:
    c = row.case
    top1, std = _stats([r["top1"] for r in row.runs])
    ref = statistics.fmean(r["top1"] for r in base.runs)
    s = speed[None if c.spec is None else build_reducer(c.spec).spec()]
    seeds = [r["seed"] for r in row.runs if r.get("seed") is not None]
    out = {
        "label": c.label, "method": c.method, "kind": c.kind, "spec": c.spec, "budget": c.budget,
        "top1": top1, "top1_std": std, "top1_drop": 0.0 if c.kind == "unpatched" else ref - top1,
        "n_runs": len(row.runs), "seeds": seeds or None,
        "macs": row.macs.total, "gmacs": row.macs.total / 1e9, "macs_speedup": base.macs.total / row.macs.total,
        "img_per_s": s.img_per_s, "img_per_s_iqr": s.img_per_s_iqr, "latency_ms": s.latency_ms,
        "latency_ms_iqr": s.latency_ms_iqr, "speedup": s.speedup, "latency_speedup": s.latency_speedup,
        "tokens_per_block": row.macs.tokens_per_block, "runs": row.runs,
        "img_per_s_runs": s.img_per_s_runs, "latency_ms_runs": s.latency_ms_runs,
    }
    if c.checkpoints:
        out["checkpoints"] = list(c.checkpoints)
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()}


def first_images(data: TensorDataset, n: int) -> tuple[Tensor, Tensor]:
    """The first ``n`` images (n, C, H, W) and labels (n,) of ``data``."""
    images, labels = data.tensors
    return images[:n], labels[:n]
