"""EET: what CTP costs in retrieval mAP, what DKT + DRG win back, how far from an oracle.

"Efficient Token Pruning for Hashing" (EET), arXiv 2504.16691. Four arms fine-tune a reference for 16-
and 64-bit hashing with EET's optimiser (recipe ``fmnist-eet``), seeds 0-2,
paired by seed (a seed fixes the data order and the FISH targets of both arms):

    (a) unpruned hashing baseline      eet(dkt=False, drg=False), no pruner
    (b) CTP only                       the same loss, ctp()
    (c) CTP + DKT                      eet(drg=False), ctp()
    (d) full EET                       eet, ctp()

``scenes`` (studies/beds.py): the premise of EET holds there, 196 patches of which most are background or
clutter; the scene bed's shortened schedule, its test scenes as the queries against a fixed part of the
training scenes as the database. CTP keeps 98 / 49 / 12 patches after blocks 3 / 7 / 9. Beside the four arms:

- FISH's sensitivity on the unpruned arm (16 bits): FISH solves its per-image targets by minimising
  sigma ||L - P V||^2 + delta ||B - R V||^2, whose minimiser depends on delta / sigma only, so the study
  varies delta at sigma = 1: the official 1e-4, then 1e-2 and 1 (no claim is declared on them).
- (e) the oracle at CTP's counts, an evaluated arm: each of (b)'s checkpoints with ``ctp()`` swapped for
  the ``oracle`` pruner at the same counts and blocks, which keeps the target garment's patches first
  (the scene masks; methods/oracle.py), on the same weights and test scenes (probes/
  oracle_at_counts.py).
- the speed of CTP against the unpruned model, one interleaved run of the eval pipeline (throughput and
  latency at bench/settings.SPEED's batches; at 16 bits: the hash head's width does not move the backbone's cost),
  the paper's -42.7% latency claim.

``fmnist``: the ``fmnist-eet`` recipe (EET's optimiser scaled to 2 CPU cores) from the ``fmnist-vit``
reference, the speed run as above, and recall@kept of ``ctp()`` on the reference (probes/recall_at_kept.py).
"""

from __future__ import annotations

import dataclasses

from ..bench.settings import SPEED
from ..study.declare import Arm, Axis, Bed, Col, Expect, Probe, Study, Timing, register_study
from ..train.recipes import get_recipe
from .beds import (
    FMNIST,
    LENGTH,
    LONGER_PENDING,
    SCENES,
    SMOKE_MEASURE,
    at_longer,
    fmnist_smoke,
    lengths,
    one_epoch_budget,
    scene_smoke,
    shortened,
)

_SOURCE = "EET, arXiv 2504.16691"
_DB = "db_subset=5000"  # the scene bed: 2 000 test queries against a fixed 5 000 training scenes
SEEDS = (0, 1, 2)
_GRID = (Axis("bits", (16, 64), "b"), Axis("seed", SEEDS, "s"))
_COLUMNS = (Col("map_asym", "mAP asym %"), Col("map_sym", "mAP sym %"), Col("p@100_asym", "P@100 asym %"),
            Col("top1", "top-1 %"), Col("map_asym", "Δ mAP asym vs (a)", paired=True), Col("train_time_s", "wall s"))


def _arms(db: str = "") -> dict[str, Arm]:
    """The four arms, their task's retrieval database narrowed by ``db`` (task parameters)."""
    more = f", {db}" if db else ""
    plain = f"eet(dkt=False, drg=False{more})"  # 0.1 CE + MSE to the FISH codes: EET without its two parts
    return {
        "a_unpruned": Arm("(a) unpruned (hash baseline)", options={"task": plain}),
        "b_ctp": Arm("(b) CTP only", options={"task": plain}, spec="ctp()"),
        "c_ctp_dkt": Arm("(c) CTP + DKT", options={"task": f"eet(drg=False{more})"}, spec="ctp()"),
        "d_eet": Arm("(d) full EET (CTP + DKT + DRG)", options={"task": f"eet({db})" if db else "eet"},
                         spec="ctp()"),
    }


def _speed(title: str) -> Timing:
    return Timing("speed", model="a_unpruned", at={"bits": 16, "seed": 0}, specs=("ctp()",),
                   finetuned=("b_ctp",), title=title,
                   columns=(Col("label", "label"), Col("kind", "kind"), Col("map", "map"),
                            Col("macs_speedup", "macs_speedup"), Col("img_per_s", "img_per_s"),
                            Col("speedup", "speedup"), Col("latency_ms", "latency_ms"),
                            Col("latency_speedup", "latency_speedup")))


