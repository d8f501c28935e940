"""Fashion-MNIST: accuracy against measured speed-up, training-free and after a distilled fine-tune.

Every training-free method at the spec whose *measured* speed-up on the ``fmnist-vit`` reference is
nearest 1.5x and 2x (the picks below), evaluated training-free, then each pick fine-tuned with 3
seeds (``fmnist-vit-ft``: 2 epochs on all 60 000 training images, logit distillation from the
reference) and all of them timed in one interleaved run (``final``). The arm ``random-matched-
topk-1.5x`` is the random pruner at top-k's 1.5x token counts: at identical counts, does the score
buy accuracy? ``matched`` and ``matched-onnxruntime`` time that comparison again, eagerly and with
onnxruntime.

The picks are fixed here, not searched at each run: they were chosen once by ``tokenreduce eval
--budgets 1.5,2 --budget-rule measured`` on the 2-core machine (the search and its fit are recorded
in ``results/fmnist/runs/free.json``), and a declared study must train the same arms wherever it
runs (a measured pick moves with the machine). ImagePiece's 2x pick is its 1.5x pick (its strongest
training-free spec is nearest both), so it is one arm.
"""

from __future__ import annotations

from ..train.recipes import get_recipe
from .study import Arm, Axis, Col, Expect, Measure, Smoke, Study, register_study
from .testbed import Testbed

#: arm -> the pick's spec (method, target); made by the measured budget rule (module docstring)
PICKS = {
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
#: the random pruner with top-k's 1.5x per-block token counts (keep 0.55 at the same blocks)
MATCHED = "random(keep=0.55, locs=(1, 3, 4))"
#: what a label adds to the pick's name (the budget search's own record, runs/free.json)
_NOTES = {"tome-2x": " (not reached: 1.63x expected)"}

_COLUMNS = (("label", "case", "{}"), ("kind", "kind", "{}"), ("macs_speedup", "MACs x", "{:.2f}"),
            ("speedup", "speed-up b32", "{:.2f}"), ("latency_speedup", "speed-up b1", "{:.2f}"),
            ("top1", "top-1 %", "{:.2f}"), ("top1_drop", "top-1 drop", "{:.2f}"), ("top1_std", "± std", "{:.2f}"))
_SOURCE = "EViT, arXiv 2202.07800 (attentive against random token selection)"

#: the smoke's tiny model: the reference's shape (28x28, patch 4, 49 patches, 6 blocks), so that the
#: picks' schedules run unchanged, at a width that trains in seconds
_TINY = {"img_size": 28, "patch_size": 4, "in_chans": 1, "num_classes": 10, "embed_dim": 32, "depth": 6,
         "num_heads": 2, "mlp_ratio": 2.0}


def _label(arm: str) -> str:
    method, target = arm.rsplit("-", 1)
    return f"{method} {target}{_NOTES.get(arm, '')}: {PICKS[arm]}"


@register_study("fmnist")
class FmnistBudget(Study):
    title = "Fashion-MNIST: top-1 against measured speed-up, training-free and fine-tuned"
    claim = ("an informed token score (CLS attention, similarity) keeps more accuracy than random selection at "
             "the same measured speed-up or the same token counts, before and after fine-tuning")
    source = f"{_SOURCE}; the project's target: a method within 0.5 top-1 points of the reference at >= 1.5x"
    testbed = Testbed(reference="fmnist-vit")
    #: also `tokenreduce train --recipe fmnist-vit-ft`; 2 epochs on the full training set; the run's final
    #: evaluation on all 10 000 test images (the number its table reads)
    recipe = {**get_recipe("fmnist-vit-ft"), "epochs": 2, "eval_subset": None}
    arms = {**{a: Arm(_label(a), spec=s) for a, s in PICKS.items()},
            "random-matched-topk-1.5x": Arm(f"random at top-k 1.5x's token counts: {MATCHED}", spec=MATCHED)}
    baseline = "random-1.5x"
    grid = (Axis("seed", (0, 1, 2), "s"),)
    columns = (Col("top1", "top-1 % (fine-tuned)"), Col("top1", "Δ top-1 vs random 1.5x", paired=True))
    measures = (
        Measure("free", reference=None, at={}, specs=tuple(PICKS.values()), columns=_COLUMNS,
                title="Training-free: the picks on the reference (random over 3 pattern seeds)"),
        Measure("final", reference=None, at={}, specs=tuple(PICKS.values()), finetuned=tuple(PICKS), columns=_COLUMNS,
                title="The picks training-free and fine-tuned (3 seeds each), one interleaved timing run"),
        Measure("matched", reference=None, at={}, specs=(MATCHED,),
                finetuned=("random-1.5x", "topk-1.5x", "random-matched-topk-1.5x"), columns=_COLUMNS,
                title="Equal token counts: random keep 0.55 against top-k keep 0.55, eager"),
        Measure("matched-onnxruntime", reference=None, at={}, specs=(MATCHED,),
                finetuned=("random-1.5x", "topk-1.5x", "random-matched-topk-1.5x"), speed={"backend": "onnxruntime"},
                columns=_COLUMNS, title="Equal token counts, with onnxruntime (each case exported, metric eager)"),
    )
    expect = (
        Expect("at equal token counts top-k's score is more accurate than random selection, fine-tuned",
               _SOURCE, arm="topk-1.5x", baseline="random-matched-topk-1.5x", metric="top1", direction=1),
        Expect("at equal measured speed-up (1.5x) a scoring method beats random selection, fine-tuned",
               _SOURCE, arm="imagepiece-1.5x", baseline="random-1.5x", metric="top1", direction=1),
        Expect("at equal measured speed-up (2x) a scoring method beats random selection, fine-tuned",
               _SOURCE, arm="evit-2x", baseline="random-2x", metric="top1", direction=1),
    )
    smoke = Smoke(testbed=Testbed(model="vit_tiny_patch16_224", kwargs=_TINY, synthetic=True),
                  recipe={"teacher": None, "distill": [], "epochs": 1, "subset": 32, "eval_subset": 16,
                          "batch_size": 16, "eval_batch_size": 16, "warmup_epochs": 0.2, "ckpt_every": 1,
                          "augment": "none", "deterministic": True, "quiet": True},
                  grid={"seed": (0, 1)},  # two seeds: the paired test needs n >= 2
                  measure={"batch": 4, "warmup": 0, "repeats": 1, "backend": "eager"})  # exporting takes minutes
    budget = ("36 fine-tunes x ~8.5 min (0.55 s a step, 936 steps) in two 1-thread lanes on 2 CPU cores (~2.5 h), "
              "4 evaluations of ~1.5-5 min each on the 2 idle cores")
