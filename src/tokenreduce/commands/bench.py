"""``tokenreduce bench``: MACs, throughput and latency of methods against the unpatched model.

Every spec is timed in the same interleaved run as the unpatched model and a control (a patched
model that reduces nothing, ``tome(r=0)`` by default, whose speed-up is the patch overhead);
``--match-random`` adds, per spec, a random pruner with identical per-block token counts.
"""

from __future__ import annotations

import argparse
import difflib
import math
import sys
from pathlib import Path
from typing import Any

from torch import nn

from ..core.errors import TokenReduceError

DEFAULTS = {"batch": 32, "warmup": 2, "repeats": 10, "min_run_s": 0.05}
QUICK = {"batch": 4, "warmup": 1, "repeats": 3, "min_run_s": 0.0}

COLUMNS = [
    ("label", "case"), ("gmacs", "GMACs"), ("img_per_s", "img/s"), ("img_per_s_iqr", "iqr"),
    ("latency_ms", "lat ms"), ("latency_ms_iqr", "iqr"), ("speedup", "speedup"),
    ("latency_speedup", "lat speedup"), ("ratio_vs_random", "vs random"),
]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench", help="MACs, throughput and latency of methods vs the unpatched model, in one run",
        description="Time each spec in one interleaved run with the unpatched model and a zero-reduction "
        "control; print MACs, tokens per block, img/s at --batch, latency at batch 1 and the speed-ups.",
    )
    add_model_args(p)
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
    p.add_argument("--device", default="cpu", help="cpu or cuda[:i] (default: %(default)s)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and inputs")
    p.add_argument("--out", metavar="PATH", help="write the results as JSON")
    p.add_argument("--quick", action="store_true",
                   help="smoke settings: batch 4, 1 warm-up round, 3 timed rounds (numbers are rough)")
    p.set_defaults(func=run)


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="deit_small_patch16_224", help="timm model name (default: %(default)s)")
    p.add_argument("--img-size", type=int, metavar="N", help="input resolution (default: the model's)")
    p.add_argument("--pretrained", action="store_true",
                   help="timm's pretrained weights (needs the Hugging Face hub; HF_HUB_OFFLINE=1 fails fast offline)")
    p.add_argument("--checkpoint", metavar="PATH", help="local state_dict (.safetensors, .pth, .pt) to load")


def create_model(name: str, *, img_size: int | None = None, pretrained: bool = False,
                 checkpoint: str | None = None) -> nn.Module:
    """A timm model by name, random weights unless ``pretrained`` or a ``checkpoint`` is given."""
    import timm

    if not timm.is_model(name):
        close = timm.list_models(f"*{name}*")[:5] or difflib.get_close_matches(name, timm.list_models(), n=5)
        hint = f"; close names: {', '.join(close)}" if close else "; see timm.list_models('*vit*')"
        raise TokenReduceError(f"unknown timm model {name!r}{hint}")
    kwargs: dict[str, Any] = {} if img_size is None else {"img_size": img_size}
    try:
        model = timm.create_model(name, pretrained=pretrained, **kwargs)
    except Exception as e:  # timm/hub raise many kinds; only the message matters to the user
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if pretrained:
            raise TokenReduceError(
                f"could not get pretrained weights for {name} ({type(e).__name__}: {first}); "
                "use --checkpoint PATH with a local file, or leave out --pretrained for random weights"
            ) from None
        raise TokenReduceError(f"could not create {name}: {type(e).__name__}: {first}") from None
    if checkpoint:
        load_checkpoint(model, checkpoint)
    return model.eval()


def load_checkpoint(model: nn.Module, path: str) -> None:
    """Load a local state_dict into ``model``; every key and shape must match.

    Accepts a bare state_dict or one under 'state_dict' / 'model', with or without a 'module.'
    (DDP) prefix. A learned reducer's own keys ('tokenreduce.*') are skipped: they change neither
    the token counts nor the speed.
    """
    import torch

    file = Path(path)
    if not file.is_file():
        raise TokenReduceError(f"checkpoint {path} does not exist")
    try:
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file

            sd = load_file(str(file))
        else:
            sd = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # corrupt file, pickled objects, wrong format
        raise TokenReduceError(f"could not read checkpoint {path}: {type(e).__name__}: {e}") from None
    for key in ("state_dict", "model"):
        if isinstance(sd, dict) and isinstance(sd.get(key), dict):
            sd = sd[key]
    if not isinstance(sd, dict):
        raise TokenReduceError(f"checkpoint {path} holds a {type(sd).__name__}, not a state_dict")
    sd = {k.removeprefix("module."): v for k, v in sd.items()}
    sd = {k: v for k, v in sd.items() if not k.startswith("tokenreduce.")}
    own = model.state_dict()
    missing = sorted(set(own) - set(sd))
    unexpected = sorted(set(sd) - set(own))
    shapes = [f"{k} {tuple(sd[k].shape)} vs {tuple(own[k].shape)}" for k in own
              if k in sd and tuple(sd[k].shape) != tuple(own[k].shape)]
    problems = [f"{what} ({len(v)}): {', '.join(v[:3])}{', ...' if len(v) > 3 else ''}" for what, v in
                (("missing keys", missing), ("unexpected keys", unexpected), ("shape mismatches", shapes)) if v]
    if problems:
        raise TokenReduceError(f"checkpoint {path} does not fit the model: {'; '.join(problems)}")
    model.load_state_dict(sd)


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    base = QUICK if args.quick else DEFAULTS
    out = {k: getattr(args, k, None) if getattr(args, k, None) is not None else v for k, v in base.items()}
    if out["batch"] < 1 or out["repeats"] < 1 or out["warmup"] < 0:
        raise TokenReduceError("--batch and --repeats must be >= 1, --warmup >= 0")
    return out


