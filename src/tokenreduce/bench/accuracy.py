"""The task's metrics, MACs and measured speed of several specs on one model, in one run.

For a reference model (unpatched), the task it was trained for (``tasks``: classify, hash,
segment, ...; its metrics come from ``Task.evaluate``), an evaluation set and a list of
:class:`EvalCase` this gives one row per case with

    metric          the task's primary metric name (``Task.metric``: top1, map, miou)
    value           its mean over the case's runs
    value_std       sample standard deviation over the runs (None for a single run)
    drop            value(unpatched) - value (> 0: worse; sign flipped for a lower-is-better
                    metric); 0 for the unpatched row
    <metric>, <metric>_std, <metric>_drop   the same three under the metric's name (top1, ...)
    metrics         mean over the runs of every numeric metric the task reports
    macs, gmacs     analytic MACs per image (count_macs, from the compiled schedule)
    macs_speedup    MACs(unpatched) / MACs
    img_per_s, latency_ms, speedup, latency_speedup
                    from ONE interleaved measure_speed run over every case (the unpatched model first)
    tokens_per_block  tokens (prefix included) leaving each block

Runs: a stochastic method (its config has a ``seed`` field) is evaluated once per seed, its spec's
seed replaced; a deterministic one once; a trained case once per checkpoint (checkpoints of one
spec, e.g. fine-tuned with different seeds, make one row), each with its own task tensors (a hash
head), or, for runs that were evaluated on these items when they finished (a study's training runs:
``EvalCase.recorded``), their recorded metrics as they are. A trained case is counted and timed as
its spec on the reference model (weights do not change the shapes, so the cost is the same), unless
its runs hold another architecture of the reference (another stem: ``EvalCase.model``): then on
that model, built from its config, so the stem's cost is in its MACs and speed.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from ..adapters import hosts, timm_vit
from ..core.compose import split_stages
from ..core.errors import TokenReduceError
from ..core.method import build_reducer, format_spec, get_method, parse_spec
from ..models import ModelSource, load_model, make_model, read_checkpoint, task_weights
from ..models.checkpoint import Checkpoint
from ..tasks import Task, TaskContext, build_task
from .macs import count_macs
from .report import no_nan
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
        budget_speedup: the speed-up the budget rule expected of the spec (what tables show: a pick
            may fall short of its target).
        checkpoints: for 'fine-tuned': the checkpoints to evaluate (one run each).
        recorded: for 'fine-tuned': runs evaluated already on the same items (one metrics dict each,
            the task's numbers as its evaluation returns them, plus 'seed' and 'run'): rows of the
            group as they are, no checkpoint read (a study's runs, whose checkpoints need not outlive
            them).
        model: for 'fine-tuned' runs whose model is the reference's with another stem or added
            transforms: that model config (their cost is counted and timed on it); None: the reference's.
    """

    label: str
    spec: str | None
    kind: str = "training-free"
    budget: float | None = None
    checkpoints: tuple[str, ...] = ()
    budget_speedup: float | None = None
    model: dict[str, Any] | None = None
    recorded: tuple[dict[str, Any], ...] = ()

    def timing_key(self) -> tuple[str | None, str | None]:
        """What its speed depends on: (its own model config as JSON, or None for the reference's; the
        canonical spec or None)."""
        own = json.dumps(self.model, sort_keys=True) if self.model is not None else None
        return own, (build_reducer(self.spec).spec() if self.spec else None)

    @property
    def method(self) -> str:
        return build_reducer(self.spec).name if self.spec else "unpatched"


def _seeded(name: str) -> bool:
    return "seed" in {f.name for f in dataclasses.fields(get_method(name).Config)}


def is_stochastic(spec: str) -> bool:
    """Whether ``spec``'s method (any stage of a composite ``'A + B'``) draws random numbers that a
    ``seed`` parameter fixes."""
    return any(_seeded(parse_spec(s)[0]) for s in split_stages(spec))


def with_seed(spec: str, seed: int) -> str:
    """``spec`` with its ``seed`` parameter set to ``seed`` (in every stage that has one)."""
    stages = [parse_spec(s) for s in split_stages(spec)]
    return " + ".join(format_spec(n, {**p, "seed": seed} if _seeded(n) else p) for n, p in stages)


