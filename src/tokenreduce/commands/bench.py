"""``tokenreduce bench``: MACs, throughput and latency of methods against the unpatched model.

Every spec is timed in the same interleaved run as the unpatched model and a control (a patched
model that reduces nothing, ``tome(r=0)`` by default, whose speed-up is the patch overhead);
``--match-random`` adds, per spec, a random pruner with identical per-block token counts.
``--backend`` runs every case, the unpatched model included, eagerly, torch.compile'd, or exported to
ONNX and run by onnxruntime (bench/backends.py), so the ratios compare models run the same way.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..bench.backends import BACKENDS, get_backend
from ..core.errors import TokenReduceError

DEFAULT_MODEL = "deit_small_patch16_224"
DEFAULTS = {"batch": 32, "warmup": 2, "repeats": 10, "min_run_s": 0.05}
QUICK = {"batch": 4, "warmup": 1, "repeats": 3, "min_run_s": 0.0}

COLUMNS = [
    ("label", "case"), ("gmacs", "GMACs"), ("img_per_s", "img/s"), ("img_per_s_iqr", "iqr"),
    ("latency_ms", "lat ms"), ("latency_ms_iqr", "iqr"), ("speedup", "speedup"),
    ("latency_speedup", "lat speedup"), ("ratio_vs_random", "vs random"), ("latency_vs_random", "lat vs random"),
]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench", help="MACs, throughput and latency of methods vs the unpatched model, in one run",
        description="Time each spec in one interleaved run with the unpatched model and a zero-reduction "
        "control; print MACs, tokens per block, img/s at --batch, latency at batch 1 and the speed-ups.",
    )
    add_model_args(p)
    p.add_argument("--reference", metavar="PATH",
                   help="time the model of a tokenreduce checkpoint instead (a file, a training output directory, "
                   "or a trained recipe's name such as fmnist-vit), unpatched; not with --model/--checkpoint")
    p.add_argument("--spec", action="append", default=[], metavar="SPEC",
                   help="method spec, e.g. 'tome(r=13)'; repeat for several")
    p.add_argument("--match-random", action="store_true",
                   help="per spec, also time a random pruner with the same per-block token counts")
    p.add_argument("--control", default="tome(r=0)", metavar="SPEC",
                   help="zero-reduction spec timed as the patch-overhead control (default: %(default)s)")
    p.add_argument("--batch", type=int, help=f"throughput batch size (default {DEFAULTS['batch']})")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's own)")
    p.add_argument("--warmup", type=int, help=f"untimed rounds (default {DEFAULTS['warmup']})")
    p.add_argument("--repeats", type=int, help=f"timed rounds (default {DEFAULTS['repeats']})")
    add_backend_arg(p)
    p.add_argument("--device", default="cpu", help="cpu, cuda[:i] or mps (default: %(default)s)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and inputs")
    p.add_argument("--out", metavar="PATH", help="write the results as JSON")
    p.add_argument("--quick", action="store_true",
                   help="smoke settings: batch 4, 1 warm-up round, 3 timed rounds (numbers are rough)")
    p.set_defaults(func=run)


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL, help="timm model name (default: %(default)s)")
    p.add_argument("--hf-config", metavar="PATH|NAME",
                   help="a transformers model instead of --model: a folder holding config.json (as save_pretrained "
                   "writes it; --pretrained loads its weights) or a built-in config (vit-tiny, deit-tiny, dinov2-tiny, "
                   "clip-tiny, vit-small); needs the hf extra")
    p.add_argument("--img-size", type=int, metavar="N", help="input resolution (default: the model's)")
    p.add_argument("--pretrained", action="store_true",
                   help="timm's pretrained weights (needs the Hugging Face hub; HF_HUB_OFFLINE=1 fails fast offline)")
    p.add_argument("--checkpoint", metavar="PATH", help="local state_dict (.safetensors, .pth, .pt) to load")


def model_source(args: argparse.Namespace):
    """The ``models.ModelSource`` of the model arguments: ``--hf-config`` or the timm ``--model``."""
    from ..models import ModelSource

    if getattr(args, "hf_config", None) and args.model != DEFAULT_MODEL:
        raise TokenReduceError("give a timm --model or a transformers --hf-config, not both")
    if getattr(args, "hf_config", None):
        return ModelSource(hf_config=args.hf_config, img_size=args.img_size, pretrained=args.pretrained,
                           weights=args.checkpoint)
    kwargs = {} if args.img_size is None else {"img_size": args.img_size}
    return ModelSource(config={"name": args.model, "kwargs": kwargs, "pretrained": args.pretrained},
                       weights=args.checkpoint)


def build_model(args: argparse.Namespace) -> tuple[Any, str]:
    """(model, its name) of the model arguments (:func:`model_source`, ``models.make_model``)."""
    from ..models import make_model

    return make_model(model_source(args)).model, getattr(args, "hf_config", None) or args.model


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    base = QUICK if args.quick else DEFAULTS
    out = {k: getattr(args, k, None) if getattr(args, k, None) is not None else v for k, v in base.items()}
    if out["batch"] < 1 or out["repeats"] < 1 or out["warmup"] < 0:
        raise TokenReduceError("--batch and --repeats must be >= 1, --warmup >= 0")
    return out


def _reference(args: argparse.Namespace) -> tuple[Any, str]:
    """(unpatched model, its timm name) of ``--reference``: a checkpoint path or a trained recipe's name."""
    from pathlib import Path

    from ..bench.evaluation import log
    from ..models import ModelSource, make_model
    from ..train.recipes import RECIPES, reference_checkpoint

    if args.checkpoint or args.pretrained or args.img_size or args.model != DEFAULT_MODEL or args.hf_config:
        raise TokenReduceError("--reference brings its own model; leave out --model, --hf-config, --checkpoint, "
                               "--pretrained and --img-size")
    if Path(args.reference).exists():
        path = args.reference
    elif args.reference in RECIPES:
        path = reference_checkpoint(args.reference)
    else:
        raise TokenReduceError(f"--reference {args.reference}: no such file or directory, and not a recipe name "
                               f"(recipes: {', '.join(sorted(RECIPES))})")
    built = make_model(ModelSource(checkpoint=path, spec=None))
    if built.meta.get("spec"):
        log(f"note: {path} carries the reducer {built.meta['spec']}; its unpatched model is timed")
    log(f"reference {path}: {built.config['name']}")
    return built.model, built.config["name"]


