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


def evaluate(reference: str, specs: Sequence[str], recorded: Sequence[dict[str, Any]], *, out: Path, threads: int,
             speed: dict[str, Any], seeds: Sequence[int] = (0, 1, 2), eval_batch: int = 250,
             data_dir: str | None = None, subset: int | None = None, device: str = "cpu", amp: str = "off",
             log: Callable[[str], None] = print) -> dict[str, Any]:
    """``tokenreduce eval --checkpoint REFERENCE --spec S ...`` with fine-tuned runs beside them: the
    reference checkpoint unpatched and with each training-free spec evaluated, and the ``recorded``
    training runs (each ``{"name", "model", "seed", "metrics"}``: a run id, its model config, its seed
    and the final metrics train() returned) grouped by model and spec, each with the evaluation it
    made of itself on the same items; the task's metric, MACs, throughput and latency in one
    interleaved run, on the checkpoint's data (read from ``data_dir`` when given) or a fixed random
    ``subset`` of its test items (``--subset``), on ``device`` with the forward autocast to ``amp``. Writes the
    command's files to ``out``; returns its results (data, speed settings, rows)."""
    import torch

    from ..bench import evaluation as ev
    from ..bench.accuracy import EvalCase, check_cases, evaluate_cases
    from ..models.precision import autocast
    from ..train import final_evaluation

    defaults = {k: ev.SPEED[k] for k in ("batch", "warmup", "repeats")}  # the eval command's
    settings = ev.speed_settings(threads=threads, eval_batch=eval_batch, **{**defaults, **speed})
    torch.set_num_threads(threads)
    ref = ev.load_reference(reference)
    ref.model.to(device)
    ref.task.to(device)
    cases = [EvalCase(s, s) for s in specs]
    check_cases(ref.model, cases)
    runs = [ev.Recorded(r["name"], r["model"], r["metrics"].get("spec"), r["metrics"]["task"], r["seed"],
                        final_evaluation(r["metrics"])) for r in recorded]
    cases += ev.finetuned_cases([], ref, runs)
    data = ev.load_data(ref, data_dir=data_dir, subset=subset)
    with autocast(device, amp):
        rows = evaluate_cases(ref.model, data.test, cases, task=ref.task, database=data.database, seeds=list(seeds),
                              eval_batch=eval_batch, speed=settings, progress=log)
    info = {"reference": {"checkpoint": reference, "task": ref.task.spec()}, "data": data.info, "speed": settings}
    ev.write_outputs(out, rows, info, f"{data.info['name']}, {data.info['n']} test images", task=ref.task)
    return {**info, "results": list(rows)}


def off_the_shelf(spec: str, *, checkpoint: str, data_dir: str | None, subset: int | None, fold: tuple[int, int],
                  threads: int, device: str = "cpu", amp: str = "off", eval_batch: int = 250) -> dict[str, Any]:
    """``tokenreduce eval --checkpoint CHECKPOINT --spec SPEC`` on one fold of the test items, per item: ``spec``
    applied to the reference off the shelf and scored on items i, i + k, i + 2k, ... of the ``subset`` (``fold``
    = (i, k)), with the per-item results the study's item-level tests read."""
    import torch
    from torch.utils.data import Subset

    from ..api import apply
    from ..bench import evaluation as ev
    from ..models.precision import autocast

    torch.set_num_threads(threads)
    ref = ev.load_reference(checkpoint)
    ref.model.to(device)
    ref.task.to(device)
    test = ev.load_data(ref, data_dir=data_dir, subset=subset)
    i, k = fold
    items = Subset(test.test, range(i, len(test.test), k))
    apply(ref.model, spec)
    with autocast(device, amp):
        metrics = ref.task.evaluate(ref.model, items, batch_size=eval_batch, device=device, database=test.database,
                                    items=True)
    return {"spec": spec, "checkpoint": checkpoint, "data": test.info, "fold": [i, k],
            "items": len(items), "metrics": metrics}


def probe(spec: str, *, out: Path, threads: int, device: str, amp: str | None = None,
          log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the registered experiment ``spec`` as ``tokenreduce experiment SPEC`` does; returns its
    spec and results."""
    from ..probes.base import RunContext, build_experiment

    exp = build_experiment(spec)
    result = exp.run(RunContext(threads=threads, device=device, amp=amp, out_dir=out, log=log))
    return {"experiment": exp.spec(), "result": result}


def report_probe(spec: str, result: dict[str, Any]) -> str:
    """The experiment's own report of ``result``."""
    from ..probes.base import build_experiment

    return build_experiment(spec).report(result)


def bench(model: dict[str, Any], specs: Sequence[str], *, checkpoint: str | None = None, control: str,
          match_random: bool, speed: dict[str, Any], threads: int, device: str, argv: Sequence[str],
          stem: str | None = None, amp: str = "off", log: Callable[[str], None] = print) -> dict[str, Any]:
    """``tokenreduce bench --model NAME --spec S ...``: ``specs`` against the unpatched model and the
    ``control`` in one interleaved run, on the timm model ``model`` (``{"name", "kwargs"}``, random weights
    from ``speed['seed']``) or, with ``checkpoint`` (a trained recipe's name), on its trained weights;
    ``speed``: the command's timing flags (batch, warmup, repeats, min_run_s; the rest as the command's
    defaults, which are eval's ``SPEED``), backend, compile_mode, dtype, seed. Returns the command's results document
    (bench/compare.py)."""
    import torch

    from ..bench.compare import bench_document, with_stem
    from ..bench.evaluation import SPEED
    from ..models import ModelSource, make_model

    speed = {"backend": "eager", "compile_mode": "default", "dtype": "float32", "seed": 0, **SPEED, **speed}
    backend, compile_mode = speed.pop("backend"), speed.pop("compile_mode")
    dtype, seed = speed.pop("dtype"), speed.pop("seed")
    torch.manual_seed(seed)
    if checkpoint:
        from ..train.recipes import reference_checkpoint

        source = ModelSource(checkpoint=str(reference_checkpoint(checkpoint)), spec=None)
    else:
        source = ModelSource(config={"name": model["name"], "kwargs": dict(model.get("kwargs", {})),
                                     "pretrained": False})
    built = make_model(source)
    built.model.to(device, getattr(torch, dtype))
    info = {"name": built.config["name"], "kwargs": built.config.get("kwargs", {}), "pretrained": False,
            "reference": checkpoint}
    return bench_document(built.model, specs, model_info=info, settings=speed, control=control,
                          match_random=match_random, threads=threads, backend=backend, device=device, dtype=dtype,
                          seed=seed, argv=argv, stem=with_stem(built.model, stem) if stem else None, amp=amp,
                          compile_mode=compile_mode, progress=log)
