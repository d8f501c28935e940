"""``tokenreduce eval``: top-1, MACs, throughput and latency of several specs on a checkpoint.

The first ``--checkpoint`` is the reference (evaluated unpatched; the first row); ``--spec`` adds
training-free specs, ``--budgets`` adds, for every training-free method, the spec closest to each
target speed-up (bench/budgets.py), and further ``--checkpoint`` s are fine-tuned models (each
carries its spec in its metadata; checkpoints of one spec make one row, mean and std over them).
Stochastic methods (``random``) run once per ``--seeds`` seed. Writes results.json (provenance +
rows), results.csv and pareto.png to ``--out``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from torch import nn

from ..core.errors import TokenReduceError

SPEED = {"batch": 32, "warmup": 2, "repeats": 10, "min_run_s": 0.05}
#: (key, header, format) of the printed table; a missing value prints as '-'.
COLUMNS = [
    ("label", "case", "{}"), ("budget", "target", "{:g}x"), ("top1", "top1 %", "{:.2f}"),
    ("top1_std", "± std", "{:.2f}"), ("top1_drop", "drop", "{:+.2f}"), ("macs", "MMACs", "{:.1f}"),
    ("macs_speedup", "MACs x", "{:.2f}"), ("img_per_s", "img/s", "{:.0f}"), ("latency_ms", "lat ms", "{:.2f}"),
    ("speedup", "speedup", "{:.2f}"), ("latency_speedup", "lat x", "{:.2f}"), ("tokens_per_block", "tokens", "{}"),
]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval", help="top-1, MACs, throughput and latency of specs on a checkpoint; JSON, CSV, Pareto plot",
        description="Evaluate the reference checkpoint unpatched and with each spec (and fine-tuned checkpoints) "
        "on a test set: top-1 (mean and std over seeds for stochastic methods), drop vs unpatched, MACs, and "
        "img/s, latency and speed-up measured in one interleaved run. Writes results.json, results.csv and "
        "pareto.png to --out.",
        epilog="Example: tokenreduce eval --checkpoint cache/fmnist-vit --spec 'tome(r=4)' --budgets 1.5,2",
    )
    p.add_argument("--checkpoint", action="append", required=True, metavar="PATH",
                   help="the reference checkpoint (file or training directory); repeat to add fine-tuned ones")
    add_eval_args(p)
    p.add_argument("--spec", action="append", default=[], metavar="SPEC",
                   help="training-free spec to evaluate, e.g. 'evit(keep=0.7, locs=(1, 3, 4))'; repeatable")
    p.add_argument("--budgets", metavar="X,Y", help="target speed-ups, e.g. 1.5,2: one spec per training-free method "
                   "and target (default when no --spec is given: 1.5,2)")
    p.add_argument("--methods", metavar="A,B", help="methods for --budgets (default: every training-free one)")
    p.add_argument("--budget-rule", choices=("macs", "measured"), default="macs",
                   help="pick budget specs by analytic MACs (default) or by a short timing run")
    p.add_argument("--out", default="runs/eval", metavar="DIR", help="output directory (default: %(default)s)")
    p.set_defaults(func=run)


def add_eval_args(p: argparse.ArgumentParser) -> None:
    """Data and measurement flags shared with ``demo``."""
    p.add_argument("--data", metavar="NAME_OR_DIR",
                   help="fashion_mnist, a directory of its idx files, or an image folder ROOT/{train,val}/<class>/ "
                   "(default: the checkpoint's dataset)")
    p.add_argument("--data-dir", metavar="DIR", help="where a named dataset's files are")
    p.add_argument("--download", action="store_true", help="fetch a missing named dataset (network)")
    p.add_argument("--subset", type=int, metavar="N", help="a fixed random N of the test images (seed 0)")
    p.add_argument("--seeds", default="0,1,2", help="seeds of stochastic methods (default: %(default)s)")
    p.add_argument("--batch", type=int, default=SPEED["batch"], help="throughput batch size (default: %(default)s)")
    p.add_argument("--eval-batch", type=int, default=250, help="batch size for accuracy (default: %(default)s)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=SPEED["repeats"], help="timed rounds (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=SPEED["warmup"], help="untimed rounds (default: %(default)s)")


def threads_text(n: int) -> str:
    return f"{n} thread{'' if n == 1 else 's'}"


def parse_floats(text: str | None, flag: str) -> list[float]:
    try:
        return [float(x) for x in (text or "").split(",") if x.strip()]
    except ValueError:
        raise TokenReduceError(f"{flag} takes comma-separated numbers like 1.5,2, got {text!r}") from None


def parse_ints(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise TokenReduceError(f"{flag} takes comma-separated integers like 0,1,2, got {text!r}") from None


def load_reference(path: str) -> tuple[nn.Module, dict[str, Any]]:
    """The reference model (unpatched, eval) and its checkpoint metadata."""
    from .. import remove
    from ..train.checkpoint import load_model

    model, meta = load_model(path)
    if meta.get("spec"):
        log(f"note: {path} carries the reducer {meta['spec']}; its unpatched model is the reference")
        remove(model)
    return model.eval(), meta


def load_data(model: nn.Module, meta: dict[str, Any], args: argparse.Namespace):
    """(TensorDataset of the test images, description for the results) for the model's input."""
    from ..bench.accuracy import materialize
    from ..data import build_dataset, data_config_from_model, subset

    name = args.data or (meta.get("data") or {}).get("name") or "fashion_mnist"
    full = build_dataset(name, "test", data_dir=args.data_dir, download=getattr(args, "download", False),
                         **data_config_from_model(model))
    ds = subset(full, args.subset, seed=0)
    if args.subset and args.subset < len(full):
        which = f"a fixed random {len(ds)} of the {len(full)} test images (torch.randperm, seed 0)"
    else:
        which = f"all {len(full)} test images"
    log(f"data: {name}, {which}")
    return materialize(ds), {"name": name, "split": "test", "n": len(ds), "of": len(full), "subset_seed": 0,
                             "which": which}


