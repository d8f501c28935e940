"""Checkpoints: one safetensors file holding everything, written atomically, plus a JSON sidecar.

Layout of ``<name>.safetensors`` (the file is the checkpoint; it alone is read back):

- tensors: the model's ``state_dict`` under its own keys (a learned reducer's under
  ``tokenreduce.*``); the training task's own tensors (a hash head, a jointly trained teacher:
  whatever lives outside the model) under ``task.<key>``; and, for resumable checkpoints, the
  training state under ``_state/...`` (optimizer moments, RNG states);
- header metadata ``tokenreduce``: a JSON document with ``format``, ``version``, the caller's
  ``meta`` (``model = {'name', 'kwargs', 'stem'?, 'transforms'?}`` - see ``models.build`` -,
  ``spec``, ``task``, ``epoch``, ``step``, ...), the non-tensor part of the optimizer / scheduler
  / RNG state, ``extra``, ``sha256`` (a SHA-256 of every tensor: names, dtypes, shapes, bytes) and
  ``header_sha256`` (a SHA-256 of the rest of this document, canonical JSON): one flipped bit anywhere
  in the file, weights or metadata, is refused naming the file.

Versions: ``version`` 2 files (written now) carry both digests and are refused without either.
``version`` 1 files were written before ``header_sha256`` existed: their tensors are checked, their
metadata is read as it is, except where a provenance record ``<name>.reference.json`` beside the file
names it (a shipped reference, models/references.py): then the whole file is checked against the
SHA-256 that record holds, so a reference read by path is as safe as one read by name. A version-1 file
without such a record cannot be told from a version-2 file edited to look older (``version`` set to 1,
``header_sha256`` removed), so it is read with a note on stderr saying its metadata is unverified, and
:attr:`Checkpoint.verified` (printed by ``tokenreduce inspect``) says so; saving it again signs it.

Loading a model (:func:`load_weights`) is strict over the model's keys and ignores ``task.*``:
those belong to the task (:func:`task_weights` returns them). Checkpoints written before tasks
existed simply have no ``task.*`` tensors.

``<name>.json`` beside it is a human-readable copy of the metadata (without the training state)
for people and tools that do not want to open the weights. It is written after the weights; a
run killed between the two writes leaves a stale sidecar, never a broken checkpoint.

Both files are written to a temporary name in the same directory, fsynced and moved into place
with ``os.replace``, so a reader sees either the old or the new checkpoint, never a mixture.
A directory may be passed to the readers: ``model.safetensors`` in it, else ``last.safetensors``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import Tensor, nn

from ..core.errors import DiskFullError, TokenReduceError

FORMAT = "tokenreduce-checkpoint"
VERSION = 2
#: Versions this tokenreduce reads (1: no ``header_sha256``; see the module docstring).
READABLE = (1, 2)
#: :attr:`Checkpoint.verified` of a version-2 file (its header digest checked)
SIGNED = "header SHA-256"
#: :attr:`Checkpoint.verified` of a version-1 file without a reference record (and the default)
UNVERIFIED = "not verified (version 1, no reference record)"
_HEADER_KEY = "tokenreduce"
_STATE = "_state/"
#: Key prefix of the training task's own tensors (outside the model).
TASK_PREFIX = "task."
#: File names the readers look for when given a training output directory, in order.
DIR_NAMES = ("model.safetensors", "last.safetensors")
#: Where the shipped references live (models/references.py: SHIPPED_DIR); a name there is a checkpoint too.
_SHIPPED = Path(__file__).resolve().parent.parent / "references"


class CheckpointError(TokenReduceError):
    """A checkpoint that is missing, corrupted, or does not match the model it is loaded into."""


#: The errors of a write that ran out of room: a full file system, an exhausted quota.
_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


@dataclass
class Checkpoint:
    """A checkpoint read into memory (CPU tensors)."""

    path: Path
    meta: dict[str, Any]
    weights: dict[str, Tensor]
    state: dict[str, Tensor]
    header: dict[str, Any]
    #: how the metadata was checked: the header digest, the whole file against its reference record, or not at all
    verified: str = UNVERIFIED

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
        shipped = _SHIPPED / f"{p.name}.safetensors"
        if p.name == str(path) and (_SHIPPED / f"{p.name}.reference.json").is_file() and shipped.is_file():
            return shipped  # a shipped reference by name (read_checkpoint checks it against its record)
        names = sorted(q.name[: -len(".reference.json")] for q in _SHIPPED.glob("*.reference.json"))
        raise CheckpointError(f"checkpoint {p} does not exist (a checkpoint file, a training run's folder, or a "
                              f"shipped reference: {', '.join(names) or 'none'})")
    return p


# ----------------------------------------------------------------------------- models


def classes_of(meta: dict[str, Any]) -> list[str] | None:
    """The class names a checkpoint's labels index (``meta['classes']``: its training split's, in
    order), or None for a checkpoint written without them. Every evaluation of it maps its data by
    these names (``data.build_dataset(..., classes=...)``)."""
    classes = meta.get("classes")
    return list(classes) if classes else None


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


def _header_digest(header: dict[str, Any]) -> str:
    """SHA-256 of ``header`` without its digests, as canonical JSON (sorted keys, no spaces)."""
    rest = {k: v for k, v in header.items() if k not in ("sha256", "header_sha256")}
    return hashlib.sha256(json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _reference_record(p: Path) -> dict[str, Any] | None:
    """The provenance record ``<name>.reference.json`` beside ``p`` that names it (a shipped reference), else None."""
    record = p.with_name(p.name[: -len(p.suffix)] + ".reference.json") if p.suffix else None
    if record is None or not record.is_file():
        return None
    try:
        doc = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("file") == p.name and doc.get("sha256") else None


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
        _set_cuda_rng_states(list(state["cuda"]))


def _set_cuda_rng_states(saved: list) -> None:
    """Restore one saved CUDA RNG state per GPU visible now, as far as both go: a run saved where more
    (or fewer) GPUs were visible resumes with the first min(saved, visible) states, said on stderr
    (``torch.cuda.set_rng_state_all`` would raise an IndexError for a state without a GPU)."""
    visible = torch.cuda.device_count()
    n = min(len(saved), visible)
    if len(saved) != visible:
        print(f"note: the checkpoint holds {len(saved)} CUDA RNG state(s) and {visible} GPU(s) are visible; "
              f"restoring the first {n}", file=sys.stderr)
    for i in range(n):
        torch.cuda.set_rng_state(saved[i], i)


# ----------------------------------------------------------------------------- write


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` so that a reader sees the old file or the new one, never a mixture.

    The bytes go to a temporary file in the same directory (created if missing), are fsynced and
    moved into place with ``os.replace``; an interrupted write leaves the old file and no
    temporary behind. The project's one atomic writer (checkpoints, sidecars, results JSON). A full disk
    is a :class:`DiskFullError` (the old file intact), not a traceback.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        _raise_if_full(e, path)
        raise
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            _raise_if_full(e, path)
        raise
    try:  # make the rename itself durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
    return path


def _raise_if_full(e: OSError, path: Path) -> None:
    """A :class:`DiskFullError` for ``e`` when it says the file system (or the quota) is full."""
    if e.errno in _FULL:
        was = "is as it was" if path.exists() else "was not written"
        raise DiskFullError(f"cannot write {path}: {e.strerror} ({_free_space(path.parent)} free); {path.name} {was} "
                            "and nothing is half-written: free some space and run again") from None


def _free_space(folder: Path) -> str:
    """The space left on ``folder``'s file system, for people ('12.3 MB'), or 'unknown'."""
    try:
        st = os.statvfs(folder)
    except (OSError, AttributeError):  # statvfs: POSIX only
        return "unknown"
    return f"{st.f_bavail * st.f_frsize / 1e6:.1f} MB"


