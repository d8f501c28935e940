"""Models: build, load and unwrap them for everyone above (train, eval, bench, studies).

- ``build``: the one model builder, :func:`make_model` of a :class:`ModelSource` (a timm model
  config, a tokenreduce checkpoint or a transformers config, local weights, a reducer);
  ``build_model`` (a model config) and ``load_model`` (a checkpoint) are its common cases;
- ``checkpoint``: the safetensors checkpoint format (and the project's one atomic writer);
- ``stems``: ``patch`` (timm's) and ``conv`` (ImagePiece's local-coherence stem) on the same grid;
- ``transforms``: structural changes recorded in the config, e.g. ``tie_qk`` (W_q = W_k, BSPF);
- ``hf``: transformers vision encoders by config (the ``hf_config`` route of the builder);
- ``deploy``: a patched model without its reducer's training-only parts, and its checkpoint.
- ``variants``: a checkpoint rebuilt as another architecture with its weights carried over (a class-token ViT
  without its class token, pooled: :func:`~.variants.without_class_token`).
"""

from .build import (
    KEEP,
    BuiltModel,
    ModelSource,
    build_model,
    changes_on_top,
    load_model,
    load_weights_file,
    make_model,
    model_config,
)
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
    "KEEP", "TASK_PREFIX", "BuiltModel", "Checkpoint", "CheckpointError", "ConvStem", "ModelSource", "TiedQKV",
    "apply_transform", "atomic_write", "changes_on_top", "classes_of",
    "build_model", "build_stem", "deploy", "export_inference", "list_stems", "list_transforms", "load_model",
    "load_weights", "load_weights_file", "make_model", "model_config",
    "read_checkpoint", "read_meta", "register_stem", "register_transform", "resolve", "restore_training_state",
    "rng_state", "save_checkpoint", "set_rng_state", "sidecar_path", "task_weights", "unwrap",
]
