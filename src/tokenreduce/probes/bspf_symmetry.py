"""bspf_symmetry: is the mirrored (upper-triangle) scoring of BSPF-ViT exact with W_q = W_k?

The paper shares W_q = W_k so that the attention logits S = Q K^T are symmetric, then scores only
the upper triangle of each attention block and mirrors the decisions. The reviewers' objection:
the scores are computed on the row-softmaxed attention A, and A_ij / A_ji = Z_j / Z_i (each row has
its own denominator), so A is not symmetric and mirroring is an approximation; a 3x3 kernel keeps
a symmetric matrix symmetric only if the kernel itself is symmetric (K = K^T).

Measured on real inputs (default: the cached Fashion-MNIST reference tied with ``tie_qk``, or a
trained tied checkpoint), for the reducer ``spec`` (a method with two scoring paths: a ``path``
parameter 'exact' | 'mirrored', ``decide(attn, path)`` and ``recording()``, e.g. the pruning and
fusion of methods/bspf.py):
- per pruning block: max and mean |A - A^T| over the softmaxed attention of the diagonal chunk
  blocks (every head and image; mean attention entry beside it for scale), and how far the two
  paths' decisions agree on the same attention: the share of the exact path's kept tokens the
  mirrored path keeps too, and the share of equal entries of the entry masks;
- end to end, the model run on each path: logit differences, top-1 of each, prediction agreement;
- the same with a non-symmetric 3x3 kernel (``kernel``) in place of the one loaded.
Smoke mode: a tiny random tied model on random images (seconds).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..core.errors import SpecError
from ..core.method import build_reducer, get_method, list_methods
from ..core.registry import format_spec, parse_spec
from .base import Experiment, RunContext, register_experiment

#: The non-symmetric kernel of the second run: mostly a local average, shifted to the right/down
#: (K != K^T; row by row).
ASYMMETRIC = (0.0, 0.3, 0.0, 0.05, 0.3, 0.25, 0.0, 0.1, 0.0)

PATHS = ("exact", "mirrored")


@dataclass(frozen=True)
class SymmetryConfig:
    """``spec``: the reducer under test (None: the checkpoint's own; in smoke mode the registered method
    with scoring paths at its example parameters); ``checkpoint``: None = the cached reference
    (``tokenreduce train --recipe fmnist-vit``); ``transform``: applied to a model that is not tied yet
    ('' = none: measure an untied model); ``images``: test images; ``kernel``: the non-symmetric kernel
    (9 numbers, row by row); ``tiny``: a tiny random model and random images instead (smoke)."""

    spec: str | None = None
    checkpoint: str | None = None
    transform: str = "tie_qk"
    images: int = 2000
    batch: int = 250
    kernel: Sequence[float] = ASYMMETRIC
    tiny: bool = False

    def __post_init__(self) -> None:
        if self.images < 1 or self.batch < 1:
            raise SpecError(f"bspf_symmetry: images and batch must be >= 1, got {self.images}, {self.batch}")


def with_path(spec: str, path: str, kernel: Sequence[float] | None = None) -> str:
    """``spec`` with its scoring ``path`` (and initial ``kernel``, if given) set."""
    name, params = parse_spec(spec)
    params = {**params, "path": path, **({"kernel": tuple(kernel)} if kernel is not None else {})}
    return format_spec(name, params)


def methods_with_paths() -> list[str]:
    """The registered methods with two scoring paths (a ``path`` parameter and ``decide``)."""
    return [name for name in list_methods()
            if "path" in {f.name for f in dataclasses.fields(get_method(name).Config)}
            and hasattr(get_method(name), "decide")]


def _tiny(seed: int = 0) -> nn.Module:
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(seed)
    return VisionTransformer(img_size=28, patch_size=4, in_chans=1, num_classes=10, embed_dim=32, depth=3,
                             num_heads=2, mlp_ratio=2.0)


def _is_tied(model: nn.Module) -> bool:
    from ..models import TiedQKV

    return all(isinstance(b.attn.qkv, TiedQKV) for b in model.blocks)


class _Stats:
    """Running sums of one path run's per-block numbers."""

    def __init__(self) -> None:
        self.blocks: dict[int, dict[str, float]] = {}

    def add(self, block: int, attn: list[Tensor], exact: Any, mirrored: Any) -> None:
        s = self.blocks.setdefault(block, dict.fromkeys(
            ("asym_max", "asym_sum", "attn_sum", "entries", "kept", "kept_both", "mask_equal", "mask_n"), 0.0))
        for a in attn:  # (B, H, chunks, c, c)
            d = (a - a.transpose(-2, -1)).abs()
            s["asym_max"] = max(s["asym_max"], d.max().item())
            s["asym_sum"] += d.sum().item()
            s["attn_sum"] += a.sum().item()
            s["entries"] += a.numel()
        ke, km = exact.token_keep(), mirrored.token_keep()
        s["kept"] += ke.sum().item()
        s["kept_both"] += (ke & km).sum().item()
        me, mm = exact.entry_keep(), mirrored.entry_keep()
        s["mask_equal"] += (me == mm).sum().item()
        s["mask_n"] += me.numel()

    def rows(self) -> list[dict[str, float]]:
        return [{"block": b, "attn_asym_max": s["asym_max"], "attn_asym_mean": s["asym_sum"] / s["entries"],
                 "attn_mean": s["attn_sum"] / s["entries"], "token_agreement": 100 * s["kept_both"] / s["kept"],
                 "entry_agreement": 100 * s["mask_equal"] / s["mask_n"]} for b, s in sorted(self.blocks.items())]


