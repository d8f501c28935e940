"""ImagePiece on Fashion-MNIST: does re-tokenization add accuracy once the conv stem is held fixed?

"ImagePiece: Content-aware Re-tokenization for Efficient Image Recognition", AAAI 2025, arXiv
2412.16491. Its accuracy gain compares a conv stem + re-tokenization against a plain patch-embedding
ViT and never trains the conv stem alone. Every arm here is trained from scratch with the same short
recipe (``fmnist-vit-short``: the fmnist-vit model, 4 epochs on a fixed 20 000 training images, the
full test set at the end) and the same seeds, so each ingredient can be taken away on its own: each
stem with and without ImagePiece, EViT and ToMe with the conv stem at ImagePiece's analytic MACs
(within 1%), ImagePiece's re-tokenization alone (``keep=1.0``) in front of EViT / ToMe at the same
MACs, and the hyper-speed regime (~14% of the tokens left). Contrasts are paired by seed (the same
seed gives both arms the same initialisation and data order).

The matched budgets were found by a search over each family's analytic MACs on the conv-stem model
(``count_macs``); the specs below are its result, fixed so every run is reproducible:
    paper regime, 1.32x fewer MACs: ``imagepiece(locs=(1, 2, 4))`` = merge at blocks (2, 5, 8) of 12
        moved to 6 blocks, prune at the next block, keep 0.8 (49 -> 45 -> 33 -> 27 -> 25 -> 20 tokens)
    hyper-speed, 1.82x: ``imagepiece(locs=(0, 1, 2, 3, 4), keep=0.7)``, 7 of 49 tokens left.
The speed measures time every reducer of a stem on that stem's unreduced seed-0 checkpoint in one
interleaved run (the weights do not change the cost).
"""

from __future__ import annotations

from ..train.recipes import get_recipe
from .eet_arms import _TINY
from .study import Arm, Axis, Col, Expect, Measure, Smoke, Study, register_study
from .testbed import Testbed

_SOURCE = "ImagePiece, arXiv 2412.16491"
_IP = "imagepiece(locs=(1, 2, 4))"
_FRONT = "imagepiece(locs=(1, 2, 4), keep=1.0)"  # re-tokenization only: merging inside the inattentive set

_ARMS = {
    "patch_none": Arm("patch-none", stem="patch"),
    "conv_none": Arm("conv-none", stem="conv"),
    "patch_imagepiece": Arm("patch-imagepiece", stem="patch", spec=_IP),
    "conv_imagepiece": Arm("conv-imagepiece", stem="conv", spec=_IP),
    "conv_evit": Arm("conv-evit", stem="conv", spec="evit(keep=0.74, locs=(1, 3, 4))"),
    "conv_tome": Arm("conv-tome", stem="conv", spec="tome(r=(5, 5, 4, 4, 4, 4))"),
    "conv_imagepiece_evit": Arm("conv-imagepiece+evit", stem="conv",
                                spec=f"{_FRONT} + evit(keep=0.76, locs=(2, 3, 5))"),
    "conv_imagepiece_tome": Arm("conv-imagepiece+tome", stem="conv", spec=f"{_FRONT} + tome(r=(4, 3, 3, 3, 3, 3))"),
    "conv_imagepiece_hyper": Arm("conv-imagepiece-hyper", stem="conv",
                                 spec="imagepiece(locs=(0, 1, 2, 3, 4), keep=0.7)"),
    "conv_evit_hyper": Arm("conv-evit-hyper", stem="conv", spec="evit(keep=0.44, locs=(1, 3, 4))"),
    "conv_tome_hyper": Arm("conv-tome-hyper", stem="conv", spec="tome(r=(9, 9, 8, 8, 8, 8))"),
}

_SPEED_COLUMNS = (("label", "spec", "{}"), ("kind", "kind", "{}"), ("macs", "MACs", "{:,}"),
                  ("speedup", "speed-up b32", "{:.2f}"), ("latency_speedup", "speed-up b1", "{:.2f}"),
                  ("ratio_vs_random", "vs random b32", "{:.2f}"), ("latency_vs_random", "vs random b1", "{:.2f}"))


