"""SAINT: dropping redundant tokens against merging them (ToMe, PiToMe) at equal MACs, each against its random
pruner, and the official batch-mean count against a calibrated fixed one.

"Similarity-Aware Token Pruning: Your VLM but Faster", arXiv 2503.11549. Its ViT claims, off the shelf on
ImageNet-1k: dropping similar tokens beats merging them at the same cost, and SAINT doubles the throughput of
ViT-H/14 at 224 px for 0.6 top-1 points, 0.8 above the strongest baseline (the abstract). The official
timm path (github.com/ArmenJeddi/saint, ViT/example_timm.py) drops in the first half of the blocks, with a
count per block that is the batch mean of the per-image counts (``saint(count='batch')``): an image's
prediction depends on the other images of its evaluation batch.

``scenes`` (studies/beds.py): the shipped reference, 12 blocks, 196 patches. The picks are by analytic
MACs on it (bench/budgets.py's family and rule 'macs', not timed): SAINT's spec nearest 1.5x and 2x in its
family (r per block in the first six blocks), ``r=12`` (1.498x) and ``r=19`` (1.999x). At each, ToMe with r
per block (within 0.11% and 0.19% of SAINT's MACs) and PiToMe (``keep=0.934``, 0.7% more MACs, the nearest
its floors allow; ``keep=0.886``, within 0.06%). Each of the three has its matched random pruner: the random
pruner at its own per-block counts (its schedule's speed limit, no scoring).

The official count: ``saint(count='batch')`` at the official threshold 0.75, K 5, gamma 10, scored in the
recipe's evaluation batches of 250, against the same rule made batch-independent, the fixed count calibrated
on 1 000 held-out training scenes as one batch (``methods.saint.r_from_tokens``): 196 -> 115 -> 80 -> 63 ->
53 -> 46 -> 43 patches in the first six blocks (3.84x fewer MACs). The claim: the batch dependence changes
top-1 by less than half a point.

``scenes_free``: the class-token-free variant of the scene reference, ``scenes-vit-free`` (the
reference without its class token, the head on the mean of the normed tokens,
``models.variants.without_class_token``, fine-tuned one epoch, 937 steps: recipe ``scenes-vit-free``, shipped
with its training record). The same picks by analytic MACs on it
(196 patches, no class token): SAINT ``r=12`` (1.501x) and ``r=19`` (2.006x), ToMe the same r per block (within 0.11%
and 0.19%), PiToMe ``keep=0.932`` (0.70% more, the nearest its floors allow) and ``keep=0.886`` (0.07% less), each
with its matched random pruner. The scores at equal counts, on both beds: top-k keeping half the tokens after
blocks 3, 6 and 9 at the block's end (``where='block'``: the shift of the MLP branch, the paper's choice; 196 ->
98 -> 49 -> 25 patches, 2.04x fewer MACs) by the representation shift, by the attention a token receives
(``scenes_free``) or by the class token's attention (``scenes``), against the random pruner at those counts.

Its timing measure ran apart, alone on the idle machine, after the fold evaluations.

Every arm is the paper's setting, training-free: its spec applied to the reference off the shelf
(``Arm(kind="off_the_shelf")``), scored per test item on all 10 000 test scenes, each seed one of three
disjoint folds of them; the claims take the test item as their unit (``Study.per_item``). The measure
``free`` evaluates every fixed-count spec again in one interleaved timing run (MACs, img/s and latency at
bench/settings.SPEED's batches); a claim reads "at equal measured speed" only where it timed both arms within
study.EQUAL_SPEED of each other. The official count is not timed: its MACs follow the batch.
"""

from __future__ import annotations

import dataclasses

from ..models.variants import FREE_KWARGS
from ..study.declare import EQUAL_SPEED, OWN, Arm, Axis, Bed, Col, Expect, Study, Timing, register_study
from ..study.testbed import Testbed
from .beds import SCENES, SMOKE_MEASURE, scene_smoke, shortened

_SOURCE = "SAINT, arXiv 2503.11549"
_RESULTS = (f"{_SOURCE} (abstract: dropping similar tokens beats merging them; ViT-H/14 2x throughput at -0.6 top-1 "
            "on ImageNet-1k, 0.8 above the strongest baseline)")
_GRID = (Axis("seed", (0, 1, 2), "s"),)
#: "at equal measured speed" tested on the speed measure's one interleaved run (study.EQUAL_SPEED)
_SPEED = ("free", EQUAL_SPEED)
_BLOCKS = tuple(range(12))


def _random(counts: tuple[int, ...]) -> str:
    """The random pruner at ``counts`` patches after the first len(counts) blocks, its seed the run's."""
    return f"random(counts={counts}, locs={_BLOCKS[:len(counts)]}, where='attn', seed={{seed}})"


