"""Named training recipes: a model config plus optimiser and schedule, as TrainConfig fields.

``scenes-vit`` is the reference of the scene test bed (``data/scenes.py``); its trained checkpoint ships
with the package (``models/references.py``).

``fmnist-vit`` is the reference model for Fashion-MNIST, a timm VisionTransformer trained from scratch on a
CPU. Its trained checkpoint lives in the cache (``$TOKENREDUCE_CACHE``, default ``cache/``), outside git:
``reference_checkpoint()`` is where others find it.

A recipe is a description (what it is for; its fields are the only description of its settings) and
TrainConfig fields, declared as a shared base plus the recipe's differences: its keys are checked against
TrainConfig's fields when this module loads, and :func:`get_recipe` parses its values through TrainConfig, so
a misspelt key or a value of the wrong type fails naming the recipe, the key and the valid fields.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.errors import TokenReduceError
from ..data import fashion_mnist, scenes
from ..data.build import cache_dir
from ..models.references import shipped
from .config import TrainConfig, check_fields

_FMNIST_VIT = {
    "name": "vit_tiny_patch16_224",  # kwargs override everything that name implies
    "kwargs": {"img_size": 28, "patch_size": 4, "in_chans": 1, "num_classes": 10, "embed_dim": 128, "depth": 6,
               "num_heads": 4, "mlp_ratio": 2.0, "drop_path_rate": 0.0},
}
_FMNIST_SEG_VIT = {"name": _FMNIST_VIT["name"], "kwargs": {**_FMNIST_VIT["kwargs"], "img_size": 56}}
#: The scene test bed's reference: DeiT-S's depth and grid (12 blocks, 14x14 patches of the 56x56 scenes), narrow
#: so that it trains on a CPU, and every published schedule (EViT 3/6/9, CTP 98/49/12 after 3/7/9, ToMe r per
#: block, Cropr every block, BSPF 3/7) runs on it unchanged.
_SCENES_VIT = {
    "name": "vit_tiny_patch16_224",
    "kwargs": {"img_size": 56, "patch_size": 4, "in_chans": 1, "num_classes": 10, "embed_dim": 72, "depth": 12,
               "num_heads": 3, "mlp_ratio": 2.0, "drop_path_rate": 0.0},
}


def _reference() -> str:
    return str(default_out("fmnist-vit") / "model.safetensors")


# Each recipe is a base and its declared differences; the fields are the only description of the fields.
#: what every recipe trains on and with unless it says otherwise
_COMMON: dict[str, Any] = {"data": "fashion_mnist", "augment": "crop_flip"}
#: AdamW, warm-up then cosine to ``min_lr``, on the 2 CPU threads every full recipe was sized for
_ADAMW: dict[str, Any] = {**_COMMON, "batch_size": 128, "lr": 2e-3, "min_lr": 1e-5, "weight_decay": 0.05,
                          "label_smoothing": 0.1, "grad_clip": 1.0, "threads": 2}
#: the fmnist-vit reference's schedule, from scratch
_FMNIST: dict[str, Any] = {**_ADAMW, "epochs": 17, "warmup_epochs": 1.0, "ckpt_every": 200}
#: a fine-tune of the trained fmnist-vit
_FINE_TUNE: dict[str, Any] = {**_ADAMW, "init": _reference, "lr": 3e-4, "min_lr": 1e-6, "warmup_epochs": 0.2}
#: a one-epoch fine-tune on a fixed part of the training set, scored on the whole test set: one recipe for
#: every arm of a controlled comparison
_ONE_EPOCH: dict[str, Any] = {**_FINE_TUNE, "epochs": 1, "subset": 20000, "eval_subset": fashion_mnist.SIZES["test"],
                              "ckpt_every": 50}
#: the scene test bed's runs from the Fashion-MNIST settings, scored on the bed's fixed test scenes
_SCENES: dict[str, Any] = {**_ADAMW, "data": "fmnist_scenes", "batch_size": 64, "eval_subset": scenes.EVAL_SUBSET,
                           "ckpt_every": 100}
#: seconds-long runs for tests, CI and demos
_SMOKE: dict[str, Any] = {**_COMMON, "epochs": 1, "lr": 1e-3, "warmup_epochs": 0.2}

RECIPES: dict[str, dict[str, Any]] = {
    "fmnist-vit": {"description": "the reference ViT for Fashion-MNIST, from scratch on a CPU",
                   "model": _FMNIST_VIT, **_FMNIST},
    "fmnist-vit-smoke": {"description": "the fmnist-vit model in seconds (CI and demos)",
                         "model": _FMNIST_VIT, **_SMOKE, "batch_size": 64, "subset": 1024, "eval_subset": 500},
    "fmnist-vit-short": {"description": "the fmnist-vit model on a short schedule, the same for every arm of a "
                                        "controlled comparison (--stem, --spec, --seed)",
                         "model": _FMNIST_VIT, **_FMNIST, "epochs": 4, "warmup_epochs": 0.5, "subset": 20000,
                         "eval_subset": fashion_mnist.SIZES["test"], "eval_every": 4, "ckpt_every": 100},
    "fmnist-vit-ft": {"description": "fine-tune the trained fmnist-vit with --spec SPEC, distilling from the "
                                     "unreduced reference; give --out per spec",
                      **_FINE_TUNE, "teacher": _reference, "distill": ["logits"], "epochs": 3, "ckpt_every": 200},
    "fmnist-hash": {"description": "hashing baseline: the trained fmnist-vit with a hash head toward fixed +-1 "
                                   "class codes (--task 'hash(bits=16|32|64)'); retrieval mAP of the test set "
                                   "against the training set, both protocols",
                    **_ONE_EPOCH, "task": "hash(bits=32)", "label_smoothing": 0.0},
    "fmnist-eet": {"description": "EET: the trained fmnist-vit with --task eet(bits=N) (FISH per-image targets, a "
                                  "jointly trained unpruned teacher, DKT, DRG) and the pruner given by --spec, on "
                                  "EET's optimiser scaled to 2 cores (its 500 warm-up steps of ~8 400 as a fraction); "
                                  "retrieval mAP against the training set, both protocols",
                   **_ONE_EPOCH, "task": "eet(bits=32)", "batch_size": 64, "optimizer": "sgd", "momentum": 0.9,
                   "lr": 0.01, "min_lr": 0.0, "weight_decay": 0.0, "warmup_epochs": 0.06, "label_smoothing": 0.0,
                   "grad_clip": None, "subset": 10000},
    "fmnist-bspf": {"description": "BSPF apples-to-apples: the trained fmnist-vit with --spec SPEC (none: full "
                                   "attention; chunked attention alone; chunked attention + pruning + fusion) and "
                                   "optionally --transform tie_qk (W_q = W_k from the reference's weights)",
                    **_ONE_EPOCH},
    "fmnist-seg": {"description": "segmentation baseline on Fashion-MNIST mosaics (2x2 items, 56x56: 196 patch "
                                  "tokens + cls at the fmnist-vit width and depth), from scratch, --task segment, "
                                  "mIoU",
                   "model": _FMNIST_SEG_VIT, **_FMNIST, "task": "segment", "epochs": 3, "batch_size": 64,
                   "warmup_epochs": 0.3, "label_smoothing": 0.0, "subset": 6000, "eval_subset": 2500,
                   "eval_batch_size": 250, "ckpt_every": 50},
    "fmnist-cropr": {"description": "learned routers (Token Cropr): the trained fmnist-vit with --spec SPEC, the "
                                    "backbone at a fraction of the reducer's learning rate; the same recipe for every "
                                    "arm (the study cropr)",
                     **_ONE_EPOCH, "task": "classify(backbone_lr=0.3)", "lr": 1e-3},
}
RECIPES["fmnist-cropr-seg"] = {
    **RECIPES["fmnist-seg"],
    "description": "learned routers (Token Cropr) on the mosaics: fmnist-seg with --spec SPEC; the same recipe for "
                   "every arm (the study cropr_seg)",
}
RECIPES.update({
    "scenes-vit": {"description": "the reference of the scene test bed (data/scenes.py), from scratch; its "
                                  "checkpoint ships with the package",
                   "model": _SCENES_VIT, **_SCENES, "epochs": 6, "lr": 1.5e-3, "warmup_epochs": 0.3},
    "scenes-vit-seg": {"description": "the reference of the scene test bed's dense task (the target's class on its "
                                      "pixels, background elsewhere): the trained scenes-vit with a fresh "
                                      "segmentation head; its checkpoint ships with the package",
                       "init": lambda: str(reference_checkpoint("scenes-vit")), **_SCENES, "task": "segment",
                       "data": "fmnist_scenes_seg", "epochs": 1, "lr": 1e-3, "warmup_epochs": 0.1,
                       "label_smoothing": 0.0},
    "scenes-vit-smoke": {"description": "the scenes-vit model in seconds (tests)",
                         "model": _SCENES_VIT, **_SMOKE, "data": "fmnist_scenes", "batch_size": 32, "subset": 256,
                         "eval_subset": 128},
})


def list_recipes() -> list[str]:
    return sorted(RECIPES)


def check_recipe(name: str, recipe: dict[str, Any]) -> None:
    """Refuse a recipe whose keys (besides its description) are not TrainConfig fields."""
    check_fields(set(recipe) - {"description"}, f"recipe {name!r}")


def parse_recipe(name: str, fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` parsed through TrainConfig: unknown keys and values of the wrong type or range are
    refused naming the recipe; returns the fields as TrainConfig holds them (e.g. the canonical task)."""
    check_fields(fields, f"recipe {name!r}")
    try:
        cfg = TrainConfig(**fields)
    except TokenReduceError as e:
        raise TokenReduceError(f"recipe {name!r}: {e}") from None
    return {k: getattr(cfg, k) for k in fields}


