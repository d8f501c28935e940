"""Training: one loop (any task, see ``tokenreduce.tasks``), its config, recipes, torchrun/DDP helpers.

The checkpoint format and model building live in ``tokenreduce.models``; their names are
re-exported here so that ``from tokenreduce.train import save_checkpoint, load_model`` keeps working.
"""

from __future__ import annotations

from ..core.lazy import lazy_exports

#: public name -> the module that defines it, loaded on first use (PEP 562), so that
#: ``tokenreduce.train.config`` (``tokenreduce train --help``) imports no torch.
_API = {
    **dict.fromkeys(("Checkpoint", "CheckpointError", "build_model", "load_model", "load_weights", "read_checkpoint",
                     "read_meta", "resolve", "restore_training_state", "rng_state", "save_checkpoint", "unwrap"),
                    "..models"),
    "TrainConfig": ".config",
    **dict.fromkeys(("final_evaluation", "fit", "train"), ".loop"),
    **dict.fromkeys(("get_recipe", "list_recipes", "reference_checkpoint"), ".recipes"),
}

__all__ = [
    "Checkpoint", "CheckpointError", "TrainConfig", "build_model", "final_evaluation", "fit", "get_recipe",
    "list_recipes", "load_model", "load_weights", "read_checkpoint", "read_meta", "reference_checkpoint", "resolve",
    "restore_training_state", "rng_state", "save_checkpoint", "train", "unwrap",
]

__getattr__, __dir__ = lazy_exports(__name__, _API, globals())
