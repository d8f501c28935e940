"""A study's kinds of run as requests of the library, and one executor per kind: request -> record body.

Training is ``TrainConfig`` (what ``tokenreduce train`` builds from its flags); a measure ``tokenreduce eval``'s
``EvalRequest``, the fine-tuned runs among its ``recorded`` evaluations; a bench ``tokenreduce bench``'s
``BenchRequest``; an off-the-shelf arm's seed a ``FoldRequest`` (bench/evaluation.py); a probe ``tokenreduce
experiment``'s ``ProbeRequest``. A request names everything its run reads (checkpoints, records' numbers), so
:func:`execute` runs it in any process, the runner's or a worker's; the ``RunContext`` (threads, device, precision,
a folder, a log) is where it runs, not what it computes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..bench import evaluation as ev
from ..bench.compare import BenchRequest, run_bench
from ..bench.evaluation import FoldRequest
from ..models.references import file_sha256
from ..probes.base import ProbeRequest, RunContext
from ..train.config import TrainConfig


def train(cfg: TrainConfig, ctx: RunContext) -> dict[str, Any]:
    """Train (or resume, or reuse) ``cfg``: its config, final metrics and the checkpoint's SHA-256."""
    from ..train.loop import train as run

    metrics = run(cfg)
    return {"config": cfg.to_dict(), "metrics": metrics, "checkpoint_sha256": file_sha256(metrics["checkpoint"])}


def fold(req: FoldRequest, ctx: RunContext) -> dict[str, Any]:
    """The fold's per-item evaluation (bench/evaluation.py), with the per-item results the item-level tests read."""
    import torch

    torch.set_num_threads(ctx.threads)
    return ev.evaluate_fold(req, ctx.device, ctx.amp)


def probe(req: ProbeRequest, ctx: RunContext) -> dict[str, Any]:
    exp = req.experiment()
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
    return {"result": run_bench(req, threads=ctx.threads, device=ctx.device, amp=ctx.amp, progress=ctx.log)}


EXECUTORS: dict[type, Callable[[Any, RunContext], dict[str, Any]]] = {
    TrainConfig: train, FoldRequest: fold, ProbeRequest: probe, ev.EvalRequest: measure, BenchRequest: bench}


def execute(request: Any, ctx: RunContext) -> dict[str, Any]:
    """The record body of ``request`` run in ``ctx``."""
    return EXECUTORS[type(request)](request, ctx)