def _cases(model: nn.Module, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Rows to measure: unpatched, control, each spec and (optionally) its matched random."""
    from ..bench.speed import matched_random

    rows = [{"label": "unpatched", "kind": "unpatched", "spec": None},
            {"label": f"control {args.control}", "kind": "control", "spec": args.control}]
    for spec in args.spec:
        rows.append({"label": spec, "kind": "method", "spec": spec})
        if args.match_random:
            rows.append({"label": f"random~{spec}", "kind": "random", "spec": matched_random(model, spec),
                         "matched_to": spec})
    labels = [r["label"] for r in rows]
    if len(set(labels)) != len(labels):
        raise TokenReduceError("each --spec must be given once")
    return rows


def _clean(v: Any) -> Any:
    """JSON has no NaN: write null."""
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_clean(x) for x in v]
    return v


def run(args: argparse.Namespace) -> int:
    import torch

    from .. import apply, build_reducer, remove
    from ..bench.macs import count_macs
    from ..bench.report import format_table, provenance, write_json
    from ..bench.speed import Case, measure_speed, paired_ratio

    settings = _settings(args)
    for spec in [args.control, *args.spec]:  # a malformed spec fails before the model is built
        build_reducer(spec)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise TokenReduceError("--device cuda asked for, but torch sees no CUDA device")
    torch.manual_seed(args.seed)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    log(f"creating {args.model} ({'pretrained' if args.pretrained else 'random'} weights)")
    model = create_model(args.model, img_size=args.img_size, pretrained=args.pretrained, checkpoint=args.checkpoint)
    dtype = getattr(torch, args.dtype)
    model.to(args.device, dtype)
    rows = _cases(model, args)

    for row in rows:  # MACs from the compiled schedules; also rejects a bad spec before any timing
        if row["spec"] is not None:
            apply(model, row["spec"])
        try:
            macs = count_macs(model, args.img_size)
        finally:
            if row["spec"] is not None:
                remove(model)
        row.update(macs=macs.total, gmacs=macs.total / 1e9, tokens_per_block=macs.tokens_per_block)

    threads = args.threads if args.threads is not None else torch.get_num_threads()
    log(f"timing {len(rows)} cases, batch {settings['batch']} and 1, {settings['warmup']} warm-up + "
        f"{settings['repeats']} timed rounds, {threads} threads, {args.device} {args.dtype}")
    speed = measure_speed(
        model, [Case(r["label"], r["spec"]) for r in rows], batch=settings["batch"], img_size=args.img_size,
        warmup=settings["warmup"], repeats=settings["repeats"], min_run_s=settings["min_run_s"],
        threads=threads, seed=args.seed, progress=log,
    )
    by_label = {s.label: s for s in speed}
    for row in rows:
        row.update({k: v for k, v in by_label[row["label"]].as_dict().items() if k not in ("label", "spec")})
    for row in rows:
        row["ratio_vs_random"] = None
        if row["kind"] == "method" and args.match_random:
            rnd = next(r for r in rows if r.get("matched_to") == row["spec"])
            # method speed-up / random speed-up, paired per round like the speed-ups themselves
            row["ratio_vs_random"] = paired_ratio(row["img_per_s_runs"], rnd["img_per_s_runs"])

    h, w = model.patch_embed.img_size
    print(f"{args.model}  {h}x{w}  batch {settings['batch']} (latency: batch 1)  "
          f"{threads} threads  {args.device} {args.dtype}  {'pretrained' if args.pretrained else 'random weights'}")
    print(format_table(rows, COLUMNS))
    print("\ntokens per block (prefix included, leaving each block):")
    for row in rows:
        print(f"  {row['label']}: {' '.join(map(str, row['tokens_per_block']))}")
    print("speedup = img/s / unpatched img/s at batch B; lat speedup = unpatched latency / latency at batch 1; "
          "both the median of same-round ratios")

    if args.out:
        result = {
            "provenance": provenance(argv=args.argv, threads=threads, dtype=args.dtype, device=args.device,
                                     batch_sizes=[settings["batch"], 1], seed=args.seed),
            "model": {"name": args.model, "img_size": list(model.patch_embed.img_size), "pretrained": args.pretrained,
                      "checkpoint": args.checkpoint, "params": sum(p.numel() for p in model.parameters())},
            "settings": {**settings, "control": args.control, "match_random": args.match_random},
            "results": rows,
        }
        log(f"wrote {write_json(args.out, _clean(result))}")
    return 0
