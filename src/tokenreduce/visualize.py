"""Pictures of what a method did: which patches were kept, merged (coloured by group) or pruned
at every reduction block. Uses ``apply(..., trace=True)`` and ``get_info(model).snapshots``.
PNGs are written atomically (``bench.report.write_figure``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from .api import apply, get_info, is_patched, remove
from .bench.report import write_figure
from .core.errors import TokenReduceError
from .core.method import Reducer
from .data import build_dataset, data_config_from_model
from .models.precision import autocast


def patch_groups(source: Tensor, num_prefix: int) -> Tensor:
    """Token each original patch belongs to after a reduction, -1 where it was pruned.

    Args:
        source: (N, N0) 0/1 membership of the N0 original tokens in the N current tokens.
    Returns:
        (N0 - num_prefix,) long: current token index per original patch, or -1.
    """
    patches = source[:, num_prefix:]  # (N, P)
    group = patches.argmax(dim=0)
    return torch.where(patches.sum(dim=0) > 0, group, torch.full_like(group, -1))


def group_image(groups: Tensor, sizes: Tensor, grid: tuple[int, int], image: np.ndarray,
                patch: tuple[int, int]) -> np.ndarray:
    """(H, W, 3) picture: kept patches as in the image, merged ones tinted by group, pruned dark."""
    out = image.copy()
    rng = np.random.default_rng(0)
    palette = rng.uniform(0.15, 1.0, size=(int(groups.max().item()) + 2, 3))
    ph, pw = patch
    for p, g in enumerate(groups.tolist()):
        r, c = divmod(p, grid[1])
        cell = out[r * ph : (r + 1) * ph, c * pw : (c + 1) * pw]
        if g < 0:
            cell *= 0.15
        elif sizes[g] > 1:
            cell[:] = 0.45 * cell + 0.55 * palette[g]
    return out


def _to_display(image: Tensor) -> np.ndarray:
    """(C, H, W) normalised tensor -> (H, W, 3) in [0, 1] (per-image min-max, for display only)."""
    img = image.detach().float().cpu()
    img = (img - img.min()) / (img.max() - img.min()).clamp_min(1e-8)
    img = img.permute(1, 2, 0).numpy()
    return np.repeat(img, 3, axis=2) if img.shape[2] == 1 else img[..., :3]


@torch.no_grad()
def visualize(model: nn.Module, spec: str | Reducer, images: Tensor, out_dir: str | Path,
              titles: list[str] | None = None, outlines: Tensor | None = None, amp: str | None = None) -> list[Path]:
    """Write one PNG per image: the input, then the token grid after every reduction block.

    Args:
        model: a timm VisionTransformer (patched or not; it is re-patched with ``spec`` and trace), on
            any device: the forward runs there, the drawing on the CPU.
        spec: a spec string, or a Reducer (e.g. a trained one, which keeps its weights).
        images: (B, C, H, W) model inputs (moved to the model's device).
        outlines: (B, H, W) bool object masks, drawn as a red contour on every panel (the scenes).
        amp: the forward's autocast ("bf16", "fp16"; None or "off": float32), as the decisions drawn are
            the ones the model makes at that precision.
    Returns:
        the PNG paths written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    apply(model, spec, trace=True)
    model.eval()
    device = next(model.parameters()).device
    with autocast(device, amp):
        model(images.to(device))
    info = get_info(model)
    p, grid = info.host.num_prefix, info.host.grid
    patch = (images.shape[2] // grid[0], images.shape[3] // grid[1])
    out_dir = Path(out_dir)
    paths = []
    blocks = sorted(info.snapshots)
    for i in range(images.shape[0]):
        base = _to_display(images[i])
        fig, axes = plt.subplots(1, len(blocks) + 1, figsize=(2.2 * (len(blocks) + 1), 2.6), squeeze=False)
        axes[0, 0].imshow(base)
        axes[0, 0].set_title(titles[i] if titles else "input", fontsize=8)
        for ax, block in zip(axes[0, 1:], blocks, strict=True):
            source = info.snapshots[block][i].float().cpu()
            groups = patch_groups(source, p)
            sizes = source.sum(-1)
            ax.imshow(group_image(groups, sizes, grid, base, patch))
            kept = int((groups >= 0).sum())
            ax.set_title(f"after block {block}\n{source.shape[0] - p} tokens, {kept} patches live", fontsize=8)
        for ax in axes[0]:
            if outlines is not None and bool(outlines[i].any()):
                ax.contour(outlines[i].float().numpy(), levels=[0.5], colors="red", linewidths=0.8)
            ax.axis("off")
        fig.suptitle(info.spec, fontsize=9)
        fig.tight_layout()
        paths.append(write_figure(fig, out_dir / f"image{i:03d}.png", dpi=110))
    return paths


def slug(spec: str) -> str:
    """A file-system-safe name for ``spec``: 'tome(r=4)' -> 'tome_r_4'."""
    return re.sub(r"[^A-Za-z0-9.]+", "_", spec).strip("_")


def draw(model: nn.Module, specs: Sequence[str | Reducer], images: Tensor, titles: list[str],
         out: str | Path, outlines: Tensor | None = None, amp: str | None = None) -> list[Path]:
    """:func:`visualize` each spec (a string, or a Reducer such as a trained one) into ``out/<slug>/``;
    ``model`` is left unpatched."""
    paths = []
    for spec in specs:
        name = spec if isinstance(spec, str) else spec.spec()
        try:
            paths += visualize(model, spec, images, Path(out) / slug(name), titles, outlines, amp)
        finally:
            if is_patched(model):  # visualize may fail before it patches
                remove(model)
    return paths


def dataset_images(model: nn.Module, data: str, data_dir: str | None, indices: Sequence[int],
                   classes: Sequence[str] | None = None) -> tuple[Tensor, list[str]]:
    """(images (n, C, H, W) as ``model`` takes them, titles '#i class') of test images ``indices``;
    ``classes``: the model's class list (a checkpoint's), by which the data is mapped."""
    ds = build_dataset(data, "test", data_dir=data_dir, classes=classes, **data_config_from_model(model))
    bad = [i for i in indices if not 0 <= i < len(ds)]
    if bad:
        raise TokenReduceError(f"image index {bad[0]} is outside the test set (0..{len(ds) - 1})")
    items = [ds[i] for i in indices]
    classes = list(getattr(ds, "classes", []))
    titles = [f"#{i} {classes[int(y)] if int(y) < len(classes) else y}" for i, (_, y) in zip(indices, items,
                                                                                              strict=True)]
    return torch.stack([x for x, _ in items]), titles
