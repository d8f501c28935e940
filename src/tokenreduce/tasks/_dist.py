"""The collectives a task's evaluator needs in a torchrun process group (no-ops in one process).

An evaluator reads its shard of the data (:func:`shard_loader`: rank ``r`` takes items
``r::world``, no padding, no duplicates) and combines shards with :func:`all_reduce_sum` (sums,
counts) or :func:`gather_shards` (per-item outputs back in dataset order, e.g. hash codes for a
ranking), so its result equals a single-process evaluation. ``train/dist.py`` re-exports these.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _comm_device(t: Tensor) -> torch.device:
    # nccl reduces only CUDA tensors; callers keep their counters on the CPU
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else t.device


def all_reduce_sum(t: Tensor) -> Tensor:
    """Sum ``t`` over processes (a copy on t's device; identity in one process)."""
    if not dist.is_initialized():
        return t.clone()
    out = t.to(_comm_device(t), copy=True)
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out.to(t.device)


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
    dev = _comm_device(t)
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


def shard_loader(dataset: Dataset, batch_size: int = 500, num_workers: int = 0) -> DataLoader:
    """A loader over this process's shard of ``dataset`` (all of it, in order, in one process)."""
    sampler = ShardSampler(len(dataset), batch_size, rank=rank(), world=world_size())
    return DataLoader(dataset, batch_sampler=sampler, num_workers=num_workers)
