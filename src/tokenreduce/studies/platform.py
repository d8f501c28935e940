"""The hashing baseline on Fashion-MNIST: what one short fine-tune with a hash head gives, per code length.

The retrieval protocol of "Efficient Token Pruning for Hashing" (EET), arXiv 2504.16691, without any
pruning: the fmnist-vit reference fine-tuned with ``hash(bits=B)`` (fixed +-1 class target codes, CE
weight 0.1) by the ``fmnist-hash`` recipe,
16, 32 and 64 bits, seeds 0, 1, 2 (the seed changes the data order and the class codes). Retrieval:
the test images against the training images by Hamming ranking, asymmetric (their
class target codes, EET's protocol) and symmetric (encoded by the network). One arm: the numbers
other hashing studies start from, not a contrast.
"""

from __future__ import annotations

from ..study.declare import Arm, Axis, Bed, Col, Study, register_study
from ..train.recipes import get_recipe
from .beds import FMNIST, fmnist_smoke


@register_study("platform")
class HashBaseline(Study):
    claim = "a reference fine-tuned for one epoch with a hash head retrieves by Hamming ranking (a baseline)"
    source = "EET, arXiv 2504.16691, its retrieval protocol (asymmetric mAP over the whole database)"
    beds = {"fmnist": Bed(
        title="The hashing baseline: retrieval mAP of the fine-tuned reference at 16, 32, 64 bits",
        testbed=FMNIST,
        recipe=get_recipe("fmnist-hash"),  # also `tokenreduce train --recipe fmnist-hash`
        arms={"hash": Arm("hash head, unpruned")},  # the recipe's task, its bits set by the grid
        baseline="hash",
        grid=(Axis("bits", (16, 32, 64), "b"), Axis("seed", (0, 1, 2), "s")),
        split=("bits", "{} bits"),
        columns=(Col("map_asym", "mAP asym %"), Col("map_sym", "mAP sym %"), Col("p@100_asym", "P@100 asym %"),
                 Col("p@100_sym", "P@100 sym %"), Col("top1", "top-1 %"), Col("train_time_s", "wall s")),
        smoke=fmnist_smoke(grid={"bits": (8,), "seed": (0, 1)}),
        budget=((9, "training", 3.25),))}
