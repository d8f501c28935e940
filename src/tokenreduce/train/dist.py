"""torchrun / DDP helpers and the samplers that make runs reproducible.

``torchrun --nproc_per_node N -m tokenreduce.cli train ...`` sets RANK / WORLD_SIZE /
LOCAL_RANK; :func:`setup` joins the process group (gloo on CPU, nccl on CUDA). Without those
variables everything runs in one process and the collectives are no-ops.

Sampling: the batch size is *global*. Each global batch is the same set of samples whatever the
number of processes (a seeded permutation per epoch, cut into global batches, each split across
ranks), and each sample's augmentation is seeded by (seed, epoch, index) through
``data.Seeded``. So N processes see exactly the data 1 process sees, and a resumed run can skip
the batches it already consumed. Evaluation shards and the collectives evaluators use live in
``tasks._dist`` (tasks sit below train) and are re-exported here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Sampler

from ..core.errors import TokenReduceError
from ..models.precision import resolve_device
from ..tasks._dist import (
    ShardSampler,
    all_reduce_sum,
    comm_device,
    counters,
    gather_shards,
    loader_options,
    shard_loader,
    world_size,
)

__all__ = ["DistInfo", "FiniteWatch", "ShardSampler", "TrainBatchSampler", "all_reduce_sum", "barrier", "counters",
           "gather_shards", "loader_options", "sample_seed", "setup", "shard_loader", "teardown",
           "world_size"]

_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands: rank among world processes, and its device."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1


def setup(device: str | None = None) -> DistInfo:
    """Join the torchrun process group if the environment says so; returns this process's DistInfo."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, local)
    if world > 1 and not dist.is_initialized():
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo", rank=rank, world_size=world)
    if dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    return DistInfo(rank, world, local, dev)


def wrap_ddp(module: nn.Module, device: torch.device) -> nn.parallel.DistributedDataParallel:
    """``module`` in DistributedDataParallel (one device per process). Rank 0's buffers are broadcast before
    each forward only where some sub-module keeps running statistics (BatchNorm in a conv stem), which
    would otherwise drift apart across ranks; every other buffer (a hash task's per-image code table,
    (n_train, bits)) is the same on every rank by construction, and broadcasting it would copy it each step."""
    running = any(getattr(m, "running_mean", None) is not None for m in module.modules())
    ids = [device] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(module, device_ids=ids, broadcast_buffers=running)


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


class FiniteWatch:
    """The first optimizer step whose losses were not finite, noted on the device so that no step waits
    for the host; :meth:`first` reads it (a sync and a collective: every rank calls it at the same step,
    the loop does so where it logs and before every checkpoint).

    Per step, with l the losses of the step and t their total: ``first <- step`` and ``values <- (l, t)``
    where ``first`` is unset and any of them is NaN or inf. Agreed over ranks: the smallest step any rank
    noted, so every rank stops at the same check (one rank raising alone would leave the others waiting
    in DDP's all-reduce until the backend's timeout). A non-finite loss reaches the weights before the
    check, so the loop checks before it writes any checkpoint: no checkpoint holds its update.
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.names: list[str] = []
        self.step = torch.full((), -1, dtype=torch.int64, device=self.device)
        self.values: torch.Tensor | None = None

    def observe(self, step: int, losses: dict[str, torch.Tensor], total: torch.Tensor) -> None:
        """Note ``step``'s ``losses`` and their ``total`` (queued on the device; no sync)."""
        row = torch.stack([v.detach().float().reshape(()) for v in (*losses.values(), total)])
        if self.values is None:
            self.names, self.values = [*losses, "total"], torch.zeros_like(row)
        new = (self.step < 0) & ~torch.isfinite(row).all()
        self.step = torch.where(new, step, self.step)
        self.values = torch.where(new, row, self.values)

    def first(self) -> tuple[int, dict[str, float] | None] | None:
        """None while every step so far was finite on every process; else the first such step of any
        process, with this process's losses at it (None where another process's step is the first)."""
        mine = int(self.step.item())
        step = mine
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            flag = torch.tensor([mine if mine >= 0 else torch.iinfo(torch.int64).max], dtype=torch.int64)
            flag = flag.to(comm_device(flag))
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            step = int(flag.item())
            step = -1 if step == torch.iinfo(torch.int64).max else step
        if step < 0:
            return None
        own = dict(zip(self.names, self.values.tolist(), strict=True)) if mine == step else None
        return step, own


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A 63-bit seed for one sample's augmentation (splitmix64 of the three numbers)."""
    z = (seed * 0x9E3779B97F4A7C15 + epoch * 0xBF58476D1CE4E5B9 + index * 0x94D049BB133111EB) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


class TrainBatchSampler(Sampler[list[tuple[int, int]]]):
    """This rank's share of each global batch of an epoch, as ``(index, sample_seed)`` keys.

    Epoch ``e``'s order is ``randperm(n)`` from a generator seeded with ``seed + e``; it is cut
    into ``n // batch_size`` global batches (the incomplete last one is dropped) and rank ``r``
    takes positions ``r::world`` of each. ``set_epoch(e, skip=k)`` starts at global batch ``k``.
    """

    def __init__(self, n: int, batch_size: int, *, seed: int, rank: int = 0, world: int = 1,
                 shuffle: bool = True) -> None:
        if batch_size % world:
            raise TokenReduceError(f"batch size {batch_size} is global and must be divisible by the "
                                   f"{world} processes")
        if n < batch_size:
            raise TokenReduceError(f"{n} training images are fewer than one batch of {batch_size}; "
                                   "lower --batch-size or raise --subset")
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.rank, self.world, self.shuffle = rank, world, shuffle
        self.epoch, self.skip = 0, 0

    @property
    def batches_per_epoch(self) -> int:
        return self.n // self.batch_size

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        self.epoch, self.skip = epoch, skip

    def __len__(self) -> int:
        return self.batches_per_epoch - self.skip

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        if self.shuffle:
            order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()
        else:
            order = list(range(self.n))
        B = self.batch_size
        for b in range(self.skip, self.batches_per_epoch):
            batch = order[b * B : (b + 1) * B][self.rank :: self.world]
            yield [(i, sample_seed(self.seed, self.epoch, i)) for i in batch]
