"""The task contract and registry: what a model is trained for and how it is scored.

A task is an ``nn.Module`` built from a dataclass config by a spec string (``'classify'``,
``'hash(bits=32)'``), like a method. ``bind(model, ctx)`` attaches the model being trained as the
submodule ``model`` and builds everything else the task owns (heads, a jointly trained teacher,
target-code buffers). The training loop knows only this contract: it sums the named losses of
``forward``, optimises ``param_groups`` (every trainable parameter of the task), checkpoints
the model plus ``owned_state_dict()`` (under ``task.``) and reports ``evaluate``'s metrics.

A frozen external teacher (``TaskContext.teacher``, from ``--teacher CKPT``) is *not* owned: it
is held outside the module tree, so it is neither optimised, saved, moved nor DDP-synced.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import torch
from timm.optim import param_groups_weight_decay
from torch import Tensor, nn
from torch.utils.data import Dataset

from ..core.errors import TokenReduceError
from ..core.registry import NoParams, Registry, config_spec
from ..data import build_dataset


@dataclass
class TaskContext:
    """What the loop knows when it binds a task.

    ``classes``: class names of the training set; ``teacher``: a frozen model loaded from
    ``--teacher`` (eval mode, on the device) or None; ``label_smoothing``, ``distill`` (kinds, e.g.
    ``('logits', 'tokens')``), ``distill_weight``, ``distill_tau``: the run's loss settings;
    ``train_labels``: (n,) int64 labels of the training set the task's :meth:`Task.dataset`
    returned, in its order (for per-class or per-image targets; the loop may train on a fixed
    subset of it), None when its items have no single label; ``seed``: the run's seed.
    """

    classes: list[str] = field(default_factory=list)
    teacher: nn.Module | None = None
    label_smoothing: float = 0.0
    distill: tuple[str, ...] = ()
    distill_weight: float = 1.0
    distill_tau: float = 1.0
    train_labels: Tensor | None = None
    seed: int = 0


class TaskOutput(NamedTuple):
    """One training forward.

    ``losses``: name -> scalar, already weighted (the loop minimises their sum); ``logits``: the
    model's (B, K) output when it has one; ``stats``: name -> batch mean of a number the progress
    line shows and the history records as ``train_<name>`` (e.g. ``acc`` in percent), weighted
    by batch size across batches and processes; a 0-dim tensor stays on the device until the loop
    reads its sums (a float would have made the step wait for it).
    """

    losses: dict[str, Tensor]
    logits: Tensor | None = None
    stats: dict[str, float | Tensor] | None = None


class Task(nn.Module):
    """Base class of every task. Subclasses set ``Config``, ``metric`` and ``example`` and
    implement ``forward`` and ``evaluate`` (and ``bind`` when they own modules).

    Class attributes: ``name`` (registry id, set by :func:`register_task`), ``Config`` (a
    dataclass of spec parameters), ``metric`` (primary metric key of ``evaluate``: 'top1' | 'map' |
    'miou'), ``higher_is_better``, ``example`` (spec parameters the contract tests train with),
    ``scores_aux_outputs`` (whether ``forward`` scores the auxiliary predictions a learned reducer
    emits, ``get_info(model).aux_outputs``; the loop refuses such a reducer under a task that does not,
    since its routers would get no gradient).
    """

    name: ClassVar[str] = ""
    Config: ClassVar[type] = NoParams
    metric: ClassVar[str] = ""
    higher_is_better: ClassVar[bool] = True
    scores_aux_outputs: ClassVar[bool] = False
    example: ClassVar[dict[str, Any]] = {}

    def __init__(self, cfg: Any = None) -> None:
        super().__init__()
        self.cfg = self.Config() if cfg is None else cfg
        self.ctx: TaskContext | None = None

    def spec(self) -> str:
        """The canonical spec string, e.g. ``"hash(bits=32, targets='class', ...)"``."""
        return config_spec(self.name, self.cfg)

    def extra_repr(self) -> str:
        return self.spec()

    # -- what a task implements

    def bind(self, model: nn.Module, ctx: TaskContext) -> None:
        """Attach ``model`` (the submodule ``self.model``) and build every owned module.
        Subclasses call ``super().bind(model, ctx)`` first. Raises TokenReduceError."""
        self.model = model
        self.ctx = ctx

    def forward(self, images: Tensor, targets: Tensor) -> TaskOutput:
        """images (B, C, H, W), targets as the task's dataset yields them -> named losses."""
        raise NotImplementedError

    def evaluate(self, model: nn.Module, data: Dataset, *, batch_size: int = 500,
                 device: str | torch.device = "cpu", database: Dataset | None = None,
                 items: bool = False) -> dict[str, Any]:
        """The task's metrics of ``model`` (patched or not) on ``data``, JSON-able; the primary one
        under ``self.metric``, the number of evaluated items under ``n`` when it has one. With
        ``items`` also the per-item values the metrics are means of, under ``items`` (tasks/items.py;
        a task whose metric is no mean over items, such as mIoU, gives none). Pure inference.
        ``database``: what retrieval ranks against (the loop passes the unaugmented training split,
        built only when read). In a torchrun process group every process passes
        the same ``data`` and gets the single-process result (see ``tasks._dist``)."""
        raise NotImplementedError

    def plot(self, metrics: dict[str, Any], out_dir: str | Path) -> list[Path]:
        """Figures of ``evaluate``'s ``metrics`` written under ``out_dir``; default none."""
        return []

    def dataset(self, name: str, split: str, *, train: bool, **data_kw: Any) -> Dataset:
        """What the task trains (``split='train'``) and evaluates on; default ``data.build_dataset``.
        ``data_kw``: build_dataset's keywords (img_size, in_chans, augment, data_dir, ...)."""
        return build_dataset(name, split, train=train, **data_kw)

    # -- optimisation

    def lr_scale(self, name: str, param: nn.Parameter) -> float:
        """Multiplier of the peak learning rate for parameter ``name`` (task-relative, e.g.
        ``model.blocks.0.attn.qkv.weight``). Default 1."""
        return 1.0

    def param_groups(self, lr: float, weight_decay: float) -> list[dict[str, Any]]:
        """Optimizer groups over every trainable parameter of the task (model and owned modules).

        timm's weight-decay split (1-d tensors, biases and each submodule's ``no_weight_decay()``
        names undecayed), each part split again by :meth:`lr_scale`. Groups carry ``lr_scale``;
        the loop sets a group's peak lr to ``lr * lr_scale`` unless the group gives ``lr``.
        """
        skip = no_weight_decay_names(self)
        names = {id(p): n for n, p in self.named_parameters()}
        out: list[dict[str, Any]] = []
        for group in param_groups_weight_decay(self, weight_decay, no_weight_decay_list=skip):
            by_scale: dict[float, list[nn.Parameter]] = {}
            for p in group["params"]:
                by_scale.setdefault(float(self.lr_scale(names[id(p)], p)), []).append(p)
            out += [{**group, "params": ps, "lr_scale": s} for s, ps in by_scale.items()]
        return out

    # -- checkpoints

    def owned_state_dict(self) -> dict[str, Tensor]:
        """The task's tensors outside the model (heads, a jointly trained teacher, buffers)."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("model.")}

    def load_owned_state_dict(self, sd: dict[str, Tensor]) -> None:
        """Inverse of :meth:`owned_state_dict`; strict (keys and shapes checked before copying)."""
        own = self.owned_state_dict()
        missing, unexpected = sorted(set(own) - set(sd)), sorted(set(sd) - set(own))
        wrong = [k for k in own if k in sd and sd[k].shape != own[k].shape]
        if missing or unexpected or wrong:
            raise TokenReduceError(f"task {self.spec()}: saved task tensors do not match (missing {missing[:3]}, "
                                   f"unexpected {unexpected[:3]}, shape mismatches {wrong[:3]}); was the "
                                   "checkpoint made with another --task?")
        with torch.no_grad():
            for k, v in self.state_dict(keep_vars=True).items():
                if k in sd:
                    v.copy_(sd[k])


def no_weight_decay_names(module: nn.Module) -> set[str]:
    """Parameter names (relative to ``module``) that every submodule's ``no_weight_decay()``
    (the timm convention: names relative to that submodule) exempts from weight decay."""
    out: set[str] = set()
    for prefix, m in module.named_modules():
        fn = getattr(m, "no_weight_decay", None)
        if m is not module and callable(fn):
            out |= {f"{prefix}.{n}" for n in fn()}
    return out


def dataset_labels(ds: Dataset) -> Tensor | None:
    """(n,) int64 per-item labels of ``ds`` read from its ``targets`` (through ``Subset``/
    ``Seeded`` wrappers: ``indices``, ``base``), without loading images; None if it has none."""
    targets = getattr(ds, "targets", None)
    if targets is not None:
        return torch.as_tensor(targets, dtype=torch.long)
    base = getattr(ds, "base", None)
    if base is None:
        return None
    labels = dataset_labels(base)
    indices = getattr(ds, "indices", None)
    if labels is not None and indices is not None:
        labels = labels[torch.as_tensor(indices, dtype=torch.long)]
    # a wrapper that is not item-for-item (e.g. mosaics of four base images) has no such labels
    return labels if labels is not None and len(labels) == len(ds) else None


# ----------------------------------------------------------------------------- registry

def _builtins() -> None:
    importlib.import_module(__package__)  # registers the built-in tasks (a no-op once imported)


_TASKS: Registry[type[Task]] = Registry("task", load=_builtins)


def register_task(name: str) -> Callable[[type[Task]], type[Task]]:
    """Class decorator: make a Task subclass addressable as ``name(...)`` in specs."""

    return _TASKS.register_class(name)


def list_tasks() -> list[str]:
    """Names of all registered tasks."""
    return _TASKS.names()


def get_task(name: str) -> type[Task]:
    """The Task class registered under ``name``."""
    return _TASKS.get(name)


def build_task(spec: str | Task) -> Task:
    """A Task from a spec string like ``'hash(bits=32)'`` or a bare ``'classify'`` (or the Task itself)."""
    if isinstance(spec, Task):
        return spec
    _, cls, cfg = _TASKS.resolve(spec)
    return cls(cfg)
