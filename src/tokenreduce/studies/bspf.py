"""BSPF: chunked attention, pruning + fusion at half the MACs, and the W_q = W_k symmetry shortcut.

"Block-based Symmetric Pruning and Fusion for Efficient Vision Transformers" (BSPF-ViT), arXiv
2507.12125. Arms fine-tune a reference the same way, seeds 0-2, contrasts paired by seed: full
attention, chunked attention alone, chunked attention + pruning + fusion (``bspf``, exact scoring path),
and W_q = W_k (the ``tie_qk`` transform of the reference's weights, the paper's precondition for
mirroring the scores of the upper triangle). ``bspf_symmetry`` (probes/bspf_symmetry.py: |A - A^T|,
exact against mirrored decisions and outputs) probes the tied models.

``scenes`` (studies/beds.py; chunks of 49 patches, keep 0.5 after blocks 3, 6, 9, the shortened
fine-tune) adds the baselines at BSPF's MACs (chunked + top-k and chunked + random at BSPF's counts), the
mirrored path trained as such, BSPF without fusion, and W_q = W_k from a fair start: phase 1 heals the
tie with full attention (``tied_full``), phase 2 trains mirrored BSPF from it (``bspf_tied2``), and the
untied model gets the same two phases (``bspf_untied2`` after ``full``). One measure times every arm's
seed-0 run against the reference.

``fmnist``: ``fmnist-bspf`` (chunks of 7 patches = one row of the 7 x 7 grid, keep 0.5 after blocks 1, 3), W_q
= W_k tied straight from the reference; the speed of the untied arms in one interleaved run (a tied model has
the untied one's cost), and the symmetry probes on the reference tied and untied and on each seed's tied
checkpoint.
"""

from __future__ import annotations

from ..data.fashion_mnist import SIZES
from ..data.scenes import EVAL_SUBSET
from ..study.declare import Arm, Axis, Bed, Col, Expect, Probe, Study, Timing, register_study
from ..train.recipes import get_recipe
from .beds import (
    FMNIST,
    LENGTH,
    LONGER_PENDING,
    SCENES,
    SMOKE_MEASURE,
    SPEED_COLUMNS,
    at_longer,
    fmnist_smoke,
    lengths,
    one_epoch_budget,
    scene_smoke,
    shortened,
)

_SOURCE = "BSPF-ViT, arXiv 2507.12125"
_SEEDS = (0, 1, 2)
_GRID = (Axis("seed", _SEEDS, "s"),)
_COLUMNS = (Col("top1", "top-1 %"), Col("top1", "Δ top-1 vs full", paired=True), Col("train_time_s", "wall s"))
_PROBE_SMOKE = {"images": 16, "batch": 8}

# the scene bed: chunks of 49 patches (a quarter of the 14 x 14 grid)
_CHUNKED = "chunked(size=49)"
_AT = "keep=0.5, locs=(3, 6, 9)"
_BSPF = f"bspf(size=49, {_AT}"
_SCENE_ARMS = {
    "full": Arm("full attention"),
    "chunked": Arm("chunked alone", spec=_CHUNKED),
    "chunked_topk": Arm("chunked + top-k at BSPF's counts", spec=f"{_CHUNKED} + topk({_AT})"),
    "chunked_random": Arm("chunked + random at BSPF's counts", spec=f"{_CHUNKED} + random({_AT}, seed={{seed}})"),
    "bspf": Arm("BSPF, exact path", spec=f"{_BSPF})"),
    "bspf_mirrored": Arm("BSPF, mirrored path (trained as such)", spec=f"{_BSPF}, path='mirrored')"),
    "bspf_nofuse": Arm("BSPF without fusion (prune only)", spec=f"{_BSPF}, fuse=False)"),
    "tied_full": Arm("phase 1, W_q = W_k: full attention (heals the tie)", options={"transforms": ("tie_qk",)}),
    "bspf_untied2": Arm("phase 2, untied: mirrored BSPF after full", spec=f"{_BSPF}, path='mirrored')",
                        kind="after", reads="full"),
    "bspf_tied2": Arm("phase 2, W_q = W_k: mirrored BSPF after tied_full", spec=f"{_BSPF}, path='mirrored')",
                      options={"transforms": ("tie_qk",)}, kind="after", reads="tied_full"),
}