def save_checkpoint(
    path: str | os.PathLike,
    model: nn.Module,
    *,
    meta: dict[str, Any],
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    extra: dict[str, Any] | None = None,
    task_state: dict[str, Tensor] | None = None,
) -> None:
    """Write ``model`` (and, if given, the training state) to ``path`` (``*.safetensors``) atomically.

    ``meta`` must hold ``model = {'name', 'kwargs', ...}`` (how to rebuild it: ``models.model_config``)
    and should hold ``spec`` (reducer spec or None), ``epoch`` and ``step``. With an optimizer, the
    RNG states are saved too so that a resumed run continues exactly. ``extra``: JSON-able values
    or tensors (loop state). ``task_state``: the training task's tensors outside the model
    (``Task.owned_state_dict()``), stored under ``task.<key>`` and read back by :func:`task_weights`.
    """
    path = Path(path)
    if path.suffix != ".safetensors":
        raise CheckpointError(f"checkpoint path must end with .safetensors, got {path}")
    if not isinstance(meta.get("model"), dict) or "name" not in meta["model"]:
        raise CheckpointError("meta['model'] = {'name': timm_model_name, 'kwargs': {...}} is required")
    path.parent.mkdir(parents=True, exist_ok=True)
    model = unwrap(model)
    tensors = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    reserved = [k for k in tensors if k.startswith((_STATE, TASK_PREFIX))]
    if reserved:
        raise CheckpointError(f"model state_dict keys may not start with {_STATE!r} or {TASK_PREFIX!r}: {reserved[:3]}")
    for k, v in (task_state or {}).items():
        tensors[TASK_PREFIX + k] = v.detach().cpu().clone()
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
    header["header_sha256"] = _header_digest(header)
    data = st_save(tensors, metadata={_HEADER_KEY: json.dumps(header)})
    atomic_write(path, data)
    side = {k: header[k] for k in ("format", "version", "meta", "sha256", "header_sha256")}
    side["weights"] = path.name
    atomic_write(sidecar_path(path), (json.dumps(side, indent=2) + "\n").encode())


