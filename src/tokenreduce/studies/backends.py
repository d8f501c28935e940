"""Backends: every method against the unreduced model and its matched random pruner, run eagerly,
torch.compile'd and exported to ONNX (onnxruntime), as a study of benches.

Each bench is one ``tokenreduce bench --match-random --backend B`` run (bench/compare.py): img/s
and latency in the same interleaved run at bench/settings.SPEED's timing; the unreduced
model and the zero-reduction control ``tome(r=0)`` run on the same backend as the specs. Two models:
DeiT-S with random weights at the published schedules (EViT, ToMe, CTP, top-k), and the trained
``fmnist-vit`` reference at each training-free method's 1.5x pick (the measured budget rule:
the arms of the study ``baselines`` on its ``fmnist`` bed). A pure speed measurement, no training and no seeds.

The stored runs (``runs/<model>-<backend>.json``) are the ``<model>-<backend>.json`` files beside
them, made by ``tokenreduce bench`` (``deit_small-eager`` at the revision in its provenance, the others at
ec525be from a snapshot of ``src/``, so without a git revision) and converted once to run JSONs: their
numbers are those measurements (a timing is never reproduced exactly), their commands the ones that
made them. The smoke times every bench eagerly: inductor's code generation takes tens of seconds a
graph on 2 cores (the compiled and exported paths have their own tests).

The ``gpu`` bed is the GPU preset (``tokenreduce study backends --testbed gpu``, on CUDA by default where
torch sees it): DeiT-S shapes at :data:`GPU_SPEED` (bfloat16 weights) for every method
at its published DeiT-S schedule (:data:`GPU_SPECS`), each with its matched random pruner, against the
unpatched model, eagerly; and a compiled subset, CUDA graphs (``reduce-overhead``): ToMe, the case
launch-bound at batch 1. Peak memory per case is in its table.
"""

from __future__ import annotations

from ..study.declare import MATCH_RANDOM, Bed, Col, Study, Timing, register_study
from ..train.recipes import get_recipe
from .deit_bench import DEIT_S, SMOKE_BENCH

BACKENDS = ("eager", "compile", "onnxruntime")
_DEIT_SPECS = ("evit(keep=0.7, locs=(3, 6, 9))", "tome(r=13)", "ctp()", "topk(keep=0.7, locs=(3, 6, 9))")
#: each training-free method's 1.5x pick on the reference (the study baselines' fmnist arms, random excluded)
_FMNIST_SPECS = ("ctp(counts=(24, 12, 3), locs=(1, 3, 4))", "evit(keep=0.45, locs=(1, 3, 4))",
                 "imagepiece(locs=(1, 2, 4), keep=0.2)", "tome(r=(15, 15, 9, 5, 2, 1))",
                 "topk(keep=0.55, locs=(1, 3, 4))")


def _fmnist_vit() -> dict:
    return get_recipe("fmnist-vit")["model"]  # the architecture a smoke narrows; the run loads the trained weights


def _benches() -> tuple[Timing, ...]:
    deit = [Timing(f"deit_small-{b}", model=DEIT_S, specs=_DEIT_SPECS, settings={MATCH_RANDOM: True, "backend": b},
                  title=f"DeiT-S (random weights), {b}") for b in BACKENDS]
    fmnist = [Timing(f"fmnist-{b}", model={**_fmnist_vit(), "checkpoint": "fmnist-vit"}, specs=_FMNIST_SPECS,
                     settings={MATCH_RANDOM: True, "backend": b},
                    title=f"The Fashion-MNIST reference at the 1.5x picks, {b}") for b in BACKENDS]
    return (*deit, *fmnist)


#: every method at its published DeiT-S schedule (the methods' docstrings): EViT, ToMe and CTP as deit_bench,
#: top-k at EViT's placement, DynamicViT's keep 0.7 at blocks (2, 5, 8), ImagePiece's and BSPF's, Cropr's
#: (deployed: its summed query, random like every weight here) and PiToMe's defaults, DiffRate's deit_s-2.9
GPU_SPECS = (*_DEIT_SPECS, "dynamicvit()", "imagepiece()", "bspf()", "cropr(inference=True)", "pitome()", "diffrate()")
#: the preset's timing: bfloat16 weights, batch 256 for throughput (latency at 1), the default rounds
GPU_SPEED = {"batch": 256, "dtype": "bfloat16"}


def _gpu_benches() -> tuple[Timing, ...]:
    eager = Timing("deit_small-gpu-eager", model=DEIT_S, specs=GPU_SPECS,
                   settings={MATCH_RANDOM: True, **GPU_SPEED, "backend": "eager"},
                  title="DeiT-S (random weights), bfloat16, batch 256 / 1, eager")
    graphs = Timing("deit_small-gpu-graphs", model=DEIT_S, specs=("tome(r=13)",),
                    settings={MATCH_RANDOM: True, **GPU_SPEED, "backend": "compile", "compile_mode": "reduce-overhead"},
                   title="DeiT-S (random weights), bfloat16, batch 256 / 1, torch.compile with CUDA graphs")
    return eager, graphs


def _side_by_side(label: str, *benches: tuple[str, str, str]) -> tuple[Col, ...]:
    """A bench table's columns: the rows' label headed ``label``, then per (bench, header, its vs-random header)
    the bench's speed-ups against the unpatched model and against its matched random pruner."""
    return (Col("label", label), *(c for name, plain, vs in benches
                                   for c in (Col(name, plain), Col(name, vs, paired=True))))


@register_study("backends")
class Backends(Study):
    claim = ("a method's speed-up is its token counts' (about 1x its matched random pruner), and no method is "
             "slower than the unreduced model at batch 1, on each backend")
    source = "the project's speed targets, read against EViT, ToMe, CTP, top-k and ImagePiece at their schedules"
    beds = {"cpu": Bed(
        title="Backends: every method against the unreduced model and its matched random pruner",
        evaluations=_benches(),
        columns={f"{what}: speed-ups per backend": _side_by_side(
            what, (f"{model}-eager", "eager b32 / b1", "vs random b32 / b1"),
            (f"{model}-compile", "compile b32 / b1", "vs random"),
            (f"{model}-onnxruntime", "onnxruntime b32 / b1", "vs random"))
            for model, what in (("deit_small", "DeiT-S (4.6 GMACs)"),
                                ("fmnist", "Fashion-MNIST reference, 1.5x picks"))},
        smoke={"bench": {**SMOKE_BENCH, "backend": "eager"}},
        budget=((6, "bench", 9),)),
        "gpu": Bed(
            title="The GPU preset: DeiT-S in bfloat16 on one GPU",
            evaluations=_gpu_benches(),
            columns={"DeiT-S, bfloat16: speed-ups eager and with CUDA graphs": _side_by_side(
                "DeiT-S (4.6 GMACs)", ("deit_small-gpu-eager", "eager b256 / b1", "vs random b256 / b1"),
                ("deit_small-gpu-graphs", "CUDA graphs b256 / b1", "vs random"))},
            smoke={"bench": {**SMOKE_BENCH, "backend": "eager", "compile_mode": "default", "dtype": "float32"}},
            budget=((1, "GPU eager bench", 1), (1, "GPU compiled bench", 3.5)),
            pending="made on a GPU only: scripts/device-check.sh (or tokenreduce study backends --testbed gpu "
                    "--device cuda) runs it where one is lent")}
