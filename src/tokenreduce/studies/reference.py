"""The ``fmnist-vit`` reference: the model every Fashion-MNIST study starts from, as a one-arm study.

One run of the ``fmnist-vit`` recipe from scratch; the study's claim states the target. There is no contrast
to judge, so no verdict; the table is the record.

The checkpoint the other studies read is the one ``tokenreduce train --recipe fmnist-vit`` writes to
the cache (``train.recipes.reference_checkpoint``); the study's run trains the same recipe into its
own folder.
"""

from __future__ import annotations

from ..study.declare import Arm, Axis, Bed, Col, Study, register_study
from ..train.recipes import get_recipe
from .beds import fmnist_smoke


@register_study("reference")
class FmnistReference(Study):
    claim = "the fmnist-vit recipe reaches >= 89% test top-1 on Fashion-MNIST within 60 minutes on 2 CPU cores"
    source = "the project's reference recipe (train/recipes.py, fmnist-vit)"
    beds = {"fmnist": Bed(
        title="The fmnist-vit reference",
        recipe=get_recipe("fmnist-vit"),  # the recipe's own model, from scratch
        arms={"fmnist_vit": Arm("fmnist-vit (from scratch)")},
        baseline="fmnist_vit",
        grid=(Axis("seed", (0,), "s"),),
        columns=(Col("top1", "test top-1 %"), Col("train_acc", "train acc %"), Col("epochs", "epochs"),
                 Col("train_time_s", "wall s")),
        smoke=fmnist_smoke(grid={}),
        budget=((1, "training", 47),))}
