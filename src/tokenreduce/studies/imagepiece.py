"""ImagePiece: re-tokenization against EViT and ToMe at equal cost, as an add-on, ablated, and the control
the paper lacks (the conv stem alone).

"ImagePiece: Content-aware Re-tokenization for Efficient Image Recognition", AAAI 2025, arXiv 2412.16491.
Its accuracy gain compares a conv stem + re-tokenization against a plain patch-embedding ViT and never
trains the conv stem alone. Contrasts are paired by seed (seeds 0-2).

``scenes`` (studies/beds.py; the patch-stem reference, the shortened fine-tune with logit
distillation from the reference). ImagePiece's pick is its spec nearest 1.5x measured speed-up,
``imagepiece(locs=(2, 5, 8), keep=0.7)``. Its rivals, two ways: at equal measured speed (EViT and ToMe at
their own 1.5x picks) and at equal MACs (EViT ``keep=0.61``, ToMe ``r=13``, found by a search over each
family's analytic MACs on the reference, within 1%). As an add-on, re-tokenization alone (``keep=1.0``)
in front of EViT, ToMe and DynamicViT. This project's readings of what the paper leaves open are ablated:
proportional attention (on by default) and the order of the A/B alternation (spatial by default; by
score; random). The stem-only control swaps ImagePiece's conv stem (models/stems.py) into the reference
with fresh weights: the conv stem alone and the conv stem + ImagePiece hold the stem fixed. Against the
patch-stem arms they also differ in a stem that had 100 steps to learn, so that contrast carries no claim.

``fmnist``: every arm trained from scratch with ``fmnist-vit-short``:
each stem with and without ImagePiece, EViT and ToMe with the conv stem at ImagePiece's analytic MACs
(within 1%), re-tokenization in front of EViT / ToMe at the same MACs, and the hyper-speed regime (~14% of
the tokens left). The speed measures time every reducer of a stem on that stem's seed-0 checkpoint.

``deit_s``: a timing only (``bench --stem conv``, bench/compare.py) on ``deit_small_patch16_224`` with
random weights: the plain model, both ImagePiece schedules on the patch stem, and the conv-stem model
unreduced and with each schedule, every speed-up against the plain DeiT-S (the paper's +54% throughput
counts the stem; the MACs usually quoted do not).
"""

from __future__ import annotations

from ..study.declare import (
    EQUAL_SPEED,
    OWN,
    TESTBED_TEACHER,
    Arm,
    Axis,
    Bed,
    Col,
    Expect,
    Study,
    Timing,
    register_study,
)
from ..study.testbed import Testbed
from ..train.recipes import get_recipe
from .beds import SCENES, SMOKE_MEASURE, SPEED_COLUMNS, fmnist_smoke, scene_smoke, shortened
from .deit_bench import DEIT_S, SMOKE_BENCH

_SOURCE = "ImagePiece, arXiv 2412.16491"
_GRID = (Axis("seed", (0, 1, 2), "s"),)
_ADD_ON = "Table 3 (+0.79 on average as an add-on)"
#: "at equal measured speed" is tested on the speed measure's one interleaved run (timings across sessions
#: move far more, so none are mixed)
_SPEED = ("speed", EQUAL_SPEED)

# the scene bed
_IP = "imagepiece(locs=(2, 5, 8), keep=0.7"
_FRONT = "imagepiece(locs=(2, 5, 8), keep=1.0)"  # re-tokenization only
_EVIT = "evit(keep=0.65, locs=(3, 6, 9))"
_TOME = "tome(r=(17, 17, 17, 17, 17, 17, 17, 17, 17, 17, 13, 6))"
_DYN = "dynamicvit()"
_SCENE_ARMS = {
    "none": Arm("unpruned (same fine-tune)"),
    "imagepiece": Arm("ImagePiece (1.5x measured pick)", spec=f"{_IP})"),
    "evit_speed": Arm("EViT at equal measured speed", spec=_EVIT),
    "tome_speed": Arm("ToMe at equal measured speed", spec=_TOME),
    "evit_macs": Arm("EViT at equal MACs", spec="evit(keep=0.61, locs=(3, 6, 9))"),
    "tome_macs": Arm("ToMe at equal MACs", spec="tome(r=13)"),
    "imagepiece_evit": Arm("re-tokenization + EViT", spec=f"{_FRONT} + {_EVIT}"),
    "imagepiece_tome": Arm("re-tokenization + ToMe", spec=f"{_FRONT} + {_TOME}"),
    "dynamicvit": Arm("DynamicViT", spec=_DYN),
    "imagepiece_dynamicvit": Arm("re-tokenization + DynamicViT", spec=f"{_FRONT} + {_DYN}"),
    "imagepiece_noprop": Arm("ImagePiece without proportional attention", spec=f"{_IP}, prop_attn=False)"),
    "imagepiece_score": Arm("ImagePiece, A/B alternation by score", spec=f"{_IP}, order='score')"),
    "imagepiece_random": Arm("ImagePiece, A/B alternation at random", spec=f"{_IP}, order='random', seed={{seed}})"),
    "conv": Arm("conv stem alone (the stem-only control)", options={"stem": "conv"}),
    "conv_imagepiece": Arm("conv stem + ImagePiece", options={"stem": "conv"}, spec=f"{_IP})"),
}

