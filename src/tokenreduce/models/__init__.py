"""Models: build, load and unwrap them for everyone above (train, eval, bench, data).

- ``checkpoint``: the safetensors checkpoint format (and the project's one atomic writer);
- ``build``: timm model + stem + transforms from a model config; ``load_model`` from a checkpoint;
- ``stems``: ``patch`` (timm's) and ``conv`` (ImagePiece's local-coherence stem) on the same grid;
- ``transforms``: structural changes recorded in the config, e.g. ``tie_qk`` (W_q = W_k, BSPF);
- ``deploy``: a patched model without its reducer's training-only parts, and its checkpoint.
"""

from .build import build_model, load_model, model_config
from .checkpoint import (
    TASK_PREFIX,
    Checkpoint,
    CheckpointError,
    atomic_write,
    classes_of,
    load_weights,
    read_checkpoint,
    read_meta,
    resolve,
    restore_training_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
    sidecar_path,
    task_weights,
    unwrap,
)
from .deploy import deploy, export_inference
from .stems import ConvStem, build_stem, list_stems, register_stem
from .transforms import TiedQKV, apply_transform, list_transforms, register_transform

__all__ = [
    "TASK_PREFIX", "Checkpoint", "CheckpointError", "ConvStem", "TiedQKV", "apply_transform", "atomic_write",
    "classes_of",
    "build_model", "build_stem", "deploy", "export_inference", "list_stems", "list_transforms", "load_model",
    "load_weights", "model_config",
    "read_checkpoint", "read_meta", "register_stem", "register_transform", "resolve", "restore_training_state",
    "rng_state", "save_checkpoint", "set_rng_state", "sidecar_path", "task_weights", "unwrap",
]
