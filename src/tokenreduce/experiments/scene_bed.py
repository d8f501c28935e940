"""What every study on the scene test bed shares: the test bed, the shortened fine-tune, the smoke bed.

The scene test bed (data/scenes.py) is the papers' regime in miniature: the shipped ``scenes-vit``
reference (12 blocks, DeiT-S's 14x14 grid of 196 patches + class token) on 56x56 scenes where one
garment sits among clutter. A fine-tune there costs about 5x one on the 49-patch model per image, so
every scene study trains each arm for the same short schedule, :data:`STEPS` steps of batch 64
(a fixed 6 400 of the 60 000 training scenes, one pass), and scores it on a fixed 2 000 test scenes.
The schedule is shortened identically for every arm of every study rather than dropping arms or seeds.
"""

from __future__ import annotations

from typing import Any

from .study import Smoke
from .testbed import Testbed

#: the scene reference starts every run and names the data
SCENES = Testbed(reference="scenes-vit")
#: the dense task (the target's pixels labelled): its own reference, scenes-vit with a segmentation head trained
#: for one epoch (recipe ``scenes-vit-seg``), so a dense arm's 100 steps adapt a model that segments to pruning
SCENES_SEG = Testbed(reference="scenes-vit-seg", data="fmnist_scenes_seg")
#: optimiser steps of every scene fine-tune (batch 64)
STEPS = 100
BATCH = 64
#: test scenes every run is scored on
EVAL_SCENES = 2000

#: the shortened schedule's fields, laid over a study's own recipe
SHORT: dict[str, Any] = {"subset": STEPS * BATCH, "batch_size": BATCH, "epochs": 1, "eval_subset": EVAL_SCENES,
                         "data": "fmnist_scenes", "augment": "crop_flip", "threads": 2, "ckpt_every": 25}


#: the columns of a scene study's speed measure: each fine-tuned arm's MACs and measured speed beside its top-1
SPEED_COLUMNS = (("label", "spec", "{}"), ("kind", "kind", "{}"), ("macs_speedup", "MACs x", "{:.2f}"),
                 ("speedup", "speed-up b32", "{:.2f}"), ("latency_speedup", "speed-up b1", "{:.2f}"),
                 ("top1", "top-1 %", "{:.2f}"))


def shortened(recipe: dict[str, Any]) -> dict[str, Any]:
    """``recipe`` (TrainConfig fields) on the scene test bed's shortened schedule (module docstring)."""
    out = {k: v for k, v in recipe.items() if k not in ("init", "model", "description")}
    return {**out, **SHORT}


#: the smoke's tiny model: the reference's shape (56x56, patch 4, 196 patches, 12 blocks), so every
#: published schedule runs unchanged, at a width that trains in seconds
TINY_SCENES = {"img_size": 56, "patch_size": 4, "in_chans": 1, "num_classes": 10, "embed_dim": 24, "depth": 12,
               "num_heads": 2, "mlp_ratio": 2.0}
SMOKE_RECIPE: dict[str, Any] = {"teacher": None, "distill": [], "subset": 32, "eval_subset": 16, "batch_size": 16,
                                "eval_batch_size": 16,
                                "warmup_epochs": 0.2, "ckpt_every": 1, "augment": "none", "deterministic": True,
                                "quiet": True}


def smoke(data: str = "fmnist_scenes", **extra: Any) -> Smoke:
    """A scene study's smoke: the tiny model on scenes (``data``) made from synthetic Fashion-MNIST-format
    images."""
    bed = Testbed(model="vit_tiny_patch16_224", kwargs=TINY_SCENES, data=data, synthetic=True)
    return Smoke(testbed=bed, recipe=dict(SMOKE_RECIPE), **extra)
