"""The baselines' benchmark: accuracy at ~1.5x and ~2x measured speed-up, training-free and fine-tuned, each
method against the random pruner at its own token counts and at the same measured speed-up.

Every training-free method at the spec whose *measured* speed-up on a bed's reference is nearest 1.5x and
2x (its picks), evaluated training-free (the measure ``free``), then fine-tuned with seeds 0-2 and timed
in one interleaved run beside the training-free picks (``final``). For a pick ``X``, ``random~X`` is the
random pruner replaying its per-block token counts and placement: at identical counts, does the method's
score or merge buy accuracy? ``random-1.5x`` / ``random-2x`` are the random pruner's own picks.

The picks are fixed here, not searched at each run: ``tokenreduce eval --budgets 1.5,2 --budget-rule
measured --match-random`` chose them once on the 2-core machine (``free.json`` of each bed records the
search), and a declared study trains the same arms wherever it runs (a measured pick moves with the
machine).

``scenes`` (studies/beds.py): the shortened fine-tune with logit distillation from the reference; every
pick with its ``random~`` arm; DynamicViT, the learned baseline, fine-tuned at the keep rates nearest 1.5x
and 2x when its speed was timed on the reference (it has no training-free row). Cropr and BSPF are
compared with the random pruner at their own counts in their own studies.

``fmnist``: ``fmnist-vit-ft`` (logit distillation from the reference) on the whole training set for two
epochs, scored on the whole test set; ImagePiece's 2x pick is its 1.5x pick (one arm); top-k's
1.5x pick has its ``random~`` arm, and the measures ``matched`` and ``matched-onnxruntime`` time that
comparison again, eagerly and with onnxruntime.
"""

from __future__ import annotations

from ..study.declare import EQUAL_SPEED, TESTBED_TEACHER, Arm, Axis, Bed, Col, Expect, Study, Timing, register_study
from ..train.recipes import get_recipe
from .beds import (
    FMNIST,
    LENGTH,
    LONGER_PENDING,
    SCENES,
    SMOKE_MEASURE,
    at_longer,
    fmnist_smoke,
    lengths,
    one_epoch_budget,
    scene_smoke,
    shortened,
)

_SOURCE = "EViT, arXiv 2202.07800 (attentive against random token selection); ToMe, arXiv 2210.09461"
_GRID = (Axis("seed", (0, 1, 2), "s"),)

# the scene bed: method-target -> (the pick, the random pruner at its counts)
SCENE_PICKS = {
    "ctp-1.5x": ("ctp(counts=(139, 98, 48), locs=(3, 7, 9))",
                 "random(counts=(139, 98, 48), locs=(3, 7, 9), where='block', seed={seed})"),
    "ctp-2x": ("ctp(counts=(74, 28, 4), locs=(3, 7, 9))",
               "random(counts=(74, 28, 4), locs=(3, 7, 9), where='block', seed={seed})"),
    "evit-1.5x": ("evit(keep=0.65, locs=(3, 6, 9))", "random(counts=(129, 85, 57), locs=(3, 6, 9), where='attn', "
                                                       "seed={seed})"),
    "evit-2x": ("evit(keep=0.35, locs=(3, 6, 9))", "random(counts=(70, 26, 11), locs=(3, 6, 9), where='attn', "
                                                     "seed={seed})"),
    "imagepiece-1.5x": ("imagepiece(locs=(2, 5, 8), keep=0.7)",
                        "random(counts=(180, 126, 116, 82, 75, 53), locs=(2, 3, 5, 6, 8, 9), where='attn', "
                        "seed={seed})"),
    "imagepiece-2x": ("imagepiece(locs=(2, 5, 8), keep=0.4)",
                      "random(counts=(180, 72, 66, 27, 25, 10), locs=(2, 3, 5, 6, 8, 9), where='attn', seed={seed})"),
    "tome-1.5x": ("tome(r=(17, 17, 17, 17, 17, 17, 17, 17, 17, 17, 13, 6))",
                  "random(counts=(179, 162, 145, 128, 111, 94, 77, 60, 43, 26, 13, 7), locs=(0, 1, 2, 3, 4, 5, 6, 7, "
                  "8, 9, 10, 11), where='attn', seed={seed})"),
    "tome-2x": ("tome(r=(24, 24, 24, 24, 24, 24, 24, 14, 7, 3, 2, 1))",
                "random(counts=(172, 148, 124, 100, 76, 52, 28, 14, 7, 4, 2, 1), locs=(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, "
                "10, 11), where='attn', seed={seed})"),
    "topk-1.5x": ("topk(keep=0.7, locs=(3, 6, 9))", "random(counts=(138, 97, 68), locs=(3, 6, 9), where='attn', "
                                                      "seed={seed})"),
    "topk-2x": ("topk(keep=0.45, locs=(3, 6, 9))", "random(counts=(89, 41, 19), locs=(3, 6, 9), where='attn', "
                                                     "seed={seed})"),
}
#: the learned baseline's picks, timed on the reference (its cost does not depend on its predictors' weights)
LEARNED_PICKS = {
    "dynamicvit-1.5x": ("dynamicvit(keep=0.7, locs=(2, 5, 8))",
                        "random(counts=(137, 96, 67), locs=(2, 5, 8), where='block', seed={seed})"),
    "dynamicvit-2x": ("dynamicvit(keep=0.45, locs=(2, 5, 8))",
                      "random(counts=(88, 39, 17), locs=(2, 5, 8), where='block', seed={seed})"),
}
#: the random pruner's own picks at the two measured speed-ups
SCENE_RANDOM = {"random-1.5x": "random(keep=0.65, locs=(3, 6, 9), seed={seed})",
                "random-2x": "random(keep=0.45, locs=(3, 6, 9), seed={seed})"}

