"""The baseline benchmark on the scene test bed: accuracy at ~1.5x and ~2x measured speed-up, training-free
and after the same short fine-tune, each method against the random pruner at its own token counts.

On the scene reference (12 blocks, 196 patches; experiments/scene_bed.py) each training-free method's
spec whose *measured* speed-up is nearest 1.5x and 2x (the picks below), and for every pick the random
pruner replaying its per-block token counts and placement (``random~pick``: at identical counts, does the
method's score or merge buy accuracy?). Every arm fine-tunes the reference for the scene bed's shortened
schedule (100 steps of 64 scenes, AdamW lr 3e-4, logit distillation from the reference), seeds 0-2,
paired by seed. The measure ``free`` evaluates every pick and matched pruner training-free on the
reference, ``final`` the fine-tuned checkpoints beside them, with MACs and measured speed in one
interleaved run.

The picks are fixed here, not searched at each run: ``tokenreduce eval --checkpoint <scenes-vit> --budgets
1.5,2 --budget-rule measured --match-random --subset 2000`` chose them once on the 2-core machine (its
table: results/scenes/free-budgets.txt), and a declared study trains the same arms wherever it runs
(a measured pick moves with the machine). The matched specs are the ones that run printed.

DynamicViT, the learned baseline, has no training-free row; its picks (keep 0.7 and 0.45 at its official
placement) are the keep rates nearest 1.5x and 2x when its speed was timed on the reference
(results/scenes/dynamicvit-budgets.txt), and it is fine-tuned like every arm. Cropr and BSPF, learned and
structural, are compared with the random pruner at their own counts in ``cropr_scenes`` and ``bspf_scenes``.

Compute plan (2 CPU cores): 26 arms x 3 seeds = 78 fine-tunes x 2-3 min, two evaluation runs of
~10 min: about 3.5 h. As run (two sittings, ``--jobs 2``): 194 minutes of training wall time summed
(DynamicViT's six runs ~6 min each), the two evaluations ~5 min each.
"""

from __future__ import annotations

from ..train.recipes import get_recipe
from .scene_bed import SCENES, shortened
from .scene_bed import smoke as scene_smoke
from .study import TESTBED_TEACHER, Arm, Axis, Col, Expect, Measure, Study, register_study

#: method-target -> (the pick, the random pruner at its counts), from the measured budget run (module docstring)
PICKS = {
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
#: the learned baseline's picks: timed on the reference (its cost does not depend on its predictors' weights;
#: results/scenes/dynamicvit-budgets.txt), fine-tuned only: it has no training-free row
LEARNED_PICKS = {
    "dynamicvit-1.5x": ("dynamicvit(keep=0.7, locs=(2, 5, 8))",
                        "random(counts=(137, 96, 67), locs=(2, 5, 8), where='block', seed={seed})"),
    "dynamicvit-2x": ("dynamicvit(keep=0.45, locs=(2, 5, 8))",
                      "random(counts=(88, 39, 17), locs=(2, 5, 8), where='block', seed={seed})"),
}
#: the random pruner's own picks at the two measured speed-ups
RANDOM = {"random-1.5x": "random(keep=0.65, locs=(3, 6, 9), seed={seed})",
          "random-2x": "random(keep=0.45, locs=(3, 6, 9), seed={seed})"}
_SOURCE = "EViT, arXiv 2202.07800 (attentive against random token selection); ToMe, arXiv 2210.09461"
_COLUMNS = (("label", "case", "{}"), ("kind", "kind", "{}"), ("macs_speedup", "MACs x", "{:.2f}"),
            ("speedup", "speed-up b32", "{:.2f}"), ("latency_speedup", "speed-up b1", "{:.2f}"),
            ("top1", "top-1 %", "{:.2f}"), ("top1_std", "± std", "{:.2f}"))


def _arms() -> dict[str, Arm]:
    arms = {}
    for name, (pick, matched) in {**PICKS, **LEARNED_PICKS}.items():
        arms[name] = Arm(f"{name.replace('-', ' ')}: {pick}", spec=pick)
        arms[f"random~{name}"] = Arm(f"random at {name}'s counts", spec=matched)
    arms.update({name: Arm(f"{name.replace('-', ' ')}: {spec.format(seed='s')}", spec=spec)
                 for name, spec in RANDOM.items()})
    return arms


def _free(spec: str) -> str:
    return spec.format(seed=0)


def _beats_matched(name: str) -> Expect:
    return Expect(f"{name}: the method beats random at its own token counts, fine-tuned", _SOURCE, arm=name,
                  baseline=f"random~{name}", metric="top1", direction=1)


@register_study("bench_scenes")
class BenchScenes(Study):
    title = "The scene test bed: top-1 at ~1.5x and ~2x measured speed-up, training-free and fine-tuned"
    claim = ("an informed token score or merge keeps more accuracy than random selection at the same token "
             "counts and at the same measured speed-up, before and after fine-tuning")
    source = _SOURCE
    testbed = SCENES
    recipe = {**shortened(get_recipe("fmnist-vit-ft")), "teacher": TESTBED_TEACHER}
    arms = _arms()
    baseline = "random-1.5x"
    grid = (Axis("seed", (0, 1, 2), "s"),)
    columns = (Col("top1", "top-1 % (fine-tuned)"), Col("top1", "Δ top-1 vs random 1.5x", paired=True),
               Col("train_time_s", "wall s"))
    measures = (
        Measure("free", reference=None, at={}, columns=_COLUMNS,
                specs=(*(_free(s) for pair in PICKS.values() for s in pair),
                       *(_free(matched) for _, matched in LEARNED_PICKS.values()), *map(_free, RANDOM.values())),
                title="Training-free: every pick and its matched random pruner on the reference (DynamicViT, "
                      "learned, only its matched pruner)"),
        Measure("final", reference=None, at={}, finetuned=tuple(_arms()), columns=_COLUMNS,
                title="Fine-tuned (3 seeds each), one interleaved timing run"),
    )
    expect = (
        *(_beats_matched(name) for name in (*PICKS, *LEARNED_PICKS)),
        Expect("at ~1.5x measured speed-up ToMe (the best training-free pick) beats random selection, fine-tuned",
               _SOURCE, arm="tome-1.5x", baseline="random-1.5x", metric="top1", direction=1),
        Expect("at ~2x measured speed-up ToMe (the best training-free pick) beats random selection, fine-tuned",
               _SOURCE, arm="tome-2x", baseline="random-2x", metric="top1", direction=1),
    )
    smoke = scene_smoke(grid={"seed": (0, 1)}, measure={"batch": 4, "warmup": 0, "repeats": 1})
    budget = ("78 fine-tunes x 2-3 min (DynamicViT's 6: ~6 min) + 2 evaluation runs x ~5 min on 2 CPU cores; as run "
              "(--jobs 2): 194 min of training wall time summed, about 2 h elapsed")
