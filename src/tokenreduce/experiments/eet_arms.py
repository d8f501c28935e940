"""EET on Fashion-MNIST: does CTP cost retrieval quality, and do DKT + DRG win it back?

"Efficient Token Pruning for Hashing" (EET), arXiv 2504.16691. Four arms fine-tune the trained
reference for hashing with the ``fmnist-eet`` recipe (EET's optimiser scaled to 2 CPU cores: SGD
momentum 0.9, lr 0.01, warm-up then cosine, batch 64, 1 epoch on a fixed 10 000 training images,
per-image FISH targets): the unpruned hashing baseline, CTP alone, CTP + DKT, full EET; at 16 and
64 bits, seeds 0, 1, 2, contrasts paired by seed (the same seed gives both arms the same data order
and FISH targets). Then the speed of CTP against the unpruned model (one interleaved run of the
eval pipeline) and recall@kept of ``ctp()`` on the reference (experiments/recall_at_kept.py).
"""

from __future__ import annotations

from ..train.recipes import get_recipe
from .study import Arm, Axis, Col, Expect, Measure, Probe, Smoke, Study, register_study
from .testbed import Testbed

_PLAIN = "eet(dkt=False, drg=False)"  # 0.1 CE + MSE to the FISH codes: EET without its two parts
_SOURCE = "EET, arXiv 2504.16691"

#: the smoke's tiny model: the reference's shape (28x28, patch 4, 49 patches, 6 blocks), so that
#: ``ctp()``'s published schedule runs unchanged, at a width that trains in seconds
_TINY = {"img_size": 28, "patch_size": 4, "in_chans": 1, "num_classes": 10, "embed_dim": 32, "depth": 6,
         "num_heads": 2, "mlp_ratio": 2.0}


@register_study("eet")
class EETArms(Study):
    title = "EET on Fashion-MNIST: CTP, DKT and DRG"
    claim = "CTP lowers retrieval mAP; DKT + DRG bring it back to the unpruned baseline or above"
    source = f"{_SOURCE}, Tables IV-V"
    testbed = Testbed(reference="fmnist-vit")
    recipe = get_recipe("fmnist-eet")  # also `tokenreduce train --recipe fmnist-eet`
    arms = {
        "a_unpruned": Arm("(a) unpruned (hash baseline)", task=_PLAIN),
        "b_ctp": Arm("(b) CTP only", task=_PLAIN, spec="ctp()"),
        "c_ctp_dkt": Arm("(c) CTP + DKT", task="eet(drg=False)", spec="ctp()"),
        "d_eet": Arm("(d) full EET (CTP + DKT + DRG)", task="eet", spec="ctp()"),
    }
    baseline = "a_unpruned"
    grid = (Axis("bits", (16, 64), "b"), Axis("seed", (0, 1, 2), "s"))
    split = ("bits", "{} bits")
    columns = (Col("map_asym", "mAP asym %"), Col("map_sym", "mAP sym %"), Col("p@100_asym", "P@100 asym %"),
               Col("top1", "top-1 %"), Col("map_asym", "Δ mAP asym vs (a)", paired=True),
               Col("train_time_s", "wall s"))
    measures = (Measure("speed", reference="a_unpruned", at={"bits": 16, "seed": 0}, specs=("ctp()",),
                        finetuned=("b_ctp",), title="Speed: CTP against the unpruned model, one interleaved run",
                        columns=(("label", "label", "{}"), ("kind", "kind", "{}"), ("map", "map", "{:.2f}"),
                                 ("macs_speedup", "macs_speedup", "{:.2f}"), ("img_per_s", "img_per_s", "{:.0f}"),
                                 ("speedup", "speedup", "{:.2f}"), ("latency_ms", "latency_ms", "{:.2f}"),
                                 ("latency_speedup", "latency_speedup", "{:.2f}"))),)
    probes = (Probe("recall", "recall_at_kept(spec='ctp()')", title="recall@kept: does CTP keep the object?",
                    fmnist_only=True),)
    expect = (
        Expect("CTP alone lowers mAP", f"{_SOURCE}, Table IV (Stanford Cars, 16 bits)", arm="b_ctp",
               baseline="a_unpruned", metric="map_asym", direction=-1, at={"bits": 16}, effect=79.96 - 82.85,
               published="82.85 -> 79.96 mAP"),
        Expect("CTP alone lowers mAP (64 bits)", f"{_SOURCE}, Table IV (CTP lowers mAP at every code length)",
               arm="b_ctp", baseline="a_unpruned", metric="map_asym", direction=-1, at={"bits": 64}),
        Expect("full EET is at or above the unpruned baseline", f"{_SOURCE}, Table V (NABirds, 16 bits)",
               arm="d_eet", baseline="a_unpruned", metric="map_asym", direction=1, margin=0.0, at={"bits": 16},
               effect=63.45 - 58.30, published="58.30 -> 63.45 mAP"),
        Expect("full EET is at or above the unpruned baseline (64 bits)", f"{_SOURCE}, Table V",
               arm="d_eet", baseline="a_unpruned", metric="map_asym", direction=1, at={"bits": 64}),
        Expect("DKT + DRG recover mAP lost to CTP", f"{_SOURCE}, Table IV", arm="d_eet", baseline="b_ctp",
               metric="map_asym", direction=1, at={"bits": 16}),
    )
    smoke = Smoke(testbed=Testbed(model="vit_tiny_patch16_224", kwargs=_TINY, synthetic=True),
                  recipe={"subset": 32, "eval_subset": 16, "batch_size": 16, "eval_batch_size": 16,
                          "warmup_epochs": 0.2, "ckpt_every": 1, "augment": "none", "deterministic": True,
                          "quiet": True},
                  grid={"bits": (8,), "seed": (0, 1)},
                  measure={"batch": 4, "warmup": 0, "repeats": 1},
                  probe={"images": 16, "seeds": (0,), "batch": 8})
    budget = "24 training runs x 3-5 min on 2 CPU cores (two lanes of 1 thread), speed and recall runs ~2 min each"
