"""``TrainConfig``: every setting a training run depends on, checked when it is made.

It is the one declaration of the training settings: ``tokenreduce train``'s flags map onto its
fields (a test checks that each field has its flag) and recipes (train/recipes.py) are parsed
through it, so a misspelt setting or a value of the wrong type is refused where it is written.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..core.errors import TokenReduceError
from .optim import OPTIMIZERS

#: Fields that say how to run, not what to train: they may change when a run is resumed.
RUNTIME_FIELDS = ("out", "resume", "force", "threads", "device", "num_workers", "quiet", "ckpt_every", "download")
#: Fields older runs recorded that mean nothing now (dropped when their config is read back, if empty).
_RETIRED = ("extra",)


@dataclass
class TrainConfig:
    """Everything a training run depends on. ``batch_size`` is global (split across processes).

    Model: ``model = {'name': timm name, 'kwargs': {...}, 'stem'?, 'transforms'?}`` built from
    scratch, or ``init`` (a checkpoint whose model and weights start the run; one trained for the
    same task also starts the task's own tensors); ``spec`` applies a reducer (fine-tuning a
    reduced model; with ``init`` and no spec, the checkpoint's own spec is kept). ``task``: what
    the model is trained for, a task spec (``'classify'``, ``'hash(bits=32)'``; stored
    canonically). ``optimizer``: ``'adamw'`` (betas 0.9, 0.999) or ``'sgd'`` (``momentum``); the
    peak ``lr`` follows warm-up then cosine to ``min_lr``, per parameter group scaled by the
    task's ``lr_scale``.
    """

    model: dict[str, Any] | None = None
    spec: str | None = None
    init: str | None = None
    task: str = "classify"
    teacher: str | None = None
    distill: tuple[str, ...] = ()
    distill_weight: float = 1.0
    distill_tau: float = 1.0
    data: str = "fashion_mnist"
    data_dir: str | None = None
    download: bool = False
    augment: str | None = None
    epochs: int = 10
    batch_size: int = 128
    eval_batch_size: int = 500
    optimizer: str = "adamw"
    lr: float = 1e-3
    min_lr: float = 1e-5
    momentum: float = 0.9
    weight_decay: float = 0.05
    warmup_epochs: float = 1.0
    label_smoothing: float = 0.1
    grad_clip: float | None = 1.0
    amp: str | None = None
    seed: int = 0
    deterministic: bool = False
    subset: int | None = None
    eval_subset: int | None = None
    eval_every: int = 1
    recipe: str | None = None
    out: str | None = None
    resume: bool = False
    force: bool = False
    ckpt_every: int = 500
    threads: int | None = None
    device: str | None = None
    num_workers: int = 0
    quiet: bool = False

    def __post_init__(self) -> None:
        from ..tasks import build_task

        _check_types(self)  # before the checks below compare numbers
        self.distill = tuple(self.distill)
        checks = [
            (self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}"),
            (self.batch_size >= 1, f"batch size must be >= 1, got {self.batch_size}"),
            (self.lr > 0, f"lr must be > 0, got {self.lr}"),
            (0 <= self.min_lr <= self.lr, f"min_lr must lie in [0, lr={self.lr}], got {self.min_lr}"),
            (self.warmup_epochs >= 0, f"warm-up epochs must be >= 0, got {self.warmup_epochs}"),
            (0 <= self.label_smoothing < 1, f"label smoothing must lie in [0, 1), got {self.label_smoothing}"),
            (self.subset is None or self.subset >= 1, f"subset must be >= 1 images, got {self.subset}"),
            (self.optimizer in OPTIMIZERS, f"unknown optimizer {self.optimizer!r}; choose from "
                                           f"{', '.join(OPTIMIZERS)}"),
            (0 <= self.momentum < 1, f"momentum must lie in [0, 1), got {self.momentum}"),
            (self.threads is None or self.threads >= 1, f"--threads must be >= 1, got {self.threads}"),
            (self.num_workers >= 0, f"--workers must be >= 0, got {self.num_workers}"),
        ]
        for ok, message in checks:
            if not ok:
                raise TokenReduceError(message)
        self.task = build_task(self.task).spec()  # canonical: equal runs compare equal
        if self.spec:  # a bad spec is refused before the run takes its output directory
            from ..core.method import build_reducer

            build_reducer(self.spec)

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        d = {k: v for k, v in d.items() if not (k in _RETIRED and not v)}
        check_fields(d)
        if "distill" in d:
            d["distill"] = tuple(d["distill"] or ())
        return cls(**d)

    def identity(self) -> dict[str, Any]:
        """The settings that define the result (runtime fields removed)."""
        d = self.to_dict()
        for k in RUNTIME_FIELDS:
            d.pop(k, None)
        return d


def field_names() -> list[str]:
    """The names of TrainConfig's fields, in declaration order."""
    return [f.name for f in dataclasses.fields(TrainConfig)]


def check_fields(keys: Iterable[str], where: str = "") -> None:
    """Refuse keys that are not TrainConfig fields, naming them and the valid fields; ``where``
    (e.g. "recipe 'fmnist-vit'") says whose keys they are."""
    unknown = sorted(set(keys) - set(field_names()))
    if unknown:
        raise TokenReduceError(f"{where + ': ' if where else ''}unknown training settings {unknown}; "
                               f"valid: {', '.join(field_names())}")


def _check_types(cfg: TrainConfig) -> None:
    """Each field's value of its declared type (an int where a float is declared is a float)."""
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if not _fits(value, hints[f.name]):
            raise TokenReduceError(f"training setting {f.name!r} must be {_describe(hints[f.name])}, got {value!r}")


def _fits(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, h) for h in typing.get_args(hint))
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if origin is tuple:  # tuple[X, ...]: a list read back from JSON counts
        return isinstance(value, (tuple, list)) and all(_fits(v, typing.get_args(hint)[0]) for v in value)
    if origin is not None:
        return isinstance(value, origin)
    if isinstance(value, bool):
        return hint is bool
    if hint is float:
        return isinstance(value, (int, float))
    return isinstance(value, hint)


def _describe(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_describe(h) for h in typing.get_args(hint))
    if hint is type(None):
        return "None"
    if typing.get_origin(hint) is tuple:
        return f"a list of {_describe(typing.get_args(hint)[0])}"
    return getattr(typing.get_origin(hint) or hint, "__name__", str(hint))