def get_recipe(name: str, **differences: Any) -> dict[str, Any]:
    """TrainConfig fields of recipe ``name`` with a study's declared ``differences`` (a copy, without the
    description, parsed through TrainConfig: :func:`parse_recipe`; callables, such as paths under the cache,
    are resolved now)."""
    if name not in RECIPES:
        raise TokenReduceError(f"unknown recipe {name!r}; choose from {', '.join(list_recipes())}")
    fields = {k: v() if callable(v) else v for k, v in RECIPES[name].items() if k != "description"}
    return {**parse_recipe(name, {**fields, **differences}), "recipe": name}


def recipe_text(recipe: dict[str, Any]) -> str:
    """A recipe's fields (:func:`get_recipe`) in words: its name, and its schedule where they change the named
    recipe's ("fmnist-cropr, schedule changed: 1 epoch(s) of 6400 training items, batch 64")."""
    name = recipe.get("recipe")
    if not name:
        return "recipe"
    if all(recipe.get(k) == RECIPES.get(name, {}).get(k) for k in ("epochs", "subset", "batch_size")):
        return name
    subset = f" of {recipe['subset']} training items" if recipe.get("subset") else ""
    return f"{name}, schedule changed: {recipe.get('epochs')} epoch(s){subset}, batch {recipe.get('batch_size')}"


