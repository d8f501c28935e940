"""Training: tasks (named losses), one loop, checkpoints, recipes, torchrun/DDP helpers."""

from .checkpoint import (
    Checkpoint,
    CheckpointError,
    build_model,
    load_model,
    read_checkpoint,
    read_meta,
    save_checkpoint,
)
from .loop import TrainConfig, eval_loader, evaluate, fit, train
from .recipes import get_recipe, list_recipes, reference_checkpoint
from .tasks import ClassificationTask

__all__ = [
    "Checkpoint", "CheckpointError", "ClassificationTask", "TrainConfig", "build_model", "eval_loader", "evaluate",
    "fit", "get_recipe", "list_recipes", "load_model", "read_checkpoint", "read_meta", "reference_checkpoint",
    "save_checkpoint", "train",
]
