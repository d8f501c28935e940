"""Speed and MACs on DeiT-S (CPU, random weights): the ``bench`` command's run as a study.

EViT (keep 0.7 at blocks 3, 6, 9), ToMe (r = 13) and CTP at their published DeiT-S schedules, each
timed against the unpatched ``deit_small_patch16_224`` (random weights: speed does not depend on
them), the zero-reduction control ``tome(r=0)`` and a random pruner with the spec's per-block token
counts, in one interleaved run (bench/compare.py): img/s at batch 32, latency at batch 1, 2 warm-up
and 10 timed rounds. Superseded by the study ``backends`` (eager, compiled, onnxruntime, top-k
added); kept as the record the platform comparison (results/platform/) cites.

The stored run (``deit_s/runs/deit_small.json``) is ``results/bench/deit_small_cpu2.json``, made by
``tokenreduce bench`` at commit 68bae1b, converted once to a run JSON: its numbers are that
measurement's (a timing is never reproduced exactly), its command the one that made it. It predates
the ``lat vs random`` column, so its table has the columns the command printed then.
"""

from __future__ import annotations

from ..bench.compare import COLUMNS
from ..study.declare import Bed, Bench, Col, Study, register_study

#: DeiT-S, random weights (timm's config: 224x224, patch 16, dim 384, depth 12, 6 heads)
DEIT_S = {"name": "deit_small_patch16_224", "kwargs": {}}
#: every DeiT-S spec at its published schedule
DEIT_SPECS = ("evit(keep=0.7, locs=(3, 6, 9))", "tome(r=13)", "ctp()")
#: a smoke's bench: batch 2, 1 timed round, the same depth and patch grid at width 16 (schedules run unchanged)
SMOKE_BENCH = {"batch": 2, "warmup": 0, "repeats": 1, "min_run_s": 0.0,
               "model_kwargs": {"embed_dim": 16, "num_heads": 1, "mlp_ratio": 1.0}}


@register_study("deit_bench")
class DeitBench(Study):
    title = "Speed and MACs on DeiT-S (CPU, random weights)"
    claim = ("at their published DeiT-S schedules EViT, ToMe and CTP run faster than the unpatched model, "
             "and about as fast as a random pruner with the same token counts")
    source = "EViT (keep 0.7 at blocks 3, 6, 9), ToMe (r = 13), EET's CTP: their DeiT-S settings"
    beds = {"deit_s": Bed(
        evaluations=(Bench("deit_small", model=DEIT_S, specs=DEIT_SPECS, match_random=True,
                       speed={"batch": 32, "repeats": 10},
                       columns=tuple(Col(k, h) for k, h in COLUMNS if k != "latency_vs_random"),
                       title="DeiT-S, 2 CPU threads: MACs, img/s at batch 32, latency at batch 1"),),
        smoke={"bench": SMOKE_BENCH},
        budget="1 run of ~8 min on 2 idle CPU threads")}