def default_out(recipe: str) -> Path:
    return cache_dir() / recipe


def reference_checkpoint(recipe: str = "fmnist-vit") -> Path:
    """The trained recipe's checkpoint: the one shipped with the package (``models.references``,
    SHA-256 checked) if there is one, else the one ``tokenreduce train --recipe NAME`` wrote to the cache."""
    ship = shipped(recipe)
    if ship is not None:
        return ship
    path = default_out(recipe) / "model.safetensors"
    if not path.is_file():
        raise TokenReduceError(f"no trained {recipe} checkpoint at {path}; make it with "
                               f"'tokenreduce train --recipe {recipe}'")
    return path


for _name, _recipe in RECIPES.items():
    check_recipe(_name, _recipe)


# ----------------------------------------------------------------------------- scenes-vit-free
def _free_init() -> str:
    """The shipped scenes-vit converted to its class-token-free, average-pooled variant (written once to the cache)."""
    from ..models.variants import without_class_token

    path = default_out("scenes-vit-free-init") / "model.safetensors"
    return str(path if path.is_file() else without_class_token(reference_checkpoint("scenes-vit"), path))


RECIPES["scenes-vit-free"] = {
    "description": "the class-token-free variant of the scene reference (study saint, bed scenes_free): scenes-vit "
                   "without its class token, the head on the mean of the normed tokens "
                   "(models.variants.without_class_token), fine-tuned one epoch; its checkpoint ships with the package",
    **_SCENES, "init": _free_init, "epochs": 1, "lr": 3e-4, "warmup_epochs": 0.1,
}
check_recipe("scenes-vit-free", RECIPES["scenes-vit-free"])
