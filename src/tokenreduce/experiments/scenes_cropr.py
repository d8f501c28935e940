"""Token Cropr on the scene test bed: the learned router against fixed scorers, classification and dense.

"Token Cropr: Faster ViTs for Quite a Few Tasks" (Cropr), arXiv 2412.00965, re-tested on the scene
reference (12 blocks, 196 patches; experiments/scene_bed.py), every arm on the same shortened
fine-tune (100 steps of 64 scenes; the router and heads at lr 1e-3, the backbone at 0.3 x), seeds 0-2,
paired by seed. Cropr prunes r = 16 patches after every block but the last (17 after the first:
196 -> 179 -> 163 -> ... -> 19 after blocks 0-10); with Last Layer Fusion (``+ llf()``) after every
block but the last two (-> 35 after block 9) and the pruned tokens return before the final block.
Every other arm keeps exactly Cropr's per-block counts, so arms differ only in who picks the tokens.

- ``cropr_scenes`` (classification): Cropr, Cropr + LLF, the referee's control (a fixed random
  *linear scorer*: a frozen random query, ``cropr(frozen=True)``), the random pruner, CLS-attention
  top-k, EViT, and the unpruned model on the same fine-tune.
- ``cropr_seg_scenes`` (dense): the scene masks as a segmentation task (the target's class on its
  pixels, background elsewhere, clutter included; 11 classes), fine-tuned from the dense reference
  ``scenes-vit-seg`` (the classification reference with a segmentation head trained, unpruned, for
  one epoch over the 60 000 training scenes; every parameter at lr 1e-3: the segment task has no
  backbone factor): Cropr + LLF (one query per output patch, R ramped up over the first half of
  training as the official ``segm/`` does), random + LLF, top-k + LLF, unpruned. A fresh head in 100
  steps does not learn the task (two runs from the classification reference: background IoU 89, the
  ten garment classes 0-12, mIoU 10.2-10.6, barely above all-background), so the arms start from a
  model that segments and the 100 steps adapt it to pruning, as the classification arms are. Then the
  collapse diagnostic as an evaluated arm, per seed on Cropr's checkpoint (experiments/
  cropr_diagnostics.py): the Spearman agreement of the deployed score (summed raw logits) with the
  training-time score (summed per-query softmax), the kept-set overlap, and the mIoU pruning by each.

Compute plan (2 CPU cores): classification 21 runs x 2-3 min; dense: the dense reference once (~25 min),
12 runs x 3-7 min and 3 diagnostics x 2-3 min: about 2.5 h for both.
"""

from __future__ import annotations

from ..train.recipes import get_recipe
from .cropr_arms import CLS_SOURCE, RESCORED_BEATS_DEPLOYED, REVIEW, SEG_COLUMNS, SEG_SOURCE, SOURCE, router_beats
from .scene_bed import SCENES, SCENES_SEG, shortened
from .scene_bed import smoke as scene_smoke
from .study import Arm, Axis, Col, Expect, Study, register_study

_R = 16
#: Cropr's counts without LLF (blocks 0-10) and with it (blocks 0-9), on 196 patches
_COUNTS = tuple(196 - (_R + 1) - _R * i for i in range(11))
_AT = f"counts={_COUNTS}, locs={tuple(range(11))}"
_AT_LLF = f"counts={_COUNTS[:10]}, locs={tuple(range(10))}"
_SEEDS = Axis("seed", (0, 1, 2), "s")


@register_study("cropr_scenes")
class CroprScenes(Study):
    title = "Token Cropr on the scene test bed (classification): the learned router against fixed scorers"
    claim = "Cropr's learned router keeps better tokens than a fixed scorer at the same per-block counts"
    source = CLS_SOURCE
    testbed = SCENES
    recipe = shortened(get_recipe("fmnist-cropr"))
    arms = {
        "cropr": Arm("Token Cropr", spec=f"cropr(r={_R}, classes=10)"),
        "cropr_llf": Arm("Token Cropr + LLF", spec=f"cropr(r={_R}, classes=10) + llf()"),
        "frozen": Arm("fixed random linear scorer (frozen query)", spec=f"cropr(r={_R}, classes=10, frozen=True)"),
        "random": Arm("random", spec=f"random({_AT}, where='block', seed={{seed}})"),
        "topk": Arm("top-k (CLS attention)", spec=f"topk({_AT}, where='block')"),
        "evit": Arm("EViT", spec=f"evit({_AT})"),
        "none": Arm("unpruned (same fine-tune)"),
    }
    baseline = "none"
    grid = (_SEEDS,)
    columns = (Col("top1", "top-1 %"), Col("top1", "Δ top-1 vs unpruned", paired=True), Col("train_time_s", "wall s"))
    expect = (
        router_beats(baseline="random", metric="top1", source=CLS_SOURCE),
        router_beats(baseline="topk", metric="top1", source=CLS_SOURCE),
        router_beats(baseline="evit", metric="top1", source=CLS_SOURCE),
        Expect("the learned router beats a fixed random linear scorer", REVIEW, arm="cropr", baseline="frozen",
               metric="top1", direction=1),
        Expect("pruning to 19 of 196 patches costs top-1", CLS_SOURCE, arm="cropr", baseline="none", metric="top1",
               direction=-1),
        Expect("LLF raises Cropr's top-1", f"{SOURCE}, Last Layer Fusion", arm="cropr_llf", baseline="cropr",
               metric="top1", direction=1),
    )
    smoke = scene_smoke(grid={"seed": (0, 1)})
    budget = "21 training runs x 2-3 min on 2 CPU cores: about 55 min"


@register_study("cropr_seg_scenes")
class CroprSegScenes(Study):
    title = "Token Cropr on the scene masks (segmentation): the router with LLF, fixed scorers, the collapse"
    claim = "with Last Layer Fusion, Cropr's router segments about as well as unpruned, better than fixed scorers"
    source = SEG_SOURCE
    testbed = SCENES_SEG
    recipe = {**shortened(get_recipe("fmnist-cropr")), "task": "segment", "label_smoothing": 0.0}
    arms = {
        "cropr": Arm("Token Cropr + LLF", spec=f"cropr(r={_R}, queries=196, classes=11, warmup_steps=50) + llf()"),
        "random": Arm("random + LLF", spec=f"random({_AT_LLF}, where='block', seed={{seed}}) + llf()"),
        "topk": Arm("top-k + LLF", spec=f"topk({_AT_LLF}, where='block') + llf()"),
        "none": Arm("unpruned (same fine-tune)"),
        "rescored": Arm("Cropr's weights pruned by the training-time score t", evaluates="cropr",
                        experiment="cropr_diagnostics(images=2000, seeds=(0, 1, 2))"),
    }
    baseline = "none"
    grid = (_SEEDS,)
    columns = SEG_COLUMNS
    expect = (
        Expect("Cropr + LLF keeps the unpruned model's mIoU (within 1 point)", SEG_SOURCE, arm="cropr",
               baseline="none", metric="miou", direction=1, margin=-1.0, effect=-0.1,
               published="ADE20k: -0.1 median mIoU at 2.0x"),
        router_beats(baseline="random", metric="miou", source=SEG_SOURCE),
        router_beats(baseline="topk", metric="miou", source=SEG_SOURCE),
        RESCORED_BEATS_DEPLOYED,
    )
    smoke = scene_smoke("fmnist_scenes_seg", grid={"seed": (0, 1)}, probe={"images": 16, "seeds": (0,), "batch": 8})
    budget = ("the dense reference once (~25 min), 12 training runs x 3-7 min + 3 diagnostics x 2-3 min on 2 CPU "
              "cores: about 90 min")
