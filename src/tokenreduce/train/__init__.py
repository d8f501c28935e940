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

__all__ = [
    "Checkpoint", "CheckpointError", "build_model", "load_model", "read_checkpoint", "read_meta",
    "save_checkpoint",
]
