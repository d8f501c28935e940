"""PiToMe: energy-steered token merging against ToMe and against the random pruner, at equal MACs.

"Accelerating Transformers with Spectrum-Preserving Token Merging", NeurIPS 2024, arXiv 2405.16148. Its
image-classification claim: off the shelf (no fine-tune), PiToMe keeps more top-1 than ToMe at the same
cost. The authors' result file ``deit_ost.csv`` (github.com/hchautran/PiToMe, added at commit 01dc2ed,
2024-02-07; DeiT-S off the shelf on ImageNet-1k, GFLOPs as the file counts them, which are MACs) gives

    GFLOPs   PiToMe   ToMe    PiToMe - ToMe
    2.92     79.08    78.41   +0.67
    2.54     78.36    77.41   +0.95
    2.22     77.40    76.24   +1.17          (unreduced: 4.60 GFLOPs, 79.88)

(its rows of this model are labelled ``DeiT-B-16``, like those of the two other models in the file; the
unreduced row, 4.60 GFLOPs at 79.88%, is DeiT-S's). Those runs predate the final official code this
project's ``pitome()`` is checked against (commit 550b5de). The paper has no random control: the claim
"PiToMe beats random at equal MACs" is this project's floor for any informed merge.

``scenes`` (studies/beds.py): the shipped reference, 12 blocks, 196 patches, head dim 24. The picks
are by analytic MACs on it (bench/budgets.py, rule 'macs'), not timed: PiToMe's spec nearest 1.5x and 2x,
``keep=0.93`` (1.52x) and ``keep=0.885`` (2.02x). At each, ToMe's and the random pruner's specs with the
same MACs: ToMe with r per block (within 0.02% and 0.15%), the random pruner at the per-block counts of a
milder PiToMe (``keep=0.939`` and ``0.893``; within 0.1% and 0.4%): the same shape of schedule, its
tokens paying for what PiToMe's scoring costs (the cosine graph, T^2 d a block: about 5% of the MACs at
this width, ToMe's matching about 1.3%).

Every arm is the paper's setting, training-free: its spec applied to the reference off the shelf
(``Arm(kind="off_the_shelf")``), scored per test item on all 10 000 test scenes, each seed one of three
disjoint folds of them; the claims take the test item as their unit (``Study.per_item``: a paired t-test
over the 10 000 per-item differences, Holm within the study and BH over the report). The measure ``free``
evaluates every spec again in one interleaved timing run (MACs, img/s and latency at bench/settings.SPEED's
batches, against the unpatched reference); a claim reads "at equal measured speed" only where it timed both
arms within study.EQUAL_SPEED of each other, else "at its own pick" with both speeds.
"""

from __future__ import annotations

from ..study.declare import EQUAL_SPEED, OWN, Arm, Axis, Bed, Col, Expect, Study, Timing, register_study
from .beds import SCENES, SMOKE_MEASURE, scene_smoke, shortened

_SOURCE = "PiToMe, arXiv 2405.16148"
_RESULTS = f"{_SOURCE}; the authors' deit_ost.csv (DeiT-S off the shelf, ImageNet-1k)"
_GRID = (Axis("seed", (0, 1, 2), "s"),)
#: "at equal measured speed" tested on the speed measure's one interleaved run (study.EQUAL_SPEED)
_SPEED = ("free", EQUAL_SPEED)
_BLOCKS = tuple(range(12))

#: target -> (PiToMe's pick, ToMe at its MACs, the random pruner at its MACs), on the scene reference
PICKS = {
    "1.5x": ("pitome(keep=0.93)",
             "tome(r=(10, 10, 10, 10, 10, 9, 9, 9, 9, 9, 9, 9))",
             f"random(counts=(185, 174, 164, 154, 145, 137, 129, 122, 115, 108, 102, 96), locs={_BLOCKS}, "
             "where='attn', seed={seed})"),
    "2x": ("pitome(keep=0.885)",
           "tome(r=15)",
           f"random(counts=(176, 158, 142, 127, 114, 102, 92, 83, 75, 67, 60, 54), locs={_BLOCKS}, where='attn', "
           "seed={seed})"),
}
#: the published PiToMe - ToMe difference nearest each target (DeiT-S: 4.60 GFLOPs unreduced)
_PUBLISHED = {"1.5x": (0.67, "+0.67 top-1 over ToMe (79.08 vs 78.41) at 2.92 GFLOPs, 1.58x"),
              "2x": (1.17, "+1.17 top-1 over ToMe (77.40 vs 76.24) at 2.22 GFLOPs, 2.07x")}

_ARMS = {
    f"{method}-{target}": Arm(f"{label.format(target)}: {spec.format(seed='s')}", spec=spec, kind="off_the_shelf")
    for target, specs in PICKS.items()
    for method, label, spec in zip(("pitome", "tome", "random"),
                                   ("PiToMe {}", "ToMe at PiToMe {}'s MACs", "random at PiToMe {}'s MACs"), specs,
                                   strict=True)
}
_COLUMNS = (Col("label", "case"), Col("kind", "kind"), Col("macs_speedup", "MACs x"),
            Col("speedup", "speed-up b32"), Col("latency_speedup", "speed-up b1"),
            Col("top1", "top-1 %"), Col("top1_std", "± std"))


def _beats_tome(target: str) -> Expect:
    return Expect(f"at ~{target} MACs PiToMe keeps more top-1 than ToMe at equal MACs ({{at_speed}}), off the shelf",
                  _RESULTS, arm=f"pitome-{target}", baseline=f"tome-{target}", metric="top1", direction=1,
                  reported=_PUBLISHED[target], speed=_SPEED)


def _beats_random(target: str) -> Expect:
    return Expect(f"at ~{target} MACs PiToMe beats the random pruner at equal MACs ({{at_speed}}), off the shelf",
                  f"{_SOURCE} (the informed merge against {OWN} random floor; the paper has none)",
                  arm=f"pitome-{target}", baseline=f"random-{target}", metric="top1", direction=1, speed=_SPEED)


@register_study("pitome")
class PiToMeStudy(Study):
    claim = "PiToMe's energy-steered merging keeps more top-1 than ToMe and than random pruning at the same MACs"
    source = f"{_SOURCE}, image classification (DeiT off the shelf)"
    expect = (*(_beats_tome(t) for t in PICKS), *(_beats_random(t) for t in PICKS))
    beds = {
        "scenes": Bed(
            testbed=SCENES,
            title="PiToMe on the scene test bed: against ToMe and the random pruner at PiToMe's 1.5x and 2x MACs",
            recipe=shortened("fmnist-vit-ft", eval_subset=None),
            arms=_ARMS, baseline="tome-1.5x", grid=_GRID,
            columns=(Col("top1", "top-1 % (off the shelf, per fold)"),
                     Col("top1", "Δ top-1 vs ToMe 1.5x", paired=True)),
            evaluations=(
                Timing("free", columns=_COLUMNS,
                        specs=tuple(spec.format(seed=0) for specs in PICKS.values() for spec in specs),
                        title="Off the shelf, one interleaved timing run: every arm's spec on the reference "
                              "(the random pruner at pattern seed 0)"),
            ),
            smoke=scene_smoke(measure=SMOKE_MEASURE),
            budget=((18, "fold evaluation", 0.25), (1, "speed", 5))),
    }