# the Fashion-MNIST bed: arm -> the pick's spec
FMNIST_PICKS = {
    "ctp-1.5x": "ctp(counts=(24, 12, 3), locs=(1, 3, 4))",
    "evit-1.5x": "evit(keep=0.45, locs=(1, 3, 4))",
    "imagepiece-1.5x": "imagepiece(locs=(1, 2, 4), keep=0.2)",
    "random-1.5x": "random(keep=0.6, locs=(1, 3, 4))",
    "tome-1.5x": "tome(r=(15, 15, 9, 5, 2, 1))",
    "topk-1.5x": "topk(keep=0.55, locs=(1, 3, 4))",
    "ctp-2x": "ctp(counts=(12, 3, 1), locs=(1, 3, 4))",
    "evit-2x": "evit(keep=0.2, locs=(1, 3, 4))",
    "random-2x": "random(keep=0.3, locs=(1, 3, 4))",
    "tome-2x": "tome(r=(17, 16, 8, 4, 2, 1))",
    "topk-2x": "topk(keep=0.2, locs=(1, 3, 4))",
}
#: the random pruner with top-k's 1.5x per-block token counts on the Fashion-MNIST reference
FMNIST_MATCHED = "random(keep=0.55, locs=(1, 3, 4))"
_NOTES = {"tome-2x": " (not reached: 1.63x expected)"}  # what the fmnist budget search's record says

_COLUMNS = (Col("label", "case"), Col("kind", "kind"), Col("macs_speedup", "MACs x"),
            Col("speedup", "speed-up b32"), Col("latency_speedup", "speed-up b1"),
            Col("top1", "top-1 %"), Col("top1_std", "± std"))
_FM_COLUMNS = (*_COLUMNS[:6], Col("top1_drop", "top-1 drop"), _COLUMNS[6])


def _scene_arms() -> dict[str, Arm]:
    arms = {}
    for name, (pick, matched) in {**SCENE_PICKS, **LEARNED_PICKS}.items():
        arms[name] = Arm(f"{name.replace('-', ' ')}: {pick}", spec=pick)
        arms[f"random~{name}"] = Arm(f"random at {name}'s counts", spec=matched)
    arms.update({name: Arm(f"{name.replace('-', ' ')}: {spec.format(seed='s')}", spec=spec)
                 for name, spec in SCENE_RANDOM.items()})
    return arms


def _fmnist_arms() -> dict[str, Arm]:
    def label(arm: str) -> str:
        method, target = arm.rsplit("-", 1)
        return f"{method} {target}{_NOTES.get(arm, '')}: {FMNIST_PICKS[arm]}"

    return {**{a: Arm(label(a), spec=s) for a, s in FMNIST_PICKS.items()},
            "random~topk-1.5x": Arm(f"random at topk-1.5x's counts: {FMNIST_MATCHED}", spec=FMNIST_MATCHED)}


def _free(spec: str) -> str:
    return spec.format(seed=0)


#: the family claim over every training-free pick's "beats random at its own token counts" (scenes: 10 picks)
INFORMED = "every informed score or merge (the training-free picks) beats random at its own token counts, fine-tuned"


def _beats_matched(name: str, family: str = "") -> Expect:
    return Expect(f"{name}: the method beats random at its own token counts, fine-tuned", _SOURCE, arm=name,
                  baseline=f"random~{name}", metric="top1", direction=1, family=family)


def _beats_random_at_speed(name: str, method: str) -> Expect:
    """The picks nearest one speed-up target: "at equal measured speed" only where the final timing run shows
    the two within :data:`EQUAL_SPEED` (a pick made on another machine need not land there)."""
    target = name.rsplit("-", 1)[1]
    return Expect(f"{method} beats random selection {{at_speed}}, fine-tuned (the picks nearest ~{target})", _SOURCE,
                  arm=name, baseline=f"random-{target}", metric="top1", direction=1, speed=("final", EQUAL_SPEED))