def materialize(dataset: Dataset, progress: Progress | None = None) -> TensorDataset:
    """The dataset as tensors: images (N, C, H, W) and targets (N, ...) (class labels (N,), label
    maps (N, H, W), ...), decoded and transformed once for every run."""
    if len(dataset) == 0:
        raise TokenReduceError("the evaluation set is empty")
    images, targets = [], []
    for i in range(len(dataset)):
        x, y = dataset[i]
        images.append(x)
        targets.append(torch.as_tensor(y))
    if progress:
        progress(f"loaded {len(images)} evaluation images")
    return TensorDataset(torch.stack(images), torch.stack(targets))


#: The task of a checkpoint whose metadata names none (made before tasks existed).
DEFAULT_TASK = "classify"


def bind_task(model: nn.Module, checkpoint: str | Path | Checkpoint | None = None) -> Task:
    """The task ``checkpoint`` was trained for (``meta['task']``), bound to ``model`` with its own
    tensors (the ``task.*`` ones: a hash head, target codes) loaded; in eval mode. ``checkpoint``: a
    path, or a checkpoint read already (``models.read_checkpoint``).

    Without a checkpoint: the default task bound to ``model`` (it owns nothing to load).
    """
    if checkpoint is None:
        task = build_task(DEFAULT_TASK)
        task.bind(model, TaskContext())
        return task.eval()
    ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else read_checkpoint(checkpoint)
    meta = ckpt.meta
    task = build_task(meta.get("task") or DEFAULT_TASK)
    task.bind(model, TaskContext(classes=list(meta.get("classes") or []),
                                 seed=int((meta.get("config") or {}).get("seed") or 0)))
    task.load_owned_state_dict(task_weights(ckpt))
    return task.eval()


def _metrics(task: Task, model: nn.Module, data: TensorDataset, batch: int, database: Dataset | None
             ) -> dict[str, Any]:
    """``task.evaluate`` of ``model`` on ``data`` on the model's device; checks the primary metric is there."""
    device = next(model.parameters()).device
    metrics = task.evaluate(model, data, batch_size=batch, device=device, database=database)
    if task.metric not in metrics:
        raise TokenReduceError(f"task {task.spec()} reported {sorted(metrics)}, not its metric {task.metric!r}")
    return dict(metrics)


def _stats(values: Sequence[float]) -> tuple[float, float | None]:
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else None)


@dataclass
class _Row:
    case: EvalCase
    runs: list[dict[str, Any]] = field(default_factory=list)
    macs: Any = None


def _evaluate_case(model: nn.Module, task: Task, case: EvalCase, data: TensorDataset, database: Dataset | None,
                   seeds: Sequence[int], batch: int, img_size: int | None, progress: Progress | None) -> _Row:
    row = _Row(case)
    m = task.metric
    if case.kind == "fine-tuned":
        for path in case.checkpoints:
            ckpt = read_checkpoint(path)  # once: the model and the task's own tensors
            device = next(model.parameters()).device  # the reference's: every case runs where it does
            trained, meta = load_model(ckpt, device)
            metrics = _metrics(bind_task(trained, ckpt).to(device), trained, data, batch, database)
            row.runs.append({**metrics, "checkpoint": str(path), "seed": (meta.get("config") or {}).get("seed")})
            row.macs = count_macs(trained, img_size)
            if progress:
                progress(f"{case.label} [{path}]: {m} {metrics[m]:.2f}")
        row.runs += [dict(r) for r in case.recorded]
        if row.macs is None:  # recorded runs only: the cost of their spec on their model
            host = _own_model(case, model) or model
            with hosts.patched(host, case.spec):
                row.macs = count_macs(host, img_size)
        return row
    variants = [(None, case.spec)]
    if case.spec is not None and is_stochastic(case.spec):
        variants = [(s, with_seed(case.spec, s)) for s in seeds]
    for seed, spec in variants:
        with hosts.patched(model, spec):
            row.runs.append({**_metrics(task, model, data, batch, database), "seed": seed, "spec": spec})
            row.macs = count_macs(model, img_size)
        if progress:
            progress(f"{case.label}{'' if seed is None else f' seed {seed}'}: {m} {row.runs[-1][m]:.2f}")
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
        if c.kind != "fine-tuned" and reducer.learned:  # before bind: this refusal, not a locs error, comes first
            raise TokenReduceError(
                f"{c.spec} has learned parameters that this checkpoint does not hold; fine-tune it "
                f"(tokenreduce train --init CKPT --spec {c.spec!r}) and pass the result with --checkpoint"
            )
        reducer.bind(host)  # raises SpecError for a spec that does not fit the model


