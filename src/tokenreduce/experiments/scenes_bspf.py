"""BSPF on the scene test bed: chunked attention, pruning + fusion, its MAC-matched baselines, W_q = W_k.

"Block-based Symmetric Pruning and Fusion for Efficient Vision Transformers" (BSPF-ViT), arXiv
2507.12125, re-tested on the scene reference (12 blocks, 196 patches; experiments/scene_bed.py). Chunks
of 49 patches (four chunks of the 14 x 14 grid); BSPF keeps half of each chunk's tokens after blocks
3, 6 and 9 (196 -> 98 -> 49 -> 24 patches). Every arm fine-tunes the reference on the scene bed's
shortened schedule (100 steps of 64 scenes, AdamW 3e-4), seeds 0-2, paired by seed:

    full              full attention (the same fine-tune, nothing reduced)
    chunked           chunked attention alone
    chunked_topk      chunked attention + CLS-attention top-k at BSPF's counts and blocks (its MACs)
    chunked_random    chunked attention + the random pruner at the same counts
    bspf              chunked + pruning + fusion, the exact scoring path
    bspf_mirrored     the paper's mirrored (upper-triangle) path, trained as such
    bspf_nofuse       pruning without the fusion this project had to specify (the prune-only ablation)

W_q = W_k from a fair start. Tying the reference's projections (``tie_qk``: W_q = W_k = their mean)
drops its accuracy before any training, so a tied arm fine-tuned as long as an untied one starts
behind. Both paths therefore get the same two phases: phase 1, 100 steps of full attention (untied:
the ``full`` arm; tied: ``tied_full``, which heals the tied model), phase 2, 100 steps of mirrored
BSPF from phase 1's checkpoint (``bspf_untied2`` and ``bspf_tied2``). The tied and untied models
thus see the same data for the same number of steps, from their own healed starting points.
``bspf_symmetry`` (experiments/bspf_symmetry.py) then measures |A - A^T| and how far the mirrored
decisions are from the exact ones on each seed's tied model.

The pruners at BSPF's counts are matched on token counts, hence roughly on MACs (fusion and scoring add
their own); the measure ``speed`` reports every arm's MACs and measured speed side by side, each on its
seed-0 run's model and spec, so a reader sees how close the match is.

Compute plan (2 CPU cores): 30 training runs x 2-3 min, 3 symmetry probes x 1 min and one speed run
~6 min: about 90 min.
"""

from __future__ import annotations

from ..train.recipes import get_recipe
from .bspf_arms import BSPFArms
from .scene_bed import SCENES, SPEED_COLUMNS, shortened
from .scene_bed import smoke as scene_smoke
from .study import Arm, Axis, Col, Expect, Measure, Probe, Study, register_study

_SOURCE = "BSPF-ViT, arXiv 2507.12125"
_CHUNKED = "chunked(size=49)"
_AT = "keep=0.5, locs=(3, 6, 9)"
_BSPF = f"bspf(size=49, {_AT}"
_SEEDS = (0, 1, 2)

_ARMS = {
    "full": Arm("full attention"),
    "chunked": Arm("chunked alone", spec=_CHUNKED),
    "chunked_topk": Arm("chunked + top-k at BSPF's counts", spec=f"{_CHUNKED} + topk({_AT})"),
    "chunked_random": Arm("chunked + random at BSPF's counts", spec=f"{_CHUNKED} + random({_AT}, seed={{seed}})"),
    "bspf": Arm("BSPF, exact path", spec=f"{_BSPF})"),
    "bspf_mirrored": Arm("BSPF, mirrored path (trained as such)", spec=f"{_BSPF}, path='mirrored')"),
    "bspf_nofuse": Arm("BSPF without fusion (prune only)", spec=f"{_BSPF}, fuse=False)"),
    "tied_full": Arm("phase 1, W_q = W_k: full attention (heals the tie)", transforms=("tie_qk",)),
    "bspf_untied2": Arm("phase 2, untied: mirrored BSPF after full", spec=f"{_BSPF}, path='mirrored')",
                        after="full"),
    "bspf_tied2": Arm("phase 2, W_q = W_k: mirrored BSPF after tied_full", spec=f"{_BSPF}, path='mirrored')",
                      transforms=("tie_qk",), after="tied_full"),
}


@register_study("bspf_scenes")
class BSPFScenes(Study):
    title = "BSPF on the scene test bed: chunking, pruning + fusion, MAC-matched pruners, W_q = W_k"
    claim = ("chunked attention + pruning + fusion beats full attention at half the MACs, and with W_q = W_k "
             "mirroring the scores of the upper triangle costs nothing")
    source = f"{_SOURCE}, Table 1 (DeiT-S 79.8 -> 81.8 top-1 at 2.4 of 4.6 GMACs)"
    testbed = SCENES
    recipe = shortened(get_recipe("fmnist-bspf"))
    arms = _ARMS
    baseline = "full"
    grid = (Axis("seed", _SEEDS, "s"),)
    columns = (Col("top1", "top-1 %"), Col("top1", "Δ top-1 vs full", paired=True), Col("train_time_s", "wall s"))
    # bspf_untied2 carries bspf_mirrored's model and spec (the same cost): one row for both
    measures = (Measure("speed", reference=None, at={"seed": 0},
                        finetuned=tuple(a for a in _ARMS if a not in ("full", "bspf_untied2")),
                        columns=SPEED_COLUMNS,
                        title="MACs and speed: every arm's seed-0 run against the reference, one interleaved "
                              "run"),)
    probes = tuple(Probe(f"symmetry_tied2_s{s}", "bspf_symmetry(images=2000)", arm="bspf_tied2", at={"seed": s},
                         title=f"Symmetry: the phase-2 tied model, seed {s}") for s in _SEEDS)
    expect = (
        *BSPFArms.expect[:2],  # the same two claims as on Fashion-MNIST
        Expect("pruning + fusion beat top-k at the same MACs", f"{_SOURCE}, reviewers (a MAC-matched baseline)",
               arm="bspf", baseline="chunked_topk", metric="top1", direction=1),
        Expect("pruning + fusion beat random pruning at the same MACs", f"{_SOURCE}, reviewers", arm="bspf",
               baseline="chunked_random", metric="top1", direction=1),
        Expect("fusion adds accuracy to pruning", f"{_SOURCE}, Section 3 (fusion)", arm="bspf", baseline="bspf_nofuse",
               metric="top1", direction=1),
        Expect("the mirrored path trained as such costs nothing (at or above exact)", f"{_SOURCE}, Section 3",
               arm="bspf_mirrored", baseline="bspf", metric="top1", direction=1),
        Expect("W_q = W_k costs no accuracy from a fair start", f"{_SOURCE}, Section 3 (shared W_q = W_k)",
               arm="bspf_tied2", baseline="bspf_untied2", metric="top1", direction=1),
    )
    smoke = scene_smoke(grid={"seed": (0, 1)}, probe={"images": 16, "batch": 8},
                        measure={"batch": 4, "warmup": 0, "repeats": 1})
    budget = ("30 training runs x 2-3 min + 3 symmetry probes x 1 min + one speed run ~6 min on 2 CPU cores: "
              "about 90 min")
