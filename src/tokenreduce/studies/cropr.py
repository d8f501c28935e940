"""Token Cropr (classification): does the learned router beat fixed scorers at the same token counts?

"Token Cropr: Faster ViTs for Quite a Few Tasks" (Cropr), arXiv 2412.00965. Every arm trains with the
same recipe and keeps the same per-block token counts, so the arms differ only in who picks the kept
tokens: Cropr's cross-attention router (trained by its auxiliary heads), a fixed random subset (its own
seed follows the run's), the CLS-attention top-k, EViT (top-k that fuses what it drops), and the
unpruned model under the same recipe; seeds 0-2, paired by seed.

``scenes`` (studies/beds.py): the scene reference on the shortened fine-tune of ``fmnist-cropr`` (the
backbone at a fraction of the router's learning rate). Cropr prunes r = 16 patches after every
block but the last (17 after the first: 196 -> 179 -> ... -> 19 after blocks 0-10); with Last Layer
Fusion (``+ llf()``) the pruned tokens return before the final block. Beside the rivals, the referee's
control: a fixed random *linear scorer* (a frozen random query, ``cropr(frozen=True)``).

``fmnist``: the ``fmnist-cropr`` recipe, a fine-tune of the fmnist-vit reference (49 -> 42 -> 36 -> 30 -> 24
-> 18 patches after blocks 0-4).

The dense task (segmentation with LLF) is the study ``cropr_seg``.
"""

from __future__ import annotations

from ..study.declare import Arm, Axis, Bed, Col, Expect, Study, register_study
from ..train.recipes import get_recipe
from .beds import (
    FMNIST,
    LENGTH,
    LONGER_PENDING,
    SCENES,
    at_longer,
    fmnist_smoke,
    lengths,
    one_epoch_budget,
    scene_smoke,
    shortened,
)

SOURCE = "Token Cropr, arXiv 2412.00965"
CLS_SOURCE = f"{SOURCE}, its ImageNet classification results against other pruners"
REVIEW = "review of Token Cropr (the fixed random scorer; the dense-task inference score)"
SEEDS = Axis("seed", (0, 1, 2), "s")

_R = 16
#: Cropr's counts on the scene bed (blocks 0-10), 196 patches
_COUNTS = tuple(196 - (_R + 1) - _R * i for i in range(11))
_AT = f"counts={_COUNTS}, locs={tuple(range(11))}"
_FMNIST_AT = "counts=(42, 36, 30, 24, 18), locs=(0, 1, 2, 3, 4)"  # what cropr(r=6) keeps on 49 patches
#: the arms fine-tuned for one epoch too (studies/beds.py, LENGTH): the router, with LLF, and its rivals
LONGER = ("cropr", "cropr_llf", "topk", "random")
_COLUMNS = (Col("top1", "top-1 %"), Col("top1", "Δ top-1 vs unpruned", paired=True), Col("train_time_s", "wall s"))


#: a router gain or loss within this many top-1 points is none that matters ("equivalent within ±0.5")
_NO_GAIN = dict(delta=0.5, why="0.5 top-1 points: under half the test-item standard error of one arm's top-1 on the "
                               "2 000 test scenes (about 1.1 at 60%; 0.4 on Fashion-MNIST's 10 000)")


def router_beats(baseline: str, metric: str, source: str, **equivalence) -> Expect:
    """The paper's claim that its router beats the fixed scorer ``baseline`` at the same token counts
    (``equivalence``: ``delta`` and ``why``, the bound within which a difference reads "equivalent")."""
    return Expect(f"Cropr beats {baseline} at the same counts", source, arm="cropr", baseline=baseline,
                  metric=metric, direction=1, **equivalence)


def rivals(at: str, tail: str = "") -> dict[str, Arm]:
    """The fixed scorers at the per-block counts ``at`` (each spec followed by ``tail``, e.g. ``' + llf()'``)."""
    return {"random": Arm(f"random{tail and ' + LLF'}", spec=f"random({at}, where='block', seed={{seed}}){tail}"),
            "topk": Arm(f"top-k{tail and ' + LLF'}", spec=f"topk({at}, where='block'){tail}"),
            "evit": Arm(f"EViT{tail and ' + LLF'}", spec=f"evit({at}){tail}")}


@register_study("cropr")
class Cropr(Study):
    paper_epochs = 30
    claim = "Cropr's learned router keeps better tokens than a fixed scorer at the same per-block counts"
    source = CLS_SOURCE
    expect = (
        router_beats(baseline="random", metric="top1", source=CLS_SOURCE, **_NO_GAIN),
        router_beats(baseline="topk", metric="top1", source=CLS_SOURCE, **_NO_GAIN),
        router_beats(baseline="evit", metric="top1", source=CLS_SOURCE, **_NO_GAIN),
        Expect("the learned router beats a fixed random linear scorer", REVIEW, arm="cropr", baseline="frozen",
               metric="top1", direction=1),
        Expect("pruning to Cropr's final count costs top-1", CLS_SOURCE, arm="cropr", baseline="none", metric="top1",
               direction=-1),
        Expect("LLF raises Cropr's top-1", f"{SOURCE}, Last Layer Fusion", arm="cropr_llf", baseline="cropr",
               metric="top1", direction=1),
    )
    expect += at_longer(expect, LONGER)
    beds = {
        "scenes": Bed(
            testbed=SCENES,
            title="Token Cropr on the scene test bed (classification): the learned router against fixed scorers",
            recipe=shortened("fmnist-cropr"),
            arms=lengths({
                "cropr": Arm("Token Cropr", spec=f"cropr(r={_R}, classes=10)"),
                "cropr_llf": Arm("Token Cropr + LLF", spec=f"cropr(r={_R}, classes=10) + llf()"),
                "frozen": Arm("fixed random linear scorer (frozen query)",
                              spec=f"cropr(r={_R}, classes=10, frozen=True)"),
                **rivals(_AT),
                "none": Arm("unpruned (same fine-tune)"),
            }, LONGER),
            baseline="none", pending=LONGER_PENDING, grid=(LENGTH, SEEDS), columns=_COLUMNS, smoke=scene_smoke(),
            budget=((21, "training", 2.5), one_epoch_budget(12, 135))),
        "fmnist": Bed(
            testbed=FMNIST,
            title="Token Cropr on Fashion-MNIST classification: the learned router against fixed scorers",
            recipe=get_recipe("fmnist-cropr"),  # also `tokenreduce train --recipe fmnist-cropr`
            arms={"cropr": Arm("Token Cropr", spec="cropr(r=6, classes=10)"), **rivals(_FMNIST_AT),
                  "none": Arm("unpruned (same fine-tune)")},
            baseline="none", grid=(SEEDS,), columns=_COLUMNS, smoke=fmnist_smoke(),
            budget=((15, "training", 1.75),)),
    }
