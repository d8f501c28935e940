"""The evaluation pipeline behind ``tokenreduce eval``, ``tokenreduce demo`` and the studies.

:func:`evaluate` (an :class:`EvalRequest` -> an :class:`EvalResult`) is the one entry: the commands
parse flags into a request and write what it returns (the demo is a request with its defaults).
Its steps live here too:
    load_reference    the reference checkpoint: its unpatched model, metadata and bound task
    load_data         the task's test set for the model's input, materialised once, and its
                      training split as the retrieval database (read only if a task uses it)
    budget_cases      per training-free method and target speed-up, the spec chosen by bench/budgets.py
    matched_cases     per training-free case, the random pruner with its per-block token counts
    finetuned_cases   fine-tuned checkpoints and recorded runs grouped by (model, spec) (mean and
                      std over each group)
    evaluate_fold     a spec scored per item on one fold of the test items (a study's off-the-shelf arm)
    table             the results table (the task's primary metric, MACs, speed) and its legend
    write_outputs     results.json, results.csv, pareto.png and the task's own figures
Progress goes to stderr (:func:`log`), results to the files and the table.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset, TensorDataset

from ..core.errors import SpecError, TokenReduceError
from ..core.method import build_reducer
from ..data import OnDemand, data_config_from_model
from ..data import subset as take
from ..models import (
    ModelSource,
    changes_on_top,
    classes_of,
    make_model,
    model_config,
    read_checkpoint,
    read_meta,
    resolve,
)
from ..tasks import Task, build_task
from .accuracy import DEFAULT_TASK, EvalCase, bind_task, check_cases, evaluate_cases, materialize
from .budgets import find_budgets, in_band, training_free
from .pareto import plot_pareto, write_csv
from .report import format_table, write_json
from .settings import BAND, BUDGET_ROUNDS, SPEED
from .speed import matched_random


def log(msg: str) -> None:
    """A progress line on stderr."""
    print(msg, file=sys.stderr, flush=True)


def threads_text(n: int) -> str:
    return f"{n} thread{'' if n == 1 else 's'}"


def parse_list(text: str | None, flag: str, kind: type = float) -> list:
    """Comma-separated numbers of ``kind`` (float or int) given to ``flag``; '' or None -> []."""
    try:
        return [kind(x) for x in (text or "").split(",") if x.strip()]
    except ValueError:
        what, example = ("numbers", "1.5,2") if kind is float else ("integers", "0,1,2")
        raise TokenReduceError(f"{flag} takes comma-separated {what} like {example}, got {text!r}") from None


def binomial_se(percent: float, n: int) -> float:
    """The standard error, in points, of an accuracy of ``percent`` measured on ``n`` independent
    images: 100 * sqrt(p (1 - p) / n)."""
    p = percent / 100
    return 100 * (p * (1 - p) / max(n, 1)) ** 0.5


def speed_settings(*, batch: int, warmup: int, repeats: int, threads: int, eval_batch: int = 1,
                   backend: str = "eager") -> dict[str, Any]:
    """Keyword arguments of ``measure_speed`` after checking them (``backend``: bench/backends.py)."""
    if batch < 1 or repeats < 1 or warmup < 0 or eval_batch < 1:
        raise TokenReduceError("--batch-size, --eval-batch-size and --repeats must be >= 1, --warmup >= 0")
    return {"batch": batch, "warmup": warmup, "repeats": repeats, "min_run_s": SPEED["min_run_s"], "threads": threads,
            "backend": backend}


# ----------------------------------------------------------------------------- reference and data


@dataclass
class Reference:
    """The reference checkpoint: ``model`` unpatched in eval mode, its ``meta``, and ``task`` (the task
    it was trained for, bound to ``model``, its own tensors loaded)."""

    path: str
    model: nn.Module
    meta: dict[str, Any]
    task: Task


def load_reference(path: str | Path, device: str = "cpu") -> Reference:
    """The reference model (its reducer removed, if it carries one) with its task, both on ``device``; the file is
    read once."""
    ckpt = read_checkpoint(path)
    built = make_model(ModelSource(checkpoint=ckpt, spec=None))
    if built.meta.get("spec"):
        log(f"note: {path} carries the reducer {built.meta['spec']}; its unpatched model is the reference")
    ref = Reference(str(path), built.model, built.meta, bind_task(built.model, ckpt))
    ref.model.to(device)
    ref.task.to(device)
    return ref


@dataclass
class EvalData:
    """``test``: the evaluation items as tensors (:func:`accuracy.materialize`); ``database``: the
    training split, built on first use (``data.OnDemand``: only a retrieval task reads it);
    ``info``: their description for the results; ``masks``: the evaluation items' object masks
    (bool (n, H, W), aligned with ``test``) where the dataset has them (the scenes), else None."""

    test: TensorDataset
    database: Dataset
    info: dict[str, Any]
    masks: Tensor | None = None


def load_data(ref: Reference, *, data: str | None = None, data_dir: str | None = None, download: bool = False,
              subset: int | None = None) -> EvalData:
    """The reference task's test set (and training split as the database) for the reference's input.

    ``data``: a dataset name or directory (default: the checkpoint's); ``subset``: a fixed random
    ``subset`` of the test items (torch.randperm, seed 0). Labels index the reference's classes
    (``models.classes_of``): an image folder is mapped by class name, one with a class the model
    does not know is refused.
    """
    name = data or (ref.meta.get("data") or {}).get("name") or "fashion_mnist"
    kw = {"data_dir": data_dir, "download": download, "classes": classes_of(ref.meta),
          **data_config_from_model(ref.model)}
    full = ref.task.dataset(name, "test", train=False, **kw)
    ds = take(full, subset, seed=0)
    if subset and subset < len(full):
        which = f"a fixed random {len(ds)} of the {len(full)} test images (torch.randperm, seed 0)"
    else:
        which = f"all {len(full)} test images"
    log(f"data: {name}, {which}")
    info = {"name": name, "split": "test", "n": len(ds), "of": len(full), "subset_seed": 0, "which": which}
    database = OnDemand(lambda: ref.task.dataset(name, "train", train=False, **kw))
    masks = None
    if callable(getattr(full, "object_mask", None)):  # a dataset that knows its objects (the scenes)
        masks = torch.stack([full.object_mask(i) for i in getattr(ds, "indices", range(len(full)))])
    return EvalData(materialize(ds), database, info, masks)


def reference_metric(path: str | Path, subset: int | None = None, batch: int = 250) -> float:
    """The primary metric of checkpoint ``path``'s task, unpatched, on a fixed ``subset`` of its test
    set (as ``tokenreduce eval --subset`` draws it): what a shipped reference records and its test
    re-measures."""
    ref = load_reference(path)
    data = load_data(ref, subset=subset)
    return float(ref.task.evaluate(ref.model, data.test, batch_size=batch, device=next(ref.model.parameters()).device,
                                   database=data.database)[ref.task.metric])


def first_images(data: TensorDataset, n: int, classes: Sequence[str]) -> tuple[Tensor, list[str]]:
    """The first ``n`` images (n, C, H, W) of ``data`` and their titles (class names where the
    targets are class labels)."""
    images, targets = data.tensors
    n = min(n, len(images))

    def title(i: int, y: Tensor) -> str:
        if y.dim() != 0:  # a dense target (e.g. a label map) names no single class
            return f"image {i}"
        return classes[int(y)] if int(y) < len(classes) else f"class {int(y)}"

    titles = [title(i, y) for i, y in enumerate(targets[:n])]
    return images[:n], titles


# ----------------------------------------------------------------------------- cases


def budget_cases(model: nn.Module, targets: Sequence[float], methods: Sequence[str] | None, rule: str,
                 speed: dict[str, Any]) -> tuple[list[EvalCase], list[dict[str, Any]], dict[str, str]]:
    """(EvalCases, picks as dicts, skipped methods) for the target speed-ups ``targets``."""
    free, skipped = training_free(model, methods)
    for name, why in skipped.items():
        log(f"skipping {name}: {why}")
    picks = find_budgets(model, free, list(targets), rule=rule, speed={**speed, **BUDGET_ROUNDS}, progress=log)
    for p in picks:
        spread = f" [{p.expected_low:.2f}, {p.expected_high:.2f}]" if p.expected_low is not None else ""
        miss = None if p.reached else f"not within {BAND:g}x of {p.target:g}x"
        notes = "".join(f"; {n}" for n in (p.schedule_origin, miss) if n)
        log(f"budget {p.target:g}x {p.method}: {p.spec}  (expected {p.expected_speedup:.2f}x{spread}, MACs "
            f"{p.macs_speedup:.2f}x{notes})")
    cases = [EvalCase(p.spec, p.spec, "training-free", budget=p.target, budget_speedup=p.expected_speedup)
             for p in picks]
    return cases, [p.as_dict() for p in picks], skipped


def matched_cases(model: nn.Module, cases: Sequence[EvalCase]) -> list[EvalCase]:
    """Per training-free case, the random pruner with identical per-block token counts
    (``speed.matched_random``), labelled ``random~<label>``: a method's accuracy against pruning the
    same number of tokens blindly (run over every ``--seeds`` seed, like any random row). Cases that
    already are such a pruner, or whose schedule no pruner can replay (a merge that acts at both
    points of a block), get none."""
    out, have = [], {c.spec for c in cases}
    for c in cases:
        if c.kind != "training-free" or c.spec is None:
            continue
        try:
            spec = matched_random(model, c.spec)
        except SpecError as e:
            log(f"no matched random pruner for {c.label}: {e}")
            continue
        match = EvalCase(f"random~{c.label}", spec, "training-free", budget=c.budget, budget_speedup=c.budget_speedup)
        if spec in have or c.method == match.method:  # a random pruner is its own match
            continue
        have.add(spec)
        out.append(match)
    return out


@dataclass(frozen=True)
class Recorded:
    """A fine-tuned run evaluated when it finished, on the items an evaluation reads (a study's training
    run: its test items are the study's): its ``model`` config, ``spec``, ``task`` and the ``metrics``
    of that evaluation (the task's numbers, ``train.final_evaluation``); ``name``: its run id. A study's
    measure groups these instead of reading checkpoints, which need not outlive the run."""

    name: str
    model: dict[str, Any]
    spec: str | None
    task: str
    seed: int | None
    metrics: dict[str, Any]


def finetuned_cases(paths: Sequence[str], ref: Reference, recorded: Sequence[Recorded] = ()) -> list[EvalCase]:
    """One EvalCase per (model, spec) among the fine-tuned checkpoints ``paths`` and ``recorded`` runs;
    each must hold the reference's model, or it with another stem or added transforms (``tokenreduce
    train --init REF --stem conv``: timed on its own model, the stem counted), have been trained for the
    reference's task and (a checkpoint says so) on its classes, in its order (the labels of the
    evaluation data index the reference's)."""
    groups: dict[tuple[str | None, str | None], tuple[list[str], list[dict[str, Any]]]] = {}
    models: dict[str | None, tuple[dict[str, Any] | None, str]] = {None: (None, "")}

    def group(name: str, model: Any, task: str | None, spec: str | None) -> tuple[list[str], list[dict[str, Any]]]:
        own, note = _beside_reference(model, ref.meta.get("model"), name)
        key = json.dumps(own, sort_keys=True) if own is not None else None
        models[key] = (own, note)
        task = build_task(task or DEFAULT_TASK).spec()
        if task != ref.task.spec():
            raise TokenReduceError(f"{name} was trained for the task {task}, the reference for {ref.task.spec()}; "
                                   "fine-tuned runs must share the reference's task")
        spec = build_reducer(spec).spec() if spec else None
        return groups.setdefault((key, spec), ([], []))

    for path in paths:
        meta = read_meta(path)
        mine, theirs = classes_of(meta), classes_of(ref.meta)
        if mine and theirs and mine != theirs:
            other = sorted(set(mine) ^ set(theirs))
            why = f"classes the other lacks: {', '.join(other)}" if other else "the same classes in another order"
            raise TokenReduceError(f"{path} was trained on other classes than the reference {ref.path} ({why}); "
                                   "its outputs would be scored against the wrong labels")
        group(path, meta.get("model"), meta.get("task"), meta.get("spec"))[0].append(str(resolve(path)))
    for r in recorded:
        group(r.name, r.model, r.task, r.spec)[1].append({**r.metrics, "seed": r.seed, "run": r.name})
    return [EvalCase(f"{spec or 'no reducer'} [{models[key][1]}fine-tuned x{len(ps) + len(rs)}]", spec, "fine-tuned",
                     checkpoints=tuple(ps), recorded=tuple(rs), model=models[key][0])
            for (key, spec), (ps, rs) in groups.items()]


def _beside_reference(model: Any, reference: Any, name: str) -> tuple[dict[str, Any] | None, str]:
    """(the canonical model config of the fine-tuned run ``name`` (a checkpoint or a record) when it is
    not the reference's, or None; the words a row label says about it, e.g. "stem conv(norm='bn'), ");
    an unrelated model is refused."""
    if model == reference:
        return None, ""
    on_top = changes_on_top(reference, model) if isinstance(model, dict) and isinstance(reference, dict) else None
    if on_top is None:
        raise TokenReduceError(f"{name} holds model {model}, the reference holds {reference}; fine-tuned runs "
                               "must hold the reference's model, or it with another stem or added transforms")
    stem, extra = on_top
    if stem is None and not extra:  # the same model spelt another way
        return None, ""
    return model_config(model), "".join([*([f"stem {stem}, "] if stem else []), *(f"+ {t}, " for t in extra)])


def one_per_method(picks: Sequence[dict[str, Any]], target: float) -> list[str]:
    """Per method, the spec picked for the budget closest to ``target`` (picks as from budget_cases)."""
    best: dict[str, dict[str, Any]] = {}
    for p in picks:
        cur = best.get(p["method"])
        if cur is None or abs(p["target"] - target) < abs(cur["target"] - target):
            best[p["method"]] = p
    return [p["spec"] for p in best.values()]


# ----------------------------------------------------------------------------- results


def _scaled(factor: float, fmt: str) -> Callable[[Any], str]:
    return lambda v: fmt.format(v / factor)


def columns(metric: str) -> list[tuple]:
    """Columns of the results table for rows whose primary metric is ``metric``."""
    return [
        ("label", "case"), ("budget_speedup", "budget", "{:.2f}x"), ("value", metric, "{:.2f}"),
        ("value_std", "± std", "{:.2f}"), ("drop", "drop", "{:+.2f}"), ("macs", "MMACs", _scaled(1e6, "{:.1f}")),
        ("macs_speedup", "MACs x", "{:.2f}"), ("img_per_s", "img/s", "{:.0f}"), ("latency_ms", "lat ms", "{:.2f}"),
        ("speedup", "speedup", "{:.2f}"), ("in_band", "on target", lambda v: "yes" if v else "NO"),
        ("latency_speedup", "lat x", "{:.2f}"), ("tokens_per_block", "tokens"), ("schedule_origin", "schedule"),
    ]


def table(rows: Sequence[dict[str, Any]]) -> str:
    """The results table of ``rows`` (as from ``evaluate_cases``) with a legend below it."""
    metric = rows[0]["metric"] if rows else "value"
    legend = ("budget: the speed-up the budget rule expected of a --budgets pick (its target is in results.json); "
              f"{metric}: mean over seeds (stochastic methods) or checkpoints (fine-tuned), ± sample std; "
              f"drop = unpatched {metric} - {metric} (> 0: worse; sign flipped for a lower-is-better metric); "
              "MACs x = analytic MACs ratio; speedup = img/s ratio at the throughput batch, lat x = latency ratio "
              f"at batch 1, both measured in one interleaved run; on target: the speedup lies within {BAND:g}x of "
              "the pick's target (NO: not comparable with the rows on target); tokens leaving each block, prefix "
              "tokens included; schedule: the model a published schedule was searched for")
    return "\n".join(x for x in (format_table(rows, columns(metric)), legend, off_target(rows)) if x)


def write_outputs(out: str | Path, rows: Sequence[dict[str, Any]], info: dict[str, Any], title: str,
                  task: Task | None = None) -> list[Path]:
    """results.json (``info`` + rows), results.csv, pareto.png and ``task``'s figures of the
    unpatched row's first run in ``out``; returns the paths written."""
    out = Path(out)
    paths = [write_json(out / "results.json", {**info, "results": list(rows)}), write_csv(out / "results.csv", rows),
             plot_pareto(out / "pareto.png", rows, title)]
    if task is not None and rows and rows[0].get("runs"):
        paths += task.plot(rows[0]["runs"][0], out)
    for p in paths:
        log(f"wrote {p}")
    return paths


def mark_band(rows: Sequence[dict[str, Any]]) -> None:
    """Set ``in_band`` on every row chosen for a target speed-up (``budget``): whether its measured
    speed-up lies within ``budgets.BAND`` of the target (``budgets.in_band``); tables and the Pareto plot
    flag the others, which are not comparable with the rows on target."""
    for r in rows:
        if r.get("budget") is not None:
            r["in_band"] = in_band(r.get("speedup"), r["budget"])


def off_target(rows: Sequence[dict[str, Any]]) -> str | None:
    """One line naming the rows measured outside the band of their target, or None when there are none."""
    off = [f"{r['label']} measured {r['speedup']:.2f}x, target {r['budget']:g}x" for r in rows
           if r.get("in_band") is False and r.get("speedup") is not None]
    if not off:
        return None
    return f"measured outside {BAND:g}x of their target (not comparable with the rows on target): " + "; ".join(off)


# ----------------------------------------------------------------------------- the entry


@dataclass(frozen=True)
class EvalRequest:
    """What :func:`evaluate` evaluates.

    Attributes:
        reference: the reference checkpoint (a file or training directory), evaluated unpatched; it
            names the task (and its metric) and the classes the data is scored against.
        specs: training-free specs, one row each.
        targets: target speed-ups: per training-free method (``methods``: only these) and target,
            the spec the budget ``rule`` picks (bench/budgets.py).
        match_random: per training-free case (given or picked), also the random pruner with its
            per-block token counts (:func:`matched_cases`).
        finetuned: fine-tuned checkpoints of the reference's model (one row per spec among them).
        recorded: fine-tuned runs by their recorded evaluations (:class:`Recorded`; a study's measure),
            grouped with ``finetuned``.
        seeds: the seeds of stochastic methods (one run each).
        eval_batch: the batch size of the task's metric.
        speed: ``measure_speed`` settings (:func:`speed_settings`; the same for every case).
        data, data_dir, download, subset: the evaluation data (:func:`load_data`).
        device: where every model runs (the metric and the timing); amp: the forward's autocast,
            bf16, fp16 or off (precision.autocast).
    """

    reference: str | Path
    specs: Sequence[str] = ()
    targets: Sequence[float] = ()
    methods: Sequence[str] | None = None
    rule: str = "measured"
    match_random: bool = False
    finetuned: Sequence[str] = ()
    recorded: Sequence[Recorded] = ()
    seeds: Sequence[int] = (0, 1, 2)
    eval_batch: int = 250
    speed: dict[str, Any] = field(default_factory=lambda: dict(SPEED))
    data: str | None = None
    data_dir: str | None = None
    download: bool = False
    subset: int | None = None
    device: str = "cpu"
    amp: str = "off"


@dataclass(frozen=True)
class FoldRequest:
    """``spec`` off the shelf on ``checkpoint``, scored per item on items i, i + k, ... (``fold`` = (i, k)) of the
    test ``subset`` (read from ``data_dir`` when given): a study's off-the-shelf arm, one fold per seed."""

    spec: str
    checkpoint: str
    fold: tuple[int, int]
    data_dir: str | None = None
    subset: int | None = None
    eval_batch: int = 250


def evaluate_fold(req: FoldRequest, device: str = "cpu", amp: str | None = "off") -> dict[str, Any]:
    """The fold's per-item evaluation (``Task.evaluate(..., items=True)``) on ``device`` under ``amp``
    (precision.autocast); the caller sets torch's threads."""
    from torch.utils.data import Subset

    from ..api import apply
    from ..models.precision import autocast

    ref = load_reference(req.checkpoint, device)
    test = load_data(ref, data_dir=req.data_dir, subset=req.subset)
    i, k = req.fold
    items = Subset(test.test, range(i, len(test.test), k))
    apply(ref.model, req.spec)
    with autocast(device, amp):
        metrics = ref.task.evaluate(ref.model, items, batch_size=req.eval_batch, device=device,
                                    database=test.database, items=True)
    return {"spec": req.spec, "checkpoint": req.checkpoint, "data": test.info, "fold": [i, k],
            "items": len(items), "metrics": metrics}


@dataclass
class EvalResult:
    """What :func:`evaluate` found: the reference, the data, one row per case (the unpatched row
    first; as from ``accuracy.evaluate_cases``) and the budget search (targets, rule, picks, skipped
    methods and why)."""

    ref: Reference
    data: EvalData
    rows: list[dict[str, Any]]
    budgets: dict[str, Any]

    @property
    def picks(self) -> list[dict[str, Any]]:
        return self.budgets["picks"]

    @property
    def skipped(self) -> dict[str, str]:
        return self.budgets["skipped"]


def evaluate(req: EvalRequest, progress: Callable[[str], None] = log) -> EvalResult:
    """The reference unpatched, each spec, each budget pick and each fine-tuned spec on the
    reference's test data: the task's metric, MACs and speed in one interleaved run (its progress
    lines to ``progress``).

    Specs are checked (and fine-tuned checkpoints matched to the reference) before the data is read;
    the caller sets torch's threads (``req.speed['threads']`` is what the timing records).
    """
    from ..models.precision import autocast

    ref = load_reference(req.reference, req.device)
    with autocast(req.device, req.amp):
        return _evaluate(req, ref, progress)


def _evaluate(req: EvalRequest, ref: Reference, progress: Callable[[str], None]) -> EvalResult:
    cases = [EvalCase(spec, spec) for spec in req.specs]
    check_cases(ref.model, cases)
    picks: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    if req.targets:
        log(f"choosing specs for {', '.join(f'{t:g}x' for t in req.targets)} ({req.rule} rule)")
        more, picks, skipped = budget_cases(ref.model, req.targets, req.methods, req.rule, req.speed)
        given = {build_reducer(c.spec).spec() for c in cases}
        cases += [c for c in more if build_reducer(c.spec).spec() not in given]
    if req.match_random:
        cases += matched_cases(ref.model, cases)
    cases += finetuned_cases(req.finetuned, ref, req.recorded)
    data = load_data(ref, data=req.data, data_dir=req.data_dir, download=req.download, subset=req.subset)
    rows = evaluate_cases(ref.model, data.test, cases, task=ref.task, database=data.database, seeds=req.seeds,
                          eval_batch=req.eval_batch, speed=req.speed, progress=progress)
    mark_band(rows)
    budgets = {"targets": list(req.targets), "rule": req.rule, "picks": picks, "skipped": skipped}
    return EvalResult(ref, data, rows, budgets)
