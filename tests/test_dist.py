"""Distributed: samplers partition the data exactly; 2 processes (torchrun, gloo) train and evaluate
to the same metrics as 1 process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tokenreduce.data.fashion_mnist import make_synthetic
from tokenreduce.models import build_model, build_stem
from tokenreduce.train import read_checkpoint
from tokenreduce.train.dist import ShardSampler, TrainBatchSampler, gather_shards, shard_loader, wrap_ddp
from tokenreduce.train.loop import TrainConfig, train

TINY = {"name": "vit_tiny_patch16_224",
        "kwargs": {"img_size": 28, "patch_size": 7, "embed_dim": 32, "depth": 2, "num_heads": 2, "in_chans": 1,
                   "num_classes": 10}}


def test_train_sampler_splits_each_global_batch() -> None:
    one = TrainBatchSampler(50, 8, seed=3)
    two = [TrainBatchSampler(50, 8, seed=3, rank=r, world=2) for r in range(2)]
    for s in (one, *two):
        s.set_epoch(1, skip=2)
    batches = list(one)
    assert len(batches) == len(one) == 50 // 8 - 2
    for b, r0, r1 in zip(batches, *two, strict=True):
        assert sorted(b) == sorted(r0 + r1) and len(r0) == len(r1) == 4
    one.set_epoch(2)
    assert [i for i, _ in next(iter(one))] != [i for i, _ in batches[0]]


def test_shard_sampler_covers_everything_once() -> None:
    shards = [list(ShardSampler(11, 3, rank=r, world=2)) for r in range(2)]
    flat = sorted(i for shard in shards for batch in shard for i in batch)
    assert flat == list(range(11))


def _gather_worker(rank: int, world: int, init: str, out: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        data = torch.utils.data.TensorDataset(torch.arange(5.0)[:, None] * 10)  # item i = [10 i]
        rows = torch.cat([x for (x,) in shard_loader(data, batch_size=2)])  # (n_r, 1), this rank's items
        torch.save(gather_shards(rows, len(data)), f"{out}.{rank}")
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
def test_gather_shards_puts_every_item_back_in_order(tmp_path: Path) -> None:
    """What evaluators that rank (retrieval) rely on: uneven shards gathered in dataset order on every rank."""
    init, out = f"file://{tmp_path / 'store'}", str(tmp_path / "rows")
    torch.multiprocessing.spawn(_gather_worker, args=(2, init, out), nprocs=2, join=True)
    for r in range(2):
        assert torch.equal(torch.load(f"{out}.{r}"), torch.arange(5.0)[:, None] * 10)


@pytest.mark.slow  # torchrun trains twice; fast: the sampler tests and the 2-process gather above
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
def test_two_processes_match_one(tmp_path: Path) -> None:
    data = str(make_synthetic(tmp_path / "data", n_train=64, n_test=33))  # 33: uneven eval shards
    common = dict(model=TINY, data=data, epochs=2, batch_size=16, lr=3e-3, warmup_epochs=0.5, augment="crop_flip",
                  threads=1, quiet=True, deterministic=True)
    single = train(TrainConfig(**common, out=str(tmp_path / "one")))
    flags = ["--model", "vit_tiny_patch16_224", "--img-size", "28", "--patch-size", "7", "--dim", "32", "--depth",
             "2", "--heads", "2", "--in-chans", "1", "--num-classes", "10", "--data", data, "--epochs", "2",
             "--batch-size", "16", "--lr", "3e-3", "--warmup-epochs", "0.5", "--augment", "crop_flip", "--threads", "1",
             "--quiet", "--deterministic", "--device", "cpu", "--out", str(tmp_path / "two")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "tokenreduce.cli", "train", *flags], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    double = json.loads((tmp_path / "two" / "metrics.json").read_text())
    assert double["world_size"] == 2 and double["n_eval"] == single["n_eval"] == 33
    for a, b in zip(single["history"], double["history"], strict=True):
        assert a["top1"] == b["top1"]
        assert a["train_acc"] == b["train_acc"]
        assert abs(a["train_loss"] - b["train_loss"]) < 1e-5 and abs(a["loss"] - b["loss"]) < 1e-5
    w1, w2 = read_checkpoint(tmp_path / "one").weights, read_checkpoint(tmp_path / "two").weights
    # summation order differs across processes; Adam turns float noise in the (theoretically zero) gradient of
    # the key bias into updates of ~1e-5, so weights agree to 1e-4 while the metrics above agree exactly
    assert all(torch.allclose(w1[k], w2[k], atol=1e-4) for k in w1)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
def test_ddp_broadcasts_buffers_only_for_running_statistics(tmp_path: Path) -> None:
    """A BatchNorm stem's running statistics are kept equal across ranks; a constant buffer is not copied each step."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        plain = build_model(TINY)
        plain.register_buffer("table", torch.zeros(100, 16, dtype=torch.int8))  # like the hash task's codes
        assert not wrap_ddp(plain, torch.device("cpu")).broadcast_buffers
        tiny4 = {**TINY, "kwargs": {**TINY["kwargs"], "patch_size": 4}}  # the conv stem reaches powers of two
        assert wrap_ddp(build_stem("conv(norm='bn')", build_model(tiny4)), torch.device("cpu")).broadcast_buffers
        assert not wrap_ddp(build_stem("conv(norm='none')", build_model(tiny4)), torch.device("cpu")).broadcast_buffers
    finally:
        torch.distributed.destroy_process_group()