def budget_cases(model: nn.Module, targets: list[float], methods: list[str] | None, rule: str,
                 speed: dict[str, Any]) -> tuple[list, list[dict[str, Any]], dict[str, str]]:
    """(EvalCases, picks as dicts, skipped methods) for the budget targets."""
    from ..bench.accuracy import EvalCase
    from ..bench.budgets import find_budgets, training_free

    free, skipped = training_free(model, methods)
    for name, why in skipped.items():
        log(f"skipping {name}: {why}")
    # the budget run only ranks candidates: fewer rounds than the final measurement
    picks = find_budgets(model, free, targets, rule=rule, speed={**speed, "warmup": 1, "repeats": 3})
    for p in picks:
        flag = "" if p.reached else "  (not reached)"
        log(f"budget {p.target:g}x {p.method}: {p.spec}  (expected {p.expected_speedup:.2f}x, MACs "
            f"{p.macs_speedup:.2f}x){flag}")
    cases = [EvalCase(p.spec, p.spec, "training-free", budget=p.target) for p in picks]
    return cases, [p.as_dict() for p in picks], skipped


def finetuned_cases(paths: list[str], ref_meta: dict[str, Any]) -> list:
    """One EvalCase per spec among the fine-tuned checkpoints ``paths``."""
    from ..bench.accuracy import EvalCase
    from ..core.method import build_reducer
    from ..train.checkpoint import read_meta, resolve

    groups: dict[str | None, list[str]] = {}
    for path in paths:
        meta = read_meta(path)
        if meta.get("model") != ref_meta.get("model"):
            raise TokenReduceError(f"{path} holds model {meta.get('model')}, the reference holds "
                                   f"{ref_meta.get('model')}; fine-tuned checkpoints must share the reference's model")
        spec = build_reducer(meta["spec"]).spec() if meta.get("spec") else None
        groups.setdefault(spec, []).append(str(resolve(path)))
    return [EvalCase(f"{spec or 'no reducer'} [fine-tuned x{len(ps)}]", spec, "fine-tuned", checkpoints=tuple(ps))
            for spec, ps in groups.items()]


