"""``tokenreduce inspect``: what a spec does to a model - schedule, tokens, MACs, parameters."""

from __future__ import annotations

import argparse

from torch import nn

from .bench import add_model_args, build_model


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "inspect", help="show a method's compiled schedule, tokens per block, MACs and parameters on a model",
        description="Compile SPEC for the model and print the schedule, the tokens leaving each block, "
        "MACs per image (unpatched vs patched, per block) and parameter counts. No forward is run.",
    )
    add_model_args(p)
    p.add_argument("--method", required=True, metavar="SPEC", help="method spec, e.g. 'evit(keep=0.7, locs=(3,6,9))'")
    p.set_defaults(func=run)


def _prefix(model: nn.Module) -> str:
    from ..adapters.hosts import parts

    kinds = parts(model).prefix
    named = ", ".join(f"{n} {name}" if name == "registers" else name for name, n in kinds)
    n = sum(n for _, n in kinds)
    return f"{n} token{'' if n == 1 else 's'} ({named or 'none'})"


def _macs(n: int) -> str:
    return f"{n / 1e9:.3f} G" if n >= 1e8 else f"{n / 1e6:.3f} M"


def run(args: argparse.Namespace) -> int:
    from .. import apply, build_reducer, get_info, reducer_of
    from ..bench.macs import count_macs
    from ..bench.report import format_table

    build_reducer(args.method)  # a malformed spec fails before the model is built
    model, args.model = build_model(args)
    params = sum(p.numel() for p in model.parameters())
    base = count_macs(model, args.img_size)
    apply(model, args.method)
    info = get_info(model)
    reducer_params = sum(p.numel() for p in reducer_of(model).parameters())
    patched = count_macs(model, args.img_size)
    host = info.host

    print(f"model      {args.model}: {host.depth} blocks, dim {host.dim}, {host.num_heads} heads, "
          f"{host.num_patches} patches ({host.grid[0]}x{host.grid[1]})")
    print(f"prefix     {_prefix(model)}, never reduced")
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
