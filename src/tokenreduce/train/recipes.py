"""Named training recipes: a model config plus optimiser and schedule, as TrainConfig fields.

``scenes-vit`` is the reference of the scene test bed (``data/scenes.py``): a 12-block ViT on
DeiT-S's 14x14 grid; its trained checkpoint ships with the package (``models/references.py``).

``fmnist-vit`` is the reference model for Fashion-MNIST: a timm VisionTransformer (class token,
28x28 grayscale input, patch 4 -> 49 patch tokens) trained from scratch on a CPU. Its
trained checkpoint lives in the cache (``$TOKENREDUCE_CACHE``, default ``cache/``), outside git:
``reference_checkpoint()`` is where others find it.

A recipe is a description and TrainConfig fields: its keys are checked against TrainConfig's
fields when this module loads, and :func:`get_recipe` parses its values through TrainConfig, so a
misspelt key or a value of the wrong type fails naming the recipe, the key and the valid fields.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.errors import TokenReduceError
from ..data.build import cache_dir
from ..models.references import shipped
from .config import TrainConfig, check_fields

_FMNIST_VIT = {
    "name": "vit_tiny_patch16_224",  # kwargs override everything that name implies
    "kwargs": {"img_size": 28, "patch_size": 4, "in_chans": 1, "num_classes": 10, "embed_dim": 128, "depth": 6,
               "num_heads": 4, "mlp_ratio": 2.0, "drop_path_rate": 0.0},
}

RECIPES: dict[str, dict[str, Any]] = {
    "fmnist-vit": {
        "description": "reference ViT for Fashion-MNIST (49 patches + cls, dim 128, depth 6, 4 heads, mlp 2); "
                       ">= 89% test top-1 in <= 60 min on 2 CPU cores",
        "model": _FMNIST_VIT,
        "data": "fashion_mnist", "augment": "crop_flip", "epochs": 17, "batch_size": 128, "lr": 2e-3,
        "min_lr": 1e-5, "weight_decay": 0.05, "warmup_epochs": 1.0, "label_smoothing": 0.1, "grad_clip": 1.0,
        "threads": 2, "ckpt_every": 200,
    },
    "fmnist-vit-smoke": {
        "description": "the fmnist-vit model on 1024 images for one epoch (seconds; CI and demos)",
        "model": _FMNIST_VIT,
        "data": "fashion_mnist", "augment": "crop_flip", "epochs": 1, "batch_size": 64, "lr": 1e-3,
        "warmup_epochs": 0.2, "subset": 1024, "eval_subset": 500,
    },
}

RECIPES["fmnist-vit-short"] = {
    "description": "the fmnist-vit model from scratch on a fixed 20 000 training images for 4 epochs (628 steps), "
                   "full test set at the end; the same short recipe for every arm of a controlled comparison "
                   "(--stem, --spec, --seed); ~4-5 min on 2 idle cores",
    "model": _FMNIST_VIT,
    "data": "fashion_mnist", "augment": "crop_flip", "epochs": 4, "batch_size": 128, "lr": 2e-3,
    "min_lr": 1e-5, "weight_decay": 0.05, "warmup_epochs": 0.5, "label_smoothing": 0.1, "grad_clip": 1.0,
    "subset": 20000, "eval_subset": 10000, "eval_every": 4, "threads": 2, "ckpt_every": 100,
}


def _reference() -> str:
    return str(default_out("fmnist-vit") / "model.safetensors")


RECIPES["fmnist-vit-ft"] = {
    "description": "fine-tune the trained fmnist-vit with --spec SPEC (3 epochs, lr 3e-4, logit distillation "
                   "from the unreduced reference); give --out per spec",
    "init": _reference, "teacher": _reference, "distill": ["logits"],
    "data": "fashion_mnist", "augment": "crop_flip", "epochs": 3, "batch_size": 128, "lr": 3e-4, "min_lr": 1e-6,
    "weight_decay": 0.05, "warmup_epochs": 0.2, "label_smoothing": 0.1, "grad_clip": 1.0, "threads": 2,
    "ckpt_every": 200,
}


RECIPES["fmnist-hash"] = {
    "description": "hashing baseline: fine-tune the trained fmnist-vit with a hash head toward fixed +-1 class "
                   "codes (--task 'hash(bits=16|32|64)', default 32; 1 epoch on a fixed 20 000 training images, "
                   "AdamW lr 3e-4); retrieval mAP on the test set against the training set, both protocols",
    "init": _reference, "task": "hash(bits=32)",
    "data": "fashion_mnist", "augment": "crop_flip", "epochs": 1, "batch_size": 128, "lr": 3e-4, "min_lr": 1e-6,
    "weight_decay": 0.05, "warmup_epochs": 0.2, "label_smoothing": 0.0, "grad_clip": 1.0, "subset": 20000,
    "eval_subset": 10000, "threads": 2, "ckpt_every": 50,
}

RECIPES["fmnist-eet"] = {
    "description": "EET: fine-tune the trained fmnist-vit with --task eet(bits=32) (FISH per-image targets, a jointly "
                   "trained unpruned teacher, DKT, DRG; --bits N sets the code length) and the pruner given by --spec; "
                   "EET's optimiser scaled to 2 cores: SGD momentum 0.9, lr 0.01, warm-up (6%, EET's 500 of ~8 400 "
                   "steps) then cosine, batch 64, 1 epoch on a fixed 10 000 training images; retrieval mAP on 10 000 "
                   "test images against the training set, both protocols",
    "init": _reference, "task": "eet(bits=32)",
    "data": "fashion_mnist", "augment": "crop_flip", "epochs": 1, "batch_size": 64, "optimizer": "sgd",
    "momentum": 0.9, "lr": 0.01, "min_lr": 0.0, "weight_decay": 0.0, "warmup_epochs": 0.06, "label_smoothing": 0.0,
    "grad_clip": None, "subset": 10000, "eval_subset": 10000, "threads": 2, "ckpt_every": 50,
}

RECIPES["fmnist-bspf"] = {
    "description": "BSPF apples-to-apples: fine-tune the trained fmnist-vit with --spec SPEC (none: full "
                   "attention; chunked attention alone; chunked attention + pruning + fusion) and optionally "
                   "--transform tie_qk (W_q = W_k from the reference's weights); 1 epoch on a fixed 20 000 training "
                   "images, AdamW lr 3e-4; top-1 on the 10 000 test images",
    "init": _reference,
    "data": "fashion_mnist", "augment": "crop_flip", "epochs": 1, "batch_size": 128, "lr": 3e-4, "min_lr": 1e-6,
    "weight_decay": 0.05, "warmup_epochs": 0.2, "label_smoothing": 0.1, "grad_clip": 1.0, "subset": 20000,
    "eval_subset": 10000, "threads": 2, "ckpt_every": 50,
}

_FMNIST_SEG_VIT = {"name": _FMNIST_VIT["name"], "kwargs": {**_FMNIST_VIT["kwargs"], "img_size": 56}}

RECIPES["fmnist-seg"] = {
    "description": "segmentation baseline on Fashion-MNIST mosaics (2x2 items, 56x56, patch 4 -> 196 patch "
                   "tokens + cls, the fmnist-vit width and depth) trained from scratch, --task segment, mIoU; "
                   "3 epochs on a fixed 6 000 of the 15 000 training mosaics",
    "model": _FMNIST_SEG_VIT, "task": "segment",
    "data": "fashion_mnist", "augment": "crop_flip", "epochs": 3, "batch_size": 64, "lr": 2e-3, "min_lr": 1e-5,
    "weight_decay": 0.05, "warmup_epochs": 0.3, "label_smoothing": 0.0, "grad_clip": 1.0, "subset": 6000,
    "eval_subset": 2500, "eval_batch_size": 250, "threads": 2, "ckpt_every": 50,
}

RECIPES["fmnist-cropr"] = {
    "description": "learned routers (Token Cropr): fine-tune the trained fmnist-vit with --spec SPEC; the reducer's "
                   "parameters at lr 1e-3, the backbone at 0.3 x (3e-4), 1 epoch on a fixed 20 000 training images, "
                   "top-1 on the 10 000 test images; the same recipe for every arm (the study cropr)",
    "init": _reference, "task": "classify(backbone_lr=0.3)",
    "data": "fashion_mnist", "augment": "crop_flip", "epochs": 1, "batch_size": 128, "lr": 1e-3, "min_lr": 1e-6,
    "weight_decay": 0.05, "warmup_epochs": 0.2, "label_smoothing": 0.1, "grad_clip": 1.0, "subset": 20000,
    "eval_subset": 10000, "threads": 2, "ckpt_every": 50,
}

RECIPES["fmnist-cropr-seg"] = {
    **RECIPES["fmnist-seg"],
    "description": "learned routers (Token Cropr) on the mosaics: fmnist-seg (from scratch, 3 epochs on 6 000 "
                   "mosaics, mIoU) with --spec SPEC; the same recipe for every arm (the study cropr_seg)",
}


#: The scene test bed's reference: a miniature DeiT with DeiT-S's depth and grid (12 blocks, 14x14 = 196 patches
#: + class token on the 56x56 scenes, patch 4), narrow (dim 72, 3 heads of 24, mlp 2) so that it trains on a
#: CPU, and every published schedule (EViT 3/6/9, CTP 98/49/12 after 3/7/9, ToMe r per block, Cropr every
#: block, BSPF 3/7) runs on it unchanged.
_SCENES_VIT = {
    "name": "vit_tiny_patch16_224",
    "kwargs": {"img_size": 56, "patch_size": 4, "in_chans": 1, "num_classes": 10, "embed_dim": 72, "depth": 12,
               "num_heads": 3, "mlp_ratio": 2.0, "drop_path_rate": 0.0},
}

RECIPES["scenes-vit"] = {
    "description": "reference for the scene test bed (fmnist_scenes: one garment on clutter, 56x56): 12 blocks, "
                   "196 patches + cls, dim 72, 3 heads, mlp 2, from scratch, 6 epochs over the 60 000 training "
                   "scenes; its checkpoint ships with the package",
    "model": _SCENES_VIT,
    "data": "fmnist_scenes", "augment": "crop_flip", "epochs": 6, "batch_size": 64, "lr": 1.5e-3,
    "min_lr": 1e-5, "weight_decay": 0.05, "warmup_epochs": 0.3, "label_smoothing": 0.1, "grad_clip": 1.0,
    "eval_subset": 2000, "threads": 2, "ckpt_every": 100,
}

RECIPES["scenes-vit-seg"] = {
    "description": "reference of the scene test bed's dense task (fmnist_scenes_seg: the target's class on its "
                   "pixels, background elsewhere): the trained scenes-vit with a fresh segmentation head, 1 epoch "
                   "over the 60 000 training scenes, mIoU on 2 000 test scenes; its checkpoint ships with the package",
    "init": lambda: str(reference_checkpoint("scenes-vit")),
    "task": "segment", "data": "fmnist_scenes_seg", "augment": "crop_flip", "epochs": 1, "batch_size": 64,
    "lr": 1e-3, "min_lr": 1e-5, "weight_decay": 0.05, "warmup_epochs": 0.1, "label_smoothing": 0.0, "grad_clip": 1.0,
    "eval_subset": 2000, "threads": 2, "ckpt_every": 100,
}

RECIPES["scenes-vit-smoke"] = {
    "description": "the scenes-vit model on 256 scenes for one epoch (seconds; tests)",
    "model": _SCENES_VIT,
    "data": "fmnist_scenes", "augment": "crop_flip", "epochs": 1, "batch_size": 32, "lr": 1e-3,
    "warmup_epochs": 0.2, "subset": 256, "eval_subset": 128,
}


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


def get_recipe(name: str) -> dict[str, Any]:
    """TrainConfig fields of recipe ``name`` (a copy, without the description, parsed through
    TrainConfig: :func:`parse_recipe`; callables, such as paths under the cache, are resolved now)."""
    if name not in RECIPES:
        raise TokenReduceError(f"unknown recipe {name!r}; choose from {', '.join(list_recipes())}")
    fields = {k: v() if callable(v) else v for k, v in RECIPES[name].items() if k != "description"}
    return {**parse_recipe(name, fields), "recipe": name}


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
    "description": "class-token-free variant of the scene reference (the study saint's bed scenes_free): the trained "
                   "scenes-vit without its class token, the head on the mean of the normed tokens "
                   "(models.variants.without_class_token), fine-tuned one pass over a fixed 19 200 of the 60 000 "
                   "training scenes (300 steps of batch 64: what fit the sitting's CPU time, not a full epoch) at the "
                   "scene recipe's schedule scaled for a fine-tune (lr 3e-4, warm-up 0.1 of the pass, cosine to "
                   "1e-5); its checkpoint ships with the package",
    "init": _free_init,
    "data": "fmnist_scenes", "augment": "crop_flip", "epochs": 1, "batch_size": 64, "lr": 3e-4, "min_lr": 1e-5,
    "weight_decay": 0.05, "warmup_epochs": 0.1, "label_smoothing": 0.1, "grad_clip": 1.0, "subset": 19200,
    "eval_subset": 2000, "threads": 2, "ckpt_every": 25,
}
check_recipe("scenes-vit-free", RECIPES["scenes-vit-free"])
