"""The test beds the papers' studies declare, and what every study on each of them shares.

``scenes`` (the default of every paper's study) is the papers' regime in miniature: the shipped
``scenes-vit`` reference (12 blocks, DeiT-S's 14x14 grid of 196 patches + class token) on 56x56 scenes
where one garment sits among clutter (data/scenes.py). A fine-tune there costs about 5x one on the
49-patch model per image, so every scene run trains for the same short schedule, :data:`STEPS` steps
of batch 64 (a fixed 6 400 of the 60 000 training scenes, one pass), and is scored on a fixed
:data:`EVAL_SCENES` test scenes: the schedule is shortened identically for every arm of every study
rather than dropping arms or seeds.

``fmnist`` is the second bed: the ``fmnist-vit`` reference (6 blocks, 49 patches of 28x28
Fashion-MNIST), each study with the paper's own recipe scaled to 2 CPU cores (or, where a study trains
from scratch, the recipe's model).

Each bed's smoke runs the same study on a tiny model of the bed's shape (same depth and patch grid, so
every published schedule runs unchanged) on synthetic Fashion-MNIST-format images, in seconds.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .study import Arm, Axis, Col, Expect, Smoke
from .testbed import Testbed

#: the scene reference starts every run and names the data
SCENES = Testbed(reference="scenes-vit")
#: the dense task (the target's pixels labelled): its own reference, scenes-vit with a segmentation head trained
#: for one epoch (recipe ``scenes-vit-seg``), so a dense arm's 100 steps adapt a model that segments to pruning
SCENES_SEG = Testbed(reference="scenes-vit-seg", data="fmnist_scenes_seg")
#: the Fashion-MNIST reference starts every run of a study that fine-tunes on that bed
FMNIST = Testbed(reference="fmnist-vit")
#: optimiser steps of every scene fine-tune (batch 64)
STEPS = 100
BATCH = 64
#: test scenes every run is scored on
EVAL_SCENES = 2000
#: one epoch of the 60 000 training scenes at batch 64 (the loader drops the last 32)
EPOCH_STEPS = 60_000 // BATCH

#: the fine-tune length, a grid axis of the studies whose arms have learned parts: the shortened schedule
#: (the runs made first keep their ids) and one epoch, scored on all 10 000 test scenes; the recipe is
#: otherwise the same (its schedule is in epochs of the training items: warm-up a fraction of the run)
LENGTH = Axis("steps", (STEPS, EPOCH_STEPS), "t", sets={EPOCH_STEPS: {"subset": None, "eval_subset": None}},
              implicit=STEPS)


def lengths(arms: dict[str, Arm], longer: tuple[str, ...], **where: tuple[Any, ...]) -> dict[str, Arm]:
    """``arms`` on the :data:`LENGTH` axis: those named in ``longer`` also for one epoch (there only at
    the grid values ``where``, e.g. ``bits=(16,)``), the rest at the shortened schedule only."""
    def one(name: str, a: Arm) -> Arm:
        short = {**a.only, "steps": (STEPS,)}
        if name not in longer:
            return dataclasses.replace(a, only=short)
        return dataclasses.replace(a, only=(short, {**a.only, **where, "steps": (EPOCH_STEPS,)})) if where else a

    return {k: one(k, a) for k, a in arms.items()}


def at_epoch(claims: tuple[Expect, ...], arms: tuple[str, ...]) -> tuple[Expect, ...]:
    """The ``claims`` between ``arms`` again after one epoch (:data:`LENGTH`)."""
    return tuple(dataclasses.replace(e, at={**e.at, "steps": EPOCH_STEPS}) for e in claims
                 if e.arm in arms and e.baseline in arms)

#: the shortened schedule's fields, laid over a study's own recipe
SHORT: dict[str, Any] = {"subset": STEPS * BATCH, "batch_size": BATCH, "epochs": 1, "eval_subset": EVAL_SCENES,
                         "data": "fmnist_scenes", "augment": "crop_flip", "threads": 2, "ckpt_every": 25}

#: the columns of a scene study's speed measure: each fine-tuned arm's MACs and measured speed beside its top-1
SPEED_COLUMNS = (Col("label", "spec", fmt="{}"), Col("kind", "kind", fmt="{}"), Col("macs_speedup", "MACs x"),
                 Col("speedup", "speed-up b32"), Col("latency_speedup", "speed-up b1"),
                 Col("top1", "top-1 %"))


def shortened(recipe: dict[str, Any]) -> dict[str, Any]:
    """``recipe`` (TrainConfig fields) on the scene test bed's shortened schedule (module docstring)."""
    out = {k: v for k, v in recipe.items() if k not in ("init", "model", "description")}
    return {**out, **SHORT}


#: the smokes' tiny models: each reference's shape at a width that trains in seconds
TINY_SCENES = {"img_size": 56, "patch_size": 4, "in_chans": 1, "num_classes": 10, "embed_dim": 24, "depth": 12,
               "num_heads": 2, "mlp_ratio": 2.0}
TINY_FMNIST = {"img_size": 28, "patch_size": 4, "in_chans": 1, "num_classes": 10, "embed_dim": 32, "depth": 6,
               "num_heads": 2, "mlp_ratio": 2.0}
SMOKE_RECIPE: dict[str, Any] = {"teacher": None, "distill": [], "epochs": 1, "subset": 32, "eval_subset": 16,
                                "batch_size": 16, "eval_batch_size": 16, "warmup_epochs": 0.2, "ckpt_every": 1,
                                "augment": "none", "deterministic": True, "quiet": True}
#: a smoke measure's timing: one round of batch 4
SMOKE_MEASURE = {"batch": 4, "warmup": 0, "repeats": 1}


def scene_smoke(data: str = "fmnist_scenes", **extra: Any) -> Smoke:
    """A scene bed's smoke: the tiny model on scenes (``data``) made from synthetic Fashion-MNIST-format
    images, two seeds (a paired test needs n >= 2)."""
    bed = Testbed(model="vit_tiny_patch16_224", kwargs=TINY_SCENES, data=data, synthetic=True)
    return Smoke(testbed=bed, recipe=dict(SMOKE_RECIPE), **{"grid": {"seed": (0, 1)}, **extra})


def fmnist_smoke(img_size: int = 28, **extra: Any) -> Smoke:
    """A Fashion-MNIST bed's smoke: the tiny model (``img_size``: 56 for the mosaics) on synthetic
    Fashion-MNIST-format images, two seeds."""
    bed = Testbed(model="vit_tiny_patch16_224", kwargs={**TINY_FMNIST, "img_size": img_size}, synthetic=True)
    return Smoke(testbed=bed, recipe=dict(SMOKE_RECIPE), **{"grid": {"seed": (0, 1)}, **extra})
