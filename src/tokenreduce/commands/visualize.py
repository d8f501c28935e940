"""``tokenreduce visualize``: which patches a spec keeps, merges or prunes, on test images.

One PNG per image and spec in ``--out/<spec>/``: the input, then the patch grid after every
reduction block (kept patches as they are, merged ones tinted by group, pruned ones dark).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..core.errors import TokenReduceError
from . import checks, vocab


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "visualize", help="PNG per image: kept, merged (coloured by group) and pruned patches at each reduction",
        description="Run the checkpoint's model with each --spec on a few test images and draw, per image, which "
        "patches are kept, merged (coloured by group) or pruned after every reduction block.",
        epilog="Example: tokenreduce visualize --checkpoint cache/fmnist-vit --spec 'tome(r=4)' --images 3",
    )
    vocab.add_checkpoint(p, required=True)
    vocab.add_spec(p, repeat=True, note="default: the checkpoint's own, trained reducer")
    vocab.add_data(p, note="default: the checkpoint's", download=False)
    p.add_argument("--images", type=int, default=3, help="the first N test images (default: %(default)s)")
    p.add_argument("--index", metavar="I,J", help="test image indices to draw instead, e.g. 0,17,42")
    vocab.add_out_dir(p, default="runs/visualize")
    vocab.add_device(p)
    vocab.add_amp(p, note="the decisions drawn are the model's at that precision")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..api import reducer_of
    from ..bench.evaluation import log, parse_list
    from ..core.method import build_reducer
    from ..models import classes_of, load_model
    from ..visualize import dataset_images, draw

    for spec in args.spec:
        build_reducer(spec)
    indices = parse_list(args.index, "--index", int) if args.index else list(range(args.images))
    if not indices:
        raise TokenReduceError("give --images N >= 1 or --index I,J")
    checks.writable_dir(args.out)
    device = checks.device(args.device)
    model, meta = load_model(args.checkpoint)
    model.to(device)
    specs: list = list(args.spec)
    if meta.get("spec"):
        trained = reducer_of(model)
        if not specs:
            specs = [trained]  # keeps its learned weights
        elif any(True for _ in trained.parameters()):
            log(f"note: the checkpoint's trained {meta['spec']} is replaced by the specs given")
    if not specs:
        raise TokenReduceError(f"{args.checkpoint} carries no reducer; give --spec, e.g. --spec 'tome(r=4)'")
    data = args.data or (meta.get("data") or {}).get("name") or "fashion_mnist"
    images, titles = dataset_images(model, data, args.data_dir, indices, classes_of(meta))
    for path in draw(model, specs, images, titles, Path(args.out), amp=args.amp):
        print(path)
    return 0