def _speed(stem: str) -> Measure:
    specs = tuple(a.spec for a in _ARMS.values() if a.stem == stem and a.spec)
    return Measure(f"speed_{stem}", reference=f"{stem}_none", at={"seed": 0}, specs=specs, columns=_SPEED_COLUMNS,
                   title=f"Speed, {stem} stem: every reducer on the unreduced seed-0 checkpoint, one interleaved run")


def _expect(claim: str, arm: str, baseline: str, where: str, **kw) -> Expect:
    return Expect(claim, f"{_SOURCE}, {where}", arm=arm, baseline=baseline, metric="top1", direction=1, **kw)


@register_study("imagepiece")
class ImagePieceControls(Study):
    title = "ImagePiece on Fashion-MNIST: the stem-only control and the baselines at the same MACs"
    claim = ("ImagePiece's re-tokenization raises accuracy at fewer MACs, alone and in front of EViT / ToMe; "
             "the control it lacks: the conv stem alone")
    source = f"{_SOURCE}, Tables 1-3 (DeiT on ImageNet)"
    recipe = get_recipe("fmnist-vit-short")  # also `tokenreduce train --recipe fmnist-vit-short --stem conv`
    arms = _ARMS
    baseline = "patch_none"
    grid = (Axis("seed", (0, 1, 2), "s"),)
    columns = (Col("top1", "top-1 %"), Col("top1", "Δ top-1 vs patch-none", paired=True),
               Col("train_time_s", "wall s"))
    measures = (_speed("conv"), _speed("patch"))
    expect = (
        _expect("conv stem + ImagePiece beats the plain ViT (the paper's comparison)", "conv_imagepiece",
                "patch_none", "Table 1 (DeiT-S)", effect=80.22 - 79.83, published="79.83 -> 80.22 top-1"),
        _expect("re-tokenization adds accuracy with the stem held fixed (conv)", "conv_imagepiece", "conv_none",
                "Table 1 (the control it lacks)"),
        _expect("re-tokenization adds accuracy with the patch stem", "patch_imagepiece", "patch_none", "Table 1"),
        _expect("the conv stem alone (no re-tokenization, no pruning) adds accuracy", "conv_none", "patch_none",
                "the control the paper left out"),
        _expect("ImagePiece beats EViT at the same stem and MACs", "conv_imagepiece", "conv_evit", "Table 1"),
        _expect("ImagePiece beats ToMe at the same stem and MACs", "conv_imagepiece", "conv_tome", "Table 1"),
        _expect("ImagePiece in front of EViT beats EViT alone", "conv_imagepiece_evit", "conv_evit",
                "Table 3 (+0.79 on average as an add-on)", effect=0.79, published="+0.79 top-1 on average"),
        _expect("ImagePiece in front of ToMe beats ToMe alone", "conv_imagepiece_tome", "conv_tome",
                "Table 3 (+0.79 on average as an add-on)", effect=0.79, published="+0.79 top-1 on average"),
        _expect("hyper-speed: ImagePiece beats EViT", "conv_imagepiece_hyper", "conv_evit_hyper", "Table 2"),
        _expect("hyper-speed: ImagePiece beats ToMe", "conv_imagepiece_hyper", "conv_tome_hyper", "Table 2"),
    )
    smoke = Smoke(testbed=Testbed(model="vit_tiny_patch16_224", kwargs=_TINY, synthetic=True),
                  recipe={"subset": 32, "eval_subset": 16, "batch_size": 16, "eval_batch_size": 16, "epochs": 1,
                          "eval_every": 1, "warmup_epochs": 0.2, "ckpt_every": 1, "augment": "none",
                          "deterministic": True, "quiet": True},
                  grid={"seed": (0, 1)},
                  measure={"batch": 4, "warmup": 0, "repeats": 1})
    budget = ("33 training runs x ~4.5 min on 2 CPU cores (two lanes of 1 thread, ~2.5 h), "
              "two speed runs ~5 min each on idle cores")
