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

The fine-tune length (:data:`LENGTH`) adds one epoch (937 steps) and ten (9 370) for the arms of the studies
whose parts start untrained (Cropr, DynamicViT in ``baselines``, EET, BSPF) and the training-free control
(top-k against random at its counts). Compute plan for one epoch, 2 CPU cores, 2 threads, one run at a time,
from one timed run (``cropr-t937-s0``: 0.53 s a step alone, about 9.5 min with its evaluation of 10 000 test
scenes; 21 min while tests shared the cores) and each arm's recorded 100-step wall time relative to Cropr's:
each longer study's budget states its part (:func:`one_epoch_budget`), about 10 hours in all, run in the
background across sittings (a run is resumable and its record is what is kept). The report prints each budget
beside what the stored runs cost as run (page.py ``as_run``). Three seeds: at the 100-step spreads three
resolve differences of a few points (Cropr against top-k: sd 0.7 of the paired difference); where a claim's sd
says three cannot resolve the paper's effect its report says so rather than this plan adding seeds: the BSPF
and EET claims declare their power plans (``at_longer(..., plans=)``) before their first one-epoch run, the
pilot sd read from the same contrast's 100-step records; Cropr's and DynamicViT's one-epoch runs came first
and have none.
Ten epochs is the GPU's part of the curve: ten times the CPU plan.

Each bed's smoke runs the same study on a tiny model of the bed's shape (same depth and patch grid, so
every published schedule runs unchanged) on synthetic Fashion-MNIST-format images, in seconds.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..core.errors import SpecError
from ..study.declare import Arm, Axis, Col, Expect
from ..study.testbed import Testbed

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

#: ten epochs: the length a GPU adds to the curve (``tokenreduce study NAME --device cuda``)
TEN_EPOCHS = 10 * EPOCH_STEPS
#: the papers' schedules in epochs, shortest and longest (the 30-epoch fine-tunes of EViT, DynamicViT and
#: Cropr; DeiT's 300 epochs from scratch, as EET and BSPF train): what the report sets the lengths run against
PAPER_EPOCHS = (30, 300)
#: the fine-tune length, a grid axis of the studies whose arms have learned parts: the shortened schedule
#: (the runs made first keep their ids), one epoch and ten, the longer ones scored on all 10 000 test scenes;
#: the recipe is otherwise the same (its schedule is in epochs of the training items: the warm-up stays a
#: fraction of the run)
LENGTH = Axis("steps", (STEPS, EPOCH_STEPS, TEN_EPOCHS), "t", implicit=STEPS,
              sets={EPOCH_STEPS: {"subset": None, "eval_subset": None},
                    TEN_EPOCHS: {"subset": None, "eval_subset": None, "epochs": 10}})


def one_epoch_budget(runs: int, minutes: int) -> str:
    """A longer study's part of the one-epoch compute plan (module docstring), as its budget says it: ``runs``
    runs of about ``minutes`` minutes in all, declared before the runs."""
    return f"one epoch ({EPOCH_STEPS} steps): {runs} runs, about {minutes} min planned from one timed run"


#: why a longer run may have no record yet (a scene bed's ``pending``)
LONGER_PENDING = (f"the {EPOCH_STEPS}-step runs are made in the background across sittings (about 10 hours on 2 CPU "
                  f"cores); the {TEN_EPOCHS}-step runs are a GPU's part of the plan (tokenreduce study NAME --device "
                  f"cuda --where steps={TEN_EPOCHS} runs them)")


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