#: target -> method -> (its spec at SAINT's MACs, its matched random pruner), on the scene reference
PICKS = {
    "1.5x": {
        "saint": ("saint(r=(12, 12, 12, 12, 12, 12, 0, 0, 0, 0, 0, 0))", _random((184, 172, 160, 148, 136, 124))),
        "tome": ("tome(r=(10, 10, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9))",
                 _random((186, 176, 167, 158, 149, 140, 131, 122, 113, 104, 95, 86))),
        "pitome": ("pitome(keep=0.934)", _random((184, 172, 161, 151, 142, 133, 125, 117, 110, 103, 97, 91))),
    },
    "2x": {
        "saint": ("saint(r=(19, 19, 19, 19, 19, 19, 0, 0, 0, 0, 0, 0))", _random((177, 158, 139, 120, 101, 82))),
        "tome": ("tome(r=(15, 15, 15, 15, 15, 15, 14, 14, 14, 14, 14, 14))",
                 _random((181, 166, 151, 136, 121, 106, 92, 78, 64, 50, 36, 22))),
        "pitome": ("pitome(keep=0.886)", _random((174, 155, 138, 123, 109, 97, 86, 77, 69, 62, 55, 49))),
    },
}
_NAMES = {"saint": "SAINT", "tome": "ToMe", "pitome": "PiToMe"}
#: the official count at the official threshold, K and gamma, and the same rule's counts calibrated on 1 000
#: held-out training scenes as one batch (the module docstring)
OFFICIAL = "saint(count='batch', threshold=0.75)"
CALIBRATED = "saint(r=(81, 35, 17, 10, 7, 3, 0, 0, 0, 0, 0, 0), threshold=0.75)"

_ARMS = {
    **{f"{method}-{target}": Arm(f"{_NAMES[method]} {target}: {spec}", spec=spec, kind="off_the_shelf")
       for target, picks in PICKS.items() for method, (spec, _) in picks.items()},
    **{f"random_{method}-{target}": Arm(f"random at {_NAMES[method]} {target}'s counts", spec=rand,
                                        kind="off_the_shelf")
       for target, picks in PICKS.items() for method, (_, rand) in picks.items()},
    "saint_batch": Arm(f"SAINT, the official batch-mean count: {OFFICIAL}", spec=OFFICIAL, kind="off_the_shelf"),
    "saint_calibrated": Arm(f"SAINT, the count calibrated on held-out scenes: {CALIBRATED}", spec=CALIBRATED,
                            kind="off_the_shelf"),
}
_COLUMNS = (Col("label", "case"), Col("kind", "kind"), Col("macs_speedup", "MACs x"),
            Col("speedup", "speed-up b32"), Col("latency_speedup", "speed-up b1"),
            Col("top1", "top-1 %"), Col("top1_std", "± std"))


def _drop_beats(merge: str, target: str) -> Expect:
    return Expect(f"at ~{target} MACs dropping (SAINT) keeps more top-1 than merging ({_NAMES[merge]}) at equal MACs "
                  "({at_speed}), off the shelf", _RESULTS, arm=f"saint-{target}", baseline=f"{merge}-{target}",
                  metric="top1", direction=1, speed=_SPEED)


def _beats_random(method: str, target: str) -> Expect:
    return Expect(f"at ~{target} MACs {_NAMES[method]} beats the random pruner at its own counts, off the shelf",
                  f"{_SOURCE} (each informed reduction against {OWN} random floor; the paper has none)",
                  arm=f"{method}-{target}", baseline=f"random_{method}-{target}", metric="top1", direction=1)


_BATCH = Expect("the official batch-mean count keeps the top-1 of the same rule's count calibrated on held-out scenes "
                "(within half a point), off the shelf", f"{_SOURCE}; the official ViT/saint/prune.py (r = the batch "
                "mean of the per-image counts, read with .item())", arm="saint_batch", baseline="saint_calibrated",
                metric="top1", direction=1, margin=0.5, kind="equivalent",
                why="half a top-1 point: below the published gaps between the methods compared here (SAINT over "
                    "the strongest baseline 0.8, PiToMe over ToMe 0.67 to 1.17), so a batch dependence within it "
                    "could not reverse them")


# ----------------------------------------------------------------------------- the class-token-free bed
#: the scene reference without its class token, fine-tuned one epoch with a pooled head (recipe scenes-vit-free)
SCENES_FREE = Testbed(reference="scenes-vit-free")
#: target -> method -> (its spec at SAINT's MACs, its matched random pruner), on the class-token-free reference
FREE_PICKS = {
    "1.5x": {**PICKS["1.5x"], "pitome": ("pitome(keep=0.932)",
                                          _random((183, 171, 160, 150, 140, 131, 123, 115, 108, 101, 95, 89)))},
    "2x": PICKS["2x"],
}
#: top-k at equal counts by each score (the module docstring), and the random pruner at those counts
_AT_COUNTS = "keep=0.5, locs=(3, 6, 9), where='block'"
_RANDOM_AT_COUNTS = "random(counts=(98, 49, 25), locs=(3, 6, 9), where='block', seed={seed})"
_SCORES = {"shift": "the representation shift", "received": "the attention it receives",
           "cls": "the class token's attention"}


