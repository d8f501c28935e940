"""Checkpoints: one safetensors file holding everything, written atomically, plus a JSON sidecar.

Layout of ``<name>.safetensors`` (the file is the checkpoint; it alone is read back):

- tensors: the model's ``state_dict`` under its own keys (a learned reducer's under
  ``tokenreduce.*``), and, for resumable checkpoints, the training state under ``_state/...``
  (optimizer moments, RNG states);
- header metadata ``tokenreduce``: a JSON document with ``format``, ``version``, the caller's
  ``meta`` (``model = {'name', 'kwargs'}``, ``spec``, ``epoch``, ``step``, ...), the non-tensor
  part of the optimizer / scheduler / RNG state, ``extra`` and a SHA-256 of every tensor.

``<name>.json`` beside it is a human-readable copy of the metadata (without the training state)
for people and tools that do not want to open the weights. It is written after the weights; a
run killed between the two writes leaves a stale sidecar, never a broken checkpoint.

Both files are written to a temporary name in the same directory, fsynced and moved into place
with ``os.replace``, so a reader sees either the old or the new checkpoint, never a mixture.
A directory may be passed to the readers: ``model.safetensors`` in it, else ``last.safetensors``.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..core.errors import TokenReduceError

FORMAT = "tokenreduce-checkpoint"
VERSION = 1
_HEADER_KEY = "tokenreduce"
_STATE = "_state/"
#: File names the readers look for when given a training output directory, in order.
DIR_NAMES = ("model.safetensors", "last.safetensors")


class CheckpointError(TokenReduceError):
    """A checkpoint that is missing, corrupted, or does not match the model it is loaded into."""


@dataclass
class Checkpoint:
    """A checkpoint read into memory (CPU tensors)."""

    path: Path
    meta: dict[str, Any]
    weights: dict[str, Tensor]
    state: dict[str, Tensor]
    header: dict[str, Any]

    @property
    def has_training_state(self) -> bool:
        return "optimizer" in self.header or "rng" in self.header


# ----------------------------------------------------------------------------- paths


def sidecar_path(path: str | os.PathLike) -> Path:
    """The JSON sidecar of ``<name>.safetensors``: ``<name>.json``."""
    return Path(path).with_suffix(".json")


def resolve(path: str | os.PathLike) -> Path:
    """The checkpoint file ``path`` names (a ``.safetensors`` file or a training output dir)."""
    p = Path(path)
    if p.is_dir():
        for name in DIR_NAMES:
            if (p / name).is_file():
                return p / name
        raise CheckpointError(f"no checkpoint in directory {p} (looked for {', '.join(DIR_NAMES)})")
    if not p.is_file():
        raise CheckpointError(f"checkpoint {p} does not exist")
    return p


# ----------------------------------------------------------------------------- models


def build_model(config: dict[str, Any]) -> nn.Module:
    """A timm model from ``{'name': timm_model_name, 'kwargs': {...create_model kwargs...}}``.

    ``config.get('pretrained')`` (default False) asks timm for pretrained weights (network).
    """
    if not isinstance(config, dict) or not isinstance(config.get("name"), str):
        raise CheckpointError(f"model config must be {{'name': str, 'kwargs': dict}}, got {config!r}")
    kwargs = config.get("kwargs") or {}
    if not isinstance(kwargs, dict):
        raise CheckpointError(f"model config 'kwargs' must be a dict, got {kwargs!r}")
    import timm

    try:
        return timm.create_model(config["name"], pretrained=bool(config.get("pretrained", False)), **kwargs)
    except (RuntimeError, TypeError, ValueError, KeyError) as e:
        raise CheckpointError(f"cannot build timm model {config['name']!r} with {kwargs}: {e}") from e


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a DistributedDataParallel / DataParallel wrapper."""
    return model.module if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)) else model


# ----------------------------------------------------------------------------- encoding


