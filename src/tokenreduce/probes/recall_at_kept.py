"""``recall_at_kept``: do the tokens a pruner keeps lie on the object? (a reviewer's falsifier of EET).

EET (arXiv 2504.16691) says its content-based pruning keeps the informative tokens. The review's
test: on images whose object is known pixel by pixel, measure at every reducing block the fraction
of the kept patch tokens that lie on the object (recall@kept), next to a random pruner and an
oracle that keep exactly as many tokens at the same blocks.

Definitions (Fashion-MNIST: one garment on a black background; scenes: one garment among clutter):
    foreground pixel   on a test set with object masks (the scenes' ``masks``: the target garment's
                       pixels, clutter excluded) a pixel of the mask; otherwise raw uint8 value >
                       ``threshold`` (default 51 = 0.2 x 255, the threshold data/mosaic.py uses for
                       its segmentation masks), read from the raw test image;
    foreground patch   at least half of its pixels are foreground: f_j >= 0.5, with f_j the fraction
                       of foreground pixels in patch j of the model's grid (the raw 28x28 image split
                       into the grid by adaptive average pooling, so a model with a larger input
                       that resizes the image gets the same regions);
    recall@kept(b)     over every image and every non-prefix token leaving reducing block b: the mean
                       of the token's share of foreground patches among the original patches it
                       holds (``get_info(model).snapshots[b]``, ``apply(..., trace=True)``). For a
                       pruner each token holds one patch, so this is the fraction of kept tokens on
                       the object; a merged or fused token counts by its members;
    matched            the spec's schedule replayed with no scoring (``core.method.matched_spec``) for
                       each seed in ``seeds``: mean and std over the seeds;
    oracle             keeps, per image, the ``k_b`` patches of largest f_j (foreground first) at each
                       block b with the spec's count k_b: recall = min(k_b, #foreground) / k_b;
    base rate          the fraction of foreground patches (what blind pruning gets in expectation).

Smoke mode (``tiny=True``): a tiny random ViT on synthetic Fashion-MNIST-format images written
under the run's folder; without a spec it prunes with the matched random pruner of a fixed
schedule (the experiment names no method).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.errors import SpecError, TokenReduceError
from ..core.method import matched_spec
from ..data.mosaic import THRESHOLD
from .base import Experiment, RunContext, register_experiment

#: the tiny model of smoke mode (Fashion-MNIST format: 28x28 grayscale, 7x7 patches of 4 pixels)
TINY = {"name": "vit_tiny_patch16_224",
        "kwargs": {"img_size": 28, "patch_size": 4, "in_chans": 1, "num_classes": 10, "embed_dim": 32, "depth": 4,
                   "num_heads": 2}}


@dataclass(frozen=True)
class RecallConfig:
    """``spec``: the pruning spec to test (required, except in smoke mode); ``checkpoint``: the model
    (default: the trained fmnist-vit reference in the cache); ``data``, ``data_dir``: the test set;
    ``images``: a fixed random subset of that many test images (None: all); ``seeds``: random pruner
    seeds; ``threshold``: foreground pixel threshold (raw uint8); ``batch``; ``tiny``: smoke mode."""

    spec: str | None = None
    checkpoint: str | None = None
    data: str = "fashion_mnist"
    data_dir: str | None = None
    images: int | None = None
    seeds: int | tuple[int, ...] = (0, 1, 2)
    threshold: int = THRESHOLD
    batch: int = 500
    tiny: bool = False

    def __post_init__(self) -> None:
        if self.spec is None and not self.tiny:
            raise SpecError("recall_at_kept: give spec='...', the pruning spec whose kept tokens are measured")
        seeds = (self.seeds,) if isinstance(self.seeds, int) else tuple(self.seeds)
        if not seeds:
            raise SpecError("recall_at_kept: seeds must name at least one random pruner seed")
        object.__setattr__(self, "seeds", seeds)
        if not 0 <= self.threshold < 255:
            raise SpecError(f"recall_at_kept: threshold must be a raw uint8 value in 0..254, got {self.threshold}")
        if self.images is not None and self.images < 1:
            raise SpecError(f"recall_at_kept: images must be >= 1 or None, got {self.images}")


def patch_foreground(raw: Tensor, grid: tuple[int, int], threshold: int = THRESHOLD) -> Tensor:
    """f (B, gh * gw): the fraction of foreground pixels of each patch, row-major; ``raw`` (B, H, W)
    either uint8 images (foreground: raw > threshold) or bool object masks (foreground: True)."""
    fg = (raw if raw.dtype == torch.bool else raw > threshold).float()[:, None]  # (B, 1, H, W)
    return F.adaptive_avg_pool2d(fg, grid).flatten(1)


def recall_of_tokens(snapshot: Tensor, fg_patch: Tensor, num_prefix: int) -> tuple[float, int]:
    """(sum over the non-prefix tokens of their share of foreground patches, number of such tokens).
    snapshot (B, N_b, N0) 0/1 membership of the original positions (prefix first); fg_patch (B, N0 - p)
    0/1 foreground patches."""
    members = snapshot[:, num_prefix:, num_prefix:].float()  # (B, n_b, N0 - p)
    share = (members @ fg_patch[..., None]).squeeze(-1) / members.sum(-1).clamp_min(1)  # (B, n_b)
    return float(share.sum()), share.numel()


def oracle_recall(fg_frac: Tensor, count: int) -> float:
    """Recall@kept of keeping the ``count`` patches of largest foreground fraction per image,
    fg_frac (B, n): the mean of min(count, #foreground patches) / count."""
    n_fg = (fg_frac >= 0.5).sum(1).float()
    return float((n_fg.clamp(max=count) / count).mean())


@register_experiment("recall_at_kept")
class RecallAtKept(Experiment):
    """Per reducing block: recall@kept of ``spec``, its matched random pruner, the oracle, the base rate."""

    Config = RecallConfig
    claim = ("EET's content-based token pruning keeps the informative tokens. Falsifier: recall@kept, the "
             "fraction of kept tokens on the object (Fashion-MNIST foreground), compared with a random pruner "
             "and a foreground-first oracle at the same per-block counts.")
    source = "review of EET (arXiv 2504.16691)"
    smoke = {"tiny": True, "images": 24, "seeds": (0, 1), "batch": 8}

    def run(self, ctx: RunContext) -> dict[str, Any]:
        from ..api import apply, get_info, is_patched, remove

        cfg = self.cfg
        model, checkpoint = self._model(ctx)
        raw, images = self._images(ctx, model)
        ctx.log(f"recall_at_kept: {len(raw)} test images, checkpoint {checkpoint}")
        if cfg.spec is None:  # smoke without a spec: the matched random pruner of a fixed schedule
            from ..adapters.hosts import check_host
            from ..core.schedule import from_counts

            host = check_host(model)
            n = host.num_patches
            spec = matched_spec(from_counts(n, host.depth, (n // 2, n // 4), (1, 2), "block", "smoke"), 0)
        else:
            spec = cfg.spec
        if is_patched(model):
            remove(model)
        apply(model, spec, trace=True)
        info = get_info(model)
        p, grid = info.host.num_prefix, info.host.grid
        fg_frac = patch_foreground(raw, grid, cfg.threshold)  # (n, N0 - p)
        fg = (fg_frac >= 0.5).float()
        matched = [matched_spec(info.schedule, seed) for seed in cfg.seeds]  # no scoring, same counts
        spec_recall = self._recall(model, images, fg, p, cfg.batch, ctx)
        per_seed = []
        for m in matched:
            apply(model, m, trace=True)
            per_seed.append(self._recall(model, images, fg, p, cfg.batch, ctx))
        blocks = []
        for b in sorted(spec_recall):
            kept = int(info.schedule.counts[b])
            seeds = torch.tensor([r[b] for r in per_seed], dtype=torch.float64)
            blocks.append({"block": b, "kept": kept, "of": info.host.num_patches, "base_rate": float(fg.mean()),
                           "spec": spec_recall[b], "matched": float(seeds.mean()),
                           "matched_std": float(seeds.std()) if len(seeds) > 1 else 0.0,
                           "matched_seeds": seeds.tolist(), "oracle_recall": oracle_recall(fg_frac, kept)})
        return {"checkpoint": checkpoint, "spec": info.spec, "matched_specs": matched, "images": len(raw),
                "threshold": cfg.threshold, "grid": list(grid), "blocks": blocks}

    # -- pieces

    def _model(self, ctx: RunContext) -> tuple[nn.Module, str]:
        cfg = self.cfg
        if cfg.tiny:
            from ..models import build_model

            torch.manual_seed(0)
            return build_model(TINY).to(ctx.device).eval(), "tiny random ViT (smoke)"
        from ..models import load_model

        if cfg.checkpoint is None:
            from ..train.recipes import reference_checkpoint

            path = str(reference_checkpoint())
        else:
            path = cfg.checkpoint
        return load_model(path, ctx.device)[0], path

    def _images(self, ctx: RunContext, model: nn.Module) -> tuple[Tensor, Tensor]:
        """(foreground (n, H, W): object masks (bool) where the test set has them, else raw uint8 images;
        model inputs (n, C, H', W')) of the test images."""
        from ..data import build_dataset, data_config_from_model, subset

        cfg = self.cfg
        data, data_dir = cfg.data, cfg.data_dir
        if cfg.tiny:
            from ..data.fashion_mnist import make_synthetic

            n = cfg.images or 24
            data_dir = str(make_synthetic(ctx.out_dir / "data", n_train=10, n_test=n))
        ds = build_dataset(data, "test", data_dir=data_dir, **data_config_from_model(model))
        sub = subset(ds, cfg.images, seed=0)
        idx = list(getattr(sub, "indices", range(len(ds))))
        images = torch.stack([ds[i][0] for i in idx])
        if callable(getattr(ds, "object_mask", None)):  # the scenes: the target's pixels, clutter excluded
            return torch.stack([ds.object_mask(i) for i in idx]), images
        raw_all = getattr(ds, "images", None)
        if not isinstance(raw_all, Tensor) or raw_all.dtype != torch.uint8 or raw_all.dim() != 3:
            raise TokenReduceError(f"recall_at_kept needs a test set with object masks or raw uint8 images (n, H, W) "
                                   f"(scenes, Fashion-MNIST); {data!r} has neither")
        return raw_all[idx], images

    @torch.inference_mode()
    def _recall(self, model: nn.Module, images: Tensor, fg: Tensor, p: int, batch: int, ctx: RunContext
                ) -> dict[int, float]:
        """block -> recall@kept of the patched ``model`` over ``images`` (fg (n, N0 - p) 0/1)."""
        from ..api import get_info

        sums: dict[int, list[float]] = {}
        dev = torch.device(ctx.device)
        for s in range(0, len(images), batch):
            with ctx.autocast():
                model(images[s:s + batch].to(dev))
            for b, snap in get_info(model).snapshots.items():
                total, n = recall_of_tokens(snap.cpu(), fg[s:s + batch], p)
                acc = sums.setdefault(b, [0.0, 0])
                acc[0] += total
                acc[1] += n
        if not sums:
            raise TokenReduceError(f"{get_info(model).spec} reduced no tokens: nothing to measure")
        return {b: t / n for b, (t, n) in sums.items()}

    def report(self, result: dict[str, Any]) -> str:
        head = (f"recall@kept (fraction of kept tokens on the object), {result['images']} test images, "
                f"{result['spec']} on {result['checkpoint']}; matched = the same counts with no scoring "
                f"({result['matched_specs'][0].partition('(')[0]}), mean +- std over {len(result['matched_specs'])} "
                "seeds\n\n| block | tokens kept | base rate | spec | matched | oracle |\n|---|---|---|---|---|---|")
        rows = [f"| {r['block']} | {r['kept']} / {r['of']} | {r['base_rate']:.3f} | {r['spec']:.3f} | "
                f"{r['matched']:.3f} +- {r['matched_std']:.3f} | {r['oracle_recall']:.3f} |" for r in result["blocks"]]
        return "\n".join([head, *rows])


__all__ = ["RecallAtKept", "RecallConfig", "oracle_recall", "patch_foreground", "recall_of_tokens"]