# ----------------------------------------------------------------------------- read


def read_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read and verify a checkpoint (format, version, checksum). Raises CheckpointError."""
    p = resolve(path)
    try:
        raw = p.read_bytes()
        header_len = int.from_bytes(raw[:8], "little")
        meta_raw = json.loads(raw[8 : 8 + header_len]).get("__metadata__") or {}
        tensors = st_load(raw)
    # a missing or unreadable file, a garbled header (not JSON, not an object), safetensors' own error type
    except (OSError, ValueError, AttributeError, SafetensorError) as e:
        raise CheckpointError(f"{p} is not a readable safetensors checkpoint (corrupted or truncated?): {e}") from e
    if _HEADER_KEY not in meta_raw:
        raise CheckpointError(f"{p} is a safetensors file without tokenreduce metadata; not a tokenreduce checkpoint")
    try:
        header = json.loads(meta_raw[_HEADER_KEY])
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{p}: checkpoint metadata is not valid JSON ({e})") from e
    if not isinstance(header, dict) or header.get("format") != FORMAT \
            or type(header.get("version")) is not int or header["version"] not in READABLE:
        shown = header if not isinstance(header, dict) else f"{header.get('format')!r} v{header.get('version')}"
        raise CheckpointError(f"{p}: unsupported checkpoint format {shown} (this tokenreduce reads {FORMAT} "
                              f"v{', v'.join(map(str, READABLE))}; a flipped bit in the header reads like this too)")
    if _digest(tensors) != header.get("sha256"):
        raise CheckpointError(f"{p}: checksum mismatch, the file is corrupted; use another checkpoint")
    if header["version"] >= 2 and _header_digest(header) != header.get("header_sha256"):
        raise CheckpointError(f"{p}: metadata checksum mismatch (config, spec, task or model header changed), "
                              "the file is corrupted or was edited; use another checkpoint")
    record = _reference_record(p) if header["version"] < 2 else None
    if record is not None and hashlib.sha256(raw).hexdigest() != record["sha256"]:
        raise CheckpointError(f"{p}: SHA-256 differs from its record {p.name[: -len(p.suffix)]}.reference.json, "
                              "the file is damaged or was replaced (reinstall the package)")
    if not isinstance(header.get("meta"), dict):
        raise CheckpointError(f"{p}: checkpoint metadata holds no 'meta' object; not a tokenreduce checkpoint")
    if header["version"] >= 2:
        verified = SIGNED
    elif record:
        verified = f"whole file against {p.stem}.reference.json"
    else:
        verified = UNVERIFIED
        print(f"note: {p} is a version-1 checkpoint: its weights are checked, its metadata (model, spec, config) "
              "is not, and a newer file edited to look like version 1 reads the same; save it again to sign it",
              file=sys.stderr)
    weights = {k: v for k, v in tensors.items() if not k.startswith(_STATE)}
    state = {k: v for k, v in tensors.items() if k.startswith(_STATE)}
    return Checkpoint(p, header["meta"], weights, state, header, verified)


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    """The ``meta`` dict of a checkpoint (verified)."""
    return read_checkpoint(path).meta


def task_weights(ckpt: Checkpoint) -> dict[str, Tensor]:
    """The training task's own tensors in ``ckpt`` (saved under ``task.<key>``), prefix stripped."""
    n = len(TASK_PREFIX)
    return {k[n:]: v for k, v in ckpt.weights.items() if k.startswith(TASK_PREFIX)}


def load_weights(model: nn.Module, ckpt: Checkpoint, *, prefix_ignore: tuple[str, ...] = (TASK_PREFIX,)) -> None:
    """Copy ``ckpt``'s weights into ``model`` strictly; checks everything before copying anything.

    Checkpoint tensors whose key starts with one of ``prefix_ignore`` are not the model's (by
    default the task's ``task.*``) and are skipped; every other key must match the model's
    ``state_dict`` exactly, in name and shape.
    """
    model = unwrap(model)
    own = model.state_dict()
    weights = {k: v for k, v in ckpt.weights.items() if not k.startswith(tuple(prefix_ignore))}
    missing = sorted(set(own) - set(weights))
    unexpected = sorted(set(weights) - set(own))
    wrong = [
        f"{k}: checkpoint {tuple(weights[k].shape)} vs model {tuple(own[k].shape)}"
        for k in own
        if k in weights and weights[k].shape != own[k].shape
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
    model.load_state_dict(weights, strict=True)


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
