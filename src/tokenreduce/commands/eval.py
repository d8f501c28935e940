"""``tokenreduce eval``: the task's metric, MACs, throughput and latency of several specs on a checkpoint.

``--checkpoint`` is the reference (evaluated unpatched; the first row) and names the task it was
trained for (classify: top1, hash: map, segment: miou); ``--spec`` adds training-free specs,
``--budgets`` adds, for every training-free method, the spec closest to each target speed-up
(bench/budgets.py), and ``--finetuned`` (repeatable) adds fine-tuned models (each carries its spec in
its metadata; checkpoints of one spec make one row, mean and std over them). Stochastic methods run
once per ``--seeds`` seed. Writes results.json (provenance + rows), results.csv, pareto.png and the
task's figures to ``--out``; the pipeline is bench/evaluation.py.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..bench.settings import SPEED
from ..core.errors import TokenReduceError
from . import checks, vocab


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval", help="the task's metric, MACs, throughput and latency of specs on a checkpoint; JSON, CSV, plot",
        description="Evaluate the reference checkpoint unpatched and with each spec (and fine-tuned checkpoints) "
        "on a test set: the metric of the checkpoint's task (top1, map, miou; mean and std over seeds for "
        "stochastic methods), drop vs unpatched, MACs, and "
        "img/s, latency and speed-up measured in one interleaved run (on --backend; the metric is always "
        "computed eagerly). Writes results.json, results.csv and "
        "pareto.png to --out.",
        epilog="Example: tokenreduce eval --checkpoint cache/fmnist-vit --spec 'tome(r=4)' --budgets 1.5,2",
    )
    vocab.add_checkpoint(p, required=True, note="the reference, evaluated unpatched (the first row)",
                         again="fine-tuned checkpoints go to --finetuned PATH (repeatable)")
    vocab.add_finetuned(p)
    vocab.add_spec(p, repeat=True, note="training-free specs to evaluate")
    vocab.add_budgets(p, "default when neither --spec nor --finetuned is given: 1.5,2")
    p.add_argument("--methods", metavar="A,B", help="methods for --budgets (default: every training-free one)")
    p.add_argument("--budget-rule", choices=("macs", "measured"), default="macs",
                   help="pick budget specs by analytic MACs (default) or by a speed model per method (speed-up = "
                   "MACs ratio ** b) calibrated by a short run of paired timing rounds")
    p.add_argument("--match-random", action="store_true",
                   help="per training-free spec (given or picked), also the random pruner with the same per-block "
                   "token counts, over --seeds")
    vocab.add_out_dir(p, default="runs/eval")
    vocab.add_data(p, note="default: the checkpoint's dataset")
    p.add_argument("--subset", type=int, metavar="N", help="a fixed random N of the test images (seed 0)")
    vocab.add_seeds(p, default="0,1,2")
    vocab.add_batch_size(p, default=SPEED["batch"], note="timed throughput")
    vocab.renamed(p, "--batch", "--batch-size")
    vocab.add_eval_batch_size(p, default=250)
    vocab.renamed(p, "--eval-batch", "--eval-batch-size")
    vocab.add_threads(p)
    vocab.add_device(p)
    vocab.add_amp(p)
    vocab.add_timing(p, SPEED)
    p.set_defaults(warmup=SPEED["warmup"], repeats=SPEED["repeats"])
    vocab.add_backend(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..bench import evaluation as ev
    from ..bench.budgets import check_targets
    from ..core.method import build_reducer

    t0 = time.perf_counter()
    seeds = ev.parse_list(args.seeds, "--seeds", int)
    # the default budgets only where nothing else was asked for: fine-tuned checkpoints are a question
    if args.budgets is not None:
        targets = check_targets(ev.parse_list(args.budgets, "--budgets"))
    else:
        targets = [] if args.spec or args.finetuned else [1.5, 2.0]
    methods = [m.strip() for m in args.methods.split(",") if m.strip()] if args.methods else None
    args.threads = checks.resolve_threads(args.threads)
    args.device = checks.device(args.device)
    _not_a_training_run(Path(args.out))
    checks.writable_dir(args.out)
    for spec in args.spec:  # a malformed spec fails before anything is loaded
        build_reducer(spec)
    for path in [args.checkpoint, *(args.finetuned or [])]:
        _finite_weights(path)
    from ..train import lock

    with lock.hold(args.out, what="eval"):  # one writer per --out: a second eval into it is refused
        return _run(args, seeds, targets, methods, t0)


def _not_a_training_run(out: Path) -> None:
    """An eval writes its figures and results beside nothing of a training run's (it would overwrite them)."""
    from ..train.loop import RUN_FILES

    found = [n for n in RUN_FILES[:4] if (out / n).is_file()]
    if found:
        raise TokenReduceError(f"--out {out} is a training run's folder (it holds {', '.join(found)}); an eval would "
                               "overwrite its files: give another --out")