#: the arms fine-tuned for one epoch too (studies/beds.py, LENGTH): full attention, BSPF and the top-k
#: pruner at its counts, and W_q = W_k from a fair start, both phases at the same length for either model
LONGER = ("full", "chunked_topk", "bspf", "tied_full", "bspf_untied2", "bspf_tied2")

# the Fashion-MNIST bed: chunks of 7 patches (one row of the 7 x 7 grid)
_FM_CHUNKED = "chunked(size=7)"
_FM_BSPF = "bspf(size=7, keep=0.5, locs=(1, 3))"


#: a "costs nothing" claim: non-inferiority, at most half a top-1 point lost
_COSTS_NOTHING = dict(kind="noninferior", margin=-0.5,
                      why="0.5 top-1 points: under half the test-item standard error of one arm's top-1 on the "
                          "2 000 test scenes (about 1.1 at 60%; 0.4 on Fashion-MNIST's 10 000): a loss the test "
                          "items could not tell from none")


def _symmetry(name: str, title: str, **params: str) -> Probe:
    args = ", ".join([*(f"{k}={v}" for k, v in params.items()), f"images={SIZES['test']}"])
    return Probe(name, f"bspf_symmetry({args})", title=title)


@register_study("bspf")
class BSPF(Study):
    paper_epochs = 300
    claim = ("chunked attention + pruning + fusion beats full attention at half the MACs, and with W_q = W_k "
             "mirroring the scores of the upper triangle costs nothing")
    source = f"{_SOURCE}, Table 1 (DeiT-S 79.8 -> 81.8 top-1 at 2.4 of 4.6 GMACs)"
    expect = (
        Expect("chunked attention + pruning + fusion beats full attention", f"{_SOURCE}, Table 1 (DeiT-S)",
               arm="bspf", baseline="full", metric="top1", direction=1,
               reported=(2.0, "79.8 -> 81.8 top-1")),
        Expect("chunked attention alone beats full attention", f"{_SOURCE}, reviewers (chunk attention alone: 81.4)",
               arm="chunked", baseline="full", metric="top1", direction=1,
               reported=(1.6, "79.8 -> 81.4 top-1")),
        Expect("pruning + fusion add accuracy to chunked attention", f"{_SOURCE}, reviewers (+0.4 over chunking)",
               arm="bspf", baseline="chunked", metric="top1", direction=1,
               reported=(0.4, "81.4 -> 81.8 top-1")),
        Expect("pruning + fusion beat top-k at the same MACs", f"{_SOURCE}, reviewers (a MAC-matched baseline)",
               arm="bspf", baseline="chunked_topk", metric="top1", direction=1),
        Expect("pruning + fusion beat random pruning at the same MACs", f"{_SOURCE}, reviewers", arm="bspf",
               baseline="chunked_random", metric="top1", direction=1),
        Expect("fusion adds accuracy to pruning", f"{_SOURCE}, Section 3 (fusion)", arm="bspf", baseline="bspf_nofuse",
               metric="top1", direction=1),
        Expect("the mirrored path trained as such costs nothing (at or above exact)", f"{_SOURCE}, Section 3",
               arm="bspf_mirrored", baseline="bspf", metric="top1", direction=1, **_COSTS_NOTHING),
        Expect("W_q = W_k costs no accuracy from a fair start", f"{_SOURCE}, Section 3 (shared W_q = W_k)",
               arm="bspf_tied2", baseline="bspf_untied2", metric="top1", direction=1, **_COSTS_NOTHING),
        Expect("W_q = W_k tied straight from the untied reference costs no accuracy",
               f"{_SOURCE}, Section 3 (shared W_q = W_k)", arm="bspf_tied", baseline="bspf", metric="top1",
               direction=1, **_COSTS_NOTHING),
    )
    # declared before any one-epoch run of this study: published effects where the paper gives one, else one
    # top-1 point (the smallest a user would choose a method by); a "costs nothing" claim is planned for a true
    # difference of 0, half a point above its margin
    expect += at_longer(expect, LONGER, plans={
        "chunked attention + pruning + fusion beats full attention": 2.0,
        "pruning + fusion beat top-k at the same MACs": 1.0,
        "W_q = W_k costs no accuracy from a fair start": 0.5})
    beds = {
        "scenes": Bed(
            testbed=SCENES,
            title="BSPF on the scene test bed: chunking, pruning + fusion, MAC-matched pruners, W_q = W_k",
            recipe=shortened("fmnist-bspf"), arms=lengths(_SCENE_ARMS, LONGER), baseline="full",
            pending=LONGER_PENDING, grid=(LENGTH, *_GRID),
            columns=_COLUMNS,
            # bspf_untied2 carries bspf_mirrored's model and spec (the same cost): one row for both
            evaluations=(Timing("speed", at={"seed": 0},
                                 finetuned=tuple(a for a in _SCENE_ARMS if a not in ("full", "bspf_untied2")),
                                 columns=SPEED_COLUMNS,
                                 title="MACs and speed: every arm's seed-0 run against the reference, one "
                                       "interleaved run"),
                         *(Probe(f"symmetry_tied2_s{s}", f"bspf_symmetry(images={EVAL_SUBSET})", arm="bspf_tied2",
                                 at={"seed": s}, title=f"Symmetry: the phase-2 tied model, seed {s}") for s in _SEEDS)),
            smoke=scene_smoke(probe=_PROBE_SMOKE, measure=SMOKE_MEASURE),
            budget=((30, "training", 2.5), (3, "symmetry probe", 1), (1, "speed", 6), one_epoch_budget(18, 105))),
        "fmnist": Bed(
            testbed=FMNIST,
            title="BSPF on Fashion-MNIST: chunked attention, pruning + fusion, W_q = W_k",
            recipe=get_recipe("fmnist-bspf"),  # also `tokenreduce train --recipe fmnist-bspf`
            arms={"full": Arm("full attention"), "chunked": Arm("chunked alone", spec=_FM_CHUNKED),
                  "bspf": Arm("chunked + pruning + fusion", spec=_FM_BSPF),
                  "bspf_tied": Arm("the same, W_q = W_k", spec=_FM_BSPF, options={"transforms": ("tie_qk",)})},
            baseline="full", grid=_GRID, columns=_COLUMNS,
            evaluations=(
                Timing("speed", model="full", at={"seed": 0}, specs=(_FM_CHUNKED,), finetuned=("chunked", "bspf"),
                        title="Speed: the untied arms against full attention, one interleaved run",
                        columns=(Col("label", "label"), Col("kind", "kind"), Col("top1", "top-1 %"),
                                 Col("gmacs", "GMACs"), Col("macs_speedup", "MACs speed-up"),
                                 Col("speedup", "speed-up b32"), Col("latency_speedup", "speed-up b1"))),
                _symmetry("symmetry_reference_tied", "Symmetry: the reference with W_q = W_k, not fine-tuned",
                          spec=f'"{_FM_BSPF}"'),
                _symmetry("symmetry_reference_untied", "Symmetry: the reference, untied", spec=f'"{_FM_BSPF}"',
                          transform="''"),
                *(Probe(f"symmetry_tied_s{s}", f"bspf_symmetry(images={SIZES['test']})", arm="bspf_tied",
                        at={"seed": s}, title=f"Symmetry: the fine-tuned tied arm, seed {s}") for s in _SEEDS),
            ),
            smoke=fmnist_smoke(measure=SMOKE_MEASURE, probe=_PROBE_SMOKE),
            budget=((12, "fine-tune", 3), (1, "speed", 5), (5, "symmetry probe", 2))),
    }
