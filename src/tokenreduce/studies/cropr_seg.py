"""Token Cropr on a dense task: with Last Layer Fusion, does the router segment as well as unpruned?

"Token Cropr: Faster ViTs for Quite a Few Tasks" (Cropr), arXiv 2412.00965, its segmentation claim. Every
arm keeps Cropr's per-block counts and brings the pruned tokens back before the final block (``+ llf()``),
so arms differ only in who picks the tokens: Cropr + LLF (one query per output patch, R ramped up over
the first steps as the official ``segm/`` does), random + LLF, top-k + LLF (and EViT + LLF on
``fmnist``), and the unpruned model; seeds 0-2, paired by seed. Then the reviewer's collapse diagnostic
as an evaluated arm ``rescored``, per seed on Cropr's checkpoint (probes/cropr_diagnostics.py):
the Spearman agreement of the deployed score (summed raw logits) with the training-time score (summed
per-query softmax), the kept-set overlap, and the mIoU pruning by each.

``scenes``: the scene masks as a segmentation task (the target's class on its pixels, background elsewhere,
clutter included; 11 classes), fine-tuned from the dense reference ``scenes-vit-seg`` (the classification
reference with a segmentation head trained, unpruned: its recipe) on the shortened schedule; 196 -> 179 ->
... -> 35 after blocks 0-9. A fresh head in 100 steps does not learn the task (two runs from the classification
reference: mIoU 10.2-10.6, barely above all-background), so the arms start from a model that segments.

``fmnist``: segmentation of the 56x56 mosaics, ``fmnist-cropr-seg`` (from scratch; 196 -> 155 -> 115 -> 75 ->
35 after blocks 0-3; R ramped over the first 140 steps). Its ``rescored`` runs were made by ``tokenreduce
experiment cropr_diagnostics`` before evaluated arms existed and converted, numbers unchanged; its unpruned
arm was trained by the platform's segmentation baseline with the same recipe.
"""

from __future__ import annotations

from ..data.scenes import EVAL_SUBSET
from ..study.declare import Arm, Bed, Col, Expect, Study, register_study
from ..study.testbed import Testbed
from ..train.recipes import get_recipe
from .beds import SCENES_SEG, fmnist_smoke, scene_smoke, shortened
from .cropr import REVIEW, SEEDS, SOURCE, rivals, router_beats

SEG_SOURCE = f"{SOURCE}, its ADE20k semantic segmentation results with LLF"
_R = 16
_COUNTS = tuple(196 - (_R + 1) - _R * i for i in range(10))  # Cropr's counts with LLF on the scene bed
_AT = f"counts={_COUNTS}, locs={tuple(range(10))}"
_FMNIST_AT = "counts=(155, 115, 75, 35), locs=(0, 1, 2, 3)"  # what cropr(r=40, locs=(0, 1, 2, 3)) keeps on 196
#: the task metric, then the collapse diagnostic's (its evaluated arm ``rescored``)
_COLUMNS = (Col("miou", "mIoU %"), Col("pixel_acc", "pixel acc %"), Col("miou", "Δ mIoU vs unpruned", paired=True),
            Col("miou_deployed", "mIoU, deployed score s %"), Col("miou_fixed", "mIoU, fixed random scorer %"),
            Col("spearman", "Spearman(s, t)"), Col("overlap", "kept-set overlap"), Col("train_time_s", "wall s"))


def _rescored(experiment: str) -> Arm:
    return Arm("Cropr's weights pruned by the training-time score t", spec=experiment, kind="evaluated", reads="cropr")


@register_study("cropr_seg")
class CroprSeg(Study):
    claim = "with Last Layer Fusion, Cropr's router segments about as well as unpruned, better than fixed scorers"
    source = SEG_SOURCE
    expect = (
        Expect("Cropr + LLF keeps the unpruned model's mIoU (within 1 point)", SEG_SOURCE, arm="cropr",
               baseline="none", metric="miou", direction=1, margin=-1.0,
               reported=(-0.1, "ADE20k: -0.1 median mIoU at 2.0x"), kind="noninferior",
               why="the claim's own tolerance: within 1 mIoU point of the unpruned model"),
        router_beats(baseline="random", metric="miou", source=SEG_SOURCE),
        router_beats(baseline="topk", metric="miou", source=SEG_SOURCE),
        Expect("pruning by the training-time score t beats the deployed score s", REVIEW, arm="rescored",
               baseline="cropr", metric="miou", direction=1),
    )
    beds = {
        "scenes": Bed(
            testbed=SCENES_SEG,
            title="Token Cropr on the scene masks (segmentation): the router with LLF, fixed scorers, the collapse",
            recipe=shortened("fmnist-cropr", task="segment", label_smoothing=0.0),
            arms={
                "cropr": Arm("Token Cropr + LLF",
                             spec=f"cropr(r={_R}, queries=196, classes=11, warmup_steps=50) + llf()"),
                **{k: a for k, a in rivals(_AT, " + llf()").items() if k != "evit"},
                "none": Arm("unpruned (same fine-tune)"),
                "rescored": _rescored(f"cropr_diagnostics(images={EVAL_SUBSET}, seeds=(0, 1, 2))"),
            },
            baseline="none", grid=(SEEDS,), columns=_COLUMNS,
            smoke=scene_smoke("fmnist_scenes_seg", probe={"images": 16, "seeds": (0,), "batch": 8}),
            budget=((1, "dense reference training", 25), (12, "training", 5), (3, "diagnostics", 2.5))),
        "fmnist": Bed(
            testbed=Testbed(),  # the recipe's model, trained from scratch by every arm
            title="Token Cropr on Fashion-MNIST mosaics (segmentation): the learned router against fixed scorers",
            recipe=get_recipe("fmnist-cropr-seg"),
            arms={
                "cropr": Arm("Token Cropr", spec="cropr(r=40, queries=196, classes=11, locs=(0, 1, 2, 3), "
                                                 "warmup_steps=140) + llf()"),
                **rivals(_FMNIST_AT, " + llf()"),
                "none": Arm("unpruned (same recipe)"),
                "rescored": _rescored("cropr_diagnostics(seeds=(0, 1, 2))"),
            },
            baseline="none", grid=(SEEDS,), columns=_COLUMNS, smoke=fmnist_smoke(56),
            budget=((15, "training", 7.5),)),
    }