# the Fashion-MNIST bed (from scratch)
_FM_IP = "imagepiece(locs=(1, 2, 4))"
_FM_FRONT = "imagepiece(locs=(1, 2, 4), keep=1.0)"
_FM_ARMS = {
    "patch_none": Arm("patch-none", options={"stem": "patch"}),
    "conv_none": Arm("conv-none", options={"stem": "conv"}),
    "patch_imagepiece": Arm("patch-imagepiece", options={"stem": "patch"}, spec=_FM_IP),
    "conv_imagepiece": Arm("conv-imagepiece", options={"stem": "conv"}, spec=_FM_IP),
    "conv_evit": Arm("conv-evit", options={"stem": "conv"}, spec="evit(keep=0.74, locs=(1, 3, 4))"),
    "conv_tome": Arm("conv-tome", options={"stem": "conv"}, spec="tome(r=(5, 5, 4, 4, 4, 4))"),
    "conv_imagepiece_evit": Arm("conv-imagepiece+evit", options={"stem": "conv"},
                                spec=f"{_FM_FRONT} + evit(keep=0.76, locs=(2, 3, 5))"),
    "conv_imagepiece_tome": Arm("conv-imagepiece+tome", options={"stem": "conv"},
                                spec=f"{_FM_FRONT} + tome(r=(4, 3, 3, 3, 3, 3))"),
    "conv_imagepiece_hyper": Arm("conv-imagepiece-hyper", options={"stem": "conv"},
                                 spec="imagepiece(locs=(0, 1, 2, 3, 4), keep=0.7)"),
    "conv_evit_hyper": Arm("conv-evit-hyper", options={"stem": "conv"}, spec="evit(keep=0.44, locs=(1, 3, 4))"),
    "conv_tome_hyper": Arm("conv-tome-hyper", options={"stem": "conv"}, spec="tome(r=(9, 9, 8, 8, 8, 8))"),
}
_FM_SPEED_COLUMNS = (Col("label", "spec"), Col("kind", "kind"), Col("macs", "MACs"),
                     Col("speedup", "speed-up b32"), Col("latency_speedup", "speed-up b1"),
                     Col("ratio_vs_random", "vs random b32"), Col("latency_vs_random", "vs random b1"))

#: ImagePiece's default DeiT-S schedule and its hyper-speed one (about 13% of the tokens left)
DEIT_SPECS = ("imagepiece()", "imagepiece(locs=(1, 2, 3, 4, 5, 6, 7))")


def _stem_speed(stem: str) -> Timing:
    specs = tuple(a.spec for a in _FM_ARMS.values() if a.stem == stem and a.spec)
    return Timing(f"speed_{stem}", model=f"{stem}_none", at={"seed": 0}, specs=specs, columns=_FM_SPEED_COLUMNS,
                   title=f"Speed, {stem} stem: every reducer on the unreduced seed-0 checkpoint, one interleaved run")


def _claim(claim: str, arm: str, baseline: str, where: str, **kw) -> Expect:
    return Expect(claim, f"{_SOURCE}, {where}", arm=arm, baseline=baseline, metric="top1", direction=1, **kw)


