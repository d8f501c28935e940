"""A study's kinds of run as requests of the library, and one executor per kind: request -> record body.

Training is ``TrainConfig`` (what ``tokenreduce train`` builds from its flags); a measure is ``tokenreduce eval``'s
``EvalRequest``, the fine-tuned runs among its ``recorded`` evaluations; the rest are the frozen requests below.
A request names everything its run reads (checkpoints, records' numbers), so :func:`execute` runs it in any
process, the runner's or a worker's; the ``RunContext`` (threads, device, precision, a folder, a log) is where it
runs, not what it computes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..bench import evaluation as ev
from ..models.references import file_sha256
from ..probes.base import RunContext, build_experiment
from ..train.config import TrainConfig


@dataclass(frozen=True)
class FoldRequest:
    """``spec`` off the shelf on ``checkpoint``, scored per item on items i, i + k, ... (``fold`` = (i, k)) of the
    test ``subset`` (read from ``data_dir`` when given)."""

    spec: str
    checkpoint: str
    fold: tuple[int, int]
    data_dir: str | None = None
    subset: int | None = None
    eval_batch: int = 250


@dataclass(frozen=True)
class ProbeRequest:
    """``tokenreduce experiment SPEC`` (probes/), its checkpoint among its parameters."""

    spec: str


@dataclass(frozen=True)
class BenchRequest:
    """``tokenreduce bench``: ``specs`` against the unpatched model and the ``control`` in one interleaved run, on
    the timm ``model`` (random weights from ``speed['seed']``) or the trained weights of the recipe ``checkpoint``;
    ``speed``: the timing flags (the rest as eval's ``SPEED``), backend, compile_mode, dtype, seed."""

    model: dict[str, Any]
    specs: tuple[str, ...]
    control: str
    match_random: bool
    speed: dict[str, Any]
    argv: tuple[str, ...]
    checkpoint: str | None = None
    stem: str | None = None


def train(cfg: TrainConfig, ctx: RunContext) -> dict[str, Any]:
    """Train (or resume, or reuse) ``cfg``: its config, final metrics and the checkpoint's SHA-256."""
    from ..train.loop import train as run

    metrics = run(cfg)
    return {"config": cfg.to_dict(), "metrics": metrics, "checkpoint_sha256": file_sha256(metrics["checkpoint"])}


def fold(req: FoldRequest, ctx: RunContext) -> dict[str, Any]:
    """The fold's per-item evaluation, with the per-item results the study's item-level tests read."""
    import torch
    from torch.utils.data import Subset

    from ..api import apply

    torch.set_num_threads(ctx.threads)
    ref = ev.load_reference(req.checkpoint, ctx.device)
    test = ev.load_data(ref, data_dir=req.data_dir, subset=req.subset)
    i, k = req.fold
    items = Subset(test.test, range(i, len(test.test), k))
    apply(ref.model, req.spec)
    with ctx.autocast():
        metrics = ref.task.evaluate(ref.model, items, batch_size=req.eval_batch, device=ctx.device,
                                    database=test.database, items=True)
    return {"spec": req.spec, "checkpoint": req.checkpoint, "data": test.info, "fold": [i, k],
            "items": len(items), "metrics": metrics}


def probe(req: ProbeRequest, ctx: RunContext) -> dict[str, Any]:
    exp = build_experiment(req.spec)
    return {"experiment": exp.spec(), "result": exp.run(ctx)}


def measure(req: ev.EvalRequest, ctx: RunContext) -> dict[str, Any]:
    """``tokenreduce eval``'s evaluation (bench/evaluation.py) timed on the context's threads; the eval command's
    files go to the context's folder."""
    import torch

    settings = ev.speed_settings(threads=ctx.threads, eval_batch=req.eval_batch, **req.speed)
    torch.set_num_threads(ctx.threads)
    res = ev.evaluate(replace(req, speed=settings), progress=ctx.log)
    info = {"reference": {"checkpoint": req.reference, "task": res.ref.task.spec()}, "data": res.data.info,
            "speed": settings}
    title = f"{res.data.info['name']}, {res.data.info['n']} test images"
    ev.write_outputs(ctx.out_dir, res.rows, info, title, task=res.ref.task)
    return {"result": {**info, "results": res.rows}}


def bench(req: BenchRequest, ctx: RunContext) -> dict[str, Any]:
    """The bench command's results document (bench/compare.py)."""
    import torch

    from ..bench.compare import bench_document, with_stem
    from ..models import ModelSource, make_model

    speed = {"backend": "eager", "compile_mode": "default", "dtype": "float32", "seed": 0, **ev.SPEED, **req.speed}
    backend, compile_mode = speed.pop("backend"), speed.pop("compile_mode")
    dtype, seed = speed.pop("dtype"), speed.pop("seed")
    torch.manual_seed(seed)
    if req.checkpoint:
        from ..train.recipes import reference_checkpoint

        source = ModelSource(checkpoint=str(reference_checkpoint(req.checkpoint)), spec=None)
    else:
        source = ModelSource(config={"name": req.model["name"], "kwargs": dict(req.model.get("kwargs", {})),
                                     "pretrained": False})
    built = make_model(source)
    built.model.to(ctx.device, getattr(torch, dtype))
    info = {"name": built.config["name"], "kwargs": built.config.get("kwargs", {}), "pretrained": False,
            "reference": req.checkpoint}
    return {"result": bench_document(built.model, req.specs, model_info=info, settings=speed, control=req.control,
                                     match_random=req.match_random, threads=ctx.threads, backend=backend,
                                     device=ctx.device, dtype=dtype, seed=seed, argv=list(req.argv),
                                     stem=with_stem(built.model, req.stem) if req.stem else None, amp=ctx.amp,
                                     compile_mode=compile_mode, progress=ctx.log)}


EXECUTORS: dict[type, Callable[[Any, RunContext], dict[str, Any]]] = {
    TrainConfig: train, FoldRequest: fold, ProbeRequest: probe, ev.EvalRequest: measure, BenchRequest: bench}


def execute(request: Any, ctx: RunContext) -> dict[str, Any]:
    """The record body of ``request`` run in ``ctx``."""
    return EXECUTORS[type(request)](request, ctx)