def evaluate_cases(
    model: nn.Module, data: TensorDataset, cases: Sequence[EvalCase], *, task: Task | None = None,
    database: Dataset | None = None, seeds: Sequence[int] = (0, 1, 2), eval_batch: int = 250,
    img_size: int | None = None, speed: dict[str, Any] | None = None, progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """Rows (see the module docstring) for ``cases`` on ``model``, the unpatched row first.

    Args:
        model: the unpatched reference model (eval mode, CPU or its device).
        data: evaluation images (N, C, H, W) and the task's targets (:func:`materialize`).
        cases: what to evaluate; an unpatched case is added first when absent.
        task: the reference's task bound to ``model`` (:func:`bind_task`); default: classification.
        database: what a retrieval task ranks against (the training split); passed to ``Task.evaluate``.
        seeds: seeds of stochastic methods' runs.
        speed: keyword arguments for ``measure_speed`` (batch, warmup, repeats, min_run_s, threads).
    """
    if hosts.is_patched(model):
        raise TokenReduceError("evaluate_cases takes the unpatched reference model; pass methods as cases")
    cases = list(cases)
    if not any(c.kind == "unpatched" for c in cases):
        cases.insert(0, EvalCase("unpatched", None, "unpatched"))
    cases.sort(key=lambda c: c.kind != "unpatched")
    check_cases(model, cases)
    if not seeds:
        raise TokenReduceError("give at least one seed")
    model.eval()
    task = bind_task(model) if task is None else task
    rows = [_evaluate_case(model, task, c, data, database, seeds, eval_batch, img_size, progress) for c in cases]

    timed: dict[tuple[str | None, str | None], Case] = {}  # timing key -> the case timed for it
    for c in cases:
        key = c.timing_key()
        if key not in timed:
            timed[key] = Case(c.label, key[1], _own_model(c, model))
    if progress:
        progress(f"timing {len(timed)} cases in one interleaved run")
    results = measure_speed(model, list(timed.values()), img_size=img_size, progress=progress, **(speed or {}))
    by_key = dict(zip(timed, results, strict=True))
    return [_finish(r, task, by_key, rows[0]) for r in rows]


def _own_model(case: EvalCase, reference: nn.Module) -> nn.Module | None:
    """The unpatched model a fine-tuned case with its own architecture is counted and timed on, built
    from its config (fresh weights: the shapes are the trained model's), on the reference's device;
    None for a case on the reference's model."""
    if case.model is None:
        return None

    config = {**case.model, "pretrained": False}  # the weights are not what is timed: never fetch any
    return make_model(ModelSource(config=config, spec=None), next(reference.parameters()).device).model


def _numeric(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _finish(row: _Row, task: Task, speed: dict, base: _Row) -> dict[str, Any]:
    c, m = row.case, task.metric
    value, std = _stats([r[m] for r in row.runs])
    ref = statistics.fmean(r[m] for r in base.runs)
    drop = 0.0 if c.kind == "unpatched" else (ref - value if task.higher_is_better else value - ref)
    s = speed[c.timing_key()]
    seeds = [r["seed"] for r in row.runs if r.get("seed") is not None]
    names = [k for k, v in row.runs[0].items() if _numeric(v) and k != "seed"
             and all(_numeric(r.get(k)) for r in row.runs)]
    out = {
        "label": c.label, "method": c.method, "kind": c.kind, "spec": c.spec, "budget": c.budget,
        "budget_speedup": c.budget_speedup,
        "task": task.spec(), "metric": m, "value": value, "value_std": std, "drop": drop,
        m: value, f"{m}_std": std, f"{m}_drop": drop,
        "metrics": {k: statistics.fmean(r[k] for r in row.runs) for k in names},
        "n_runs": len(row.runs), "seeds": seeds or None,
        "macs": row.macs.total, "gmacs": row.macs.total / 1e9, "macs_speedup": base.macs.total / row.macs.total,
        "img_per_s": s.img_per_s, "img_per_s_iqr": s.img_per_s_iqr, "latency_ms": s.latency_ms,
        "latency_ms_iqr": s.latency_ms_iqr, "speedup": s.speedup, "latency_speedup": s.latency_speedup,
        "tokens_per_block": row.macs.tokens_per_block, "runs": row.runs,
        "schedule_origin": build_reducer(c.spec).schedule_origin() if c.spec else None,
        "img_per_s_runs": s.img_per_s_runs, "latency_ms_runs": s.latency_ms_runs,
    }
    if c.checkpoints:
        out["checkpoints"] = list(c.checkpoints)
    return no_nan(out)

