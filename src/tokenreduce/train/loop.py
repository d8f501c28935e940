"""The training loop: one loop for every model and method (no method-specific branches).

``train(TrainConfig) -> metrics``. AdamW with linear warm-up and cosine decay per step, the
task's named losses summed, gradient clipping, optional bf16 autocast, DDP under torchrun.

Output directory (``config.out``):
    last.safetensors / last.json    resumable state, every ``ckpt_every`` steps and each epoch
    model.safetensors / model.json  the final weights and metadata (``load_model(out)`` reads it)
    metrics.json                    per-epoch history and final metrics

Exact resume: the checkpoint holds the model, optimizer, scheduler, RNG states, epoch, the
batch reached in the epoch and the epoch's running sums; the sampler replays the epoch's
permutation and skips consumed batches; augmentation is seeded per sample. A resumed run
therefore ends with the same weights as an uninterrupted one (bit-identical in deterministic mode
on the same machine and thread count).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import random
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ..core.errors import TokenReduceError
from . import dist
from .checkpoint import (
    build_model,
    load_model,
    load_weights,
    read_checkpoint,
    read_meta,
    restore_training_state,
    save_checkpoint,
    unwrap,
)
from .tasks import ClassificationTask

#: Fields that say how to run, not what to train: they may change when a run is resumed.
RUNTIME_FIELDS = ("out", "resume", "force", "threads", "device", "num_workers", "quiet", "ckpt_every", "download")


@dataclass
class TrainConfig:
    """Everything a training run depends on. ``batch_size`` is global (split across processes).

    Model: ``model = {'name': timm name, 'kwargs': {...}}`` built from scratch, or ``init`` (a
    checkpoint whose model and weights start the run); ``spec`` applies a reducer (fine-tuning a
    reduced model; with ``init`` and no spec, the checkpoint's own spec is kept).
    """

    model: dict[str, Any] | None = None
    spec: str | None = None
    init: str | None = None
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
    lr: float = 1e-3
    min_lr: float = 1e-5
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
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        checks = [
            (self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}"),
            (self.batch_size >= 1, f"batch size must be >= 1, got {self.batch_size}"),
            (self.lr > 0, f"lr must be > 0, got {self.lr}"),
            (0 <= self.min_lr <= self.lr, f"min_lr must lie in [0, lr={self.lr}], got {self.min_lr}"),
            (self.warmup_epochs >= 0, f"warm-up epochs must be >= 0, got {self.warmup_epochs}"),
            (0 <= self.label_smoothing < 1, f"label smoothing must lie in [0, 1), got {self.label_smoothing}"),
            (self.subset is None or self.subset >= 1, f"subset must be >= 1 images, got {self.subset}"),
        ]
        for ok, message in checks:
            if not ok:
                raise TokenReduceError(message)

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise TokenReduceError(f"unknown training settings {unknown}")
        d = dict(d)
        if "distill" in d:
            d["distill"] = tuple(d["distill"] or ())
        return cls(**d)

    def identity(self) -> dict[str, Any]:
        """The settings that define the result (runtime fields removed)."""
        d = self.to_dict()
        for k in RUNTIME_FIELDS:
            d.pop(k, None)
        return d


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


# ----------------------------------------------------------------------------- evaluation


def eval_loader(dataset: Dataset, batch_size: int = 500, num_workers: int = 0) -> DataLoader:
    """A loader over this process's shard of ``dataset`` (all of it in one process)."""
    sampler = dist.ShardSampler(len(dataset), batch_size, rank=_rank(), world=dist.world_size())
    return DataLoader(dataset, batch_sampler=sampler, num_workers=num_workers)


def _rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


@torch.inference_mode()
def evaluate(model: nn.Module, loader: DataLoader, device: str | torch.device = "cpu",
             amp: str | None = None) -> dict[str, float]:
    """Top-1 accuracy (percent) and mean cross-entropy of ``model`` over ``loader``.

    In a torchrun process group the correct / loss / image counts are summed over processes, so
    ``loader`` must give each process its own shard (build it with :func:`eval_loader`); the
    result then equals a single-process evaluation. Returns ``{'top1', 'loss', 'n'}``.
    """
    if torch.distributed.is_initialized() and not isinstance(loader.batch_sampler, dist.ShardSampler):
        raise TokenReduceError("in a distributed run, evaluate() needs a sharded loader; build it with eval_loader()")
    model = unwrap(model)
    was_training = model.training
    model.eval()
    device = torch.device(device)
    sums = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, images
    try:
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            with _autocast(device, amp):
                logits = model(images)
            sums[0] += F.cross_entropy(logits.float(), labels, reduction="sum").item()
            sums[1] += (logits.argmax(-1) == labels).sum().item()
            sums[2] += labels.numel()
    finally:
        model.train(was_training)
    loss, correct, n = dist.all_reduce_sum(sums).tolist()
    if n == 0:
        raise TokenReduceError("evaluation set is empty")
    return {"top1": 100.0 * correct / n, "loss": loss / n, "n": int(n)}


# ----------------------------------------------------------------------------- set-up helpers


def _autocast(device: torch.device, amp: str | None):
    if amp in (None, "none", "fp32"):
        return nullcontext()
    if amp != "bf16":
        raise TokenReduceError(f"amp must be 'bf16' or None, got {amp!r}")
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def set_deterministic(on: bool) -> None:
    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(on)
    torch.backends.cudnn.benchmark = False


def _canonical(spec: str) -> str:
    from ..core.method import build_reducer

    return build_reducer(spec).spec()


def make_model(cfg: TrainConfig) -> tuple[nn.Module, dict[str, Any], str | None]:
    """(model, its {'name', 'kwargs'} config, canonical spec or None) for ``cfg``."""
    from ..api import apply, get_info, remove

    if cfg.init:
        model, meta = load_model(cfg.init)
        model_cfg = meta["model"]
        if cfg.model and cfg.model != model_cfg:
            raise TokenReduceError(f"--init {cfg.init} holds model {model_cfg}, which differs from the model "
                                   f"requested {cfg.model}; drop one of them")
        current = meta.get("spec")
    elif cfg.model:
        model, model_cfg, current = build_model(cfg.model), cfg.model, None
    else:
        raise TokenReduceError("no model: give a recipe, model flags, or --init CKPT")
    if cfg.spec and (current is None or _canonical(cfg.spec) != _canonical(current)):
        if current is not None:
            remove(model)
        apply(model, cfg.spec)
    spec = get_info(model).spec if (cfg.spec or current) else None
    return model.train(), json.loads(json.dumps(model_cfg)), spec


def _fit_classes(model: nn.Module, model_cfg: dict[str, Any], n: int) -> dict[str, Any]:
    """Give the model an ``n``-way head if it has another; returns the updated model config."""
    if getattr(unwrap(model), "num_classes", n) != n:
        unwrap(model).reset_classifier(n)
        model_cfg = {**model_cfg, "kwargs": {**model_cfg.get("kwargs", {}), "num_classes": n}}
    return model_cfg


def run_info() -> dict[str, Any]:
    """Versions and machine, for results files."""
    import subprocess

    import timm

    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        rev = None
    return {"git": rev, "torch": torch.__version__, "timm": timm.__version__, "python": platform.python_version(),
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(), "cpu_count": os.cpu_count(),
            "threads": torch.get_num_threads()}


# ----------------------------------------------------------------------------- the loop


class _Progress:
    """tqdm bar on rank 0 when stderr is a terminal; otherwise (a log file) a line with loss,
    accuracy and ETA every ``every`` steps plus the epoch lines; nothing when quiet."""

    def __init__(self, total: int, initial: int, enabled: bool, quiet: bool, every: int = 50) -> None:
        from tqdm import tqdm

        self.quiet = quiet or not enabled
        self.bar = None
        self.total, self.done, self.every = total, initial, every
        self.start, self.start_step = time.monotonic(), initial
        if enabled and not quiet and sys.stderr.isatty():
            self.bar = tqdm(total=total, initial=initial, dynamic_ncols=True, unit="step", leave=True)

    def step(self, **post: Any) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(post, refresh=False)
        elif not self.quiet and self.done % self.every == 0:
            rate = (time.monotonic() - self.start) / max(1, self.done - self.start_step)
            eta = rate * (self.total - self.done)
            stats = " ".join(f"{k} {v}" for k, v in post.items())
            self.write(f"step {self.done}/{self.total} {stats} | {rate:.2f} s/step, ETA {eta / 60:.1f} min")

    def write(self, line: str) -> None:
        if self.quiet:
            return
        if self.bar is not None:
            self.bar.write(line)
        else:
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _resolve_resume(cfg: TrainConfig) -> tuple[TrainConfig, Any]:
    """(config to run, checkpoint to resume from or None); guards an existing output directory."""
    if cfg.out is None:
        if cfg.resume:
            raise TokenReduceError("--resume needs --out DIR (where the checkpoints are)")
        return cfg, None
    out = Path(cfg.out)
    last = out / "last.safetensors"
    if cfg.resume and last.is_file():
        ckpt = read_checkpoint(last)
        saved = TrainConfig.from_dict(ckpt.meta["config"])
        runtime = {k: getattr(cfg, k) for k in RUNTIME_FIELDS}
        return dataclasses.replace(saved, **runtime), ckpt
    if last.is_file() and not cfg.force:
        raise TokenReduceError(f"{out} holds an unfinished run; pass --resume to continue it or --force to start over")
    return cfg, None


def _finished(cfg: TrainConfig) -> dict[str, Any] | None:
    """Metrics of a completed run of the same config in ``cfg.out`` (reuse), else None."""
    if cfg.out is None or cfg.force:
        return None
    final = Path(cfg.out) / "model.safetensors"
    if not final.is_file():
        return None
    meta = read_meta(final)
    if TrainConfig.from_dict(meta["config"]).identity() != cfg.identity() and not cfg.resume:
        raise TokenReduceError(f"{cfg.out} holds a finished run of a different config; choose another --out "
                               "or pass --force to overwrite it")
    return {**meta.get("metrics", {}), "checkpoint": str(final), "reused": True}


def train(config: TrainConfig, *, on_step: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Run (or resume, or reuse) a training run; returns its final metrics.

    ``on_step(step)`` is called after every optimizer step (and any checkpoint at that step);
    tests use it to interrupt a run.
    """
    return fit(config, on_step=on_step)[1]


def fit(config: TrainConfig, *, on_step: Callable[[int], None] | None = None) -> tuple[nn.Module, dict[str, Any]]:
    """Like :func:`train`, also returning the trained model (unwrapped, eval mode, on its device)."""
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
        from ..data import Seeded, build_dataset, data_config_from_model, subset

        if config.threads:
            torch.set_num_threads(config.threads)
        cfg, ckpt = _resolve_resume(config)
        self.cfg, self.info, self.device = cfg, info, info.device
        set_deterministic(cfg.deterministic)
        seed_all(cfg.seed)  # same on every rank: identical init and RNG streams across processes
        model, model_cfg, self.spec = make_model(cfg)
        self.data_cfg = data_config_from_model(model)
        kw = dict(data_dir=cfg.data_dir, download=cfg.download, **self.data_cfg)
        if cfg.download and info.distributed and not info.main:
            dist.barrier()  # let rank 0 download first
        train_ds = build_dataset(cfg.data, "train", train=True, augment=cfg.augment, **kw)
        eval_ds = build_dataset(cfg.data, "test", train=False, **kw)
        if cfg.download and info.distributed and info.main:
            dist.barrier()
        self.classes = list(train_ds.classes)
        self.model_cfg = _fit_classes(model, model_cfg, len(self.classes))
        self.train_ds = Seeded(subset(train_ds, cfg.subset))
        self.eval_ds = subset(eval_ds, cfg.eval_subset if cfg.eval_subset is not None else cfg.subset)
        self.model = model.to(self.device)
        teacher = load_model(cfg.teacher, self.device)[0] if cfg.teacher else None
        self.task = ClassificationTask(model, label_smoothing=cfg.label_smoothing, teacher=teacher,
                                       distill=cfg.distill, distill_weight=cfg.distill_weight,
                                       tau=cfg.distill_tau).to(self.device)
        from timm.optim import param_groups_weight_decay

        skip = model.no_weight_decay() if hasattr(model, "no_weight_decay") else ()
        groups = param_groups_weight_decay(model, cfg.weight_decay, no_weight_decay_list=skip)
        self.opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.999))
        self.sampler = dist.TrainBatchSampler(len(self.train_ds), cfg.batch_size, seed=cfg.seed, rank=info.rank,
                                              world=info.world)
        self.spe = self.sampler.batches_per_epoch
        total = cfg.epochs * self.spe
        warmup = min(total, max(1, round(cfg.warmup_epochs * self.spe)))
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, WarmupCosine(warmup, total, cfg.min_lr / cfg.lr))
        self.epoch = self.batch = self.step = 0
        self.sums = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, images (this epoch)
        self.loss_sums: dict[str, float] = {}
        self.history: list[dict[str, Any]] = []
        self.elapsed = 0.0
        if ckpt is not None:
            self._restore(ckpt)
        self.ddp: nn.Module = self.task
        if info.distributed:
            ids = [self.device] if self.device.type == "cuda" else None
            self.ddp = nn.parallel.DistributedDataParallel(self.task, device_ids=ids)

    def _restore(self, ckpt) -> None:
        load_weights(self.model, ckpt)
        extra = restore_training_state(ckpt, self.opt, self.sched)
        self.epoch, self.batch, self.step = extra["epoch"], extra["batch"], extra["step"]
        self.history, self.elapsed = extra["history"], extra["elapsed"]
        if self.info.main:  # the saved sums are over all processes already
            self.sums = extra["sums"].clone()
            self.loss_sums = dict(extra["loss_sums"])
        else:
            self.loss_sums = {k: 0.0 for k in extra["loss_sums"]}

    # -- checkpoints

    def _meta(self, metrics: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"model": self.model_cfg, "spec": self.spec, "epoch": self.epoch, "step": self.step,
                "config": self.cfg.to_dict(), "data": {"name": self.cfg.data, **self.data_cfg},
                "classes": self.classes, "metrics": metrics or (self.history[-1] if self.history else {})}

    def _global_sums(self) -> tuple[torch.Tensor, dict[str, float]]:
        names = sorted(self.loss_sums)
        packed = dist.all_reduce_sum(torch.cat([self.sums, torch.tensor([self.loss_sums[k] for k in names],
                                                                        dtype=torch.float64)]))
        return packed[:3], dict(zip(names, packed[3:].tolist(), strict=True))

    def save_last(self) -> None:
        sums, loss_sums = self._global_sums()  # a collective: every rank gets here
        if self.cfg.out is None or not self.info.main:
            return
        extra = {"epoch": self.epoch, "batch": self.batch, "step": self.step, "sums": sums, "loss_sums": loss_sums,
                 "history": self.history, "elapsed": self.elapsed + time.perf_counter() - self.t0}
        save_checkpoint(Path(self.cfg.out) / "last.safetensors", self.model, meta=self._meta(), optimizer=self.opt,
                        scheduler=self.sched, extra=extra)

    # -- training

    def run(self, on_step: Callable[[int], None] | None) -> tuple[nn.Module, dict[str, Any]]:
        cfg, info = self.cfg, self.info
        self.t0 = time.perf_counter()
        bar = _Progress(cfg.epochs * self.spe, self.step, info.main, cfg.quiet)
        if self.step:
            bar.write(f"resuming {cfg.out} at epoch {self.epoch + 1}, step {self.step}")
        eval_dl = eval_loader(self.eval_ds, cfg.eval_batch_size, cfg.num_workers)
        try:
            while self.epoch < cfg.epochs:
                self._train_epoch(bar, on_step)
                self._end_epoch(bar, eval_dl)
        finally:
            bar.close()
        return self._finish()

    def _train_epoch(self, bar: _Progress, on_step: Callable[[int], None] | None) -> None:
        cfg = self.cfg
        self.sampler.set_epoch(self.epoch, skip=self.batch)
        loader = DataLoader(self.train_ds, batch_sampler=self.sampler, num_workers=cfg.num_workers,
                            generator=torch.Generator().manual_seed(cfg.seed))  # keeps the global RNG untouched
        self.ddp.train()
        for images, labels in loader:
            images, labels = images.to(self.device), labels.to(self.device)
            with _autocast(self.device, cfg.amp):
                out = self.ddp(images, labels)
            loss = sum(out.losses.values())
            if not torch.isfinite(loss):
                raise TokenReduceError(f"loss is {loss.item()} at step {self.step}; lower --lr or check the data")
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip:
                nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
            self.opt.step()
            self.sched.step()
            self.step += 1
            self.batch += 1
            n = labels.numel()
            self.sums += torch.tensor([loss.item() * n, (out.logits.argmax(-1) == labels).sum().item(), n],
                                      dtype=torch.float64)
            for k, v in out.losses.items():
                self.loss_sums[k] = self.loss_sums.get(k, 0.0) + v.item() * n
            bar.step(epoch=f"{self.epoch + 1}/{cfg.epochs}", loss=f"{self.sums[0] / self.sums[2]:.4f}",
                     acc=f"{100 * self.sums[1] / self.sums[2]:.2f}", lr=f"{self.sched.get_last_lr()[0]:.2e}")
            if cfg.ckpt_every and self.step % cfg.ckpt_every == 0 and self.batch < self.spe:
                self.save_last()
            if on_step is not None:
                on_step(self.step)

    def _end_epoch(self, bar: _Progress, eval_dl: DataLoader) -> None:
        cfg = self.cfg
        sums, loss_sums = self._global_sums()
        loss, correct, n = sums.tolist()
        row: dict[str, Any] = {"epoch": self.epoch + 1, "step": self.step, "train_loss": loss / n,
                               "train_acc": 100 * correct / n,
                               **{f"train_{k}": v / n for k, v in loss_sums.items() if len(loss_sums) > 1}}
        last = self.epoch + 1 == cfg.epochs
        if last or (cfg.eval_every and (self.epoch + 1) % cfg.eval_every == 0):
            ev = evaluate(self.model, eval_dl, self.device, cfg.amp)
            row.update({"top1": ev["top1"], "loss": ev["loss"], "n_eval": ev["n"]})
        row["time_s"] = round(self.elapsed + time.perf_counter() - self.t0, 1)
        self.history.append(row)
        test = f" | test top1 {row['top1']:.2f} loss {row['loss']:.4f}" if "top1" in row else ""
        bar.write(f"epoch {row['epoch']}/{cfg.epochs} train loss {row['train_loss']:.4f} acc "
                  f"{row['train_acc']:.2f}{test} | {row['time_s']:.0f}s")
        self.epoch += 1
        self.batch = 0
        self.sums.zero_()
        self.loss_sums = {k: 0.0 for k in self.loss_sums}
        self.save_last()

    def _finish(self) -> tuple[nn.Module, dict[str, Any]]:
        final = self.history[-1] if self.history else {}
        metrics = {**{k: final[k] for k in ("top1", "loss", "n_eval", "train_loss", "train_acc") if k in final},
                   "epochs": self.cfg.epochs, "steps": self.step, "train_time_s": final.get("time_s"),
                   "spec": self.spec, "seed": self.cfg.seed, "batch_size": self.cfg.batch_size,
                   "world_size": self.info.world, "dtype": self.cfg.amp or "float32", "history": self.history,
                   **run_info()}
        if self.cfg.out and self.info.main:
            out = Path(self.cfg.out)
            save_checkpoint(out / "model.safetensors", self.model, meta={**self._meta(metrics), "complete": True})
            metrics["checkpoint"] = str(out / "model.safetensors")
            (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        return self.model.eval(), metrics