@register_study("imagepiece")
class ImagePiece(Study):
    claim = ("ImagePiece's re-tokenization keeps more accuracy than EViT / ToMe at the same cost, alone and in "
             "front of them; the control it lacks: the conv stem alone")
    source = f"{_SOURCE}, Tables 1-3 (DeiT on ImageNet)"
    expect = (
        # at equal cost
        _claim("ImagePiece beats EViT {at_speed}", "imagepiece", "evit_speed", "Table 1", speed=_SPEED),
        _claim("ImagePiece beats ToMe {at_speed}", "imagepiece", "tome_speed", "Table 1", speed=_SPEED),
        _claim("ImagePiece beats EViT at equal MACs", "imagepiece", "evit_macs", "Table 1"),
        _claim("ImagePiece beats ToMe at equal MACs", "imagepiece", "tome_macs", "Table 1"),
        _claim("ImagePiece beats EViT at the same stem and MACs (conv stem)", "conv_imagepiece", "conv_evit",
               "Table 1"),
        _claim("ImagePiece beats ToMe at the same stem and MACs (conv stem)", "conv_imagepiece", "conv_tome",
               "Table 1"),
        _claim("hyper-speed: ImagePiece beats EViT", "conv_imagepiece_hyper", "conv_evit_hyper", "Table 2"),
        _claim("hyper-speed: ImagePiece beats ToMe", "conv_imagepiece_hyper", "conv_tome_hyper", "Table 2"),
        # as an add-on
        _claim("re-tokenization in front of EViT beats EViT alone, {at_speed}", "imagepiece_evit", "evit_speed",
               _ADD_ON, reported=(0.79, "+0.79 top-1 on average"), speed=_SPEED),
        _claim("re-tokenization in front of ToMe beats ToMe alone, {at_speed}", "imagepiece_tome", "tome_speed",
               _ADD_ON, reported=(0.79, "+0.79 top-1 on average"), speed=_SPEED),
        _claim("re-tokenization in front of EViT beats EViT alone (conv stem, equal MACs)", "conv_imagepiece_evit",
               "conv_evit", _ADD_ON, reported=(0.79, "+0.79 top-1 on average")),
        _claim("re-tokenization in front of ToMe beats ToMe alone (conv stem, equal MACs)", "conv_imagepiece_tome",
               "conv_tome", _ADD_ON, reported=(0.79, "+0.79 top-1 on average")),
        _claim("re-tokenization in front of DynamicViT beats DynamicViT alone", "imagepiece_dynamicvit",
               "dynamicvit", "Table 3 (the add-on)"),
        # this project's readings: exploratory
        _claim("proportional attention helps ImagePiece", "imagepiece", "imagepiece_noprop",
               f"{OWN} reading (on by default)"),
        _claim("spatial A/B order beats order by score", "imagepiece", "imagepiece_score",
               f"{OWN} reading (spatial by default)"),
        _claim("spatial A/B order beats a random order", "imagepiece", "imagepiece_random",
               f"{OWN} reading (spatial by default)"),
        # the stem
        _claim("conv stem + ImagePiece beats the plain ViT (the paper's comparison)", "conv_imagepiece",
               "patch_none", "Table 1 (DeiT-S)", reported=(80.22 - 79.83, "79.83 -> 80.22 top-1")),
        _claim("re-tokenization adds accuracy with the conv stem held fixed", "conv_imagepiece", "conv",
               "Table 1 (the stem-only control it lacks)"),
        _claim("re-tokenization adds accuracy with the conv stem held fixed (trained from scratch)",
               "conv_imagepiece", "conv_none", "Table 1 (the control it lacks)"),
        _claim("re-tokenization adds accuracy with the patch stem", "patch_imagepiece", "patch_none", "Table 1"),
        _claim("the conv stem alone (no re-tokenization, no pruning) adds accuracy", "conv_none", "patch_none",
               "the control the paper left out"),
    )
    beds = {
        "scenes": Bed(
            testbed=SCENES,
            title="ImagePiece on the scene test bed: re-tokenization at equal speed and MACs, as an add-on, ablated",
            recipe=shortened("fmnist-vit-ft", teacher=TESTBED_TEACHER),
            arms=_SCENE_ARMS, baseline="none", grid=_GRID,
            columns=(Col("top1", "top-1 %"), Col("top1", "Δ top-1 vs unpruned", paired=True),
                     Col("train_time_s", "wall s")),
            evaluations=(Timing("speed", at={"seed": 0},
                              finetuned=tuple(a for a in _SCENE_ARMS if a != "none"), columns=SPEED_COLUMNS,
                              title="Speed: every arm's seed-0 run against the reference, one interleaved run (each "
                                    "row with its own stem: the conv-stem rows count the conv stem)"),),
            smoke=scene_smoke(measure=SMOKE_MEASURE),
            budget=((45, "fine-tune", 2.5), (1, "speed", 5))),
        "fmnist": Bed(
            testbed=Testbed(),  # the recipe's model, from scratch
            title="ImagePiece on Fashion-MNIST: the stem-only control and the baselines at the same MACs",
            recipe=get_recipe("fmnist-vit-short"),  # also `tokenreduce train --recipe fmnist-vit-short --stem conv`
            arms=_FM_ARMS, baseline="patch_none", grid=_GRID,
            columns=(Col("top1", "top-1 %"), Col("top1", "Δ top-1 vs patch-none", paired=True),
                     Col("train_time_s", "wall s")),
            evaluations=(_stem_speed("conv"), _stem_speed("patch")),
            smoke=fmnist_smoke(measure=SMOKE_MEASURE),
            budget=((33, "training", 4.5), (2, "speed", 5))),
        "deit_s": Bed(
            title="ImagePiece on DeiT-S, the conv stem counted (CPU, random weights)",
            evaluations=(Timing("deit_small_conv", model={**DEIT_S, "stem": "conv"}, specs=DEIT_SPECS,
                               title="DeiT-S, 2 CPU threads: ImagePiece with the patch stem and with its conv stem, "
                                     "against the plain model"),),
            smoke={"bench": SMOKE_BENCH},
            budget=((1, "bench", 6),)),
    }
