"""The test beds the papers' studies declare, and what every study on each of them shares.

``scenes`` (the default of every paper's study) is the papers' regime in miniature: the shipped
``scenes-vit`` reference (DeiT-S's depth and 14x14 patch grid) on 56x56 scenes where one garment sits among
clutter (data/scenes.py). A fine-tune there costs more per image than one on the 49-patch model, so every
scene run trains on the same shortened schedule (:func:`shortened`) and is scored on the same fixed test
scenes: the schedule is shortened identically for every arm of every study rather than dropping arms or seeds.

``fmnist`` is the second bed: the ``fmnist-vit`` reference (49 patches of 28x28 Fashion-MNIST), each study
with the paper's own recipe scaled to 2 CPU cores (or, where a study trains from scratch, the recipe's model).

The fine-tune length (:data:`LENGTH`) adds one epoch and ten for the arms of the studies whose parts start
untrained and for the training-free control (top-k against random at its counts); one epoch is the CPU's
part of the plan, run in the background across sittings (a run is resumable and its record is what is
kept), ten epochs a GPU's. Each study's bed declares what its runs cost (``Bed.budget``, numbers from timed
runs), and the report prints it beside what the stored runs cost as run. Three seeds: where a claim's spread
says three cannot resolve the paper's effect its report says so rather than the plan adding seeds; a claim
whose longer runs need a power plan declares it before them (:func:`at_longer`).

Each bed's smoke runs the same study on a tiny model of the bed's shape (same depth and patch grid, so
every published schedule runs unchanged) on synthetic Fashion-MNIST-format images, in seconds.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..core.errors import SpecError
from ..data.fashion_mnist import SIZES
from ..data.scenes import EVAL_SUBSET
from ..study.declare import Arm, Axis, Col, Expect
from ..study.testbed import Testbed
from ..train.recipes import get_recipe

#: the scene reference starts every run and names the data
SCENES = Testbed(reference="scenes-vit")
#: the dense task (the target's pixels labelled): its own reference, scenes-vit with a segmentation head trained
#: for one epoch (recipe ``scenes-vit-seg``), so a dense arm's 100 steps adapt a model that segments to pruning
SCENES_SEG = Testbed(reference="scenes-vit-seg", data="fmnist_scenes_seg")
#: the Fashion-MNIST reference starts every run of a study that fine-tunes on that bed
FMNIST = Testbed(reference="fmnist-vit")
#: optimiser steps of every scene fine-tune, and its batch
STEPS = 100
BATCH = 64
#: one epoch of the training scenes (one per training item; the loader drops the last partial batch)
EPOCH_STEPS = SIZES["train"] // BATCH

#: ten epochs: the length a GPU adds to the curve (``tokenreduce study NAME --device cuda``)
TEN_EPOCHS = 10 * EPOCH_STEPS
#: what a longer length trains on and is scored on: every item
_WHOLE_SETS = {"subset": None, "eval_subset": None}
#: the fine-tune length, a grid axis of the studies whose arms have learned parts: the shortened schedule
#: (the runs made first keep their ids), one epoch and ten, the longer ones scored on all the test scenes;
#: the recipe is otherwise the same (its schedule is in epochs of the training items: the warm-up stays a
#: fraction of the run)
LENGTH = Axis("steps", (STEPS, EPOCH_STEPS, TEN_EPOCHS), "t",
              sets={EPOCH_STEPS: _WHOLE_SETS, TEN_EPOCHS: {**_WHOLE_SETS, "epochs": TEN_EPOCHS // EPOCH_STEPS}})


def one_epoch_budget(runs: int, minutes: float) -> tuple[int, str, float]:
    """A longer study's part of the one-epoch compute plan, as a budget entry (``Bed.budget``): ``runs`` runs
    of about ``minutes`` minutes in all, planned from one timed run before the runs."""
    return runs, f"{EPOCH_STEPS}-step training", minutes / runs


#: why a longer run may have no record yet (a scene bed's ``pending``; the summary counts those missing per length)
LONGER_PENDING = (f"by plan, the {EPOCH_STEPS}-step runs are made on CPU cores across sittings and the "
                  f"{TEN_EPOCHS}-step runs on a GPU (tokenreduce study NAME --device cuda --where steps={TEN_EPOCHS} "
                  "runs them)")


def lengths(arms: dict[str, Arm], longer: tuple[str, ...], **where: tuple[Any, ...]) -> dict[str, Arm]:
    """``arms`` on the :data:`LENGTH` axis: those named in ``longer`` also at the longer lengths (there only
    at the grid values ``where``, e.g. ``bits=(16,)``), the rest at the shortened schedule only."""
    def one(name: str, a: Arm) -> Arm:
        short = {**a.only, "steps": (STEPS,)}
        if name not in longer:
            return dataclasses.replace(a, only=short)
        return dataclasses.replace(a, only=(short, {**a.only, **where, "steps": LENGTH.values[1:]})) if where else a

    return {k: one(k, a) for k, a in arms.items()}


def at_longer(claims: tuple[Expect, ...], arms: tuple[str, ...],
              plans: dict[str, float] | None = None) -> tuple[Expect, ...]:
    """The ``claims`` between ``arms`` again at each longer length (:data:`LENGTH`). ``plans``: claim text ->
    the smallest effect (toward the claim) its longer runs must detect, a power plan declared before them
    whose pilot is the same contrast at the shortened schedule (``Expect.power``)."""
    plans = plans or {}
    unknown = set(plans) - {e.claim for e in claims}
    if unknown:
        raise SpecError(f"power plans for claims that are not declared: {sorted(unknown)}")

    return tuple(dataclasses.replace(e, at={**e.at, "steps": steps}, power=plans.get(e.claim))
                 for steps in LENGTH.values[1:]
                 for e in claims if e.arm in arms and e.baseline in arms)

#: the shortened schedule: the scene bed's one difference from a study's own recipe
SHORT: dict[str, Any] = {"subset": STEPS * BATCH, "batch_size": BATCH, "epochs": 1, "eval_subset": EVAL_SUBSET,
                         "data": "fmnist_scenes", "ckpt_every": 25}

#: the columns of a scene study's speed measure: each fine-tuned arm's MACs and measured speed beside its top-1
SPEED_COLUMNS = (Col("label", "spec"), Col("kind", "kind"), Col("macs_speedup", "MACs x"),
                 Col("speedup", "speed-up b32"), Col("latency_speedup", "speed-up b1"),
                 Col("top1", "top-1 %"))


def shortened(recipe: str, **differences: Any) -> dict[str, Any]:
    """Recipe ``recipe`` on the scene test bed (which gives the model and its weights) on its shortened
    schedule (:data:`SHORT`), with a study's own ``differences`` (TrainConfig fields)."""
    out = {k: v for k, v in get_recipe(recipe).items() if k not in ("init", "model")}
    return {**out, **SHORT, **differences}


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


def scene_smoke(data: str = "fmnist_scenes", **extra: Any) -> dict[str, Any]:
    """A scene bed's smoke: the tiny model on scenes (``data``) made from synthetic Fashion-MNIST-format
    images, two seeds (a paired test needs n >= 2)."""
    bed = Testbed(model="vit_tiny_patch16_224", kwargs=TINY_SCENES, data=data, synthetic=True)
    return {"testbed": bed, "recipe": dict(SMOKE_RECIPE), "grid": {"seed": (0, 1)}, **extra}


def fmnist_smoke(img_size: int = 28, **extra: Any) -> dict[str, Any]:
    """A Fashion-MNIST bed's smoke: the tiny model (``img_size``: 56 for the mosaics) on synthetic
    Fashion-MNIST-format images, two seeds."""
    bed = Testbed(model="vit_tiny_patch16_224", kwargs={**TINY_FMNIST, "img_size": img_size}, synthetic=True)
    return {"testbed": bed, "recipe": dict(SMOKE_RECIPE), "grid": {"seed": (0, 1)}, **extra}