def _score_arms(*scores: str) -> dict[str, Arm]:
    """top-k by each of ``scores`` at the counts of :data:`_AT_COUNTS`, and the random pruner at them."""
    return {**{f"topk_{s}": Arm(f"top-k by {_SCORES[s]}: topk({_AT_COUNTS}, score='{s}')",
                                spec=f"topk({_AT_COUNTS}, score='{s}')", kind="off_the_shelf") for s in scores},
            "random_topk": Arm("random at top-k's counts", spec=_RANDOM_AT_COUNTS, kind="off_the_shelf")}


_FREE_ARMS = {
    **{f"{method}-{target}": Arm(f"{_NAMES[method]} {target}: {spec}", spec=spec, kind="off_the_shelf")
       for target, picks in FREE_PICKS.items() for method, (spec, _) in picks.items()},
    **{f"random_{method}-{target}": Arm(f"random at {_NAMES[method]} {target}'s counts", spec=rand,
                                        kind="off_the_shelf")
       for target, picks in FREE_PICKS.items() for method, (_, rand) in picks.items()},
    **_score_arms("shift", "received"),
}
_SHIFT_SOURCE = ("Representation Shift, arXiv 2508.00367 (abstract and comparisons: the shift of a token through a "
                 "layer ranks tokens better than attention-map scores, training-free, and needs no attention map)")


def _shift_beats(baseline: str, what: str, source: str = _SHIFT_SOURCE) -> Expect:
    return Expect(f"at equal counts (half the tokens kept after blocks 3, 6, 9) top-k by the representation shift "
                  f"keeps more top-1 than by {what}, off the shelf", source, arm="topk_shift",
                  baseline=baseline, metric="top1", direction=1)


#: declared before any run of them (tested on each bed that has both arms)
_SCORE_CLAIMS = (_shift_beats("topk_received", "the attention a token receives"),
                 _shift_beats("topk_cls", "the class token's attention"),
                 _shift_beats("random_topk", "the random pruner at those counts",
                              f"Representation Shift, arXiv 2508.00367 (against {OWN} random floor; the paper "
                              "compares attention-map scores, not random)"))
_FREE_SMOKE = scene_smoke(measure=SMOKE_MEASURE)
_FREE_BED = Bed(
    testbed=SCENES_FREE,
    title="SAINT on the class-token-free scene reference: against ToMe and PiToMe at SAINT's 1.5x and 2x MACs, "
          "each against the random pruner at its counts, and the representation shift against the received "
          "attention and random at equal counts",
    recipe=shortened("fmnist-vit-ft", eval_subset=None),
    arms=_FREE_ARMS, baseline="saint-1.5x", grid=_GRID,
    columns=(Col("top1", "top-1 % (off the shelf, per fold)"), Col("top1", "Δ top-1 vs SAINT 1.5x", paired=True)),
    evaluations=(
        Timing("free", columns=_COLUMNS,
                specs=tuple(spec.format(seed=0) for picks in FREE_PICKS.values() for pair in picks.values()
                            for spec in pair),
                title="Off the shelf, one interleaved timing run: every fixed-count arm's spec on the class-token-free "
                      "reference (the random pruners at pattern seed 0)"),
    ),
    smoke={**_FREE_SMOKE, "testbed": dataclasses.replace(
        _FREE_SMOKE["testbed"], kwargs={**dict(_FREE_SMOKE["testbed"].kwargs), **FREE_KWARGS})},
    budget=((1, "reference fine-tune", 35), (45, "fold evaluation", 0.9), (1, "speed", 8)))


@register_study("saint")
class SaintStudy(Study):
    claim = ("dropping redundant tokens by SAINT's similarity graph keeps more top-1 than merging them (ToMe, PiToMe) "
             "at the same MACs; the official count's batch dependence does not change top-1")
    source = f"{_SOURCE}, image classification (ViTs off the shelf)"
    expect = (*(_drop_beats(m, t) for t in PICKS for m in ("tome", "pitome")),
              *(_beats_random(m, t) for t in PICKS for m in _NAMES), _BATCH, *_SCORE_CLAIMS)
    beds = {
        "scenes": Bed(
            testbed=SCENES,
            title="SAINT on the scene test bed: against ToMe and PiToMe at SAINT's 1.5x and 2x MACs, each against "
                  "the random pruner at its counts, and the official batch-mean count against a calibrated one",
            recipe=shortened("fmnist-vit-ft", eval_subset=None),
            arms={**_ARMS, **_score_arms("shift", "cls")}, baseline="saint-1.5x", grid=_GRID,
            columns=(Col("top1", "top-1 % (off the shelf, per fold)"),
                     Col("top1", "Δ top-1 vs SAINT 1.5x", paired=True)),
            evaluations=(
                Timing("free", columns=_COLUMNS,
                        specs=(*(spec.format(seed=0) for picks in PICKS.values() for pair in picks.values()
                                 for spec in pair), CALIBRATED),
                        title="Off the shelf, one interleaved timing run: every fixed-count arm's spec on the "
                              "reference (the random pruners at pattern seed 0)"),
            ),
            smoke=scene_smoke(measure=SMOKE_MEASURE),
            budget=((42, "fold evaluation", 0.25), (1, "speed", 8))),
        "scenes_free": _FREE_BED,
    }