def _encode(obj: Any, prefix: str, tensors: dict[str, Tensor]) -> Any:
    """JSON-able copy of ``obj`` with every tensor moved into ``tensors`` (replaced by its key)."""
    if isinstance(obj, Tensor):
        tensors[prefix] = obj.detach().cpu().clone()
        return {"__tensor__": prefix}
    if isinstance(obj, np.ndarray):
        tensors[prefix] = torch.from_numpy(obj.astype(np.int64) if obj.dtype.kind in "ui" else obj).clone()
        return {"__ndarray__": prefix, "dtype": str(obj.dtype)}
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj):
            return {k: _encode(v, f"{prefix}.{k}", tensors) for k, v in obj.items()}
        return {"__items__": [[k, _encode(v, f"{prefix}.{i}", tensors)] for i, (k, v) in enumerate(obj.items())]}
    if isinstance(obj, (list, tuple)):
        out = [_encode(v, f"{prefix}.{i}", tensors) for i, v in enumerate(obj)]
        return {"__tuple__": out} if isinstance(obj, tuple) else out
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    raise CheckpointError(f"cannot store a {type(obj).__name__} at {prefix!r} in a checkpoint")


def _decode(obj: Any, tensors: dict[str, Tensor]) -> Any:
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__ndarray__" in obj:
            return tensors[obj["__ndarray__"]].numpy().astype(obj["dtype"])
        if "__items__" in obj:
            return {k: _decode(v, tensors) for k, v in obj["__items__"]}
        if "__tuple__" in obj:
            return tuple(_decode(v, tensors) for v in obj["__tuple__"])
        return {k: _decode(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    return obj


def _digest(tensors: dict[str, Tensor]) -> str:
    """SHA-256 over names, dtypes, shapes and bytes of ``tensors`` (safetensors has no checksum)."""
    h = hashlib.sha256()
    for k in sorted(tensors):
        t = tensors[k].detach().cpu().contiguous()
        h.update(f"{k}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# ----------------------------------------------------------------------------- RNG


def rng_state() -> dict[str, Any]:
    """The python, numpy, torch (and CUDA, when initialised) RNG states."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`rng_state`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np.random.set_state(tuple(state["numpy"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(state["cuda"]))


# ----------------------------------------------------------------------------- write


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    try:  # make the rename itself durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def save_checkpoint(
    path: str | os.PathLike,
    model: nn.Module,
    *,
    meta: dict[str, Any],
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """Write ``model`` (and, if given, the training state) to ``path`` (``*.safetensors``) atomically.

    ``meta`` must hold ``model = {'name', 'kwargs'}`` (how to rebuild it) and should hold ``spec``
    (reducer spec or None), ``epoch`` and ``step``. With an optimizer, the RNG states are saved too
    so that a resumed run continues exactly. ``extra``: JSON-able values or tensors (loop state).
    """
    from safetensors.torch import save as st_save

    path = Path(path)
    if path.suffix != ".safetensors":
        raise CheckpointError(f"checkpoint path must end with .safetensors, got {path}")
    if not isinstance(meta.get("model"), dict) or "name" not in meta["model"]:
        raise CheckpointError("meta['model'] = {'name': timm_model_name, 'kwargs': {...}} is required")
    path.parent.mkdir(parents=True, exist_ok=True)
    model = unwrap(model)
    tensors = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    if any(k.startswith(_STATE) for k in tensors):
        raise CheckpointError(f"model state_dict keys may not start with {_STATE!r}")
    try:
        meta_json = json.loads(json.dumps(meta))
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"meta must be JSON-serialisable (put tensors in extra=): {e}") from e
    header: dict[str, Any] = {"format": FORMAT, "version": VERSION, "meta": meta_json}
    state: dict[str, Tensor] = {}
    if optimizer is not None:
        header["optimizer"] = _encode(optimizer.state_dict(), _STATE + "optimizer", state)
        header["rng"] = _encode(rng_state(), _STATE + "rng", state)
    if scheduler is not None:
        header["scheduler"] = _encode(scheduler.state_dict(), _STATE + "scheduler", state)
    if extra is not None:
        header["extra"] = _encode(extra, _STATE + "extra", state)
    tensors.update(state)
    header["sha256"] = _digest(tensors)
    data = st_save(tensors, metadata={_HEADER_KEY: json.dumps(header)})
    _atomic_write(path, data)
    side = {k: header[k] for k in ("format", "version", "meta", "sha256")}
    side["weights"] = path.name
    _atomic_write(sidecar_path(path), (json.dumps(side, indent=2) + "\n").encode())


# ----------------------------------------------------------------------------- read


def read_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read and verify a checkpoint (format, version, checksum). Raises CheckpointError."""
    from safetensors.torch import load as st_load

    p = resolve(path)
    try:
        raw = p.read_bytes()
        header_len = int.from_bytes(raw[:8], "little")
        meta_raw = json.loads(raw[8 : 8 + header_len]).get("__metadata__") or {}
        tensors = st_load(raw)
    except Exception as e:  # safetensors raises its own error type for truncated/garbled files
        raise CheckpointError(f"{p} is not a readable safetensors checkpoint (corrupted or truncated?): {e}") from e
    if _HEADER_KEY not in meta_raw:
        raise CheckpointError(f"{p} is a safetensors file without tokenreduce metadata; not a tokenreduce checkpoint")
    try:
        header = json.loads(meta_raw[_HEADER_KEY])
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{p}: checkpoint metadata is not valid JSON ({e})") from e
    if header.get("format") != FORMAT or header.get("version") != VERSION:
        raise CheckpointError(
            f"{p}: unsupported checkpoint format {header.get('format')!r} v{header.get('version')} "
            f"(this tokenreduce reads {FORMAT} v{VERSION})"
        )
    if _digest(tensors) != header.get("sha256"):
        raise CheckpointError(f"{p}: checksum mismatch, the file is corrupted; use another checkpoint")
    weights = {k: v for k, v in tensors.items() if not k.startswith(_STATE)}
    state = {k: v for k, v in tensors.items() if k.startswith(_STATE)}
    return Checkpoint(p, header["meta"], weights, state, header)


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    """The ``meta`` dict of a checkpoint (verified)."""
    return read_checkpoint(path).meta


def load_weights(model: nn.Module, ckpt: Checkpoint) -> None:
    """Copy ``ckpt``'s weights into ``model`` strictly; checks everything before copying anything."""
    model = unwrap(model)
    own = model.state_dict()
    missing = sorted(set(own) - set(ckpt.weights))
    unexpected = sorted(set(ckpt.weights) - set(own))
    wrong = [
        f"{k}: checkpoint {tuple(ckpt.weights[k].shape)} vs model {tuple(own[k].shape)}"
        for k in own
        if k in ckpt.weights and ckpt.weights[k].shape != own[k].shape
    ]
    if missing or unexpected or wrong:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} keys (e.g. {', '.join(missing[:3])})")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)} keys (e.g. {', '.join(unexpected[:3])})")
        if wrong:
            parts.append(f"{len(wrong)} shape mismatches (e.g. {'; '.join(wrong[:2])})")
        raise CheckpointError(
            f"{ckpt.path} does not match this model: {'; '.join(parts)}. Was it saved from a "
            f"different model config or spec? (checkpoint: {ckpt.meta.get('model')}, spec {ckpt.meta.get('spec')!r})"
        )
    model.load_state_dict(ckpt.weights, strict=True)


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu") -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild the model a checkpoint was saved from: timm model from ``meta['model']``, the
    reducer from ``meta['spec']`` (``tokenreduce.apply``), the weights loaded strictly.

    Returns ``(model in eval mode on device, meta)``. Raises CheckpointError, never returns a
    half-loaded model.
    """
    from ..api import apply

    ckpt = read_checkpoint(path)
    model = build_model(ckpt.meta.get("model"))
    if ckpt.meta.get("spec"):
        try:
            apply(model, ckpt.meta["spec"])
        except TokenReduceError as e:
            raise CheckpointError(f"{ckpt.path}: cannot apply its spec {ckpt.meta['spec']!r}: {e}") from e
    load_weights(model, ckpt)
    return model.to(device).eval(), ckpt.meta


def restore_training_state(
    ckpt: Checkpoint, optimizer: torch.optim.Optimizer | None = None, scheduler: Any | None = None
) -> dict[str, Any]:
    """Load optimizer / scheduler state and the RNG states; returns ``extra`` (or {})."""
    if optimizer is not None:
        if "optimizer" not in ckpt.header:
            raise CheckpointError(f"{ckpt.path} holds no optimizer state; it cannot be resumed (use --init)")
        try:
            optimizer.load_state_dict(_decode(ckpt.header["optimizer"], ckpt.state))
        except (ValueError, KeyError, RuntimeError) as e:
            raise CheckpointError(f"{ckpt.path}: optimizer state does not match this run: {e}") from e
    if scheduler is not None and "scheduler" in ckpt.header:
        scheduler.load_state_dict(_decode(ckpt.header["scheduler"], ckpt.state))
    if "rng" in ckpt.header:
        set_rng_state(_decode(ckpt.header["rng"], ckpt.state))
    return _decode(ckpt.header.get("extra", {}), ckpt.state)