@register_experiment("bspf_symmetry")
class BSPFSymmetry(Experiment):
    claim = ("With W_q = W_k the attention is symmetric, so scoring the upper triangle of each attention block "
             "and mirroring it gives the same pruning as scoring the full block.")
    source = ("BSPF-ViT, arXiv 2507.12125 (symmetric pruning with shared query/key weights); reviewers' objection 1 "
              "(row-wise softmax breaks symmetry; a 3x3 kernel keeps it only if symmetric); "
              "docs/methods.md, section 'BSPF-ViT'")
    Config = SymmetryConfig
    smoke = {"tiny": True, "images": 8, "batch": 4}

    def run(self, ctx: RunContext) -> dict[str, Any]:
        cfg = self.cfg
        torch.set_num_threads(ctx.threads)
        model, spec, source, x, y, trained = self._setup(ctx)
        tied = _is_tied(model)
        ctx.log(f"bspf_symmetry: {spec} on {source} ({'tied W_q = W_k' if tied else 'untied'}), {len(x)} images")
        model.to(ctx.device).eval()
        from ..api import apply

        variants = []
        for label, kernel in (("as loaded", None), ("non-symmetric", tuple(cfg.kernel))):
            runs = {}
            for path in PATHS:
                apply(model, with_path(spec, path, kernel))
                if kernel is None and trained and trained.keys() == model.tokenreduce.state_dict().keys():
                    model.tokenreduce.load_state_dict(trained)  # the checkpoint's trained kernel, on both paths
                runs[path] = self._forward(model, x, y, ctx, record=path == "exact")
            reducer = model.tokenreduce
            k = reducer.kernel.detach().cpu() if hasattr(reducer, "kernel") else None
            le, lm = runs["exact"]["logits"], runs["mirrored"]["logits"]
            variants.append({
                "kernel": label, "kernel_values": None if k is None else [round(v, 6) for v in k.flatten().tolist()],
                "kernel_asymmetry": None if k is None else (k - k.T).abs().max().item(),
                "blocks": runs["exact"]["stats"].rows(),
                "top1_exact": runs["exact"]["top1"], "top1_mirrored": runs["mirrored"]["top1"],
                "top1_diff": runs["mirrored"]["top1"] - runs["exact"]["top1"],
                "pred_agreement": 100 * (le.argmax(-1) == lm.argmax(-1)).float().mean().item(),
                "logit_diff_max": (le - lm).abs().max().item(), "logit_diff_mean": (le - lm).abs().mean().item(),
            })
        return {"spec": with_path(spec, "exact"), "source": source, "tied": tied, "images": len(x),
                "variants": variants}

    def _setup(self, ctx: RunContext) -> tuple[nn.Module, str, str, Tensor, Tensor, dict[str, Tensor]]:
        """(model, spec under test, where the model came from, images, labels, the trained reducer's
        weights when the checkpoint carries one)."""
        from ..api import remove
        from ..models import apply_transform

        cfg = self.cfg
        if cfg.tiny:
            model, meta, source = _tiny(), {}, "a tiny random ViT (smoke)"
            g = torch.Generator().manual_seed(0)
            x, y = torch.randn(cfg.images, 1, 28, 28, generator=g), torch.randint(0, 10, (cfg.images,), generator=g)
        else:
            from ..models import load_model
            from ..train.recipes import reference_checkpoint

            path = cfg.checkpoint or str(reference_checkpoint())
            model, meta = load_model(path)
            source = path
            x, y = _test_images(model, meta, cfg.images)
        trained = {k: v.clone() for k, v in model.tokenreduce.state_dict().items()} if _owned(model) else {}
        spec = cfg.spec or meta.get("spec")
        if spec is None:
            found = methods_with_paths()
            if not cfg.tiny or not found:
                raise SpecError("bspf_symmetry: give spec=..., the reducer to test (a method with scoring paths: "
                                f"{', '.join(found) or 'none registered'}); the checkpoint carries none")
            spec = format_spec(found[0], get_method(found[0]).example)
        if meta.get("spec"):
            remove(model)  # the experiment applies the spec under test itself, on each path
        if cfg.transform and not _is_tied(model):
            apply_transform(cfg.transform, model)
        _check_paths(spec)
        return model, spec, source, x, y, trained

    def _forward(self, model: nn.Module, x: Tensor, y: Tensor, ctx: RunContext, record: bool) -> dict[str, Any]:
        reducer = model.tokenreduce
        stats, logits = _Stats(), []
        with torch.inference_mode(), ctx.autocast():
            for i in range(0, len(x), self.cfg.batch):
                xb = x[i:i + self.cfg.batch].to(ctx.device)
                if not record:
                    logits.append(model(xb).float().cpu())
                    continue
                with reducer.recording() as records:
                    logits.append(model(xb).float().cpu())
                for r in records:
                    stats.add(r.block, r.attn, *(reducer.decide(r.attn, p) for p in PATHS))
        out = torch.cat(logits)
        return {"logits": out, "top1": 100 * (out.argmax(-1) == y).float().mean().item(), "stats": stats}

    def report(self, result: dict[str, Any]) -> str:
        lines = [f"{result['spec']} on {result['source']}, {'W_q = W_k' if result['tied'] else 'untied W_q, W_k'}, "
                 f"{result['images']} images", "",
                 "| kernel | block | max abs(A - A^T) | mean abs(A - A^T) | mean A | kept tokens shared % | "
                 "entry masks equal % |", "|---|---|---|---|---|---|---|"]
        for v in result["variants"]:
            for b in v["blocks"]:
                lines.append(f"| {v['kernel']} | {b['block']} | {b['attn_asym_max']:.4f} | {b['attn_asym_mean']:.5f} | "
                             f"{b['attn_mean']:.5f} | {b['token_agreement']:.2f} | {b['entry_agreement']:.2f} |")
        lines += ["", "| kernel | max abs(K - K^T) | top-1 exact % | top-1 mirrored % | diff | same prediction % | "
                  "max abs logit diff | mean abs logit diff |", "|---|---|---|---|---|---|---|---|"]
        for v in result["variants"]:
            asym = "-" if v["kernel_asymmetry"] is None else f"{v['kernel_asymmetry']:.4f}"
            lines.append(f"| {v['kernel']} | {asym} | {v['top1_exact']:.2f} | {v['top1_mirrored']:.2f} | "
                         f"{v['top1_diff']:+.2f} | {v['pred_agreement']:.2f} | {v['logit_diff_max']:.4f} | "
                         f"{v['logit_diff_mean']:.5f} |")
        return "\n".join(lines)


def _owned(model: nn.Module) -> bool:
    return "tokenreduce" in model._modules


def _check_paths(spec: str) -> None:
    for path in PATHS:
        reducer = build_reducer(with_path(spec, path))
        if not (hasattr(reducer, "decide") and hasattr(reducer, "recording")):
            raise SpecError(f"bspf_symmetry: {spec} has no scoring paths to compare (decide, recording); methods "
                            f"with them: {', '.join(methods_with_paths()) or 'none'}")


def _test_images(model: nn.Module, meta: dict[str, Any], n: int) -> tuple[Tensor, Tensor]:
    """A fixed random ``n`` of the checkpoint's test images (torch.randperm, seed 0) and their labels."""
    from ..data import build_dataset, data_config_from_model, subset
    from ..models import classes_of

    name = (meta.get("data") or {}).get("name") or "fashion_mnist"
    ds = subset(build_dataset(name, "test", classes=classes_of(meta), **data_config_from_model(model)), n, seed=0)
    items = [ds[i] for i in range(len(ds))]
    return torch.stack([im for im, _ in items]), torch.tensor([int(t) for _, t in items])
