"""Deploy a trained model: drop what only training needs, and save that as an inference checkpoint.

A learned reducer may hold parts that only training uses (Cropr's queries, aggregators and
auxiliary heads). ``Reducer.for_inference()`` returns the reducer with the same inference-time
computation and none of them (its spec says so, e.g. ``inference=True``); :func:`deploy` swaps it
into a patched model in place, and :func:`export_inference` writes a checkpoint of the deployed
model that :func:`tokenreduce.models.load_model` reloads to the same deployed form. A training
checkpoint (the loop's ``last``/``model``) keeps every part and resumes; the deployed one cannot
be trained further (its reducer has nothing to train) but evaluates to the same outputs.
"""

from __future__ import annotations

import os
from pathlib import Path

from torch import nn

from ..api import get_info, is_patched, reapply, reducer_of
from .build import load_model
from .checkpoint import read_checkpoint, save_checkpoint, task_weights, unwrap

__all__ = ["deploy", "export_inference"]


def deploy(model: nn.Module) -> nn.Module:
    """Replace the reducer of a tokenreduce-patched ``model`` by its deployed form
    (``Reducer.for_inference``), keeping ``trace``/``dense``; an unpatched model or a reducer with
    nothing training-only is left as it is. Returns the model in eval mode."""
    model = unwrap(model)
    if not is_patched(model):
        return model.eval()
    reducer = reducer_of(model)
    deployed = reducer.for_inference()
    if deployed is not reducer:
        reapply(model, deployed)
    return model.eval()


def export_inference(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Write the deployed form of checkpoint ``src`` (a file or a training output directory) to
    ``dst`` (``*.safetensors``): the model through :func:`deploy`, ``meta['spec']`` its deployed
    spec, the task's own tensors (a segmentation head) kept, no training state. Returns ``dst``."""
    ckpt = read_checkpoint(src)
    model, meta = load_model(ckpt)
    deploy(model)
    spec = get_info(model).spec if meta.get("spec") else None
    meta = {**meta, "spec": spec, "deployed_from": str(ckpt.path)}
    save_checkpoint(dst, model, meta=meta, task_state=task_weights(ckpt))
    return Path(dst)
