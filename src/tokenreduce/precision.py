"""Where and in what precision a command runs its model: ``--device`` and ``--amp`` (commands/vocab.py).

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

from .bench.settings import AMP_CHOICES

#: ``--amp`` choice (declared torch-free in bench/settings.py) -> autocast dtype, in the same order.
AMP_DTYPES: dict[str, torch.dtype | None] = dict(zip(AMP_CHOICES, (torch.bfloat16, torch.float16, None), strict=True))


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


def enable_tf32() -> None:
    """Let float32 matmuls and cuDNN convolutions use TF32 tensor cores (CUDA only; no effect elsewhere)."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


def prepare_device(device: str | None) -> str:
    """``device`` checked (train.dist.resolve_device; None: cuda when available, else cpu), as a string;
    on CUDA, TF32 is enabled for float32 matmuls."""
    from .train.dist import resolve_device

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
