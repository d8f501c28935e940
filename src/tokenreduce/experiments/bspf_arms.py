"""BSPF on Fashion-MNIST: chunked attention, pruning + fusion, and the W_q = W_k symmetry shortcut.

"Block-based Symmetric Pruning and Fusion for Efficient Vision Transformers" (BSPF-ViT), arXiv
2507.12125. Four arms fine-tune the trained reference the same way (``fmnist-bspf``: 1 epoch on a
fixed 20 000 training images, AdamW 3e-4, batch 128; top-1 on the 10 000 test images): full
attention, chunked attention alone (chunks of 7 patches = one row of the 7 x 7 grid), chunked
attention + pruning + fusion (``bspf``, exact scoring path), and the same with W_q = W_k (the
``tie_qk`` transform of the reference's weights, the paper's precondition for mirroring), seeds
0, 1, 2, contrasts paired by seed. Then the speed of the untied arms in one interleaved run of the
eval pipeline (a tied model has the untied one's cost: the same fused qkv), and ``bspf_symmetry``
(experiments/bspf_symmetry.py: |A - A^T|, exact against mirrored decisions and outputs) on the
reference tied and untied and on each seed's trained tied checkpoint.
"""

from __future__ import annotations

from ..train.recipes import get_recipe
from .eet_arms import _TINY
from .study import Arm, Axis, Col, Expect, Measure, Probe, Smoke, Study, register_study
from .testbed import Testbed

_SOURCE = "BSPF-ViT, arXiv 2507.12125"
_CHUNKED = "chunked(size=7)"
_BSPF = "bspf(size=7, keep=0.5, locs=(1, 3))"
_SEEDS = (0, 1, 2)


def _symmetry(name: str, title: str, **params: str) -> Probe:
    args = ", ".join([*(f"{k}={v}" for k, v in params.items()), "images=10000"])
    return Probe(name, f"bspf_symmetry({args})", title=title)


@register_study("bspf")
class BSPFArms(Study):
    title = "BSPF on Fashion-MNIST: chunked attention, pruning + fusion, W_q = W_k"
    claim = ("chunked attention + pruning + fusion beats full attention at half the MACs, and with W_q = W_k "
             "mirroring the scores of the upper triangle is exact")
    source = f"{_SOURCE}, Table 1 (DeiT-S 79.8 -> 81.8 top-1 at 2.4 of 4.6 GMACs)"
    testbed = Testbed(reference="fmnist-vit")
    recipe = get_recipe("fmnist-bspf")  # also `tokenreduce train --recipe fmnist-bspf`
    arms = {
        "full": Arm("full attention"),
        "chunked": Arm("chunked alone", spec=_CHUNKED),
        "bspf": Arm("chunked + pruning + fusion", spec=_BSPF),
        "bspf_tied": Arm("the same, W_q = W_k", spec=_BSPF, transforms=("tie_qk",)),
    }
    baseline = "full"
    grid = (Axis("seed", _SEEDS, "s"),)
    columns = (Col("top1", "top-1 %"), Col("top1", "Δ top-1 vs full", paired=True), Col("train_time_s", "wall s"))
    measures = (Measure("speed", reference="full", at={"seed": 0}, specs=(_CHUNKED,), finetuned=("chunked", "bspf"),
                        title="Speed: the untied arms against full attention, one interleaved run",
                        columns=(("label", "label", "{}"), ("kind", "kind", "{}"), ("top1", "top-1 %", "{:.2f}"),
                                 ("gmacs", "GMACs", "{:.4f}"), ("macs_speedup", "MACs speed-up", "{:.2f}"),
                                 ("speedup", "speed-up b32", "{:.2f}"),
                                 ("latency_speedup", "speed-up b1", "{:.2f}"))),)
    probes = (
        _symmetry("symmetry_reference_tied", "Symmetry: the reference with W_q = W_k, not fine-tuned",
                  spec=f'"{_BSPF}"'),
        _symmetry("symmetry_reference_untied", "Symmetry: the reference, untied", spec=f'"{_BSPF}"', transform="''"),
        *(Probe(f"symmetry_tied_s{s}", "bspf_symmetry(images=10000)", arm="bspf_tied", at={"seed": s},
                title=f"Symmetry: the fine-tuned tied arm, seed {s}") for s in _SEEDS),
    )
    expect = (
        Expect("chunked attention + pruning + fusion beats full attention", f"{_SOURCE}, Table 1 (DeiT-S)",
               arm="bspf", baseline="full", metric="top1", direction=1, effect=2.0, published="79.8 -> 81.8 top-1"),
        Expect("chunked attention alone beats full attention", f"{_SOURCE}, reviewers (chunk attention alone: 81.4)",
               arm="chunked", baseline="full", metric="top1", direction=1, effect=1.6, published="79.8 -> 81.4 top-1"),
        Expect("pruning + fusion add accuracy to chunked attention", f"{_SOURCE}, reviewers (+0.4 over chunking)",
               arm="bspf", baseline="chunked", metric="top1", direction=1, effect=0.4, published="81.4 -> 81.8 top-1"),
        Expect("W_q = W_k costs no accuracy (at or above the untied model)", f"{_SOURCE}, Section 3 (shared W_q = W_k)",
               arm="bspf_tied", baseline="bspf", metric="top1", direction=1),
    )
    smoke = Smoke(testbed=Testbed(model="vit_tiny_patch16_224", kwargs=_TINY, synthetic=True),
                  recipe={"subset": 32, "eval_subset": 16, "batch_size": 16, "eval_batch_size": 16,
                          "warmup_epochs": 0.2, "ckpt_every": 1, "augment": "none", "deterministic": True,
                          "quiet": True},
                  grid={"seed": (0, 1)},
                  measure={"batch": 4, "warmup": 0, "repeats": 1},
                  probe={"images": 16, "batch": 8})
    budget = ("12 fine-tunes x 2-4 min on 2 CPU cores, one speed run ~5 min, five symmetry runs "
              "(10 000 test images) ~2 min each")
