"""``tokenreduce inspect``: what a spec does to a model - schedule, tokens, MACs, parameters - and,
with ``--checkpoint``, what a tokenreduce checkpoint holds (model, spec, task, classes, training
metrics), its own spec's schedule included."""

from __future__ import annotations

import argparse
from typing import Any

from ..core.errors import TokenReduceError
from . import vocab
from .bench import build_model, refuse_model_flags


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "inspect", help="show a spec's schedule, tokens per block, MACs and parameters on a model, or a checkpoint's",
        description="Compile --spec for the model (--model / --hf-config, or the model of --checkpoint) and print "
        "the schedule, the tokens leaving each block, MACs per image (unpatched vs patched, per block) and parameter "
        "counts. With --checkpoint, first what it holds: model, spec, task, classes and training metrics; its own "
        "spec is inspected unless --spec replaces it. No forward is run.",
        epilog="Examples: tokenreduce inspect --model deit_small_patch16_224 --spec 'tome(r=13)'; "
        "tokenreduce inspect --checkpoint cache/fmnist-vit",
    )
    vocab.add_model_source(p)
    vocab.add_checkpoint(p, note="print what it holds and inspect its model; not with --model/--hf-config/--weights/"
                         "--pretrained/--img-size")
    vocab.add_spec(p, note="needed without --checkpoint; with one, replaces its own spec")
    vocab.renamed(p, "--method", "--spec")
    p.set_defaults(func=run)


def _prefix(model: Any) -> str:
    from ..adapters.hosts import parts

    kinds = parts(model).prefix
    named = ", ".join(f"{n} {name}" if name == "registers" else name for name, n in kinds)
    n = sum(n for _, n in kinds)
    return f"{n} token{'' if n == 1 else 's'} ({named or 'none'})"


def _macs(n: int) -> str:
    return f"{n / 1e9:.3f} G" if n >= 1e8 else f"{n / 1e6:.3f} M"


def _scalars(d: dict[str, Any]) -> str:
    return "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                     for k, v in d.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)) or "none"


def _checkpoint(args: argparse.Namespace) -> tuple[Any, Any, str]:
    """(unpatched model of ``--checkpoint``, the spec to inspect: --spec or its own reducer (None for
    none), its model's name), after printing what the checkpoint holds."""
    from ..api import reducer_of, remove
    from ..models import classes_of, load_model, read_checkpoint, resolve

    refuse_model_flags(args, "--checkpoint")
    path = resolve(args.checkpoint)
    ckpt = read_checkpoint(path)
    model, meta = load_model(ckpt)
    own = reducer_of(model) if meta.get("spec") else None
    if own is not None:
        remove(model)
    built = meta.get("model") or {}
    classes = classes_of(meta)
    print(f"checkpoint {path}")
    print(f"metadata   {ckpt.verified}")
    print(f"trained    {built.get('name')} {_scalars(built.get('kwargs') or {})}"
          + "".join(f"; {k} {built[k]}" for k in ("stem", "transforms") if built.get(k)))
    print(f"spec       {meta.get('spec') or 'none (unpatched)'}")
    print(f"task       {meta.get('task') or 'classify (written before tasks)'}")
    print(f"classes    {f'{len(classes)}: ' + ', '.join(classes) if classes else 'not recorded'}")
    print(f"metrics    {_scalars(meta.get('metrics') or {})}"
          + (f"  (epoch {meta['epoch']}, step {meta.get('step')})" if meta.get("epoch") is not None else ""))
    return model, args.spec or own, built.get("name")


def run(args: argparse.Namespace) -> int:
    from ..adapters.hosts import check_host
    from ..api import apply, get_info, reducer_of
    from ..bench.macs import count_macs
    from ..bench.report import format_table
    from ..core.method import build_reducer

    if args.spec:
        build_reducer(args.spec)  # a malformed spec fails before the model is built
    if args.checkpoint:
        model, spec, args.model = _checkpoint(args)
    elif not args.spec:
        raise TokenReduceError("give --spec SPEC (with --model or --hf-config) or --checkpoint PATH")
    else:
        (model, args.model), spec = build_model(args), args.spec
    params = sum(p.numel() for p in model.parameters())
    base = count_macs(model, args.img_size)
    host = check_host(model)
    print(f"model      {args.model}: {host.depth} blocks, dim {host.dim}, {host.num_heads} heads, "
          f"{host.num_patches} patches ({host.grid[0]}x{host.grid[1]})")
    print(f"prefix     {_prefix(model)}, never reduced")
    if spec is None:
        print(f"params     {params / 1e6:.2f} M")
        print(f"MACs/image {_macs(base.total)} unpatched (give --spec SPEC for a method's schedule)")
        return 0
    apply(model, spec)
    info = get_info(model)
    reducer_params = sum(p.numel() for p in reducer_of(model).parameters())
    patched = count_macs(model, args.img_size)

    print(f"params     {params / 1e6:.2f} M; reducer's own {reducer_params}")
    print(f"method     {info.spec}")
    print(f"schedule   {info.schedule.describe()}")
    print(f"tokens     {' '.join(map(str, info.tokens_per_block))}  (prefix included, leaving each block)")
    rows = [
        {"block": b.block, "tokens_in": b.tokens_in, "tokens_mlp": b.tokens_mlp, "tokens_out": b.tokens_out,
         "unpatched": u.total / 1e6, "patched": b.total / 1e6, "scoring": b.scoring / 1e6}
        for b, u in zip(patched.blocks, base.blocks, strict=True)
    ]
    print()
    print(format_table(rows, [("block", "block"), ("tokens_in", "tokens in"), ("tokens_mlp", "MLP tokens"),
                              ("tokens_out", "tokens out"), ("unpatched", "MMACs unpatched"),
                              ("patched", "MMACs patched"), ("scoring", "of which scoring")]))
    print()
    print(f"MACs/image unpatched {_macs(base.total)}, patched {_macs(patched.total)}, "
          f"ratio {patched.total / base.total:.3f} (stem {_macs(base.stem)}, head {_macs(base.head)}, "
          f"scoring {_macs(patched.scoring)})")
    return 0