def _finite_weights(path: str) -> None:
    """Refuse a checkpoint with a non-finite weight: its outputs are not numbers, and scoring them (argmax of NaN
    is class 0) would report a top-1 for a broken model."""
    import torch

    from ..models import read_checkpoint

    ckpt = read_checkpoint(path)
    bad = [k for k, v in ckpt.weights.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise TokenReduceError(f"{ckpt.path} holds non-finite weights ({len(bad)} tensors, e.g. {', '.join(bad[:3])}): "
                               "its outputs are not numbers; it is not evaluated (use another checkpoint)")


def _run(args: argparse.Namespace, seeds: list, targets: list, methods: list | None, t0: float) -> int:
    import torch

    from ..bench import evaluation as ev
    from ..bench.backends import get_backend
    from ..bench.report import provenance

    speed = ev.speed_settings(batch=args.batch_size, warmup=args.warmup, repeats=args.repeats, threads=args.threads,
                              eval_batch=args.eval_batch_size, backend=args.backend)
    torch.set_num_threads(args.threads)
    res = ev.evaluate(ev.EvalRequest(
        args.checkpoint, specs=args.spec, targets=targets, methods=methods, rule=args.budget_rule,
        match_random=args.match_random, finetuned=args.finetuned, seeds=seeds, eval_batch=args.eval_batch_size,
        speed=speed, data=args.data, data_dir=args.data_dir, download=args.download, subset=args.subset,
        device=args.device, amp=args.amp))
    _finite_outputs(res)
    data_info = res.data.info
    print(f"{args.checkpoint}  task {res.ref.task.spec()}  {data_info['name']} ({data_info['which']})  "
          f"batch {args.batch_size} (latency: batch 1)  {ev.threads_text(args.threads)}  {args.device} amp "
          f"{args.amp}  backend {args.backend}  "
          f"seeds {seeds}")
    print(ev.table(res.rows), flush=True)
    info = {
        "provenance": provenance(argv=args.argv, threads=args.threads, device=args.device, amp=args.amp,
                                 batch_sizes=[args.batch_size, 1],
                                 seed=seeds[0] if seeds else None, seeds=seeds, eval_batch=args.eval_batch_size,
                                 backend=args.backend, **get_backend(args.backend).versions(),
                                 wall_s=round(time.perf_counter() - t0, 1)),
        "reference": {"checkpoint": args.checkpoint, "model": res.ref.meta.get("model"),
                      "spec": res.ref.meta.get("spec"), "task": res.ref.task.spec()},
        "data": data_info, "speed": speed, "budgets": res.budgets,
        "match_random": args.match_random,
    }
    ev.write_outputs(Path(args.out), res.rows, info, f"{data_info['name']}, {data_info['n']} test images, "
                     f"{ev.threads_text(args.threads)}, batch {args.batch_size}, {args.backend}", task=res.ref.task)
    return 0


def _finite_outputs(res) -> None:
    """Refuse the evaluation of a reference whose outputs on the first test items are not finite numbers."""
    import torch

    x = res.data.test.tensors[0][:16]
    model = res.ref.model.eval()
    with torch.no_grad():
        out = model(x.to(next(model.parameters()).device)).float()
    if not torch.isfinite(out).all():
        raise TokenReduceError(f"{res.ref.path}: the model's outputs are not finite (NaN or infinite) on the test "
                               "items; its metrics would mean nothing, so it is not scored")
