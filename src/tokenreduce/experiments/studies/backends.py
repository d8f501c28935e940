"""Backends: every method against the unreduced model and its matched random pruner, run eagerly,
torch.compile'd and exported to ONNX (onnxruntime), as a study of benches.

Each bench is one ``tokenreduce bench --match-random --backend B`` run (bench/compare.py): batch 32
img/s and batch 1 latency in the same interleaved run, 2 warm-up and 10 timed rounds; the unreduced
model and the zero-reduction control ``tome(r=0)`` run on the same backend as the specs. Two models:
DeiT-S with random weights at the published schedules (EViT, ToMe, CTP, top-k), and the trained
``fmnist-vit`` reference at each training-free method's 1.5x pick (the measured budget rule:
the arms of the study ``baselines`` on its ``fmnist`` bed). A pure speed measurement, no training and no seeds.

The stored runs (``runs/<model>-<backend>.json``) are the ``<model>-<backend>.json`` files beside
them, made by ``tokenreduce bench`` (``deit_small-eager`` at commit 026a70f, the others at ec525be
from a snapshot of ``src/``, so without a git revision) and converted once to run JSONs: their
numbers are those measurements (a timing is never reproduced exactly), their commands the ones that
made them. The smoke times every bench eagerly: inductor's code generation takes tens of seconds a
graph on 2 cores (the compiled and exported paths have their own tests).
"""

from __future__ import annotations

from ...train.recipes import get_recipe
from ..study import Bed, Bench, BenchTable, Smoke, Study, register_study
from ..testbed import Testbed
from .deit_bench import DEIT_S, SMOKE_BENCH

BACKENDS = ("eager", "compile", "onnxruntime")
_DEIT_SPECS = ("evit(keep=0.7, locs=(3, 6, 9))", "tome(r=13)", "ctp()", "topk(keep=0.7, locs=(3, 6, 9))")
#: each training-free method's 1.5x pick on the reference (the study baselines' fmnist arms, random excluded)
_FMNIST_SPECS = ("ctp(counts=(24, 12, 3), locs=(1, 3, 4))", "evit(keep=0.45, locs=(1, 3, 4))",
                 "imagepiece(locs=(1, 2, 4), keep=0.2)", "tome(r=(15, 15, 9, 5, 2, 1))",
                 "topk(keep=0.55, locs=(1, 3, 4))")


def _fmnist_vit() -> dict:
    return get_recipe("fmnist-vit")["model"]  # the architecture a smoke narrows; the run loads the trained weights


def _benches() -> tuple[Bench, ...]:
    speed = {"batch": 32, "repeats": 10}
    deit = [Bench(f"deit_small-{b}", model=DEIT_S, specs=_DEIT_SPECS, match_random=True, speed={**speed, "backend": b},
                  title=f"DeiT-S (random weights), {b}") for b in BACKENDS]
    fmnist = [Bench(f"fmnist-{b}", model=_fmnist_vit(), checkpoint="fmnist-vit", specs=_FMNIST_SPECS,
                    match_random=True, speed={**speed, "backend": b},
                    title=f"The Fashion-MNIST reference at the 1.5x picks, {b}") for b in BACKENDS]
    return (*deit, *fmnist)


@register_study("backends")
class Backends(Study):
    title = "Backends: every method against the unreduced model and its matched random pruner"
    claim = ("a method's speed-up is its token counts' (about 1x its matched random pruner), and no method is "
             "slower than the unreduced model at batch 1, on each backend")
    source = "the project's speed targets, read against EViT, ToMe, CTP, top-k and ImagePiece at their schedules"
    beds = {"cpu": Bed(
        benches=_benches(),
        bench_tables=tuple(
            BenchTable(f"{what}: speed-ups per backend", tuple(f"{model}-{b}" for b in BACKENDS),
                       (what, "eager b32 / b1", "vs random b32 / b1", "compile b32 / b1", "vs random",
                        "onnxruntime b32 / b1", "vs random"))
            for model, what in (("deit_small", "DeiT-S (4.6 GMACs)"),
                                ("fmnist", "Fashion-MNIST reference, 1.5x picks"))),
        smoke=Smoke(testbed=Testbed(), bench={**SMOKE_BENCH, "backend": "eager"}),
        budget="6 runs of 3-15 min on 2 idle CPU threads (compiling and exporting every case included)")}
