"""Training tasks: an ``nn.Module`` that maps a batch to named losses.

The loop minimises the sum of the returned losses and knows nothing about methods: a learned
reducer's auxiliary losses arrive through ``get_info(model).aux_losses`` like any other loss.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.errors import TokenReduceError

DISTILL_KINDS = ("logits", "tokens")


class TaskOutput(NamedTuple):
    """``losses``: name -> scalar (already weighted; the loop sums them); ``logits`` (B, K)."""

    losses: dict[str, Tensor]
    logits: Tensor


def _info(model: nn.Module):
    """``get_info(model)``, or None for a model tokenreduce has not patched."""
    from ..api import get_info

    try:
        return get_info(model)
    except TokenReduceError:
        return None


def final_positions(model: nn.Module, num_tokens: int, batch: int, device: torch.device) -> Tensor:
    """(B, N) original sequence position of each token leaving the last block.

    For a reduced model this is ``get_info(model).index`` of the last forward (a merged token
    takes the position of the token it was merged into); otherwise ``arange(N)``.
    """
    info = _info(model)
    if info is not None and info.index is not None:
        return info.index
    return torch.arange(num_tokens, device=device).expand(batch, num_tokens)


class ClassificationTask(nn.Module):
    """Cross-entropy with label smoothing, the reducer's auxiliary losses, optional distillation.

    Losses (names as returned):
        ``ce``              CE(logits, y) with label smoothing ``label_smoothing``;
        ``aux/<name>``      each auxiliary loss the model's reducer emitted in this forward;
        ``distill_logits``  ``w * tau^2 * KL(softmax(t / tau) || softmax(s / tau))`` (batch mean),
                            any teacher with the same classes;
        ``distill_tokens``  ``w * MSE(student patch tokens, teacher tokens at the same original
                            positions)``; final normalised tokens (B, N', C) of an unpatched
                            teacher of the same width, gathered at ``final_positions``; where
                            the reducer masks tokens (``get_info(model).keep_mask``, DynamicViT
                            in training) the mean runs over the kept tokens only.

    The teacher is frozen and always in eval mode.
    """

    def __init__(self, model: nn.Module, *, label_smoothing: float = 0.1, teacher: nn.Module | None = None,
                 distill: tuple[str, ...] | list[str] = (), distill_weight: float = 1.0, tau: float = 1.0) -> None:
        super().__init__()
        self.model = model
        self.label_smoothing = label_smoothing
        self.distill = tuple(distill)
        self.distill_weight, self.tau = distill_weight, tau
        bad = [d for d in self.distill if d not in DISTILL_KINDS]
        if bad:
            raise TokenReduceError(f"unknown distillation {bad}; choose from {', '.join(DISTILL_KINDS)}")
        if self.distill and teacher is None:
            raise TokenReduceError("distillation needs a teacher (--teacher CKPT)")
        if teacher is not None and not self.distill:
            self.distill = ("logits",)
        self.teacher = teacher
        if teacher is not None:
            teacher.requires_grad_(False)
            teacher.eval()
            if "tokens" in self.distill:
                self._check_token_teacher(model, teacher)

    @staticmethod
    def _check_token_teacher(model: nn.Module, teacher: nn.Module) -> None:
        if _info(teacher) is not None:
            raise TokenReduceError("token distillation needs an unreduced teacher (one token per patch)")
        s_dim, t_dim = getattr(model, "embed_dim", None), getattr(teacher, "embed_dim", None)
        if s_dim != t_dim:
            raise TokenReduceError(f"token distillation needs equal widths; student {s_dim}, teacher {t_dim}")
        s_grid = tuple(model.patch_embed.grid_size)
        t_grid = tuple(teacher.patch_embed.grid_size)
        if s_grid != t_grid:
            raise TokenReduceError(f"token distillation needs the same patch grid; student {s_grid}, teacher {t_grid}")

    def train(self, mode: bool = True) -> ClassificationTask:
        super().train(mode)
        if self.teacher is not None:
            self.teacher.eval()
        return self

    def forward(self, images: Tensor, labels: Tensor) -> TaskOutput:
        """images (B, C, H, W), labels (B,) long."""
        want_tokens = "tokens" in self.distill
        if want_tokens:
            tokens = self.model.forward_features(images)  # (B, N', C)
            logits = self.model.forward_head(tokens)
        else:
            logits = self.model(images)
        losses = {"ce": F.cross_entropy(logits, labels, label_smoothing=self.label_smoothing)}
        info = _info(self.model)
        if info is not None:
            losses.update({f"aux/{k}": v for k, v in info.aux_losses.items()})
        if self.teacher is not None:
            with torch.no_grad():
                t_tokens = self.teacher.forward_features(images)  # (B, N0, C)
                t_logits = self.teacher.forward_head(t_tokens)
            if "logits" in self.distill:
                losses["distill_logits"] = self.distill_weight * self._kl(logits, t_logits)
            if want_tokens:
                losses["distill_tokens"] = self.distill_weight * self._token_mse(tokens, t_tokens)
        return TaskOutput(losses, logits)

    def _kl(self, s: Tensor, t: Tensor) -> Tensor:
        """s, t (B, K) logits."""
        if s.shape != t.shape:
            raise TokenReduceError(f"student logits {tuple(s.shape)} and teacher logits {tuple(t.shape)} differ; "
                                   "the teacher must have the same classes")
        log_p = F.log_softmax(s / self.tau, -1)
        log_q = F.log_softmax(t / self.tau, -1)
        return F.kl_div(log_p, log_q, log_target=True, reduction="batchmean") * self.tau**2

    def _token_mse(self, s_tokens: Tensor, t_tokens: Tensor) -> Tensor:
        """s_tokens (B, N', C) student, t_tokens (B, N0, C) teacher; patch tokens only."""
        B, N, _ = s_tokens.shape
        s_prefix = self.model.num_prefix_tokens
        t_prefix = self.teacher.num_prefix_tokens
        pos = final_positions(self.model, N, B, s_tokens.device)[:, s_prefix:] - s_prefix  # (B, N'-p) patch ids
        idx = (pos + t_prefix)[..., None].expand(-1, -1, t_tokens.shape[-1])
        target = t_tokens.gather(1, idx)  # (B, N'-p, C)
        err = (s_tokens[:, s_prefix:] - target).pow(2).mean(-1)  # (B, N'-p)
        info = _info(self.model)
        mask = None if info is None else info.keep_mask
        if mask is None:
            return err.mean()
        # a reducer that masks instead of dropping (DynamicViT in training): only live tokens count
        live = mask[:, s_prefix:].detach()
        return (err * live).sum() / live.sum().clamp_min(1.0)
