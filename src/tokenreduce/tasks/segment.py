"""``segment``: semantic segmentation of Fashion-MNIST mosaics (``data/mosaic.py``), scored by mIoU.

Model: a timm ViT whose final tokens, one per original token position, go through a per-token
linear head owned by the task (the official Cropr ``segm/`` linear decoder, after Segmenter):

    T = fc_norm(forward_features(x)[:, p:])          (B, N0, D)  patch tokens, original order
    L = T W^T + b                                     (B, N0, K)  W (K, D); K = classes (+1 background)
    logits = upsample(L -> (B, K, gh, gw), (H, W))    (B, K, H, W) bilinear (align_corners=False)
    loss   = mean over pixels of CE(logits, mask)

A reduced model must give every position back: a patched model is switched to
``apply(..., dense=True)`` in place, with the same reducer object (same parameters, same
schedule), by :meth:`Segment.bind` and by :meth:`Segment.evaluate` (pruned tokens return to their
positions, merged tokens are copied to every position they hold; ``TokenState.dense``). An
unpatched timm ViT returns every token already. Anything else that does not return p + N0 tokens
is a clear error.

Spec parameters: ``background`` (default True): the background (index = number of classes,
label 10 for the mosaics) is a class of the head, of the loss and of the metric. With
``background=False`` the head has one output per garment class and background pixels are
ignored (CE ``ignore_index``; left out of the confusion matrix). ``upsample``: 'bilinear'
(default, as the official decoder) or 'nearest'.

Metrics (:meth:`Segment.evaluate`, in percent like top1): ``miou`` = mean IoU over the classes
present in the prediction or in the ground truth, from ONE confusion matrix accumulated over the
whole evaluation set (not a mean of per-image IoUs); classes absent from both are left out;
background included when it is a class. ``pixel_acc``, ``iou_per_class`` (None for an absent
class), ``n`` (images).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import Dataset

from ..api import capture, find_info, reapply
from ..core.errors import SpecError, TokenReduceError
from ..data import build_dataset, build_mosaic, is_dense
from . import _dist
from .base import Task, TaskContext, TaskOutput, register_task

Upsample = Literal["bilinear", "nearest"]
UPSAMPLE: tuple[str, ...] = get_args(Upsample)


# ----------------------------------------------------------------------------- deterministic forms on CUDA


def _deterministic_cuda(t: Tensor) -> bool:
    return t.is_cuda and torch.are_deterministic_algorithms_enabled()


def separable_bilinear(x: Tensor, size: tuple[int, int]) -> Tensor:
    """Bilinear upsampling (align_corners=False) as two products, x (B, K, h, w) -> R_H x R_W^T (B, K, H, W),
    with R_H (H, h) and R_W (W, w) F.interpolate's weights (read off interpolating the identity along one
    axis). Equal to ``F.interpolate`` up to rounding; used on CUDA under ``--deterministic``, where
    interpolate's backward has no deterministic kernel and a matmul's has."""
    (H, W), (h, w) = size, x.shape[-2:]
    rows = F.interpolate(torch.eye(h, dtype=x.dtype, device=x.device)[None, None], size=(H, h), mode="bilinear",
                         align_corners=False)[0, 0]  # (H, h)
    cols = F.interpolate(torch.eye(w, dtype=x.dtype, device=x.device)[None, None], size=(W, w), mode="bilinear",
                         align_corners=False)[0, 0]  # (W, w)
    return torch.einsum("Hh,bkhw,Ww->bkHW", rows, x, cols)


def pixel_cross_entropy(logits: Tensor, masks: Tensor, ignore_index: int) -> Tensor:
    """Mean CE over the counted pixels, logits (B, K, H, W), masks (B, H, W). On CUDA under
    ``--deterministic`` computed over the pixels as rows, (B H W, K): the 2-D NLL kernel has no
    deterministic CUDA implementation, the 1-D one has (the same mean, summed in another order)."""
    if _deterministic_cuda(logits):
        k = logits.shape[1]
        return F.cross_entropy(logits.movedim(1, -1).reshape(-1, k), masks.reshape(-1), ignore_index=ignore_index)
    return F.cross_entropy(logits, masks, ignore_index=ignore_index)


# ----------------------------------------------------------------------------- metrics (pure)


def confusion_matrix(pred: Tensor, target: Tensor, num_classes: int) -> Tensor:
    """(K, K) int64 counts, ``cm[t, p]`` = pixels of true class t predicted as p.

    pred, target: integer tensors of the same shape (any). Pixels whose target is outside
    ``0..K-1`` are left out (an ignored label); a prediction outside that range is an error.
    """
    if pred.shape != target.shape:
        raise TokenReduceError(f"prediction {tuple(pred.shape)} and target {tuple(target.shape)} shapes differ")
    pred, target = pred.reshape(-1).long(), target.reshape(-1).long()
    valid = (target >= 0) & (target < num_classes)
    pred, target = pred[valid], target[valid]
    if pred.numel() and (pred.min() < 0 or pred.max() >= num_classes):
        raise TokenReduceError(f"predictions must lie in 0..{num_classes - 1}")
    return torch.bincount(target * num_classes + pred, minlength=num_classes**2).view(num_classes, num_classes)


def miou_from_confusion(cm: Tensor) -> tuple[float, Tensor]:
    """Mean IoU (a fraction) and per-class IoU (K,) float64 from a confusion matrix (K, K).

    ``IoU_k = cm[k, k] / (sum_j cm[k, j] + sum_i cm[i, k] - cm[k, k])`` (TP / (TP + FN + FP)).
    A class that is neither in the ground truth nor predicted (row and column empty) has no IoU
    (NaN) and is left out of the mean. Raises on an empty matrix.
    """
    cm = cm.double()
    tp = cm.diagonal()
    union = cm.sum(0) + cm.sum(1) - tp  # (K,)
    present = union > 0
    if not bool(present.any()):
        raise TokenReduceError("the confusion matrix is empty: no pixel was evaluated")
    iou = torch.where(present, tp / union.clamp_min(1), torch.full_like(tp, float("nan")))
    return float(iou[present].mean()), iou


# ----------------------------------------------------------------------------- task


@dataclass(frozen=True)


class SegmentConfig:
    """``background``: background is a class (head output, loss, metric); else its pixels are
    ignored. ``upsample``: how token-grid logits reach pixels, 'bilinear' or 'nearest'."""

    background: bool = True
    upsample: Upsample = "bilinear"

    def __post_init__(self) -> None:
        if not isinstance(self.background, bool):
            raise SpecError(f"segment: background must be True or False, got {self.background!r}")
        if self.upsample not in UPSAMPLE:
            raise SpecError(f"segment: upsample={self.upsample!r}; choose from {', '.join(UPSAMPLE)}")


def make_dense(model: nn.Module) -> nn.Module:
    """Switch a tokenreduce-patched model to dense output in place (same reducer object, so the
    same parameters and schedule; ``forward_features`` then returns (B, p + N0, C)); an
    unpatched model is returned as it is. Returns the model."""
    info = find_info(model)
    if info is not None and not info.dense:
        reapply(model, dense=True)
    return model


@register_task("segment")
class Segment(Task):
    """Per-pixel classification of the mosaics with a per-token linear head (see the module doc).

    Owned: ``head`` = Linear(D, K), trunc-normal(0.02) weights, zero bias (Segmenter's init).
    Binding removes the model's image-level classifier (``reset_classifier(0)``: it would get no
    gradient); the final norm is applied per token (``norm`` in ``forward_features``, or timm's
    post-pooling ``fc_norm`` in avg-pool models).
    Losses: ``ce`` (pixel mean) and ``aux/<name>`` for each auxiliary loss the reducer emitted and
    for each auxiliary prediction (B, gh * gw, K) it emitted (``tokenreduce.capture``,
    Cropr's per-patch heads): CE per grid cell against the mask sampled at the patch grid.
    Stats: ``pixel_acc`` (percent, over the pixels the loss counts). No distillation: a
    ``--teacher`` / ``--distill`` is a clear error.
    """

    Config = SegmentConfig
    metric = "miou"
    scores_aux_outputs = True
    example: dict[str, Any] = {}

    def bind(self, model: nn.Module, ctx: TaskContext) -> None:
        super().bind(model, ctx)
        if ctx.teacher is not None or ctx.distill:
            raise TokenReduceError("segment has no distillation; train it without --teacher / --distill")
        if not ctx.classes:
            raise TokenReduceError("segment needs the class names of the dataset (TaskContext.classes)")
        grid = getattr(getattr(model, "patch_embed", None), "grid_size", None)
        dim = getattr(model, "embed_dim", None)
        if grid is None or dim is None:
            raise TokenReduceError(f"segment needs a ViT with a patch grid (patch_embed.grid_size) and embed_dim; "
                                   f"got {type(model).__name__}")
        make_dense(model)
        if getattr(model, "num_classes", 0) and hasattr(model, "reset_classifier"):
            # the image-level classifier gets no gradient from pixels: drop it (the loop records num_classes=0)
            model.reset_classifier(0)
        self.background = len(ctx.classes)  # the dataset's background label
        self.num_outputs = len(ctx.classes) + (1 if self.cfg.background else 0)
        ref = next(model.parameters())
        self.head = nn.Linear(dim, self.num_outputs, device=ref.device, dtype=ref.dtype)
        nn.init.trunc_normal_(self.head.weight, std=0.02)
        nn.init.zeros_(self.head.bias)

    @property
    def ignore_index(self) -> int:
        """The label CE and the metric skip: background when it is not a class, else none (-100)."""
        return -100 if self.cfg.background else self.background

    def pixel_logits(self, model: nn.Module, images: Tensor) -> Tensor:
        """images (B, C, H, W) -> logits (B, K, H, W) through ``model``'s dense tokens and the head."""
        tokens = model.forward_features(images)  # (B, p + N0, D)
        p = model.num_prefix_tokens
        gh, gw = model.patch_embed.grid_size
        if tokens.dim() != 3 or tokens.shape[1] != p + gh * gw:
            raise TokenReduceError(
                f"segment needs one token per position ({p} prefix + {gh * gw} patch tokens) from forward_features, "
                f"got {tuple(tokens.shape)}; a reduced model must be applied with tokenreduce.apply(..., dense=True)")
        B = tokens.shape[0]
        # timm normalises after pooling in avg-pool models (fc_norm; Identity otherwise): per token here
        patches = getattr(model, "fc_norm", nn.Identity())(tokens[:, p:])  # (B, N0, D)
        logits = self.head(patches)  # (B, N0, K)
        logits = logits.transpose(1, 2).reshape(B, -1, gh, gw)  # (B, K, gh, gw), timm's row-major grid
        if self.cfg.upsample == "bilinear" and _deterministic_cuda(logits):
            return separable_bilinear(logits, images.shape[-2:])
        kw = {"align_corners": False} if self.cfg.upsample == "bilinear" else {}
        return F.interpolate(logits, size=images.shape[-2:], mode=self.cfg.upsample, **kw)  # (B, K, H, W)

    def _check_masks(self, images: Tensor, masks: Tensor) -> None:
        if masks.dim() != 3 or masks.shape[0] != images.shape[0] or masks.shape[-2:] != images.shape[-2:]:
            raise TokenReduceError(f"segment needs per-pixel masks (B, H, W) matching images {tuple(images.shape)}, "
                                   f"got {tuple(masks.shape)}; train it on the mosaics (Segment.dataset)")

    def forward(self, images: Tensor, masks: Tensor) -> TaskOutput:
        """images (B, C, H, W), masks (B, H, W) long in 0..classes (classes = background)."""
        self._check_masks(images, masks)

        with capture(self.model) as seen:
            logits = self.pixel_logits(self.model, images)
        losses = {"ce": pixel_cross_entropy(logits, masks, self.ignore_index)}
        info = seen.last  # the live record; None for an unpatched model: it emits none
        if info is not None:
            losses.update({f"aux/{k}": v for k, v in info.aux_losses.items()})
            losses.update({f"aux/{k}": self._aux_ce(k, v, masks) for k, v in info.aux_outputs.items()})
        with torch.no_grad():
            counted = masks != self.ignore_index
            hits = (logits.argmax(1) == masks) & counted
            acc = 100.0 * hits.sum() / counted.sum().clamp(min=1)  # a tensor: the loop reads it when it logs
        return TaskOutput(losses, None, {"pixel_acc": acc})

    def _aux_ce(self, name: str, pred: Tensor, masks: Tensor) -> Tensor:
        """Per-cell CE of a reducer's auxiliary prediction ``pred`` (B, gh * gw, K), one per patch
        (row-major), against ``masks`` (B, H, W) taken at the patch grid with nearest-neighbour
        sampling (the official Cropr segm/engine.py), ignoring the same label as the main loss (the same
        deterministic form on CUDA, :func:`pixel_cross_entropy`)."""
        gh, gw = self.model.patch_embed.grid_size
        B = masks.shape[0]
        if pred.dim() != 3 or pred.shape[0] != B or pred.shape[1:] != (gh * gw, self.num_outputs):
            raise TokenReduceError(f"auxiliary prediction {name!r} has shape {tuple(pred.shape)}; segment scores one "
                                   f"prediction per patch, (B, {gh * gw}, {self.num_outputs}) (a reducer's "
                                   "queries/classes parameters; the classes include background when it is one)")
        cells = pred.transpose(1, 2).reshape(B, self.num_outputs, gh, gw)  # (B, K, gh, gw)
        target = F.interpolate(masks[:, None].float(), size=(gh, gw), mode="nearest")[:, 0].long()  # (B, gh, gw)
        return pixel_cross_entropy(cells, target, self.ignore_index)

    @torch.inference_mode()
    def evaluate(self, model: nn.Module, data: Dataset, *, batch_size: int = 500,
                 device: str | torch.device = "cpu", database: Dataset | None = None,
                 items: bool = False) -> dict[str, Any]:
        """``{'miou', 'pixel_acc', 'iou_per_class', 'n'}`` (percent; ``iou_per_class[k]`` None for a
        class absent from prediction and ground truth) of ``model`` with this task's head on
        ``data`` (image, mask) pairs. A patched model is switched to dense output in place. In a
        torchrun process group the confusion matrices of the shards are summed. mIoU is no mean over
        images, so ``items`` adds nothing."""
        if not hasattr(self, "head"):
            raise TokenReduceError("segment: bind the task to a model before evaluating (it owns the head)")
        make_dense(model)
        was_training = model.training
        model.eval()
        device = torch.device(device)
        K = self.num_outputs
        cm = torch.zeros(K, K, dtype=torch.int64)
        n = torch.zeros(1, dtype=torch.int64)
        try:
            for images, masks in _dist.shard_loader(data, batch_size, device):
                images, masks = images.to(device, non_blocking=True), masks.to(device, non_blocking=True)
                self._check_masks(images, masks)
                pred = self.pixel_logits(model, images).float().argmax(1)  # (B, H, W)
                target = masks if self.cfg.background else masks.masked_fill(masks == self.background, -1)
                cm += confusion_matrix(pred, target, K).cpu()
                n += images.shape[0]
        finally:
            model.train(was_training)
        cm, n = _dist.all_reduce_sum(cm), int(_dist.all_reduce_sum(n))
        if n == 0:
            raise TokenReduceError("evaluation set is empty")
        miou, iou = miou_from_confusion(cm)
        acc = float(cm.diagonal().sum()) / max(1, int(cm.sum()))
        return {"miou": 100.0 * miou, "pixel_acc": 100.0 * acc,
                "iou_per_class": [None if v != v else 100.0 * float(v) for v in iou.tolist()], "n": n}

    def dataset(self, name: str, split: str, *, train: bool, **data_kw: Any) -> Dataset:
        """A dense dataset as it is (``data.is_dense``: the scene masks), else mosaics of dataset ``name``
        (Fashion-MNIST, or a mosaic name): ``data.build_mosaic``."""
        if is_dense(name):
            return build_dataset(name, split, train=train, **data_kw)
        return build_mosaic(name, split, train=train, **data_kw)


__all__ = ["Segment", "SegmentConfig", "confusion_matrix", "make_dense", "miou_from_confusion"]
