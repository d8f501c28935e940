"""The collectives a task's evaluator needs in a torchrun process group (no-ops in one process).

An evaluator reads its shard of the data (:func:`shard_loader`: rank ``r`` takes items
``r::world``, no padding, no duplicates) and combines shards with :func:`all_reduce_sum` (sums,
counts) or :func:`gather_shards` (per-item outputs back in dataset order, e.g. hash codes for a
ranking), so its result equals a single-process evaluation. ``train/dist.py`` re-exports these.

Every loader of the package (training and evaluation) takes :func:`loader_options` for its device: on
CUDA, worker processes, pinned memory and persistent workers, so that a batch is decoded while the
GPU runs the previous one and its copy (``.to(device, non_blocking=True)``) overlaps; on the CPU, the
main process (workers would take the cores the model runs on).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def comm_device(t: Tensor) -> torch.device:
    # nccl reduces only CUDA tensors; callers keep their counters on the CPU
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else t.device


def all_reduce_sum(t: Tensor) -> Tensor:
    """Sum ``t`` over processes (a copy on t's device; identity in one process)."""
    if not dist.is_initialized():
        return t.clone()
    out = t.to(comm_device(t), copy=True)
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out.to(t.device)


def counters(n: int, device: torch.device | str) -> Tensor:
    """``n`` running sums on ``device``, float64 (float32 on MPS, which has none): adding a step's
    values to them is queued on the device, so nothing waits for it until they are read."""
    dtype = torch.float32 if torch.device(device).type == "mps" else torch.float64
    return torch.zeros(n, dtype=dtype, device=device)


def gather_shards(t: Tensor, n: int) -> Tensor:
    """All ``n`` rows in dataset order from this rank's rows ``t`` (items ``rank::world``, in order).

    t (n_r, ...) -> (n, ...) on every rank; identity in one process.
    """
    world = world_size()
    if world == 1:
        return t
    rows = -(-n // world)  # the largest shard; smaller ones are padded to it
    pad = t.new_zeros((rows, *t.shape[1:]))
    pad[: len(t)] = t
    dev = comm_device(t)
    parts = [torch.empty_like(pad, device=dev) for _ in range(world)]
    dist.all_gather(parts, pad.to(dev))
    out = t.new_empty((n, *t.shape[1:]))
    for r, part in enumerate(parts):
        k = len(range(r, n, world))
        out[r::world] = part[:k].to(t.device)
    return out


class ShardSampler(Sampler[list[int]]):
    """Evaluation batches: rank ``r`` takes images ``r::world`` (no padding, no duplicates), so
    summed counts over ranks equal one process's counts exactly."""

    def __init__(self, n: int, batch_size: int, *, rank: int = 0, world: int = 1) -> None:
        self.indices = list(range(rank, n, world))
        self.batch_size = batch_size

    def __len__(self) -> int:
        return -(-len(self.indices) // self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        for s in range(0, len(self.indices), self.batch_size):
            yield self.indices[s : s + self.batch_size]


#: the most worker processes a loader starts on its own (a node's cores are shared by its GPUs' processes)
MAX_AUTO_WORKERS = 8


def loader_options(device: torch.device | str | None, workers: int | None = None) -> dict[str, Any]:
    """DataLoader settings for a loader that feeds ``device``: ``workers`` processes (None: on CUDA
    min(MAX_AUTO_WORKERS, this process's share of the cores), else 0), pinned memory on CUDA, and
    persistent workers where there are any. Items are seeded per key (data.Seeded), so the number of
    workers never changes what a run sees."""
    cuda = device is not None and torch.device(device).type == "cuda"
    if workers is None:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        workers = min(MAX_AUTO_WORKERS, max(1, (os.cpu_count() or 1) // local - 1)) if cuda else 0
    return {"num_workers": workers, "pin_memory": cuda, "persistent_workers": workers > 0}


def shard_loader(dataset: Dataset, batch_size: int = 500, device: torch.device | str | None = None,
                 workers: int | None = None) -> DataLoader:
    """A loader over this process's shard of ``dataset`` (all of it, in order, in one process), set up
    for ``device`` (:func:`loader_options`)."""
    sampler = ShardSampler(len(dataset), batch_size, rank=rank(), world=world_size())
    return DataLoader(dataset, batch_sampler=sampler, **loader_options(device, workers))
