"""``tokenreduce visualize``: which patches a spec keeps, merges or prunes, on test images.

One PNG per image and spec in ``--out/<spec>/``: the input, then the patch grid after every
reduction block (kept patches as they are, merged ones tinted by group, pruned ones dark).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from torch import nn

from ..core.errors import TokenReduceError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "visualize", help="PNG per image: kept, merged (coloured by group) and pruned patches at each reduction",
        description="Run the checkpoint's model with each --spec on a few test images and draw, per image, which "
        "patches are kept, merged (coloured by group) or pruned after every reduction block.",
        epilog="Example: tokenreduce visualize --checkpoint cache/fmnist-vit --spec 'tome(r=4)' --images 3",
    )
    p.add_argument("--checkpoint", required=True, metavar="PATH", help="checkpoint file or training directory")
    p.add_argument("--spec", action="append", default=[], metavar="SPEC",
                   help="spec to draw (repeatable; default: the checkpoint's own, trained reducer)")
    p.add_argument("--data", metavar="NAME_OR_DIR", help="dataset (default: the checkpoint's)")
    p.add_argument("--data-dir", metavar="DIR", help="where a named dataset's files are")
    p.add_argument("--images", type=int, default=3, help="the first N test images (default: %(default)s)")
    p.add_argument("--index", metavar="I,J", help="test image indices to draw instead, e.g. 0,17,42")
    p.add_argument("--out", default="runs/visualize", metavar="DIR", help="output directory (default: %(default)s)")
    p.set_defaults(func=run)


def slug(spec: str) -> str:
    """A file-system-safe name for ``spec``: 'tome(r=4)' -> 'tome_r_4'."""
    return re.sub(r"[^A-Za-z0-9.]+", "_", spec).strip("_")


def load_images(model: nn.Module, data: str, data_dir: str | None, indices: list[int]):
    """(images (n, C, H, W) as the model takes them, titles) of test images ``indices``."""
    import torch

    from ..data import build_dataset, data_config_from_model

    ds = build_dataset(data, "test", data_dir=data_dir, **data_config_from_model(model))
    bad = [i for i in indices if not 0 <= i < len(ds)]
    if bad:
        raise TokenReduceError(f"image index {bad[0]} is outside the test set (0..{len(ds) - 1})")
    items = [ds[i] for i in indices]
    classes = list(getattr(ds, "classes", []))
    titles = [f"#{i} {classes[int(y)] if int(y) < len(classes) else y}" for i, (_, y) in zip(indices, items,
                                                                                              strict=True)]
    return torch.stack([x for x, _ in items]), titles


def draw(model: nn.Module, specs: list, images, titles: list[str], out: Path) -> list[Path]:
    """visualize() each spec (string or trained Reducer) into ``out/<slug>/``; the model is left unpatched."""
    from .. import remove
    from ..adapters.timm_vit import _ATTR
    from ..visualize import visualize

    paths = []
    for spec in specs:
        name = spec if isinstance(spec, str) else spec.spec()
        try:
            paths += visualize(model, spec, images, out / slug(name), titles)
        finally:
            if hasattr(model, _ATTR):
                remove(model)
    return paths


def run(args: argparse.Namespace) -> int:
    from ..adapters.timm_vit import get_patch
    from ..core.method import build_reducer
    from ..train.checkpoint import load_model
    from .eval import log, parse_ints

    for spec in args.spec:
        build_reducer(spec)
    indices = parse_ints(args.index, "--index") if args.index else list(range(args.images))
    if not indices:
        raise TokenReduceError("give --images N >= 1 or --index I,J")
    model, meta = load_model(args.checkpoint)
    specs: list = list(args.spec)
    if meta.get("spec"):
        trained = get_patch(model).reducer
        if not specs:
            specs = [trained]  # keeps its learned weights
        elif any(True for _ in trained.parameters()):
            log(f"note: the checkpoint's trained {meta['spec']} is replaced by the specs given")
    if not specs:
        raise TokenReduceError(f"{args.checkpoint} carries no reducer; give --spec, e.g. --spec 'tome(r=4)'")
    data = args.data or (meta.get("data") or {}).get("name") or "fashion_mnist"
    images, titles = load_images(model, data, args.data_dir, indices)
    for path in draw(model, specs, images, titles, Path(args.out)):
        print(path)
    return 0
