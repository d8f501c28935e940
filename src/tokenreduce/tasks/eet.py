"""``eet``: EET's training of a pruned retrieval model - FISH targets, distillation (DKT), salient masking (DRG).

Paper: "Rethinking Vision Transformer for Large-Scale Fine-Grained Image Retrieval" (EET), Jiang,
Tang, Pan, Li, arXiv 2504.16691. Checked against github.com/WhiteJiang/EET (``train_model.py``:
the losses and the mask, ``utils.py``: the targets, ``model/vit.py``: the teacher's importance).

Built on :class:`~tokenreduce.tasks.hash.Hash` with per-image targets: the student is the model being
trained (pruned by whatever ``--spec`` it runs, EET's is CTP), ``h = head(z)``, ``z = model(x)``
(B, C) logits, ``h`` (B, bits). Targets ``t`` (B, bits) +-1 are FISH codes (:mod:`.fish`), solved
once from the training labels at the first training step and kept as task buffers
(``image_codes``, ``codes_solved``), so they are saved in every checkpoint and a resumed or
evaluated run never solves them again.

Student losses (names as returned; the loop sums them):
    ``ce``         ``ce_weight * CE(z, y)``                                 (EET: 0.1)
    ``ce_masked``  ``ce_weight * CE(model(mask(x)), y)``  with ``drg``       (EET: 0.1)
    ``hash``       ``hash_weight * MSE(h, t)``                              (EET: 1)
    ``dkt``        ``dkt_weight * mean_b (1 - cos(h_b, stopgrad(h^T_b)))``  with ``dkt`` (EET: 1)
    ``aux/<name>`` the student reducer's auxiliary losses
Teacher losses (jointly trained teacher only): ``teacher/ce`` = CE(z^T, y), ``teacher/hash`` =
MSE(h^T, t). The student losses never reach the teacher (DKT detaches its code, DRG only reads
its importance); the teacher losses never reach the student.

Teacher (built only when ``dkt`` or ``drg`` is on):
    ``teacher='joint'`` (EET's): a deep copy of the student at bind time with tokenreduce's patch
        removed - the unpruned model of the same architecture with the same weights - plus its
        own hash head ``teacher_head`` Linear(C, bits); both owned (saved under ``task.teacher.*``,
        ``task.teacher_head.*``) and trained jointly by the same optimizer. h^T = teacher_head(teacher(x)).
    ``teacher='frozen'``: ``TaskContext.teacher`` (``--teacher CKPT``), any timm ViT (larger
        allowed) whose OUTPUT is a continuous code of the same ``bits``: h^T = teacher(x), no
        teacher loss. :func:`export_teacher` makes one from a ``hash``/``eet`` run by folding its
        hash head into its classifier (h = W_h (W_c f + b_c) + b_h is one Linear of the features).
DRG's importance: the teacher runs with a probe patch (:class:`ImportanceProbe`, reduces nothing)
that asks the adapter for the last block's CLS attention row and per-head output norms and scores
them with CTP's score (``methods.ctp.importance``, the one CTP score). The top ``w`` patches of
each image are zeroed in the (normalised) input (:func:`mask_patches`): patch index i of a
(gh, gw) grid is row i // gw, column i % gw (``mask='grid'``); ``mask='official'`` reproduces the
official code, which swaps them (row i % gw, column i // gw: the transposed patch; square grids).

Retrieval evaluation, protocols, metrics: exactly the ``hash`` task's (asymmetric database = the
FISH codes of the training items).

Options (arms a study can switch; the defaults are EET's): ``fish_sigma`` (> 0) and ``fish_delta``
(> 0), the weights of the label fit and of the quantisation term of the FISH objective, and
``fish_iters`` (>= 1), its block-coordinate rounds (:mod:`.fish`).

Deviations: the official CE is plain (ours takes the run's ``label_smoothing``; the recipe sets 0);
the teacher's importance comes from its training-mode forward, as in the official code; with
``dkt`` and ``drg`` both off no teacher is built (the arms of the benchmark without EET's parts).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import Dataset

from ..api import apply, capture, find_info, is_patched, remove
from ..core.errors import SpecError, TokenReduceError
from ..core.method import AttnInfo, Host, Reducer
from ..core.registry import NoParams
from ..core.schedule import Schedule
from ..core.state import TokenState
from ..methods.ctp import importance as ctp_importance
from ..models import load_model, model_config, read_checkpoint, save_checkpoint, task_weights
from .base import TaskContext, TaskOutput, register_task
from .fish import DELTA, ITERS, SIGMA, fish_codes
from .hash import Hash, HashConfig, Protocol, binarize, labels_of

Mask = Literal["grid", "official"]
MASKS: tuple[str, ...] = get_args(Mask)
Teacher = Literal["joint", "frozen"]
TEACHERS: tuple[str, ...] = get_args(Teacher)
#: what the probe asks of the teacher's last block
PROBE_NEEDS = frozenset({"cls_attn", "head_norms"})


@dataclass(frozen=True)
class EETConfig:
    """``bits``; ``dkt``, ``drg``: EET's two parts on/off; ``w``: patches DRG masks; ``mask``:
    'grid' | 'official' (module docstring); ``teacher``: 'joint' | 'frozen'; loss weights
    ``ce_weight`` (clean and masked CE), ``hash_weight``, ``dkt_weight``; ``code_seed``: seed of the
    FISH targets (None: the run's seed); ``fish_sigma``, ``fish_delta``, ``fish_iters``: the FISH
    solver's sigma, delta and iterations (:mod:`.fish`); ``protocol``, ``db_subset``, ``ks``: as ``hash``."""

    bits: int = 32
    dkt: bool = True
    drg: bool = True
    w: int = 4
    mask: Mask = "grid"
    teacher: Teacher = "joint"
    ce_weight: float = 0.1
    hash_weight: float = 1.0
    dkt_weight: float = 1.0
    code_seed: int | None = None
    fish_sigma: float = SIGMA
    fish_delta: float = DELTA
    fish_iters: int = ITERS
    protocol: Protocol = "both"
    db_subset: int | None = None
    ks: int | tuple[int, ...] = (1, 10, 100, 1000)
    #: EET trains toward per-image codes (read by the hash task's machinery)
    targets: ClassVar[str] = "image"

    def __post_init__(self) -> None:
        HashConfig.__post_init__(self)  # bits, protocol, weights, db_subset, ks: the hash task's checks
        if not isinstance(self.dkt, bool) or not isinstance(self.drg, bool):
            raise SpecError(f"eet: dkt and drg are True or False, got {self.dkt!r}, {self.drg!r}")
        if not isinstance(self.w, int) or isinstance(self.w, bool) or self.w < 1:
            raise SpecError(f"eet: w (patches DRG masks) must be an integer >= 1, got {self.w!r}")
        if self.mask not in MASKS:
            raise SpecError(f"eet: unknown mask {self.mask!r}; choose from {', '.join(MASKS)}")
        if self.teacher not in TEACHERS:
            raise SpecError(f"eet: unknown teacher {self.teacher!r}; choose from {', '.join(TEACHERS)}")
        if not self.dkt_weight >= 0:
            raise SpecError(f"eet: dkt_weight must be >= 0, got {self.dkt_weight}")
        for name in ("fish_sigma", "fish_delta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise SpecError(f"eet: {name} must be a finite number > 0 (a weight of the FISH objective), got "
                                f"{value!r}")
        if isinstance(self.fish_iters, bool) or not isinstance(self.fish_iters, int) or self.fish_iters < 1:
            raise SpecError(f"eet: fish_iters must be an integer >= 1 (rounds of the FISH solver), got "
                            f"{self.fish_iters!r}")


class ImportanceProbe(Reducer):
    """A patch that reduces nothing and, at every forward, keeps CTP's importance M (B, N - p) of
    the model's last block in ``importance`` (detached; None before the first forward). Not a
    registered method: it asks the adapter for side products through ``Reducer.observes``."""

    Config = NoParams
    name = "importance_probe"
    needs_class_token = True
    where = "block"

    def __init__(self) -> None:
        super().__init__(NoParams())
        self.block = -1
        self.grid: tuple[int, int] = (0, 0)
        self.importance: Tensor | None = None

    def bind(self, host: Host) -> Schedule:
        self.block, self.grid = host.depth - 1, tuple(host.grid)
        n = host.num_patches
        return Schedule(n, (n,) * host.depth, (), self.where)  # no reduction anywhere

    def observes(self, block: int) -> frozenset[str]:
        return PROBE_NEEDS if block == self.block else frozenset()

    def observe(self, state: TokenState, info: AttnInfo) -> None:
        self.importance = ctp_importance(info.head_norms, info.cls_attn, state.num_prefix).detach()


def mask_patches(images: Tensor, idx: Tensor, grid: tuple[int, int], mask: str = "grid") -> Tensor:
    """``images`` (B, C, H, W) with the patches ``idx`` (B, w) (indices into the (gh, gw) patch grid,
    row-major) set to 0. ``mask='grid'``: patch i is row i // gw, column i % gw; ``'official'``: the
    official EET code's transposed patch, row i % gw, column i // gw (square grids only). A patch
    is H // gh x W // gw pixels."""
    if mask not in MASKS:
        raise TokenReduceError(f"unknown mask {mask!r}; choose from {', '.join(MASKS)}")
    gh, gw = grid
    B, _, H, W = images.shape
    if H % gh or W % gw:
        raise TokenReduceError(f"images of {H}x{W} do not split into the {gh}x{gw} patch grid")
    if mask == "official":
        if gh != gw:
            raise TokenReduceError(f"mask='official' (the transposed patch) needs a square grid, got {gh}x{gw}")
        idx = (idx % gw) * gw + idx // gw  # row i % gw, column i // gw
    keep = images.new_ones(B, gh * gw).scatter(1, idx, 0.0).view(B, 1, gh, gw)
    keep = keep.repeat_interleave(H // gh, dim=2).repeat_interleave(W // gw, dim=3)  # (B, 1, H, W)
    return images * keep


def _unpatched_copy(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` without tokenreduce's patch (the unpruned model, same weights)."""
    teacher = copy.deepcopy(model)
    return remove(teacher) if is_patched(teacher) else teacher


@register_task("eet")
class EET(Hash):
    """EET: FISH targets, a teacher, DKT and DRG on top of the hash task (module docstring)."""

    Config = EETConfig
    metric = "map"
    example: dict[str, Any] = {"bits": 8}

    def bind(self, model: nn.Module, ctx: TaskContext) -> None:
        cfg = self.cfg
        if ctx.distill:
            raise TokenReduceError("eet distils hash codes (DKT) by itself; drop --distill")
        if cfg.teacher == "joint" and ctx.teacher is not None:
            raise TokenReduceError("eet(teacher='joint') trains its own teacher; drop --teacher, or use "
                                   "eet(teacher='frozen') with --teacher CKPT")
        super().bind(model, dataclasses.replace(ctx, teacher=None))  # the hash task refuses a teacher
        self.ctx = ctx
        dev = self._device_of(model)
        self.register_buffer("codes_solved", torch.tensor(False, device=dev))
        self._solved = False
        self._probe: ImportanceProbe | None = None
        if not (cfg.dkt or cfg.drg):
            return

        if cfg.teacher == "joint":
            self.teacher = _unpatched_copy(model).to(dev).train(model.training)
            self.teacher_head = nn.Linear(self.head.in_features, cfg.bits).to(dev)
            target = self.teacher
        else:
            target = ctx.teacher
            if target is None:
                # bound to evaluate a finished run: the frozen teacher is not needed (nor saved)
                return
            self._check_frozen(target)
        if cfg.drg:
            if find_info(target) is not None:
                raise TokenReduceError("eet(drg=True) reads the importance of an unpruned teacher; the frozen teacher "
                                       "is patched with a reducer (export it from an unpruned run)")
            probe = ImportanceProbe()
            apply(target, probe)
            if cfg.w > probe.grid[0] * probe.grid[1]:
                raise TokenReduceError(f"eet: w={cfg.w} patches to mask, but the teacher has only "
                                       f"{probe.grid[0] * probe.grid[1]}")
            object.__setattr__(self, "_probe", probe)  # a plain attribute: the teacher's patch, not a submodule

    def _check_frozen(self, teacher: nn.Module) -> None:
        teacher.requires_grad_(False)
        teacher.eval()
        out = getattr(teacher, "num_classes", None)
        if out != self.cfg.bits:
            raise TokenReduceError(f"eet(teacher='frozen'): the teacher outputs {out} values, but its output is read "
                                   f"as a {self.cfg.bits}-bit code; make the teacher with "
                                   "tokenreduce.tasks.eet.export_teacher(run_checkpoint, out) from a hash/eet run with "
                                   f"bits={self.cfg.bits}")

    def load_owned_state_dict(self, sd: dict[str, Tensor]) -> None:
        super().load_owned_state_dict(sd)
        self._solved = bool(self.codes_solved)

    # -- targets

    def solve_codes(self) -> list[float]:
        """Solve the FISH targets of the bound training labels now (:func:`.fish.fish_codes`) and
        store them; returns the objective per iteration. Called once, at the first training step."""
        labels = self.image_labels
        if labels.numel() == 0:
            raise TokenReduceError("eet: no training labels to solve the FISH targets for; bind the task with "
                                   "TaskContext.train_labels (training) or load a trained run's checkpoint")
        cfg = self.cfg
        seed = self.ctx.seed if cfg.code_seed is None else cfg.code_seed
        res = fish_codes(labels.cpu(), cfg.bits, num_classes=self.class_codes.shape[0], seed=seed,
                         iters=cfg.fish_iters, sigma=cfg.fish_sigma, delta=cfg.fish_delta)
        self.set_image_codes(res.codes)
        self.codes_solved.fill_(True)
        self._solved = True
        return res.objective

    def _ensure_codes(self) -> None:
        if not self._solved:
            if bool(self.codes_solved):
                self._solved = True
            else:
                self.solve_codes()

    # -- training

    def forward(self, images: Tensor, targets: Tensor) -> TaskOutput:
        """images (B, C, H, W), targets (B, 2) [label, index] (the task's training set)."""
        cfg, ls = self.cfg, self.ctx.label_smoothing
        self._ensure_codes()
        labels = labels_of(targets)
        t = self.target_codes(targets)  # (B, bits)
        with capture(self.model) as seen:
            logits = self.model(images)  # (B, C)
        h = self.head(logits)  # (B, bits)
        losses = {"ce": cfg.ce_weight * F.cross_entropy(logits, labels, label_smoothing=ls),
                  "hash": cfg.hash_weight * F.mse_loss(h.float(), t)}
        info = seen.last
        if info is not None:
            losses.update({f"aux/{k}": v for k, v in info.aux_losses.items()})
        stats: dict[str, float] = {}
        if cfg.dkt or cfg.drg:
            t_h, t_logits, importance = self._teacher_forward(images, labels, t, losses)
            if cfg.dkt:
                cos = F.cosine_similarity(h.float(), t_h.detach().float(), dim=-1)  # (B,)
                losses["dkt"] = cfg.dkt_weight * (1.0 - cos).mean()
            if cfg.drg:
                idx = importance.topk(cfg.w, dim=1).indices  # (B, w) the teacher's most important patches
                masked = mask_patches(images, idx, self._probe.grid, cfg.mask)
                losses["ce_masked"] = cfg.ce_weight * F.cross_entropy(self.model(masked), labels, label_smoothing=ls)
            if t_logits is not None:
                stats["teacher_acc"] = 100.0 * (t_logits.detach().argmax(-1) == labels).float().mean()
        with torch.no_grad():
            stats.update({"acc": 100.0 * (logits.argmax(-1) == labels).float().mean(),
                          "bit_acc": 100.0 * (binarize(h) == t).float().mean()})
        return TaskOutput(losses, logits, stats)

    def _teacher_forward(self, images: Tensor, labels: Tensor, t: Tensor, losses: dict[str, Tensor]
                         ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """(teacher code h^T (B, bits), teacher logits or None, importance (B, N - p) or None); adds
        the jointly trained teacher's losses to ``losses``."""
        if self._probe is not None:
            self._probe.importance = None
        if self.cfg.teacher == "joint":
            t_logits = self.teacher(images)
            t_h = self.teacher_head(t_logits)
            losses["teacher/ce"] = F.cross_entropy(t_logits, labels, label_smoothing=self.ctx.label_smoothing)
            losses["teacher/hash"] = F.mse_loss(t_h.float(), t)
        else:
            if self.ctx.teacher is None:
                raise TokenReduceError("eet(teacher='frozen') needs a teacher: --teacher CKPT")
            t_logits = None
            with torch.no_grad():
                t_h = self.ctx.teacher(images)
        importance = self._probe.importance if self._probe is not None else None
        if self._probe is not None and importance is None:
            raise TokenReduceError("eet: the teacher's forward recorded no importance (was its patch removed?)")
        return t_h, t_logits, importance

    # -- evaluation

    def evaluate(self, model: nn.Module, data: Dataset, *, batch_size: int = 500,
                 device: str | torch.device = "cpu", database: Dataset | None = None,
                 items: bool = False) -> dict[str, Any]:
        """The hash task's retrieval metrics against the FISH targets (solved first if a bound
        training run has not done so yet)."""
        if self.image_labels.numel():
            self._ensure_codes()
        return super().evaluate(model, data, batch_size=batch_size, device=device, database=database, items=items)


def export_teacher(checkpoint: str | os.PathLike, out: str | os.PathLike) -> Path:
    """A frozen EET teacher (``eet(teacher='frozen')``, ``--teacher OUT``) from a finished
    ``hash``/``eet`` run: its model with the hash head folded into the classifier, so that the
    model's output is the continuous code, h = (W_h W_c) f + (W_h b_c + b_h) (B, bits). Any
    architecture (larger too); the reducer of the run, if any, stays (DRG then refuses it).
    Returns the path written (``out``, ``*.safetensors``)."""
    owned = task_weights(read_checkpoint(checkpoint))
    if "head.weight" not in owned or "head.bias" not in owned:
        raise TokenReduceError(f"{checkpoint}: no hash head (task.head.*); export a run of --task hash(...) or "
                               "eet(...)")
    model, meta = load_model(checkpoint)
    head = model.get_classifier()
    if not isinstance(head, nn.Linear) or getattr(model, "head_dist", None) is not None:
        raise TokenReduceError("export_teacher needs a model with one Linear classifier head")
    wh, bh = owned["head.weight"].double(), owned["head.bias"].double()  # (bits, C), (bits,)
    if wh.shape[1] != head.out_features:
        raise TokenReduceError(f"{checkpoint}: the hash head reads {wh.shape[1]} logits, the model gives "
                               f"{head.out_features}")
    weight = wh @ head.weight.detach().double()  # (bits, D)
    bias = wh @ head.bias.detach().double() + bh
    bits = wh.shape[0]
    model.reset_classifier(bits)
    with torch.no_grad():
        model.get_classifier().weight.copy_(weight)
        model.get_classifier().bias.copy_(bias)
    model_cfg = model_config(meta["model"])
    model_cfg = {**model_cfg, "kwargs": {**model_cfg.get("kwargs", {}), "num_classes": bits}}
    out = Path(out)
    save_checkpoint(out, model, meta={"model": model_cfg, "spec": meta.get("spec"), "epoch": meta.get("epoch"),
                                      "step": meta.get("step"), "teacher_of": str(checkpoint), "bits": bits,
                                      "data": meta.get("data"), "classes": meta.get("classes")})
    return out


__all__ = ["EET", "EETConfig", "ImportanceProbe", "MASKS", "export_teacher", "mask_patches"]
