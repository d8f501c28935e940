"""``tokenreduce bench``: MACs, throughput and latency of methods against the unpatched model.

Every spec is timed in the same interleaved run as the unpatched model and a control (a patched
model that reduces nothing, ``tome(r=0)`` by default, whose speed-up is the patch overhead);
``--match-random`` adds, per spec, a random pruner with identical per-block token counts.
``--backend`` runs every case, the unpatched model included, eagerly, torch.compile'd, or exported to
ONNX and run by onnxruntime (bench/backends.py), so the ratios compare models run the same way.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..bench.settings import COMPILE_MODES, QUICK, SPEED
from ..core.errors import TokenReduceError
from . import checks, vocab

if TYPE_CHECKING:  # imported late at run time: the CLI starts without torch
    from ..models import Checkpoint, ModelSource


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench", help="MACs, throughput and latency of methods vs the unpatched model, in one run",
        description="Time each spec in one interleaved run with the unpatched model and a zero-reduction "
        "control; print MACs, tokens per block, img/s at --batch-size, latency at batch 1 and the speed-ups.",
    )
    vocab.add_model_source(p)
    vocab.add_checkpoint(p, note="its model is timed instead, unpatched; a trained recipe's name such as fmnist-vit "
                         "names its checkpoint; not with --model/--hf-config/--weights/--pretrained/--img-size")
    vocab.renamed(p, "--reference", "--checkpoint")
    vocab.add_spec(p, repeat=True)
    p.add_argument("--match-random", action="store_true",
                   help="per spec, also time a random pruner with the same per-block token counts")
    p.add_argument("--control", default="tome(r=0)", metavar="SPEC",
                   help="zero-reduction spec timed as the patch-overhead control (default: %(default)s)")
    p.add_argument("--stem", metavar="SPEC",
                   help="also time the model with this stem in place of its patch embedding (e.g. 'conv', "
                   "ImagePiece's; fresh weights), unreduced and with every spec, against the plain unpatched "
                   "model: the figures of a method that needs the stem")
    vocab.add_batch_size(p, default=None, note=f"timed throughput (default {SPEED['batch']})")
    vocab.renamed(p, "--batch", "--batch-size")
    vocab.add_threads(p)
    vocab.add_timing(p, SPEED)
    vocab.add_backend(p)
    p.add_argument("--compile-mode", default="default", choices=COMPILE_MODES,
                   help="with --backend compile: torch.compile's mode; reduce-overhead adds CUDA graphs (batch-1 "
                   "latency on a GPU, where launches dominate), max-autotune searches kernels (default: %(default)s)")
    vocab.add_device(p)
    vocab.add_amp(p)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="the weights' own precision (pure low precision, no autocast; default: %(default)s)")
    vocab.add_seed(p, of=" of the random weights and inputs")
    vocab.add_out_dir(p, default=None, note="writes DIR/results.json (settings, provenance with the machine's load, "
                      "every row); held alone while timing: a study run working there is refused meanwhile")
    vocab.add_quick(p, f"batch {QUICK['batch']}, {QUICK['warmup']} warm-up round, {QUICK['repeats']} timed rounds")
    p.set_defaults(func=run)


def model_source(args: argparse.Namespace) -> ModelSource:
    """The ``models.ModelSource`` of the model arguments: ``--hf-config`` or the timm ``--model``."""
    from ..models import ModelSource

    if getattr(args, "hf_config", None) and vocab.given(args, "model"):
        raise TokenReduceError("give a timm --model or a transformers --hf-config, not both")
    if getattr(args, "hf_config", None):
        return ModelSource(hf_config=args.hf_config, img_size=args.img_size, pretrained=args.pretrained,
                           weights=args.weights)
    kwargs = {} if args.img_size is None else {"img_size": args.img_size}
    return ModelSource(config={"name": args.model, "kwargs": kwargs, "pretrained": args.pretrained},
                       weights=args.weights)


def build_model(args: argparse.Namespace) -> tuple[Any, str]:
    """(model, its name) of the model arguments (:func:`model_source`, ``models.make_model``)."""
    from ..models import make_model

    return make_model(model_source(args)).model, getattr(args, "hf_config", None) or args.model


def refuse_model_flags(args: argparse.Namespace, flag: str) -> None:
    """A TokenReduceError if a flag of :func:`vocab.add_model_source` is given next to ``flag``, which brings
    its own model."""
    if args.weights or args.pretrained or args.img_size or vocab.given(args, "model") or args.hf_config:
        raise TokenReduceError(f"{flag} brings its own model; leave out --model, --hf-config, --weights, "
                               "--pretrained and --img-size")


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    base = QUICK if args.quick else SPEED
    given = {"batch": args.batch_size, "warmup": args.warmup, "repeats": args.repeats}
    out = {k: given.get(k) if given.get(k) is not None else v for k, v in base.items()}
    if out["batch"] < 1 or out["repeats"] < 1 or out["warmup"] < 0:
        raise TokenReduceError("--batch-size and --repeats must be >= 1, --warmup >= 0")
    return out


def _checkpoint(args: argparse.Namespace) -> Checkpoint:
    """The checkpoint ``--checkpoint`` names (a file or folder, or a trained recipe's name), read once."""
    from ..bench.evaluation import log
    from ..models import CheckpointError, read_checkpoint
    from ..train.recipes import RECIPES, reference_checkpoint

    refuse_model_flags(args, "--checkpoint")
    if Path(args.checkpoint).exists():
        path = args.checkpoint
    elif args.checkpoint in RECIPES:
        path = reference_checkpoint(args.checkpoint)
    else:
        raise TokenReduceError(f"--checkpoint {args.checkpoint}: no such file or directory, and not a recipe name "
                               f"(recipes: {', '.join(sorted(RECIPES))})")
    try:
        ckpt = read_checkpoint(path)
    except CheckpointError as e:
        if not Path(path).is_file():
            raise
        raise CheckpointError(f"{e} (a timm state_dict is given as --weights PATH)") from e
    if ckpt.meta.get("spec"):
        log(f"note: {path} carries the reducer {ckpt.meta['spec']}; its unpatched model is timed")
    return ckpt


def run(args: argparse.Namespace) -> int:
    from ..bench.backends import get_backend
    from ..core.method import build_reducer

    settings = _settings(args)
    for spec in [args.control, *args.spec]:  # a malformed spec fails before the model is built
        build_reducer(spec)
    checks.threads(args.threads)
    args.device = checks.device(args.device)
    get_backend(args.backend, compile_mode=args.compile_mode)  # a mode without --backend compile fails here
    if args.amp != "off" and args.backend == "onnxruntime":
        raise TokenReduceError("--amp autocasts torch's forward; the onnxruntime backend runs in float32: "
                               "give --amp off")
    if args.out:
        checks.writable_dir(args.out)
        from ..train import lock

        with lock.hold(args.out, what="bench"):  # one writer per --out, and timings that share no cores with it
            return _run(args, settings)
    return _run(args, settings)


def _run(args: argparse.Namespace, settings: dict) -> int:
    from ..bench import load
    from ..bench.compare import BenchRequest, columns_for, run_bench
    from ..bench.evaluation import log
    from ..bench.report import format_table, write_json
    from ..models import ModelSource

    if args.stem and args.hf_config:
        raise TokenReduceError("--stem replaces a timm model's patch embedding; a transformers model (--hf-config) "
                               "keeps its own")
    if args.checkpoint:
        source = ModelSource(checkpoint=_checkpoint(args), spec=None)
    else:
        log(f"creating {args.hf_config or args.model} "
            f"({'pretrained' if args.pretrained else 'randomly initialised'} weights)")
        source = model_source(args)
    request = BenchRequest(source, tuple(args.spec), args.control, args.match_random, argv=tuple(args.argv),
                           speed={**settings, "backend": args.backend, "compile_mode": args.compile_mode,
                                  "dtype": args.dtype, "seed": args.seed}, reference=args.checkpoint, stem=args.stem)
    threads = checks.resolve_threads(args.threads)
    n_cases = len(args.spec) * (2 if args.match_random else 1) + 2 + (len(args.spec) + 1 if args.stem else 0)
    log(f"timing {n_cases} cases, batch {settings['batch']} and 1, "
        f"{settings['warmup']} warm-up + {settings['repeats']} timed rounds, {threads} threads, {args.device} "
        f"{args.dtype}, amp {args.amp}, backend {args.backend}")
    with load.watched(threads, log) as seen:
        doc = run_bench(request, threads=threads, device=args.device, amp=args.amp, progress=log)
    doc["provenance"][load.KEY] = seen
    rows, (h, w) = doc["results"], doc["model"]["img_size"]
    print(f"{doc['model']['name']}  {h}x{w}  batch {settings['batch']} (latency: batch 1)  "
          f"{threads} threads  {args.device} {args.dtype}  backend {args.backend}  "
          f"{'trained weights' if args.checkpoint else 'pretrained' if args.pretrained else 'random weights'}")
    print(format_table(rows, columns_for(rows)))
    print("\ntokens per block (prefix included, leaving each block):")
    for row in rows:
        print(f"  {row['label']}: {' '.join(map(str, row['tokens_per_block']))}")
    print("speedup = img/s / unpatched img/s at batch B; lat speedup = unpatched latency / latency at batch 1; "
          "vs random, lat vs random: the same against the random pruner with the spec's token counts (--match-random); "
          f"each the median of same-round ratios, every case run by the {args.backend} backend")

    if args.out:
        log(f"wrote {write_json(Path(args.out) / 'results.json', doc)}")
    return 0
