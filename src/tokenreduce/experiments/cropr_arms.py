"""Token Cropr on Fashion-MNIST: does the learned router beat fixed scorers at the same schedule?

"Token Cropr: Faster ViTs for Quite a Few Tasks" (Cropr), arXiv 2412.00965. Two studies, one per task,
each trains every arm with the same recipe and the same per-block token counts, so the arms differ
only in who picks the kept tokens: Cropr's cross-attention router (trained by its auxiliary heads),
a fixed random subset (its own seed follows the run's), the CLS-attention top-k, EViT (top-k that
fuses what it drops), and the unpruned model under the same recipe.

- ``cropr``: classification, the ``fmnist-cropr`` recipe (1 epoch fine-tune of the fmnist-vit
  reference on a fixed 20 000 images; 49 -> 42 -> 36 -> 30 -> 24 -> 18 patches after blocks 0-4).
- ``cropr_seg``: segmentation of the 56x56 mosaics, ``fmnist-cropr-seg`` (from scratch, 3 epochs on
  6 000 mosaics; 196 -> 155 -> 115 -> 75 -> 35 after blocks 0-3, then Last Layer Fusion: the pruned
  tokens return before the final block). Cropr has one query per output patch and ramps R up over
  the first 140 steps, as the official ``segm/`` does.

The reviewer's diagnostics of the segmentation router (deployed score against the training-time
score, experiments/cropr_diagnostics.py) are the evaluated arm ``rescored`` of ``cropr_seg``: one run
per seed on that seed's Cropr checkpoint (its runs were made by ``tokenreduce experiment
cropr_diagnostics`` before evaluated arms existed and converted, numbers unchanged).
"""

from __future__ import annotations

from ..train.recipes import get_recipe
from .eet_arms import _TINY
from .study import Arm, Axis, Col, Expect, Smoke, Study, register_study
from .testbed import Testbed

SOURCE = "Token Cropr, arXiv 2412.00965"
CLS_SOURCE = f"{SOURCE}, its ImageNet classification results against other pruners"
SEG_SOURCE = f"{SOURCE}, its ADE20k semantic segmentation results with LLF"
_CLS_AT = "counts=(42, 36, 30, 24, 18), locs=(0, 1, 2, 3, 4)"  # what cropr(r=6) keeps on 49 patches
_SEG_AT = "counts=(155, 115, 75, 35), locs=(0, 1, 2, 3)"  # what cropr(r=40, locs=(0, 1, 2, 3)) keeps on 196
_SEEDS = Axis("seed", (0, 1, 2), "s")
_SMOKE_RECIPE = {"subset": 32, "eval_subset": 16, "batch_size": 16, "eval_batch_size": 16, "warmup_epochs": 0.2,
                 "ckpt_every": 1, "augment": "none", "deterministic": True, "quiet": True}


REVIEW = "review of Token Cropr (the fixed random scorer; the dense-task inference score)"


#: the dense studies' columns: the task metric, then the collapse diagnostic's (its evaluated arm ``rescored``)
SEG_COLUMNS = (Col("miou", "mIoU %"), Col("pixel_acc", "pixel acc %"), Col("miou", "Δ mIoU vs unpruned", paired=True),
               Col("miou_deployed", "mIoU, deployed score s %"), Col("miou_fixed", "mIoU, fixed random scorer %"),
               Col("spearman", "Spearman(s, t)"), Col("overlap", "kept-set overlap"), Col("train_time_s", "wall s"))
#: the review's claim on the dense-task score: pruning by the training-time score t beats the deployed s
RESCORED_BEATS_DEPLOYED = Expect("pruning by the training-time score t beats the deployed score s", REVIEW,
                                 arm="rescored", baseline="cropr", metric="miou", direction=1)


def router_beats(baseline: str, metric: str, source: str) -> Expect:
    """The paper's claim that its router beats the fixed scorer ``baseline`` at the same token counts."""
    return Expect(f"Cropr beats {baseline} at the same counts", source, arm="cropr", baseline=baseline,
                  metric=metric, direction=1)