def add_backend_arg(p: argparse.ArgumentParser) -> None:
    """``--backend``: how every timed case runs (bench/backends.py); shared by bench and eval."""
    p.add_argument("--backend", default="eager", choices=list(BACKENDS),
                   help="how every timed case runs: eagerly, torch.compile'd (compiled before timing), or exported "
                   "to ONNX and run by onnxruntime on the CPU in float32 (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    import torch

    from ..bench.compare import bench_specs
    from ..bench.evaluation import log
    from ..bench.macs import input_shape
    from ..bench.report import format_table, provenance, write_json
    from ..core.method import build_reducer
    from . import checks

    settings = _settings(args)
    for spec in [args.control, *args.spec]:  # a malformed spec fails before the model is built
        build_reducer(spec)
    checks.threads(args.threads)
    checks.device(args.device)
    if args.out:
        checks.writable_file(args.out)
    torch.manual_seed(args.seed)
    if args.reference:
        model, args.model = _reference(args)
    else:
        log(f"creating {args.hf_config or args.model} "
            f"({'pretrained' if args.pretrained else 'randomly initialised'} weights)")
        model, args.model = build_model(args)
    model.to(args.device, getattr(torch, args.dtype))
    threads = args.threads if args.threads is not None else torch.get_num_threads()
    log(f"timing {len(args.spec) * (2 if args.match_random else 1) + 2} cases, batch {settings['batch']} and 1, "
        f"{settings['warmup']} warm-up + {settings['repeats']} timed rounds, {threads} threads, {args.device} "
        f"{args.dtype}, backend {args.backend}")
    rows = bench_specs(model, args.spec, control=args.control, match_random=args.match_random, img_size=args.img_size,
                       speed={**settings, "threads": threads, "backend": args.backend}, seed=args.seed, progress=log)

    h, w = input_shape(model)[1:]
    print(f"{args.model}  {h}x{w}  batch {settings['batch']} (latency: batch 1)  "
          f"{threads} threads  {args.device} {args.dtype}  backend {args.backend}  "
          f"{'trained weights' if args.reference else 'pretrained' if args.pretrained else 'random weights'}")
    print(format_table(rows, COLUMNS))
    print("\ntokens per block (prefix included, leaving each block):")
    for row in rows:
        print(f"  {row['label']}: {' '.join(map(str, row['tokens_per_block']))}")
    print("speedup = img/s / unpatched img/s at batch B; lat speedup = unpatched latency / latency at batch 1; "
          "vs random, lat vs random: the same against the random pruner with the spec's token counts (--match-random); "
          f"each the median of same-round ratios, every case run by the {args.backend} backend")

    if args.out:
        result = {
            "provenance": provenance(argv=args.argv, threads=threads, dtype=args.dtype, device=args.device,
                                     batch_sizes=[settings["batch"], 1], seed=args.seed, backend=args.backend,
                                     **get_backend(args.backend).versions()),
            "model": {"name": args.model, "img_size": [h, w], "hf_config": args.hf_config,
                      "pretrained": args.pretrained, "checkpoint": args.checkpoint, "reference": args.reference,
                      "params": sum(p.numel() for p in model.parameters())},
            "settings": {**settings, "control": args.control, "match_random": args.match_random,
                         "backend": args.backend},
            "results": rows,
        }
        log(f"wrote {write_json(args.out, result)}")
    return 0
