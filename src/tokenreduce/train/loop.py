"""The training loop: one loop for every model, method and task (no method- or task-specific branches).

``train(TrainConfig) -> metrics``. The task (``TrainConfig.task``, a spec string) owns the losses,
its own modules, the parameter groups and the evaluation; the loop builds the model, binds the
task to it, optimises the sum of the task's named losses over ``task.param_groups`` (AdamW or SGD
with momentum; linear warm-up and cosine decay per step, each group at its ``lr_scale``), clips
the gradient norm over every task parameter, optional bf16 autocast, DDP (over the task) under
torchrun, and reports ``task.evaluate`` at epoch ends.

Output directory (``config.out``):
    last.safetensors / last.json    resumable state, every ``ckpt_every`` steps and each epoch
    model.safetensors / model.json  the final weights and metadata (``load_model(out)`` reads it)
    metrics.json                    per-epoch history and final metrics (plus the task's figures)
    .lock                           held while a run works there: a second run into it is refused (lock.py)

Checkpoints hold the model under its own keys, the task's own tensors under ``task.<key>`` and
``meta['task']`` (the canonical task spec). Exact resume: they also hold the optimizer, scheduler,
RNG states, epoch, the batch reached in the epoch and the epoch's running sums; the sampler
replays the epoch's permutation and skips consumed batches; augmentation is seeded per sample. A
resumed run therefore ends with the same weights as an uninterrupted one (bit-identical in
deterministic mode on the same machine and thread count). A resumed run keeps the settings it was
started with: a config that contradicts them is refused, naming the settings (only the runtime
fields, ``RUNTIME_FIELDS``, may change, and the run says which did).

Ctrl-C (SIGINT, single process) stops a run after the step it is in, with a resumable checkpoint
there, and raises :class:`TrainingInterrupted`; a second Ctrl-C interrupts at once. A non-finite loss
or metric stops a run with a TokenReduceError naming it and where, before anything records it.

Test-only, inert unless set: ``TOKENREDUCE_TEST_HOLD="K:FILE"`` (see ``HOLD_ENV``) holds a
single-process run after optimizer step K, so tests can signal it at a known state instead of racing it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

from .. import models
from ..api import find_info
from ..bench.report import provenance
from ..core.errors import TokenReduceError
from ..data import DataError, OnDemand, Seeded, data_config_from_model, subset
from ..models import (
    KEEP,
    Checkpoint,
    ModelSource,
    atomic_write,
    classes_of,
    load_model,
    load_weights,
    precision,
    read_checkpoint,
    read_meta,
    resolve,
    restore_training_state,
    save_checkpoint,
    sidecar_path,
    task_weights,
    unwrap,
)
from ..tasks import Task, TaskContext, build_task, dataset_labels, get_task, list_tasks
from . import dist, lock
from .config import RESUME_KEEPS, RUNTIME_FIELDS, TrainConfig
from .optim import WarmupCosine, build_optimizer
from .progress import Progress

__all__ = ["RUNTIME_FIELDS", "TrainConfig", "TrainingInterrupted", "WarmupCosine", "fit", "make_model",
           "saved_config", "seed_all", "train"]


# ----------------------------------------------------------------------------- set-up helpers


def _autocast(device: torch.device, amp: str | None):
    """No autocast, or ``amp`` (one of the field's choices, checked by TrainConfig: 'bf16', 'fp16')."""
    return precision.autocast(device, amp)


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def set_deterministic(on: bool) -> None:
    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(on)
    torch.backends.cudnn.benchmark = False


def make_model(cfg: TrainConfig, init: Checkpoint | None = None) -> tuple[nn.Module, dict[str, Any], str | None]:
    """(model in training mode, its model config, canonical spec or None) for ``cfg``
    (``models.make_model``); ``init``: ``cfg.init`` read already."""
    if not (cfg.init or cfg.model):
        raise TokenReduceError("no model: give a recipe, model flags, or --init CKPT")
    source = ModelSource(config=cfg.model, checkpoint=init or cfg.init or None, spec=cfg.spec or KEEP)
    built = models.make_model(source)
    return built.model.train(), built.config, built.spec


def _fit_classes(model: nn.Module, model_cfg: dict[str, Any], n: int) -> dict[str, Any]:
    """Give the model an ``n``-way head if it has another; returns the updated model config."""
    if getattr(unwrap(model), "num_classes", n) != n:
        unwrap(model).reset_classifier(n)
    return _record_classes(model, model_cfg)


def _record_classes(model: nn.Module, model_cfg: dict[str, Any]) -> dict[str, Any]:
    """``model_cfg`` with the head size the model has now (a task may reset it when it binds)."""
    n = getattr(unwrap(model), "num_classes", None)
    kwargs = model_cfg.get("kwargs", {})
    if n is None or kwargs.get("num_classes") == n:
        return model_cfg
    return {**model_cfg, "kwargs": {**kwargs, "num_classes": n}}


def _check_groups(task: Task, groups: list[dict[str, Any]]) -> None:
    """Every trainable parameter of the task in exactly one group (else it would silently not learn)."""
    seen = [id(p) for g in groups for p in g["params"]]
    names = {id(p): n for n, p in task.named_parameters() if p.requires_grad}
    missing = [n for i, n in names.items() if i not in set(seen)]
    if missing or len(seen) != len(set(seen)):
        raise TokenReduceError(f"task {task.spec()}: param_groups must hold every trainable parameter once "
                               f"(missing {missing[:3]}, {len(seen) - len(set(seen))} repeated)")


def _scalars(metrics: dict[str, Any]) -> dict[str, Any]:
    """The numbers of an evaluation (what a history row records); ``n`` becomes ``n_eval``."""
    out = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if "n" in out:
        out["n_eval"] = out.pop("n")
    return out


def final_evaluation(metrics: dict[str, Any]) -> dict[str, Any]:
    """The numbers of the test evaluation that ends a run, from the final ``metrics`` train() returned
    (its last history row without the epoch's training statistics): the numbers ``tokenreduce eval`` of
    its checkpoint on the same items reports (``n`` as ``n_eval``). Empty for a run that ended without one."""
    last = (metrics.get("history") or [{}])[-1]
    return {k: v for k, v in last.items() if k not in ("epoch", "step", "time_s") and not k.startswith("train_")}


def _same_file(path: str, read: Checkpoint | None) -> str | Checkpoint:
    """``read`` when it is the checkpoint ``path`` names (a --teacher that is the --init), else ``path``."""
    return read if read is not None and resolve(path).resolve() == read.path.resolve() else path


# ----------------------------------------------------------------------------- the loop


def saved_config(out: str | os.PathLike) -> TrainConfig | None:
    """The config of the run in ``out``: its finished model's, else its last checkpoint's; None if none."""
    for name in ("model.safetensors", "last.safetensors"):
        path = Path(out) / name
        if path.is_file():
            return TrainConfig.from_dict(read_meta(path)["config"])
    return None


def _differences(saved: TrainConfig, cfg: TrainConfig) -> str:
    """The settings of ``cfg`` that contradict ``saved``, as flags: '--lr 0.5 (the run has 0.001), ...'."""
    have, want = saved.identity(), cfg.identity()
    return ", ".join(f"--{k.replace('_', '-')} {want.get(k)!r} (the run has {have[k]!r})"
                     for k in have if have[k] != want.get(k))


def _contradicted(saved: TrainConfig, cfg: TrainConfig) -> TokenReduceError:
    """The error of a --resume whose settings contradict those the run in ``cfg.out`` was started with."""
    return TokenReduceError(f"--resume continues the run in {cfg.out} with the settings it was started with, but "
                            f"this command changes them: {_differences(saved, cfg)}; drop those flags to resume, "
                            "or start a new run (--force or another --out)")


def _resolve_resume(cfg: TrainConfig) -> tuple[TrainConfig, Any, list[str]]:
    """(config to run, checkpoint to resume from or None, notes on changed runtime settings); guards an
    existing output directory."""
    if cfg.out is None:
        if cfg.resume:
            raise TokenReduceError("--resume needs --out DIR (where the checkpoints are)")
        return cfg, None, []
    out = Path(cfg.out)
    last = out / "last.safetensors"
    if cfg.resume and last.is_file():
        ckpt = read_checkpoint(last)
        _note_edited_sidecar(ckpt)
        saved = TrainConfig.from_dict(ckpt.meta["config"])
        if saved.identity() != cfg.identity():
            raise _contradicted(saved, cfg)
        given = {k: getattr(cfg, k) for k in RUNTIME_FIELDS}
        for k in RESUME_KEEPS:  # not given (None): the run's own pace (another thread count is not bit-identical)
            if given[k] is None:
                given[k] = getattr(saved, k)
        notes = [f"{k} {given[k]} (was {getattr(saved, k)})" for k in RUNTIME_FIELDS
                 if k not in ("out", "resume", "force", "allow_data_change") and given[k] != getattr(saved, k)]
        return dataclasses.replace(saved, **given), ckpt, notes
    if last.is_file() and not cfg.force:
        raise TokenReduceError(f"{out} holds an unfinished run; pass --resume to continue it or --force to start over")
    return cfg, None, []


def _note_edited_sidecar(ckpt: Checkpoint) -> None:
    """Say so when a checkpoint's JSON sidecar no longer matches it (edited by hand, or left by a killed write):
    it is a copy for people; the run reads the checkpoint's own (verified) metadata."""
    side = sidecar_path(ckpt.path)
    try:
        same = json.loads(side.read_text()).get("meta") == ckpt.meta
    except (OSError, ValueError, AttributeError):
        same = not side.exists()
    if not same:
        print(f"note: {side} does not match {ckpt.path.name} (edited by hand, or left by a killed write); it is not "
              f"read: the run continues with the settings {ckpt.path.name} holds", file=sys.stderr)


def _finished(cfg: TrainConfig) -> dict[str, Any] | None:
    """Metrics of a completed run of the same config in ``cfg.out`` (reuse), else None."""
    if cfg.out is None or cfg.force:
        return None
    final = Path(cfg.out) / "model.safetensors"
    if not final.is_file():
        return None
    meta = read_meta(final)
    saved = TrainConfig.from_dict(meta["config"])
    if saved.identity() != cfg.identity():
        if cfg.resume:
            raise _contradicted(saved, cfg)
        raise TokenReduceError(f"{cfg.out} holds a finished run of a different config ({_differences(saved, cfg)}); "
                               "choose another --out or pass --force to overwrite it")
    return {**meta.get("metrics", {}), "checkpoint": str(final), "reused": True}


#: The files of a run in its output directory that ``--force`` moves aside (with the figures metrics.json lists).
RUN_FILES = ("model.safetensors", "model.json", "last.safetensors", "last.json", "metrics.json")
#: Where ``--force`` moves the previous run (inside the output directory): ``previous-run/``, or for a later
#: ``--force`` the first of ``previous-run-2/``, ``previous-run-3/``, ... that does not exist (none is replaced).
PREVIOUS = "previous-run"


def _aside_dir(out: Path) -> Path:
    """The first free ``--force`` folder in ``out``: ``previous-run``, then ``previous-run-2``, ..."""
    n = 1
    while (out / (PREVIOUS if n == 1 else f"{PREVIOUS}-{n}")).exists():
        n += 1
    return out / (PREVIOUS if n == 1 else f"{PREVIOUS}-{n}")


def _move_aside(out: Path) -> None:
    """``--force``: move the run in ``out`` (its checkpoints, metrics and figures) to a new folder in it
    (:func:`_aside_dir`: the runs moved there by earlier ``--force`` stay) before anything of the new run is
    written, so that an interrupted forced run is the only run there and resumes with the command it printed;
    other files in ``out`` stay."""
    files = [out / n for n in RUN_FILES if (out / n).is_file()]
    if not files:
        return
    metrics = out / "metrics.json"
    try:
        figures = json.loads(metrics.read_text()).get("figures", []) if metrics.is_file() else []
    except (OSError, ValueError, AttributeError):
        figures = []
    files += [out / Path(f).name for f in figures if isinstance(f, str) and (out / Path(f).name).is_file()]
    aside = _aside_dir(out)
    aside.mkdir()
    for f in files:
        os.replace(f, aside / f.name)
    print(f"--force: moved the previous run in {out} to {aside}", file=sys.stderr)


def _clean_temporaries(out: Path) -> None:
    """Remove the temporary files (``.<name>.<random>.tmp``) a killed atomic write left in ``out``: the caller
    holds ``out``'s lock, so no writer is using them."""
    for tmp in out.glob(".*.tmp"):
        tmp.unlink(missing_ok=True)


def fingerprint(ds: Any) -> dict[str, Any]:
    """What identifies a training set: its size, its items per class and, for files (an image folder), a
    SHA-256 over their paths (relative to the folder) and sizes; for a dataset that digests its content
    (``content_digest()``: Fashion-MNIST's idx files) that digest, per file; for another dataset its type."""
    targets = getattr(ds, "targets", None)
    classes = list(getattr(ds, "classes", []) or [])
    counts: dict[str, int] = {}
    if targets is not None and classes:
        per = torch.bincount(torch.as_tensor(targets).reshape(-1).long(), minlength=len(classes)).tolist()
        counts = {c: int(n) for c, n in zip(classes, per, strict=False)}
    out: dict[str, Any] = {"n": len(ds), "per_class": counts, "kind": type(ds).__name__}
    samples, root = getattr(ds, "samples", None), getattr(ds, "root", None)
    if samples and root is not None:
        h = hashlib.sha256()
        for path, _ in samples:
            p = Path(path)
            h.update(f"{p.relative_to(root).as_posix()}|{p.stat().st_size}\n".encode())
        out["files"] = h.hexdigest()
    digest = getattr(ds, "content_digest", None)
    if callable(digest):
        out["content"] = digest()
    return out


def _check_same_data(ckpt: Checkpoint, now: dict[str, Any], cfg: TrainConfig) -> None:
    """Refuse resuming over a training set that changed since the run started (its permutation would no
    longer be the one the run was drawing from), naming the difference; ``--allow-data-change`` goes on."""
    was = ckpt.meta.get("data_fingerprint")
    if not was or all(now.get(k) == v for k, v in was.items()):
        return  # a checkpoint written before fingerprints (or before a part of them): nothing (more) to compare
    diff = []
    if was.get("n") != now.get("n"):
        diff.append(f"{was.get('n')} items then, {now.get('n')} now")
    per_was, per_now = was.get("per_class") or {}, now.get("per_class") or {}
    for c in dict.fromkeys([*per_was, *per_now]):
        if per_was.get(c) != per_now.get(c):
            diff.append(f"class {c!r}: {per_was.get(c, 0)} -> {per_now.get(c, 0)}")
    content_was, content_now = was.get("content") or {}, now.get("content") or {}
    diff += [f"{name} holds other content" for name in content_was if content_now.get(name) != content_was[name]]
    if not diff:
        diff.append("the same counts, but other files or file sizes")
    if cfg.allow_data_change:
        print(f"resuming {cfg.out} over a changed training set ({'; '.join(diff[:6])}) (--allow-data-change)",
              file=sys.stderr)
        return
    raise TokenReduceError(f"--resume: the training set of the run in {cfg.out} changed since it started "
                           f"({'; '.join(diff[:6])}{'; ...' if len(diff) > 6 else ''}); an exact resume needs the "
                           "same set: restore it, pass --allow-data-change to go on anyway, or --force to start over")


def _check_finite(values: dict[str, Any], where: str) -> None:
    """A TokenReduceError naming the non-finite numbers of ``values`` and ``where`` they came up: a
    diverged run must not end as a success with NaN in its results."""
    bad = [(k, v) for k, v in values.items() if isinstance(v, float) and not math.isfinite(v)]
    if bad:
        shown = ", ".join(f"{k} {v}" for k, v in bad)
        raise TokenReduceError(f"training diverged: {shown} {where}; lower --lr or check the data")


#: Test-only hook, inert unless set: ``K:FILE`` makes a single-process run, after optimizer step K (and any
#: checkpoint at that step), create FILE and wait there until Ctrl-C; the run then stops at step K as usual.
#: The Ctrl-C and lock tests use it to signal or kill a run at a known step instead of after a guessed delay.
HOLD_ENV = "TOKENREDUCE_TEST_HOLD"


def _hold_here(stop: _StopRequest) -> None:
    """The ``HOLD_ENV`` hook's wait: announce the hold, then wait for Ctrl-C (SIGINT sets ``stop.requested``)."""
    Path(os.environ[HOLD_ENV].split(":", 1)[1]).touch()
    while not stop.requested:
        time.sleep(0.01)


def _hold_step(stop: _StopRequest) -> int | None:
    """The step ``HOLD_ENV`` holds at; None when unset, or when Ctrl-C cannot stop the run (the wait would hang)."""
    hold = os.environ.get(HOLD_ENV)
    return int(hold.split(":", 1)[0]) if hold and stop.previous is not None else None


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a run after optimizer step ``step``; ``checkpoint`` resumes it (None: not saved)."""

    def __init__(self, step: int, checkpoint: Path | None) -> None:
        super().__init__(f"interrupted after step {step}")
        self.step, self.checkpoint = step, checkpoint


class _StopRequest:
    """While active, the first SIGINT only sets ``requested`` (the loop stops at the next step
    boundary, where its state is whole) and puts the previous handler back, so a second Ctrl-C
    interrupts at once. Inactive off the main thread, under another SIGINT handler, or when ``on``
    is False (several processes: they would stop at different steps)."""

    def __init__(self, on: bool) -> None:
        self.on, self.requested, self.previous = on, False, None

    def __enter__(self) -> _StopRequest:
        if (self.on and threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            self.previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, self.previous)

    def __exit__(self, *exc: Any) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def train(config: TrainConfig, *, on_step: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Run (or resume, or reuse) a training run; returns its final metrics.

    ``on_step(step)`` is called after every optimizer step (and any checkpoint at that step);
    tests use it to interrupt a run.
    """
    return fit(config, on_step=on_step)[1]


def fit(config: TrainConfig, *, on_step: Callable[[int], None] | None = None) -> tuple[nn.Module, dict[str, Any]]:
    """Like :func:`train`, also returning the trained model (unwrapped, eval mode, on its device)."""
    main = int(os.environ.get("RANK", "0")) == 0  # the main process locks for all of a torchrun group
    with lock.hold(config.out) if config.out is not None and main else nullcontext():
        if config.out is not None and main:
            _clean_temporaries(Path(config.out))
            if config.force:
                _move_aside(Path(config.out))
        cached = _finished(config)
        if cached is not None:
            return load_model(cached["checkpoint"])[0], cached
        owns_group = not torch.distributed.is_initialized()
        info = dist.setup(config.device)
        try:
            return _Run(config, info).run(on_step)
        finally:
            if owns_group:
                dist.teardown()


class _Run:
    """One training session (fresh or resumed) in one process."""

    def __init__(self, config: TrainConfig, info: dist.DistInfo) -> None:
        cfg, ckpt, self.notes = _resolve_resume(config)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.cfg, self.info, self.device = cfg, info, info.device
        if self.device.type == "cuda":
            precision.enable_tf32()
        #: fp16 autocast scales the loss (a no-op otherwise); its scale and growth tracker are checkpointed
        self.scaler = precision.grad_scaler(self.device, cfg.amp)
        set_deterministic(cfg.deterministic)
        seed_all(cfg.seed)  # same on every rank: identical init and RNG streams across processes
        # --init is read once and handed to everyone who needs it (the model, the class list, the task's
        # tensors, a --teacher of the same file)
        init = read_checkpoint(cfg.init) if cfg.init else None
        model, model_cfg, self.spec = make_model(cfg, init)
        starts = init if ckpt is None else None  # a resumed run starts from its own checkpoint
        self.task = build_task(cfg.task)
        self.data_cfg = data_config_from_model(model)
        kw = dict(data_dir=cfg.data_dir, download=cfg.download, **self.data_cfg)
        if cfg.download and info.distributed and not info.main:
            dist.barrier()  # let rank 0 download first
        train_ds = self._train_split(cfg, ckpt, starts, kw)
        self.classes = list(train_ds.classes)
        self.data_fingerprint = fingerprint(train_ds)
        if ckpt is not None:
            _check_same_data(ckpt, self.data_fingerprint, cfg)
        eval_ds = self.task.dataset(cfg.data, "test", train=False, classes=self.classes, **kw)
        if cfg.download and info.distributed and info.main:
            dist.barrier()
        model_cfg = _fit_classes(model, model_cfg, len(self.classes))
        self.train_ds = Seeded(subset(train_ds, cfg.subset))
        self.eval_ds = subset(eval_ds, cfg.eval_subset if cfg.eval_subset is not None else cfg.subset)
        # the database a task may rank against (retrieval): the whole training split, unaugmented
        self.database = OnDemand(lambda: self.task.dataset(cfg.data, "train", train=False, classes=self.classes,
                                                           **kw))
        self.model = model.to(self.device)
        teacher = load_model(_same_file(cfg.teacher, init), self.device)[0] if cfg.teacher else None
        # train_labels index the dataset the task returned (a task may key per-item targets by it)
        ctx = TaskContext(classes=self.classes, teacher=teacher, label_smoothing=cfg.label_smoothing,
                          distill=tuple(cfg.distill), distill_weight=cfg.distill_weight, distill_tau=cfg.distill_tau,
                          train_labels=dataset_labels(train_ds), seed=cfg.seed)
        self.task.bind(model, ctx)
        self.task.to(self.device)
        self.model_cfg = _record_classes(model, model_cfg)
        if starts is not None:
            self._init_task(starts)
        groups = self.task.param_groups(cfg.lr, cfg.weight_decay)
        _check_groups(self.task, groups)
        self.opt = build_optimizer(cfg.optimizer, groups, cfg.lr, cfg.momentum)
        self.sampler = dist.TrainBatchSampler(len(self.train_ds), cfg.batch_size, seed=cfg.seed, rank=info.rank,
                                              world=info.world)
        self.spe = self.sampler.batches_per_epoch
        total = cfg.epochs * self.spe
        warmup = min(total, max(1, round(cfg.warmup_epochs * self.spe)))
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, WarmupCosine(warmup, total, cfg.min_lr / cfg.lr))
        self.epoch = self.batch = self.step = 0
        #: this epoch's sums, weighted by images: 'n', 'loss', 'loss/<name>', 'stat/<name>'
        self.sums: dict[str, float | Tensor] = {}
        self.watch = dist.FiniteWatch(self.device)
        self._train_loader: DataLoader | None = None
        self.history: list[dict[str, Any]] = []
        self.last_eval: dict[str, Any] = {}
        self.elapsed = 0.0
        if ckpt is not None:
            self._restore(ckpt)
        self.ddp: nn.Module = self.task
        if info.distributed:
            self.ddp = dist.wrap_ddp(self.task, self.device)

    def _train_split(self, cfg: TrainConfig, ckpt, init: Checkpoint | None, kw: dict[str, Any]):
        """The training split, its labels indexing the run's ONE class list (recorded in every
        checkpoint, by which every other split and evaluation is mapped): a resumed run's (its
        checkpoint's; a class folder added since is refused, named), else the ``--init`` model's when
        they hold every class of the split (its head keeps its meaning), else the split's own."""
        known = classes_of(ckpt.meta) if ckpt is not None else None
        train_ds = self.task.dataset(cfg.data, "train", train=True, augment=cfg.augment, classes=known, **kw)
        start = classes_of(init.meta) if init is not None else None
        if start and start != list(train_ds.classes) and set(train_ds.classes) <= set(start):
            train_ds = self.task.dataset(cfg.data, "train", train=True, augment=cfg.augment, classes=start, **kw)
        return train_ds

    def _init_task(self, ckpt: Checkpoint) -> None:
        """--init from a run of the same task also starts the task's own tensors from it."""
        owned = task_weights(ckpt)
        if owned and ckpt.meta.get("task") == self.task.spec():
            self.task.load_owned_state_dict(owned)

    def _restore(self, ckpt) -> None:
        load_weights(self.model, ckpt)
        self.task.load_owned_state_dict(task_weights(ckpt))
        extra = restore_training_state(ckpt, self.opt, self.sched)
        self.epoch, self.batch, self.step = extra["epoch"], extra["batch"], extra["step"]
        self.history, self.elapsed = extra["history"], extra["elapsed"]
        self.last_eval = extra.get("last_eval", {})
        if extra.get("scaler"):
            self.scaler.load_state_dict(extra["scaler"])
        sums = extra["sums"]
        # the saved sums are over all processes already: the main process carries them on
        self.sums = {k: (v if self.info.main else 0.0) for k, v in sums.items()}

    # -- checkpoints

    def _meta(self, metrics: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"model": self.model_cfg, "spec": self.spec, "task": self.task.spec(), "epoch": self.epoch,
                "step": self.step, "config": self.cfg.to_dict(), "data": {"name": self.cfg.data, **self.data_cfg},
                "classes": self.classes, "data_fingerprint": self.data_fingerprint,
                "metrics": metrics or (self.history[-1] if self.history else {})}

    def _global_sums(self) -> dict[str, float]:
        """The epoch's sums over every process (a collective), after the finite check of the losses so
        far: every checkpoint and epoch line goes through here, so none records a diverged step."""
        self._check_losses()
        names = sorted(self.sums)  # the same names on every process: each step adds the same ones
        packed = dist.counters(len(names), self.device)
        for i, k in enumerate(names):
            packed[i] += self.sums[k]
        return dict(zip(names, dist.all_reduce_sum(packed).tolist(), strict=True))

    def _save(self, name: str, meta: dict[str, Any], extra: dict[str, Any] | None = None) -> None:
        """Model, the task's own tensors and, with ``extra`` (resumable), optimizer/scheduler/RNG."""
        training = dict(optimizer=self.opt, scheduler=self.sched, extra=extra) if extra is not None else {}
        save_checkpoint(Path(self.cfg.out) / name, self.model, meta=meta, task_state=self.task.owned_state_dict(),
                        **training)

    def save_last(self) -> None:
        sums = self._global_sums()  # a collective: every rank gets here
        if self.cfg.out is None or not self.info.main:
            return
        extra = {"epoch": self.epoch, "batch": self.batch, "step": self.step, "sums": sums, "history": self.history,
                 "last_eval": self.last_eval, "elapsed": self.elapsed + time.perf_counter() - self.t0,
                 "scaler": self.scaler.state_dict()}
        self._save("last.safetensors", self._meta(), extra)

    # -- training

    def run(self, on_step: Callable[[int], None] | None) -> tuple[nn.Module, dict[str, Any]]:
        cfg, info = self.cfg, self.info
        self.t0 = time.perf_counter()
        bar = Progress(cfg.epochs * self.spe, self.step, info.main, cfg.quiet)
        if self.step:
            changed = f" with {', '.join(self.notes)}" if self.notes else ""
            bar.write(f"resuming {cfg.out} at epoch {self.epoch + 1}, step {self.step}{changed}")
        try:
            with _StopRequest(not info.distributed) as self.stop:
                self.hold_at = _hold_step(self.stop)
                while self.epoch < cfg.epochs:
                    self._train_epoch(bar, on_step)
                    self._end_epoch(bar)
                    if self.stop.requested and self.epoch < cfg.epochs:
                        self._interrupt(saved=True)
        except DataError as e:  # an unreadable file is met when the sampler reaches it, maybe hours in
            where = f"; after fixing or removing the file, --resume --allow-data-change goes on from the run's last " \
                    f"checkpoint in {cfg.out} (the set changed), --force starts over" if cfg.out else ""
            raise DataError(f"{e} (at step {self.step}){where}") from None
        finally:
            bar.close()
        return self._finish()

    def _interrupt(self, saved: bool) -> None:
        """Stop on Ctrl-C with a resumable checkpoint at this step (``saved``: the last one is here already)."""
        if not saved:
            self.save_last()
        last = Path(self.cfg.out) / "last.safetensors" if self.cfg.out else None
        raise TrainingInterrupted(self.step, last)

    def _refuse_unscored_aux(self) -> None:
        """A learned reducer that trains through auxiliary predictions (Token Cropr's heads) under a
        task that does not score them would train nothing but the backbone: say so instead."""
        info = find_info(self.task.model)
        if info is not None and info.aux_outputs:
            scoring = sorted(name for name in list_tasks() if get_task(name).scores_aux_outputs)
            raise TokenReduceError(
                f"task {self.task.name!r} does not score the auxiliary predictions of {info.spec!r} "
                f"({', '.join(sorted(info.aux_outputs))}): its routers would get no gradient; train it with a task "
                f"that does ({', '.join(scoring)}) and apply the trained reducer afterwards"
            )

    def _add(self, key: str, value: float | Tensor) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + value

    def _loader(self) -> DataLoader:
        """The training loader, built once (its workers persist across epochs on CUDA); each epoch
        re-seeds its sampler (``set_epoch``) before iterating it."""
        if self._train_loader is None:
            self._train_loader = DataLoader(
                self.train_ds, batch_sampler=self.sampler, **dist.loader_options(self.device, self.cfg.num_workers),
                generator=torch.Generator().manual_seed(self.cfg.seed))  # keeps the global RNG untouched
        return self._train_loader

    def _check_losses(self) -> None:
        """Raise on the first non-finite loss any process saw (:class:`dist.FiniteWatch`, a collective)."""
        seen = self.watch.first()
        if seen is None:
            return
        step, losses = seen
        where = f"at step {step} (epoch {(step - 1) // self.spe + 1})"
        if losses is None:
            raise TokenReduceError(f"training diverged: a non-finite loss on another process {where}; lower "
                                   "--lr or check the data")
        _check_finite({f"{k} loss": v for k, v in losses.items()}, where)

    def _postfix(self) -> dict[str, str]:
        """The running means the progress line shows (read from the device: only when it is shown)."""
        sums = {k: float(v) for k, v in self.sums.items()}
        running = {k[5:]: f"{v / sums['n']:.2f}" for k, v in sums.items() if k.startswith("stat/")}
        return {"epoch": f"{self.epoch + 1}/{self.cfg.epochs}", "loss": f"{sums['loss'] / sums['n']:.4f}", **running,
                "lr": f"{max(self.sched.get_last_lr()):.2e}"}

    def _train_epoch(self, bar: Progress, on_step: Callable[[int], None] | None) -> None:
        """One epoch's steps. Nothing here waits for the device: the sums, and the finite check of the
        losses, stay on it until the progress line, a checkpoint or the epoch's end reads them (fp16's
        GradScaler alone reads its inf check every step, as torch's GradScaler does)."""
        cfg = self.cfg
        self.sampler.set_epoch(self.epoch, skip=self.batch)
        self._first_batch = self.batch
        self.ddp.train()
        for images, targets in self._loader():
            images = images.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            with _autocast(self.device, cfg.amp):
                out = self.ddp(images, targets)
            if self.batch == self._first_batch and not self.task.scores_aux_outputs:
                self._refuse_unscored_aux()
            loss = sum(out.losses.values())
            self.step += 1
            self.batch += 1
            self.watch.observe(self.step, out.losses, loss)
            self.opt.zero_grad(set_to_none=True)
            self.scaler.scale(loss).backward()
            if cfg.grad_clip:
                self.scaler.unscale_(self.opt)
                nn.utils.clip_grad_norm_(self.task.parameters(), cfg.grad_clip)
            self.scaler.step(self.opt)
            self.scaler.update()
            self.sched.step()
            n = len(images)
            self._add("n", n)
            self._add("loss", loss.detach().double() * n)
            for k, v in out.losses.items():
                self._add(f"loss/{k}", v.detach().double() * n)
            for k, v in (out.stats or {}).items():
                self._add(f"stat/{k}", (v.detach().double() if torch.is_tensor(v) else float(v)) * n)
            if bar.due():
                self._check_losses()
            bar.step(self._postfix)
            if cfg.ckpt_every and self.step % cfg.ckpt_every == 0 and self.batch < self.spe:
                self.save_last()
            if on_step is not None:
                on_step(self.step)
            if self.step == self.hold_at:
                _hold_here(self.stop)
            if self.stop.requested:
                self._interrupt(saved=False)

    def _evaluate(self, items: bool = False) -> dict[str, Any]:
        """The task's evaluation on the test items; with ``items`` (the run's last) their per-item values
        too, which the run's record keeps (tasks/items.py)."""
        with _autocast(self.device, self.cfg.amp):
            return self.task.evaluate(self.model, self.eval_ds, batch_size=self.cfg.eval_batch_size,
                                      device=self.device, database=self.database, items=items)

    def _end_epoch(self, bar: Progress) -> None:
        cfg = self.cfg
        sums = self._global_sums()
        n = sums.pop("n")
        losses = {k[5:]: v / n for k, v in sums.items() if k.startswith("loss/")}
        row: dict[str, Any] = {"epoch": self.epoch + 1, "step": self.step, "train_loss": sums["loss"] / n,
                               **{f"train_{k[5:]}": v / n for k, v in sums.items() if k.startswith("stat/")},
                               **{f"train_{k}": v for k, v in losses.items() if len(losses) > 1}}
        _check_finite(row, f"(the mean over epoch {row['epoch']})")
        last = self.epoch + 1 == cfg.epochs
        if last or (cfg.eval_every and (self.epoch + 1) % cfg.eval_every == 0):
            self.last_eval = self._evaluate(items=last)
            test = _scalars(self.last_eval)
            _check_finite({f"test {k}": v for k, v in test.items()}, f"in the evaluation after epoch {row['epoch']} "
                          f"(step {self.step})")
            row.update(test)
        row["time_s"] = round(self.elapsed + time.perf_counter() - self.t0, 1)
        self.history.append(row)
        shown = ["train_loss", *(f"train_{k[5:]}" for k in sums if k.startswith("stat/"))]
        train = " ".join(f"{k[6:]} {row[k]:.4g}" for k in shown)
        shown_eval = dict.fromkeys((self.task.metric, "loss"))  # the rest is in the history
        test = " ".join(f"{k} {row[k]:.4g}" for k in shown_eval if k in row and k in self.last_eval)
        bar.write(f"epoch {row['epoch']}/{cfg.epochs} train {train}" + (f" | test {test}" if test else "")
                  + f" | {row['time_s']:.0f}s")
        self.epoch += 1
        self.batch = 0
        self.sums = {k: 0.0 for k in self.sums}
        self.save_last()

    def _finish(self) -> tuple[nn.Module, dict[str, Any]]:
        final = {k: v for k, v in (self.history[-1] if self.history else {}).items()
                 if k not in ("epoch", "step", "time_s")}
        metrics = {**{k: v for k, v in self.last_eval.items() if k != "n"}, **final,
                   "epochs": self.cfg.epochs, "steps": self.step, "train_time_s": (self.history or [{}])[-1].get(
                       "time_s"), "task": self.task.spec(), "metric": self.task.metric, "spec": self.spec,
                   "seed": self.cfg.seed, "batch_size": self.cfg.batch_size, "world_size": self.info.world,
                   "dtype": self.cfg.amp or "float32", "history": self.history,
                   "provenance": provenance(threads=torch.get_num_threads(), dtype=self.cfg.amp or "float32",
                                            device=str(self.device), batch_sizes=[self.cfg.batch_size],
                                            seed=self.cfg.seed, world_size=self.info.world)}
        if self.cfg.out and self.info.main:
            out = Path(self.cfg.out)
            figures = self.task.plot(self.last_eval, out)
            if figures:
                metrics["figures"] = [str(p) for p in figures]
            self._save("model.safetensors", {**self._meta(metrics), "complete": True})
            metrics["checkpoint"] = str(out / "model.safetensors")
            # the numbers are finite (_check_finite); a NaN here would be a bug, not a result to write down
            atomic_write(out / "metrics.json", (json.dumps(metrics, indent=2, allow_nan=False) + "\n").encode())
        return self.model.eval(), metrics
