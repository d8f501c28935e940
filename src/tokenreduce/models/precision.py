"""Where and in what precision a command runs its model: ``--device`` and ``--amp`` (commands/vocab.py).
It sits with the models, below bench, train and the commands that all use it, and imports none of them.

- :func:`resolve_device`: a device string checked against torch and this machine (train.dist's process
  group and every command's ``--device`` check);
- :func:`prepare_device`: the ``--device`` string resolved (None: cuda when available, else cpu) and
  checked; on CUDA, TF32 is allowed for float32 matmuls and convolutions (what :func:`device_info`
  records).
- :func:`autocast`: the forward's autocast for ``--amp bf16|fp16`` (a no-op for off/None).
- :func:`grad_scaler`: the training loop's GradScaler, enabled for fp16 only.
- :func:`device_info`: the provenance of the accelerator: device names per index, CUDA, cuDNN and
  driver versions, TF32 (all None on the CPU).
"""

from __future__ import annotations

import subprocess
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from ..core.errors import TokenReduceError

#: ``--amp`` choice -> autocast dtype. The choices are spelled for the command line in bench/settings.py
#: (``AMP_CHOICES``, torch-free, above this layer); tests/test_facts.py holds the two equal.
AMP_DTYPES: dict[str, torch.dtype | None] = {"bf16": torch.bfloat16, "fp16": torch.float16, "off": None}


def amp_dtype(amp: str | None) -> torch.dtype | None:
    """The autocast dtype of ``amp`` (None and 'off': none)."""
    if amp is None:
        return None
    if amp not in AMP_DTYPES:
        raise ValueError(f"amp must be one of {', '.join(AMP_DTYPES)}, got {amp!r}")
    return AMP_DTYPES[amp]


def autocast(device: torch.device | str, amp: str | None) -> AbstractContextManager:
    """Autocast to ``amp``'s dtype on ``device``'s type, or nothing for off/None."""
    dtype = amp_dtype(amp)
    if dtype is None:
        return nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


def grad_scaler(device: torch.device | str, amp: str | None) -> torch.amp.GradScaler:
    """A GradScaler, enabled for fp16 only (bf16 has float32's range and needs none)."""
    return torch.amp.GradScaler(torch.device(device).type, enabled=amp == "fp16")


def resolve_device(device: str | None, local_rank: int = 0, here: bool = True) -> torch.device:
    """``device`` (any torch device string: cpu, cuda, cuda:N, mps, ...) checked to exist here or, when
    None, cuda:<local_rank> if CUDA is available, else cpu. A TokenReduceError for a string torch
    does not know or (``here``) a device this machine lacks; ``here=False`` checks the name only (for
    what runs elsewhere: the commands ``study --list`` prints)."""
    if device in (None, "auto"):
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise TokenReduceError(f"unknown device {device!r}; use cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device(f"cuda:{local_rank}")
    if not here:
        return dev
    backend = getattr(torch, dev.type, None) if dev.type != "mps" else torch.backends.mps
    available = getattr(backend, "is_available", None)
    if available is not None and not available():
        raise TokenReduceError(f"device {device!r} requested but torch sees no {dev.type} device here; use cpu")
    count = getattr(backend, "device_count", None)
    if dev.index is not None and count is not None and dev.index >= count():
        raise TokenReduceError(f"device {device!r} requested but torch sees {count()} {dev.type} device(s) "
                               f"({', '.join(f'{dev.type}:{i}' for i in range(count()))})")
    return dev


def enable_tf32() -> None:
    """Let float32 matmuls and cuDNN convolutions use TF32 tensor cores (CUDA only; no effect elsewhere)."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


def prepare_device(device: str | None) -> str:
    """``device`` checked (:func:`resolve_device`; None: cuda when available, else cpu), as a string;
    on CUDA, TF32 is enabled for float32 matmuls."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = resolve_device(device)
    if dev.type == "cuda":
        enable_tf32()
    return device


def _driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.split()
    return lines[0] if out.returncode == 0 and lines else None


def device_info(device: str | torch.device) -> dict[str, Any]:
    """The accelerator's provenance: ``gpus`` (name per visible index), ``cuda_version``, ``cudnn_version``,
    ``driver_version``, ``tf32`` (whether float32 matmuls may use TF32); all None when ``device`` is not CUDA."""
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return dict.fromkeys(("gpus", "cuda_version", "cudnn_version", "driver_version", "tf32"))
    return {"gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
            "cuda_version": torch.version.cuda, "cudnn_version": torch.backends.cudnn.version(),
            "driver_version": _driver_version(), "tf32": bool(torch.backends.cuda.matmul.allow_tf32)}
