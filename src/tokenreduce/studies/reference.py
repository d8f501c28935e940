"""The ``fmnist-vit`` reference: the model every Fashion-MNIST study starts from, as a one-arm study.

One run of the ``fmnist-vit`` recipe from scratch (timm ``VisionTransformer``, 28x28 grayscale at
native size, patch 4 -> 49 patches + class token, dim 128, depth 6, 4 heads, mlp 2; AdamW lr 2e-3,
17 epochs, cosine, label smoothing 0.1). Its recipe states the target: >= 89% test top-1 within 60
minutes on 2 CPU cores. There is no contrast to judge, so no verdict; the table is the record.

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
    title = "The fmnist-vit reference"
    claim = "the fmnist-vit recipe reaches >= 89% test top-1 on Fashion-MNIST within 60 minutes on 2 CPU cores"
    source = "the project's reference recipe (train/recipes.py, fmnist-vit)"
    beds = {"fmnist": Bed(
        recipe=get_recipe("fmnist-vit"),  # the recipe's own model, from scratch
        arms={"fmnist_vit": Arm("fmnist-vit (from scratch)")},
        baseline="fmnist_vit",
        grid=(Axis("seed", (0,), "s"),),
        columns=(Col("top1", "test top-1 %"), Col("train_acc", "train acc %"), Col("epochs", "epochs"),
                 Col("train_time_s", "wall s")),
        smoke=fmnist_smoke(grid={}),
        budget="1 run of 17 epochs x ~165 s on 2 idle CPU cores (~47 min)")}
