"""Optimizers by name and the learning-rate schedule (linear warm-up, then cosine)."""

from __future__ import annotations

import math
from typing import Any

import torch

from .config import OPTIMIZERS


def build_optimizer(name: str, groups: list[dict[str, Any]], lr: float, momentum: float = 0.9) -> torch.optim.Optimizer:
    """Optimizer ``name`` (one of ``config.OPTIMIZERS``) over ``groups``; each group's peak lr is its ``lr`` if
    given, else ``lr * lr_scale`` (the scheduler then scales every group by the same factor)."""
    groups = [{**g, "lr": g.get("lr", lr * g.get("lr_scale", 1.0))} for g in groups]
    cls, kwargs = OPTIMIZERS[name]
    return getattr(torch.optim, cls)(groups, lr=lr, **kwargs(momentum))


class WarmupCosine:
    """LR factor at optimizer step s: linear warm-up to 1 over ``warmup`` steps, then cosine to
    ``min_ratio`` at ``total``. A class (not a lambda) so LambdaLR can checkpoint it."""

    def __init__(self, warmup: int, total: int, min_ratio: float) -> None:
        self.warmup, self.total, self.min_ratio = warmup, total, min_ratio

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        t = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * t))
