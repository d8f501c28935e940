"""ImagePiece's speed on DeiT-S with its conv stem counted: the ``bench --stem conv`` run as a study.

ImagePiece (arXiv 2412.16491) reports DeiT-S throughput +54% with re-tokenization and the local-coherence
conv stem together, and its MACs are usually quoted without the stem (``imagepiece()`` alone: 1.50x fewer
MACs than DeiT-S; with the conv stem, which adds 0.38 GMACs, 1.34x; the hyper-speed schedule 2.44x and 2.03x).
One interleaved run on ``deit_small_patch16_224`` (random weights: speed does not depend on them): the plain
model, the control, both ImagePiece schedules on the patch stem, and the conv-stem model unreduced and with
each schedule (``bench --stem conv``, bench/compare.py), every speed-up against the plain unpatched DeiT-S,
img/s at batch 32 and latency at batch 1, 2 warm-up and 10 timed rounds.
"""

from __future__ import annotations

from .bench_deit import DEIT_S, SMOKE_BENCH
from .study import Bench, Smoke, Study, register_study
from .testbed import Testbed

#: ImagePiece's default schedule and its hyper-speed one (about 13% of the tokens left)
SPECS = ("imagepiece()", "imagepiece(locs=(1, 2, 3, 4, 5, 6, 7))")


@register_study("imagepiece_deit")
class ImagePieceDeit(Study):
    title = "ImagePiece on DeiT-S, the conv stem counted (CPU, random weights)"
    claim = "ImagePiece speeds DeiT-S up by about 1.5x (+54% throughput) with its conv stem"
    source = "ImagePiece, arXiv 2412.16491, Table 1 (DeiT-S, RTX 3090: +54% throughput)"
    benches = (Bench("deit_small_conv", model=DEIT_S, specs=SPECS, stem="conv", speed={"batch": 32, "repeats": 10},
                     title="DeiT-S, 2 CPU threads: ImagePiece with the patch stem and with its conv stem, against the "
                           "plain model"),)
    smoke = Smoke(testbed=Testbed(), bench=SMOKE_BENCH)
    budget = "1 run of ~6 min on 2 idle CPU threads"