def speed_settings(args: argparse.Namespace) -> dict[str, Any]:
    if args.batch < 1 or args.repeats < 1 or args.warmup < 0 or args.eval_batch < 1:
        raise TokenReduceError("--batch, --eval-batch and --repeats must be >= 1, --warmup >= 0")
    return {"batch": args.batch, "warmup": args.warmup, "repeats": args.repeats,
            "min_run_s": SPEED["min_run_s"], "threads": args.threads}


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The results table: the case left-aligned, numbers right-aligned."""
    def cell(key: str, fmt: str, v: Any) -> str:
        if v is None or v == "":
            return "-" if key != "budget" else ""
        if key == "macs":
            v = v / 1e6
        if key == "tokens_per_block":
            return " ".join(map(str, v))
        return fmt.format(v)

    cells = [[cell(k, f, r.get(k)) for k, _, f in COLUMNS] for r in rows]
    heads = [h for _, h, _ in COLUMNS]
    widths = [max(len(heads[i]), *(len(c[i]) for c in cells)) for i in range(len(COLUMNS))]

    def line(values: list[str]) -> str:
        return "  ".join(v.ljust(w) if i in (0, len(values) - 1) else v.rjust(w)
                         for i, (v, w) in enumerate(zip(values, widths, strict=True))).rstrip()

    return "\n".join([line(heads), line(["-" * w for w in widths]), *(line(c) for c in cells)])


def print_table(rows: list[dict[str, Any]]) -> None:
    print(format_rows(rows))
    print("top1: mean over seeds (random) or checkpoints (fine-tuned), ± sample std; drop = unpatched top1 - top1 "
          "(points); MACs x = analytic MACs ratio; speedup = img/s ratio at the throughput batch, lat x = latency "
          "ratio at batch 1, both measured in one interleaved run; tokens leaving each block, class token included",
          flush=True)


def write_outputs(out: Path, rows: list[dict[str, Any]], info: dict[str, Any], title: str) -> list[Path]:
    """results.json (``info`` + rows), results.csv and pareto.png in ``out``."""
    from ..bench.pareto import plot_pareto, write_csv
    from ..bench.report import write_json

    paths = [write_json(out / "results.json", {**info, "results": rows}), write_csv(out / "results.csv", rows),
             plot_pareto(out / "pareto.png", rows, title)]
    for p in paths:
        log(f"wrote {p}")
    return paths


def run(args: argparse.Namespace) -> int:
    import torch

    from ..bench.accuracy import EvalCase, check_cases, evaluate_cases
    from ..bench.report import provenance
    from ..core.method import build_reducer

    t0 = time.perf_counter()
    seeds = parse_ints(args.seeds, "--seeds")
    targets = parse_floats(args.budgets, "--budgets") or ([] if args.spec else [1.5, 2.0])
    methods = [m.strip() for m in args.methods.split(",") if m.strip()] if args.methods else None
    for spec in args.spec:  # a malformed spec fails before anything is loaded
        build_reducer(spec)
    speed = speed_settings(args)
    torch.set_num_threads(args.threads)
    model, meta = load_reference(args.checkpoint[0])
    cases = [EvalCase(spec, spec) for spec in args.spec]
    check_cases(model, cases)
    picks, skipped = [], {}
    if targets:
        more, picks, skipped = budget_cases(model, targets, methods, args.budget_rule, speed)
        given = {build_reducer(c.spec).spec() for c in cases}
        cases += [c for c in more if build_reducer(c.spec).spec() not in given]
    cases += finetuned_cases(args.checkpoint[1:], meta)
    data, data_info = load_data(model, meta, args)
    rows = evaluate_cases(model, data, cases, seeds=seeds, eval_batch=args.eval_batch, speed=speed, progress=log)
    print(f"{args.checkpoint[0]}  {data_info['name']} ({data_info['which']})  batch {args.batch} "
          f"(latency: batch 1)  {threads_text(args.threads)}  seeds {seeds}")
    print_table(rows)
    info = {
        "provenance": provenance(argv=args.argv, threads=args.threads, batch_sizes=[args.batch, 1],
                                 seed=seeds[0] if seeds else None, seeds=seeds, eval_batch=args.eval_batch,
                                 wall_s=round(time.perf_counter() - t0, 1)),
        "reference": {"checkpoint": args.checkpoint[0], "model": meta.get("model"), "spec": meta.get("spec")},
        "data": data_info, "speed": speed, "budgets": {"targets": targets, "rule": args.budget_rule,
                                                       "picks": picks, "skipped": skipped},
    }
    write_outputs(Path(args.out), rows, info, f"{data_info['name']}, {data_info['n']} test images, "
                  f"{threads_text(args.threads)}, batch {args.batch}")
    return 0