_MATCHED_ARMS = ("random-1.5x", "topk-1.5x", "random~topk-1.5x")
#: the arms fine-tuned for one epoch too (studies/beds.py, LENGTH): DynamicViT, whose predictors start
#: untrained, and top-k, the training-free control, each with the random pruner at its counts
LONGER = ("dynamicvit-1.5x", "random~dynamicvit-1.5x", "topk-1.5x", "random~topk-1.5x")


@register_study("baselines")
class Baselines(Study):
    paper_epochs = 30
    claim = ("an informed token score or merge keeps more accuracy than random selection at the same token "
             "counts and at the same measured speed-up, before and after fine-tuning")
    source = _SOURCE
    expect = (
        *(_beats_matched(name, INFORMED) for name in SCENE_PICKS),
        *(_beats_matched(name) for name in LEARNED_PICKS),
        _beats_random_at_speed("tome-1.5x", "ToMe"),
        _beats_random_at_speed("tome-2x", "ToMe"),
        _beats_random_at_speed("imagepiece-1.5x", "ImagePiece"),
        _beats_random_at_speed("evit-2x", "EViT"),
    )
    expect += at_longer(expect, LONGER)
    beds = {
        "scenes": Bed(
            testbed=SCENES,
            title="The scene test bed: top-1 at ~1.5x and ~2x measured speed-up, training-free and fine-tuned",
            recipe=shortened("fmnist-vit-ft", teacher=TESTBED_TEACHER),
            arms=lengths(_scene_arms(), LONGER), baseline="random-1.5x", pending=LONGER_PENDING, grid=(LENGTH, *_GRID),
            columns=(Col("top1", "top-1 % (fine-tuned)"), Col("top1", "Δ top-1 vs random 1.5x", paired=True),
                     Col("train_time_s", "wall s")),
            evaluations=(
                Timing("free", columns=_COLUMNS,
                        specs=(*(_free(s) for pair in SCENE_PICKS.values() for s in pair),
                               *(_free(matched) for _, matched in LEARNED_PICKS.values()),
                               *map(_free, SCENE_RANDOM.values())),
                        title="Training-free: every pick and its matched random pruner on the reference (DynamicViT, "
                              "learned, only its matched pruner)"),
                Timing("final", finetuned=tuple(_scene_arms()), columns=_COLUMNS,
                        title="Fine-tuned (3 seeds each), one interleaved timing run"),
            ),
            smoke=scene_smoke(measure=SMOKE_MEASURE),
            budget=((72, "fine-tune", 2.5), (6, "DynamicViT fine-tune", 6), (2, "evaluation", 5),
                    one_epoch_budget(12, 170))),
        "fmnist": Bed(
            testbed=FMNIST,
            title="Fashion-MNIST: top-1 against measured speed-up, training-free and fine-tuned",
            # fmnist-vit-ft for 2 epochs on the full training set, scored on all 10 000 test images
            recipe=get_recipe("fmnist-vit-ft", epochs=2, eval_subset=None),
            arms=_fmnist_arms(), baseline="random-1.5x", grid=_GRID,
            columns=(Col("top1", "top-1 % (fine-tuned)"), Col("top1", "Δ top-1 vs random 1.5x", paired=True)),
            evaluations=(
                Timing("free", specs=tuple(FMNIST_PICKS.values()), columns=_FM_COLUMNS,
                        title="Training-free: the picks on the reference (random over 3 pattern seeds)"),
                Timing("final", specs=tuple(FMNIST_PICKS.values()),
                        finetuned=tuple(FMNIST_PICKS), columns=_FM_COLUMNS,
                        title="The picks training-free and fine-tuned (3 seeds each), one interleaved timing run"),
                Timing("matched", specs=(FMNIST_MATCHED,), finetuned=_MATCHED_ARMS,
                        columns=_FM_COLUMNS, title="Equal token counts: random keep 0.55 against top-k keep 0.55, "
                                                   "eager"),
                Timing("matched-onnxruntime", specs=(FMNIST_MATCHED,), finetuned=_MATCHED_ARMS,
                        settings={"backend": "onnxruntime"}, columns=_FM_COLUMNS,
                        title="Equal token counts, with onnxruntime (each case exported, metric eager)"),
            ),
            smoke=fmnist_smoke(measure={**SMOKE_MEASURE, "backend": "eager"}),  # exporting takes minutes
            budget=((36, "fine-tune", 8.5), (4, "evaluation", 3.25))),
    }
