"""Training: one loop (any task, see ``tokenreduce.tasks``), its config, recipes, torchrun/DDP helpers.

The checkpoint format and model building live in ``tokenreduce.models``; their names are
re-exported here so that ``from tokenreduce.train import save_checkpoint, load_model`` keeps working.
"""

from ..models import (
    Checkpoint,
    CheckpointError,
    build_model,
    load_model,
    load_weights,
    read_checkpoint,
    read_meta,
    resolve,
    restore_training_state,
    rng_state,
    save_checkpoint,
    unwrap,
)
from .config import TrainConfig
from .loop import final_evaluation, fit, train
from .recipes import get_recipe, list_recipes, reference_checkpoint

__all__ = [
    "Checkpoint", "CheckpointError", "TrainConfig", "build_model", "final_evaluation", "fit", "get_recipe",
    "list_recipes", "load_model", "load_weights", "read_checkpoint", "read_meta", "reference_checkpoint", "resolve",
    "restore_training_state", "rng_state", "save_checkpoint", "train", "unwrap",
]
