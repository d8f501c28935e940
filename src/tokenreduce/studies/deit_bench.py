"""Speed and MACs on DeiT-S (CPU, random weights): the ``bench`` command's run as a study.

EViT (keep 0.7 at blocks 3, 6, 9), ToMe (r = 13) and CTP at their published DeiT-S schedules, each
timed against the unpatched ``deit_small_patch16_224`` (random weights: speed does not depend on
them), the zero-reduction control ``tome(r=0)`` and a random pruner with the spec's per-block token
counts, in one interleaved run (bench/compare.py): img/s and latency at bench/settings.SPEED's
timing. Superseded by the study ``backends`` (eager, compiled, onnxruntime, top-k
added); kept as the record the platform comparison (results/platform/) cites.

The stored run (``deit_s/runs/deit_small.json``) is ``results/bench/deit_small_cpu2.json``, made by
``tokenreduce bench`` (its revision is in its provenance), converted once to a run JSON: its numbers are that
measurement's (a timing is never reproduced exactly), its command the one that made it. It predates
the ``lat vs random`` column, so its table has the columns the command printed then.
"""

from __future__ import annotations

from ..bench.compare import COLUMNS
from ..bench.settings import SPEED
from ..study.declare import MATCH_RANDOM, Bed, Col, Study, Timing, register_study

#: DeiT-S, random weights (timm's config: 224x224, patch 16, dim 384, depth 12, 6 heads)
DEIT_S = {"name": "deit_small_patch16_224", "kwargs": {}}
#: every DeiT-S spec at its published schedule
DEIT_SPECS = ("evit(keep=0.7, locs=(3, 6, 9))", "tome(r=13)", "ctp()")
#: a smoke's bench: batch 2, 1 timed round, the same depth and patch grid at width 16 (schedules run unchanged)
SMOKE_BENCH = {"batch": 2, "warmup": 0, "repeats": 1, "min_run_s": 0.0,
               "model_kwargs": {"embed_dim": 16, "num_heads": 1, "mlp_ratio": 1.0}}


@register_study("deit_bench")
class DeitBench(Study):
    claim = ("at their published DeiT-S schedules EViT, ToMe and CTP run faster than the unpatched model, "
             "and about as fast as a random pruner with the same token counts")
    source = "EViT (keep 0.7 at blocks 3, 6, 9), ToMe (r = 13), EET's CTP: their DeiT-S settings"
    beds = {"deit_s": Bed(
        title="Speed and MACs on DeiT-S (CPU, random weights)",
        evaluations=(Timing("deit_small", model=DEIT_S, specs=DEIT_SPECS, settings={MATCH_RANDOM: True},
                           columns=tuple(Col(k, h) for k, h in COLUMNS if k != "latency_vs_random"),
                           title=f"DeiT-S, 2 CPU threads: MACs, img/s at batch {SPEED['batch']}, latency at batch 1"),),
        smoke={"bench": SMOKE_BENCH},
        budget=((1, "bench", 8),))}