#: the claims at 16 bits, the code length the paper's figures are quoted at
_AT_16 = (
    Expect("CTP alone lowers mAP", f"{_SOURCE}, Table IV (Stanford Cars, 16 bits)", arm="b_ctp",
           baseline="a_unpruned", metric="map_asym", direction=-1, at={"bits": 16},
           reported=(79.96 - 82.85, "82.85 -> 79.96 mAP")),
    Expect("full EET is at or above the unpruned baseline", f"{_SOURCE}, Table V (NABirds, 16 bits)",
           arm="d_eet", baseline="a_unpruned", metric="map_asym", direction=1, at={"bits": 16},
           reported=(63.45 - 58.30, "58.30 -> 63.45 mAP"), kind="noninferior", margin=-1.0,
           why="1 mAP point: about 1.5 test-query standard errors of an mAP over 2 000 queries (AP's spread "
               "across queries about 0.3), and well inside the published +5.15"),
    Expect("DKT + DRG recover mAP lost to CTP", f"{_SOURCE}, Table IV", arm="d_eet", baseline="b_ctp",
           metric="map_asym", direction=1, at={"bits": 16}),
    Expect("CTP falls short of the object-first oracle at its counts", "review of EET (the oracle arm)",
           arm="e_oracle", baseline="b_ctp", metric="map_asym", direction=1, at={"bits": 16}),
    Expect("DKT alone recovers mAP lost to CTP", f"{_SOURCE}, Table IV (the DKT row)", arm="c_ctp_dkt",
           baseline="b_ctp", metric="map_asym", direction=1, at={"bits": 16}),
)


#: the arms fine-tuned for one epoch too, at 16 bits (studies/beds.py, LENGTH)
LONGER = ("a_unpruned", "b_ctp", "d_eet", "e_oracle")


def _at_64(e: Expect) -> Expect:
    """The same claim at 64 bits, where no published figure is quoted."""
    return dataclasses.replace(e, at={"bits": 64}, reported=None,
                               source=f"{e.source}, re-tested at 64 bits")


@register_study("eet")
class EET(Study):
    paper_epochs = 300
    claim = "CTP lowers retrieval mAP; DKT + DRG bring it back to the unpruned baseline or above"
    source = f"{_SOURCE}, Tables IV-V"
    # declared before any one-epoch run of this study: the published CTP loss (82.85 -> 79.96), recovered whole
    # for DKT + DRG; a true difference of 0 for "at or above" (its 1-point margin); one mAP point for the oracle
    expect = (*_AT_16, *map(_at_64, _AT_16), *at_longer(_AT_16, LONGER, plans={
        "CTP alone lowers mAP": 2.89, "full EET is at or above the unpruned baseline": 1.0,
        "DKT + DRG recover mAP lost to CTP": 2.89, "CTP falls short of the object-first oracle at its counts": 1.0}))
    beds = {
        "scenes": Bed(
            testbed=SCENES,
            title="EET on the scene test bed: CTP, DKT and DRG, and the oracle at CTP's counts",
            recipe=shortened("fmnist-eet"),
            arms=lengths({
                **_arms(_DB),
                "e_oracle": Arm("(e) oracle at CTP's counts, (b)'s weights", kind="evaluated", reads="b_ctp",
                                spec="oracle_at_counts(subset={eval_subset})"),
                "a_fish_d1e-2": Arm("(a) with FISH delta = 1e-2",
                                    options={"task": f"eet(dkt=False, drg=False, fish_delta=0.01, {_DB})"},
                                    only={"bits": (16,)}),
                "a_fish_d1": Arm("(a) with FISH delta = 1",
                                 options={"task": f"eet(dkt=False, drg=False, fish_delta=1.0, {_DB})"},
                                 only={"bits": (16,)}),
            }, LONGER, bits=(16,)),
            baseline="a_unpruned", pending=LONGER_PENDING, grid=(LENGTH, *_GRID), split=("bits", "{} bits"),
            columns=_COLUMNS,
            evaluations=(_speed(f"Speed: CTP against the unpruned model, one interleaved run (batch {SPEED['batch']}; "
                                "latency at 1)"),),
            # no "subset" here: the oracle takes its source's test items ({eval_subset}), so the two pair by item
            smoke=scene_smoke(grid={"bits": (8,), "seed": (0, 1)}, measure=SMOKE_MEASURE, probe={"batch": 8}),
            budget=((30, "training", 4), (6, "oracle evaluation", 2), (1, "speed", 3), one_epoch_budget(12, 205))),
        "fmnist": Bed(
            testbed=FMNIST,
            title="EET on Fashion-MNIST: CTP, DKT and DRG",
            recipe=get_recipe("fmnist-eet"),  # also `tokenreduce train --recipe fmnist-eet`
            arms=_arms(), baseline="a_unpruned", grid=_GRID, split=("bits", "{} bits"), columns=_COLUMNS,
            evaluations=(_speed("Speed: CTP against the unpruned model, one interleaved run"),
                         Probe("recall", "recall_at_kept(spec='ctp()')", title="recall@kept: does CTP keep the object?",
                               fmnist_only=True)),
            smoke=fmnist_smoke(grid={"bits": (8,), "seed": (0, 1)}, measure=SMOKE_MEASURE,
                               probe={"images": 16, "seeds": (0,), "batch": 8}),
            budget=((24, "training", 4), (1, "speed", 2), (1, "recall probe", 2))),
    }
