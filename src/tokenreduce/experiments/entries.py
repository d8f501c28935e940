"""The one seam between a study's runs and the code the commands run: training (``tokenreduce
train``'s ``train()``), evaluation (``tokenreduce eval``'s pipeline, bench/evaluation.py) and a
registered experiment (``tokenreduce experiment``). When those entries move, only this file changes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def train_run(fields: dict[str, Any]) -> dict[str, Any]:
    """Train (or resume, or reuse) the run TrainConfig(**fields); returns (config dict, final metrics)."""
    from ..train.config import TrainConfig
    from ..train.loop import train

    cfg = TrainConfig.from_dict(fields)
    return {"config": cfg.to_dict(), "metrics": train(cfg)}


def evaluate(reference: str, specs: Sequence[str], finetuned: Sequence[str], *, out: Path, threads: int,
             speed: dict[str, Any], seeds: Sequence[int] = (0, 1, 2), eval_batch: int = 250,
             data_dir: str | None = None, subset: int | None = None,
             log: Callable[[str], None] = print) -> dict[str, Any]:
    """``tokenreduce eval --checkpoint REFERENCE --spec S ... --checkpoint F ...``: the reference checkpoint
    unpatched and with each training-free spec, the fine-tuned checkpoints grouped by spec; the task's
    metric, MACs, throughput and latency in one interleaved run, on the checkpoint's data (read from
    ``data_dir`` when given) or a fixed random ``subset`` of its test items (``--subset``). Writes the
    command's files to ``out``; returns its results (data, speed settings, rows)."""
    import torch

    from ..bench import evaluation as ev
    from ..bench.accuracy import EvalCase, check_cases, evaluate_cases

    defaults = {k: ev.SPEED[k] for k in ("batch", "warmup", "repeats")}  # the eval command's
    settings = ev.speed_settings(threads=threads, eval_batch=eval_batch, **{**defaults, **speed})
    torch.set_num_threads(threads)
    ref = ev.load_reference(reference)
    cases = [EvalCase(s, s) for s in specs]
    check_cases(ref.model, cases)
    cases += ev.finetuned_cases(list(finetuned), ref)
    data = ev.load_data(ref, data_dir=data_dir, subset=subset)
    rows = evaluate_cases(ref.model, data.test, cases, task=ref.task, database=data.database, seeds=list(seeds),
                          eval_batch=eval_batch, speed=settings, progress=log)
    info = {"reference": {"checkpoint": reference, "task": ref.task.spec()}, "data": data.info, "speed": settings}
    ev.write_outputs(out, rows, info, f"{data.info['name']}, {data.info['n']} test images", task=ref.task)
    return {**info, "results": list(rows)}


def probe(spec: str, *, out: Path, threads: int, device: str, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the registered experiment ``spec`` as ``tokenreduce experiment SPEC`` does; returns its
    spec and results."""
    from .base import RunContext, build_experiment

    exp = build_experiment(spec)
    result = exp.run(RunContext(threads=threads, device=device, out_dir=out, log=log))
    return {"experiment": exp.spec(), "result": result}


def report_probe(spec: str, result: dict[str, Any]) -> str:
    """The experiment's own report of ``result``."""
    from .base import build_experiment

    return build_experiment(spec).report(result)