@register_study("cropr")
class CroprClassify(Study):
    title = "Token Cropr on Fashion-MNIST classification: the learned router against fixed scorers"
    claim = "Cropr's learned router keeps better tokens than a fixed scorer at the same per-block counts"
    source = CLS_SOURCE
    testbed = Testbed(reference="fmnist-vit")
    recipe = get_recipe("fmnist-cropr")  # also `tokenreduce train --recipe fmnist-cropr`
    arms = {
        "cropr": Arm("Token Cropr", spec="cropr(r=6, classes=10)"),
        "random": Arm("random", spec=f"random({_CLS_AT}, where='block', seed={{seed}})"),
        "topk": Arm("top-k", spec=f"topk({_CLS_AT}, where='block')"),
        "evit": Arm("EViT", spec=f"evit({_CLS_AT})"),
        "none": Arm("unpruned (same fine-tune)"),
    }
    baseline = "none"
    grid = (_SEEDS,)
    columns = (Col("top1", "top-1 %"), Col("top1", "Δ top-1 vs unpruned", paired=True),
               Col("train_time_s", "wall s"))
    expect = (
        router_beats(baseline="random", metric="top1", source=CLS_SOURCE),
        router_beats(baseline="topk", metric="top1", source=CLS_SOURCE),
        Expect("pruning to 18 of 49 patches costs top-1", CLS_SOURCE, arm="cropr", baseline="none", metric="top1",
               direction=-1),
    )
    smoke = Smoke(testbed=Testbed(model="vit_tiny_patch16_224", kwargs=_TINY, synthetic=True),
                  recipe=_SMOKE_RECIPE, grid={"seed": (0, 1)})
    budget = "15 training runs x 1.5-2 min on 2 CPU cores (two lanes of 1 thread)"


@register_study("cropr_seg")
class CroprSegment(Study):
    title = "Token Cropr on Fashion-MNIST mosaics (segmentation): the learned router against fixed scorers"
    claim = "with Last Layer Fusion, Cropr's router segments about as well as unpruned, better than fixed scorers"
    source = SEG_SOURCE
    testbed = Testbed()  # the recipe's model, trained from scratch by every arm
    recipe = get_recipe("fmnist-cropr-seg")
    arms = {
        "cropr": Arm("Token Cropr", spec="cropr(r=40, queries=196, classes=11, locs=(0, 1, 2, 3), "
                                         "warmup_steps=140) + llf()"),
        "random": Arm("random", spec=f"random({_SEG_AT}, where='block', seed={{seed}}) + llf()"),
        "topk": Arm("top-k", spec=f"topk({_SEG_AT}, where='block') + llf()"),
        "evit": Arm("EViT", spec=f"evit({_SEG_AT}) + llf()"),
        "none": Arm("unpruned (same recipe)"),
        "rescored": Arm("Cropr's weights pruned by the training-time score t", evaluates="cropr",
                        experiment="cropr_diagnostics(seeds=(0, 1, 2))"),
    }
    baseline = "none"
    grid = (_SEEDS,)
    columns = SEG_COLUMNS
    expect = (
        Expect("Cropr + LLF keeps the unpruned model's mIoU (within 1 point)", SEG_SOURCE, arm="cropr",
               baseline="none", metric="miou", direction=1, margin=-1.0),
        router_beats(baseline="random", metric="miou", source=SEG_SOURCE),
        router_beats(baseline="topk", metric="miou", source=SEG_SOURCE),
        RESCORED_BEATS_DEPLOYED,
    )
    smoke = Smoke(testbed=Testbed(model="vit_tiny_patch16_224", kwargs={**_TINY, "img_size": 56}, synthetic=True),
                  recipe=_SMOKE_RECIPE, grid={"seed": (0, 1)})
    budget = ("15 training runs x 5-10 min on 2 CPU cores (two lanes of 1 thread); the unpruned arm was "
              "trained by the platform's segmentation baseline with the same recipe")
