"""``TrainConfig``: every setting a training run depends on, checked when it is made.

It is the one declaration of the training settings: each field carries its default, its help and its
flag's keywords, ``tokenreduce train``'s flags are generated from the fields (adding a field adds its
flag), and recipes (train/recipes.py) are parsed through it, so a misspelt setting or a value of the
wrong type is refused where it is written. The module imports no torch.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..bench.settings import AMP_CHOICES
from ..core.errors import TokenReduceError

#: Fields that say how to run, not what to train: they may change when a run is resumed.
RUNTIME_FIELDS = ("out", "resume", "force", "allow_data_change", "threads", "device", "num_workers", "quiet",
                  "ckpt_every", "download")
#: Of those, the run's own pace, which a bare ``--resume`` keeps (a flag given changes it): a resumed run is
#: bit-identical only on its own thread count, and checkpoints as often as it did.
RESUME_KEEPS = ("threads", "num_workers", "ckpt_every")
#: Fields older runs recorded that mean nothing now (dropped when their config is read back, if empty).
_RETIRED = ("extra",)


#: ``optimizer``'s choices: name -> (the ``torch.optim`` class, its arguments besides ``lr`` as a function of the
#: run's ``momentum``); train/optim.py builds them. Data, not torch, so that ``tokenreduce train --help`` stays light.
OPTIMIZERS: dict[str, tuple[str, Callable[[float], dict[str, Any]]]] = {
    "adamw": ("AdamW", lambda momentum: {"betas": (0.9, 0.999)}),
    "sgd": ("SGD", lambda momentum: {"momentum": momentum}),
}
#: The sections of ``tokenreduce train --help``, in order: each field names its own.
GROUPS = ("model", "data", "optimisation", "run")


def _setting(default: Any, help: str, group: str, **flag: Any) -> Any:
    """A TrainConfig field: its default, what it means (``tokenreduce train --help``; empty for the flags the
    command line's shared vocabulary declares), its section of the help, and argparse keywords for its flag
    (``flag``: the option string when it is not ``--field-name``; ``metavar``; ``choices``, checked here too)."""
    assert group in GROUPS, group
    return dataclasses.field(default=default, metadata={"help": help, "group": group, **flag})


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

    recipe: str | None = _setting(None, "named recipe (model + optimiser + schedule; tokenreduce list); flags "
                                  "override it", "model")
    model: dict[str, Any] | None = _setting(
        None, "the timm model built from scratch: {'name', 'kwargs', 'stem'?, 'transforms'?}", "model")
    spec: str | None = _setting(None, "the reducer to fine-tune with, a method spec (with --init and no spec: the "
                                "checkpoint's own)", "model")
    init: str | None = _setting(None, "start from this tokenreduce checkpoint's model and weights (one trained for "
                                "the same task also starts the task's own tensors)", "model", metavar="CKPT")
    task: str = _setting("classify", "what to train for, a task spec, e.g. 'hash(bits=32)' (tokenreduce list)", "model",
                         metavar="SPEC")
    teacher: str | None = _setting(None, "distil from this frozen tokenreduce checkpoint", "model", metavar="CKPT")
    distill: tuple[str, ...] = _setting((), "what to distil: logits, tokens or logits,tokens (with a teacher and "
                                        "none given: logits)", "model")
    distill_weight: float = _setting(1.0, "weight of the distillation loss", "model")
    distill_tau: float = _setting(1.0, "softmax temperature of logit distillation", "model")
    data: str = _setting("fashion_mnist", "", "data")
    data_dir: str | None = _setting(None, "", "data")
    download: bool = _setting(False, "", "data")
    augment: str | None = _setting(None, "training augmentation, e.g. crop_flip or rrc_flip (default: the dataset's)",
                                   "data")
    subset: int | None = _setting(None, "train (and evaluate) on a fixed N-image subset", "data", metavar="N")
    eval_subset: int | None = _setting(None, "evaluate on a fixed N-image subset", "data", metavar="N")
    epochs: int = _setting(10, "training epochs", "optimisation")
    batch_size: int = _setting(128, "global, split across processes", "optimisation")
    eval_batch_size: int = _setting(500, "", "optimisation")
    optimizer: str = _setting("adamw", "adamw (betas 0.9, 0.999) or sgd (with --momentum)", "optimisation",
                              choices=tuple(OPTIMIZERS))
    lr: float = _setting(1e-3, "peak learning rate, after warm-up, before the cosine decay (a task's parameter "
                         "groups may scale it)", "optimisation")
    min_lr: float = _setting(1e-5, "the learning rate the cosine decay ends at", "optimisation")
    momentum: float = _setting(0.9, "SGD momentum", "optimisation")
    weight_decay: float = _setting(0.05, "weight decay", "optimisation")
    warmup_epochs: float = _setting(1.0, "epochs of linear learning-rate warm-up (may be a fraction)", "optimisation")
    label_smoothing: float = _setting(0.1, "label smoothing of the cross-entropy", "optimisation")
    grad_clip: float | None = _setting(1.0, "clip the gradient norm to this", "optimisation")
    amp: str | None = _setting(None, "autocast to this precision: bf16, or fp16 with a GradScaler (default: off, "
                               "float32; None in a record is off)", "optimisation", choices=AMP_CHOICES)
    out: str | None = _setting(None, "where the checkpoints go (default for a recipe: $TOKENREDUCE_CACHE/<recipe>)",
                               "run")
    resume: bool = _setting(False, "continue the run in --out with its own settings (flags that contradict them are "
                            "refused; runtime ones such as --threads, --device, --workers may change)", "run")
    force: bool = _setting(False, "start the run in --out over (the previous one is moved to --out/previous-run/ "
                           "first; a later --force to previous-run-2/, -3/, ...: none is deleted)", "run")
    allow_data_change: bool = _setting(False, "with --resume: go on although the training set changed since the run "
                                       "started (it is refused otherwise, naming the difference)", "run")
    ckpt_every: int = _setting(500, "checkpoint every N optimizer steps", "run", metavar="STEPS")
    seed: int = _setting(0, "", "run")
    deterministic: bool = _setting(False, "deterministic algorithms only", "run")
    eval_every: int = _setting(1, "evaluate every N epochs", "run", metavar="EPOCHS")
    threads: int | None = _setting(None, "", "run")
    device: str | None = _setting(None, "", "run")
    num_workers: int | None = _setting(None, "data loader worker processes (default: on CUDA up to 8, with pinned "
                                       "memory; on the CPU none, the model has the cores)", "run", flag="--workers",
                                       metavar="N")
    quiet: bool = _setting(False, "no progress output", "run")

    def __post_init__(self) -> None:
        from ..tasks import build_task  # torch: this module stays light for tokenreduce train --help

        _check_types(self)  # before the checks below compare numbers
        self.distill = tuple(self.distill)
        if self.amp == "off":  # one spelling of no autocast, as records made before --amp off have it
            self.amp = None
        checks = [
            (self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}"),
            (self.batch_size >= 1, f"batch size must be >= 1, got {self.batch_size}"),
            (0 < self.lr < math.inf, f"lr must be a finite number > 0, got {self.lr}"),
            (0 <= self.min_lr <= self.lr, f"min_lr must lie in [0, lr={self.lr}], got {self.min_lr}"),
            (self.warmup_epochs >= 0, f"warm-up epochs must be >= 0, got {self.warmup_epochs}"),
            (0 <= self.label_smoothing < 1, f"label smoothing must lie in [0, 1), got {self.label_smoothing}"),
            (self.subset is None or self.subset >= 1, f"subset must be >= 1 images, got {self.subset}"),
            (0 <= self.momentum < 1, f"momentum must lie in [0, 1), got {self.momentum}"),
            (self.threads is None or self.threads >= 1, f"--threads must be >= 1, got {self.threads}"),
            (self.num_workers is None or self.num_workers >= 0, f"--workers must be >= 0, got {self.num_workers}"),
        ]
        for ok, message in checks:
            if not ok:
                raise TokenReduceError(message)
        self.task = build_task(self.task).spec()  # canonical: equal runs compare equal
        if self.spec:  # a bad spec is refused before the run takes its output directory
            from ..core.method import build_reducer  # torch, as above

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
        choices = f.metadata.get("choices")
        if choices and value is not None and value not in choices:
            raise TokenReduceError(f"unknown {f.name} {value!r}; choose from {', '.join(choices)}")


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
