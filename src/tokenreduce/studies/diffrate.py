"""DiffRate: prune-then-merge against prune-only and merge-only at the same per-block token counts.

"DiffRate: Differentiable Compression Rate for Efficient Vision Transformers", ICCV 2023, arXiv
2305.17997. Its premise: token pruning and merging, done together in each block (prune by class-token
attention, then merge the least attended survivors into their most similar kept token), compress better
than either alone. Its published DeiT-S schedule at 2.9 G MACs (``compression_rate.json``, ViT-S-DeiT
2.9) gives 79.54 top-1 off the shelf on ImageNet-1k (the official README: ``main.py --eval
--load_compression_rate --target_flops 2.9`` prints Acc@1 79.538, flops 2.905; DeiT-S unreduced: 79.8).

``scenes`` (studies/beds.py): the shipped reference has DeiT-S's shape (12 blocks, 196 patches), so
the published schedule runs unchanged, ``diffrate(schedule='deit_s-2.9')``: 196 -> 193 -> 175 -> ... -> 55
-> 2 patches. The two controls remove the same number of tokens in every block, one way only:
prune-only drops what DiffRate prunes and merges, by the same class-token ranking
(``diffrate(prune=COUNTS)``); merge-only merges it (``diffrate(merge=COUNTS)``), COUNTS the patches
DiffRate leaves after each block (``methods.diffrate.kept_counts``). The three have equal MACs up to the
matching's cost (prune-only has none).

Every arm is the paper's setting, training-free: its spec applied to the reference off the shelf
(``Arm(kind="off_the_shelf")``), scored per test item on all 10 000 test scenes, each seed one of three
disjoint folds of them; the claims take the test item as their unit (``Study.per_item``: a paired
t-test over the 10 000 per-item differences). The measure ``free`` evaluates the three specs again in one
interleaved timing run (MACs, img/s and latency at bench/settings.SPEED's batches).
"""

from __future__ import annotations

from ..methods.diffrate import DEFAULT, kept_counts, published
from ..study.declare import Arm, Axis, Bed, Col, Expect, Study, Timing, register_study
from .beds import SCENES, SMOKE_MEASURE, scene_smoke, shortened

_SOURCE = ("DiffRate, arXiv 2305.17997 (prune, then merge: Fig. 3); the official README (DeiT-S at 2.9 G MACs: 79.54 "
           "off the shelf)")
_GRID = (Axis("seed", (0, 1, 2), "s"),)
#: patches left after each block by DiffRate's published DeiT-S 2.9 G MACs schedule (196 patches)
COUNTS = kept_counts(*published(DEFAULT), 196)

_SPEC = f"diffrate(schedule={DEFAULT!r})"
_ARMS = {
    "diffrate": Arm(f"DiffRate, prune then merge: {_SPEC}", spec=_SPEC, kind="off_the_shelf"),
    "prune_only": Arm("prune-only at DiffRate's counts", spec=f"diffrate(prune={COUNTS})", kind="off_the_shelf"),
    "merge_only": Arm("merge-only at DiffRate's counts", spec=f"diffrate(merge={COUNTS})", kind="off_the_shelf"),
}
_COLUMNS = (Col("label", "case"), Col("kind", "kind"), Col("macs_speedup", "MACs x"),
            Col("speedup", "speed-up b32"), Col("latency_speedup", "speed-up b1"), Col("top1", "top-1 %"))


def _beats(control: str, words: str) -> Expect:
    return Expect(f"prune-then-merge keeps more top-1 than {words} at the same per-block counts, off the shelf",
                  _SOURCE, arm="diffrate", baseline=control, metric="top1", direction=1)


@register_study("diffrate")
class DiffRateStudy(Study):
    claim = ("pruning by class-token attention and then merging keeps more accuracy than pruning alone or merging "
             "alone at the same per-block token counts")
    source = _SOURCE
    expect = (_beats("prune_only", "prune-only"), _beats("merge_only", "merge-only"))
    beds = {
        "scenes": Bed(
            testbed=SCENES,
            title="DiffRate on the scene test bed: its DeiT-S 2.9 G MACs schedule, prune-then-merge against each "
                  "alone",
            recipe=shortened("fmnist-vit-ft", eval_subset=None),
            arms=_ARMS, baseline="diffrate", grid=_GRID,
            columns=(Col("top1", "top-1 % (off the shelf, per fold)"), Col("top1", "Δ top-1 vs DiffRate", paired=True)),
            evaluations=(
                Timing("free", columns=_COLUMNS, specs=tuple(a.spec for a in _ARMS.values()),
                        title="Off the shelf, one interleaved timing run: each arm's spec on the reference"),
            ),
            smoke=scene_smoke(measure=SMOKE_MEASURE),
            budget=((9, "fold evaluation", 0.25), (1, "speed", 3))),
    }
