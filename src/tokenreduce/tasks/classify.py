"""``classify``: image classification with the model's own head, scored by top-1 accuracy.

The loop minimises the sum of the returned losses and knows nothing about methods: a learned
reducer's auxiliary losses arrive like any other loss, through the live record of the forward
(``tokenreduce.capture(model)`` around it), its auxiliary predictions through the same record,
scored here with the main criterion.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import Dataset

from ..api import capture, find_info
from ..core.errors import SpecError, TokenReduceError
from ..core.method import Reducer
from . import _dist
from .base import Task, TaskContext, TaskOutput, register_task
from .items import encode

DISTILL_KINDS = ("logits", "tokens")


def final_positions(model: nn.Module, num_tokens: int, batch: int, device: torch.device) -> Tensor:
    """(B, N) original sequence position of each token leaving the last block.

    For a reduced model this is ``get_info(model).index`` of the last forward (a merged token
    takes the position of the token it was merged into); otherwise ``arange(N)``.
    """
    info = find_info(model)
    if info is not None and info.index is not None:
        return info.index
    return torch.arange(num_tokens, device=device).expand(batch, num_tokens)


@dataclass(frozen=True)
class ClassifyConfig:
    """``backbone_lr``: learning-rate multiplier of the model's parameters outside a learned
    reducer (DynamicViT trains its backbone at 0.01 x the predictors' rate); 1 = one rate for all."""

    backbone_lr: float = 1.0

    def __post_init__(self) -> None:
        if not self.backbone_lr > 0:
            raise SpecError(f"classify: backbone_lr must be > 0, got {self.backbone_lr}")


@register_task("classify")
class Classify(Task):
    """Cross-entropy with label smoothing, the reducer's auxiliary losses, optional distillation.

    Losses (names as returned):
        ``ce``              CE(logits, y) with label smoothing ``ctx.label_smoothing``;
        ``aux/<name>``      each auxiliary loss the model's reducer emitted in this forward, and
                            the CE above (same smoothing) of each auxiliary prediction (B, 1, K)
                            it emitted (``tokenreduce.capture``, Cropr's heads);
        ``distill_logits``  ``w * tau^2 * KL(softmax(t / tau) || softmax(s / tau))`` (batch mean),
                            any teacher with the same classes;
        ``distill_tokens``  ``w * MSE(student patch tokens, teacher tokens at the same original
                            positions)``; final normalised tokens (B, N', C) of an unpatched
                            teacher of the same width, gathered at ``final_positions``; where
                            the reducer masks tokens (``get_info(model).keep_mask``, DynamicViT
                            in training) the mean runs over the kept tokens only.
    Stats: ``acc``, batch top-1 in percent. The teacher (``ctx.teacher``) is frozen, in eval
    mode and not owned: the task holds no parameter of its own.
    """

    Config = ClassifyConfig
    metric = "top1"
    scores_aux_outputs = True
    example: dict[str, Any] = {}

    def bind(self, model: nn.Module, ctx: TaskContext) -> None:
        super().bind(model, ctx)
        self.distill = tuple(ctx.distill)
        bad = [d for d in self.distill if d not in DISTILL_KINDS]
        if bad:
            raise TokenReduceError(f"unknown distillation {bad}; choose from {', '.join(DISTILL_KINDS)}")
        teacher = ctx.teacher
        if self.distill and teacher is None:
            raise TokenReduceError("distillation needs a teacher (--teacher CKPT)")
        if teacher is not None and not self.distill:
            self.distill = ("logits",)
        if teacher is not None:
            teacher.requires_grad_(False)
            teacher.eval()
            if "tokens" in self.distill:
                self._check_token_teacher(model, teacher)

    @property
    def teacher(self) -> nn.Module | None:
        return self.ctx.teacher if self.ctx is not None else None

    @staticmethod
    def _check_token_teacher(model: nn.Module, teacher: nn.Module) -> None:
        if find_info(teacher) is not None:
            raise TokenReduceError("token distillation needs an unreduced teacher (one token per patch)")
        s_dim, t_dim = getattr(model, "embed_dim", None), getattr(teacher, "embed_dim", None)
        if s_dim != t_dim:
            raise TokenReduceError(f"token distillation needs equal widths; student {s_dim}, teacher {t_dim}")
        s_grid = tuple(model.patch_embed.grid_size)
        t_grid = tuple(teacher.patch_embed.grid_size)
        if s_grid != t_grid:
            raise TokenReduceError(f"token distillation needs the same patch grid; student {s_grid}, teacher {t_grid}")

    def lr_scale(self, name: str, param: nn.Parameter) -> float:
        learned = {id(p) for m in self.model.modules() if isinstance(m, Reducer) for p in m.parameters()}
        return 1.0 if id(param) in learned else self.cfg.backbone_lr

    def forward(self, images: Tensor, labels: Tensor) -> TaskOutput:
        """images (B, C, H, W), labels (B,) long."""
        want_tokens = "tokens" in self.distill
        with capture(self.model) as seen:
            if want_tokens:
                tokens = self.model.forward_features(images)  # (B, N', C)
                logits = self.model.forward_head(tokens)
            else:
                logits = self.model(images)
        losses = {"ce": F.cross_entropy(logits, labels, label_smoothing=self.ctx.label_smoothing)}
        info = seen.last
        if info is not None:
            losses.update({f"aux/{k}": v for k, v in info.aux_losses.items()})
            losses.update({f"aux/{k}": self._aux_ce(k, v, logits, labels) for k, v in info.aux_outputs.items()})
        teacher = self.teacher
        if teacher is not None:
            teacher.eval()
            with torch.no_grad():
                t_tokens = teacher.forward_features(images)  # (B, N0, C)
                t_logits = teacher.forward_head(t_tokens)
            if "logits" in self.distill:
                losses["distill_logits"] = self.ctx.distill_weight * self._kl(logits, t_logits)
            if want_tokens:
                losses["distill_tokens"] = self.ctx.distill_weight * self._token_mse(tokens, t_tokens)
        acc = 100.0 * (logits.detach().argmax(-1) == labels).float().mean()
        return TaskOutput(losses, logits, {"acc": acc})

    def _aux_ce(self, name: str, pred: Tensor, logits: Tensor, labels: Tensor) -> Tensor:
        """The main criterion on a reducer's auxiliary prediction ``pred`` (B, 1, K) or (B, K)."""
        if pred.dim() == 3 and pred.shape[1] == 1:
            pred = pred[:, 0]
        if pred.shape != logits.shape:
            raise TokenReduceError(f"auxiliary prediction {name!r} has shape {tuple(pred.shape)}; classify scores one "
                                   f"prediction per image over the {logits.shape[-1]} classes, (B, 1, "
                                   f"{logits.shape[-1]}) (a reducer's classes/queries parameters)")
        return F.cross_entropy(pred, labels, label_smoothing=self.ctx.label_smoothing)

    def _kl(self, s: Tensor, t: Tensor) -> Tensor:
        """s, t (B, K) logits."""
        if s.shape != t.shape:
            raise TokenReduceError(f"student logits {tuple(s.shape)} and teacher logits {tuple(t.shape)} differ; "
                                   "the teacher must have the same classes")
        tau = self.ctx.distill_tau
        log_p = F.log_softmax(s / tau, -1)
        log_q = F.log_softmax(t / tau, -1)
        return F.kl_div(log_p, log_q, log_target=True, reduction="batchmean") * tau**2

    def _token_mse(self, s_tokens: Tensor, t_tokens: Tensor) -> Tensor:
        """s_tokens (B, N', C) student, t_tokens (B, N0, C) teacher; patch tokens only."""
        B, N, _ = s_tokens.shape
        s_prefix = self.model.num_prefix_tokens
        t_prefix = self.teacher.num_prefix_tokens
        pos = final_positions(self.model, N, B, s_tokens.device)[:, s_prefix:] - s_prefix  # (B, N'-p) patch ids
        idx = (pos + t_prefix)[..., None].expand(-1, -1, t_tokens.shape[-1])
        target = t_tokens.gather(1, idx)  # (B, N'-p, C)
        err = (s_tokens[:, s_prefix:] - target).pow(2).mean(-1)  # (B, N'-p)
        info = find_info(self.model)
        mask = None if info is None else info.keep_mask
        if mask is None:
            return err.mean()
        # a reducer that masks instead of dropping (DynamicViT in training): only live tokens count
        live = mask[:, s_prefix:].detach()
        return (err * live).sum() / live.sum().clamp_min(1.0)

    @torch.inference_mode()
    def evaluate(self, model: nn.Module, data: Dataset, *, batch_size: int = 500,
                 device: str | torch.device = "cpu", database: Dataset | None = None,
                 items: bool = False) -> dict[str, Any]:
        """Top-1 accuracy (percent) and mean cross-entropy of ``model`` over ``data``:
        ``{'top1', 'loss', 'n'}`` (with ``items``: each image's correct or not, ``items['top1']``). In
        a torchrun process group each process reads its shard and the correct / loss / image counts
        are summed, so the result equals one process's."""
        was_training = model.training
        model.eval()
        device = torch.device(device)
        sums = _dist.counters(3, device)  # loss sum, correct, images: read once, after the last batch
        hits = []
        try:
            for images, labels in _dist.shard_loader(data, batch_size, device):
                images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
                logits = model(images)
                hit = logits.argmax(-1) == labels
                sums[0] += F.cross_entropy(logits.float(), labels, reduction="sum")
                sums[1] += hit.sum()
                sums[2] += labels.numel()
                hits.append(hit.float())  # float: every backend gathers it
        finally:
            model.train(was_training)
        loss, correct, n = _dist.all_reduce_sum(sums).tolist()
        if n == 0:
            raise TokenReduceError("evaluation set is empty")
        out = {"top1": 100.0 * correct / n, "loss": loss / n, "n": int(n)}
        if items:
            out["items"] = {"top1": encode(_dist.gather_shards(torch.cat(hits), int(n)) > 0.5)}
        return out
