"""GPU paths reproduced on the CPU (docs/own-gpu.md): crash paths found by reading the code for CUDA, and the
``--device`` / ``--amp`` flags every command that runs a model takes.

- C1: the random pruner's cached index made inside ``torch.inference_mode`` broke a later training forward
  ("Inference tensors cannot be saved for backward").
- C3: a checkpoint holds one CUDA RNG state per GPU visible when it was saved; resuming where fewer are visible
  raised an IndexError.
- C4: under DDP a non-finite loss raised on one rank only and the others waited in the all-reduce: the
  first non-finite step is agreed over the ranks at the same checks (train.dist.FiniteWatch).
"""

from __future__ import annotations

import argparse
import math
import random
from pathlib import Path

import pytest
import timm
import torch

import tokenreduce
from tokenreduce.bench.report import provenance
from tokenreduce.cli import build_parser
from tokenreduce.data.fashion_mnist import make_synthetic
from tokenreduce.methods.random import _moved
from tokenreduce.models import checkpoint
from tokenreduce.models.precision import autocast, device_info, grad_scaler
from tokenreduce.train.dist import FiniteWatch
from tokenreduce.train.loop import TrainConfig, train

TINY = {"name": "vit_tiny_patch16_224",
        "kwargs": {"img_size": 28, "patch_size": 7, "embed_dim": 32, "depth": 2, "num_heads": 2, "in_chans": 1,
                   "num_classes": 10}}


def _tiny_vit() -> torch.nn.Module:
    return timm.create_model(TINY["name"], **TINY["kwargs"])


# ----------------------------------------------------------------------------- C1


def test_random_pruner_applied_in_inference_mode_then_trained() -> None:
    """Applied and evaluated under inference_mode, then trained: the cached index must be a normal tensor."""
    model = _tiny_vit()
    x = torch.randn(2, 1, 28, 28)
    with torch.inference_mode():
        tokenreduce.apply(model, "random(keep=0.5, locs=(1,))")
        model.eval()
        model(x)
    model.train()
    model(x).sum().backward()  # raised "Inference tensors cannot be saved for backward"
    assert model.head.weight.grad is not None


def test_random_pruner_index_moved_inside_inference_mode_is_a_normal_tensor() -> None:
    """The lazy move to the input's device (CUDA only in practice) made inside inference_mode: a normal tensor."""
    idx = torch.arange(5)
    with torch.inference_mode():
        moved = _moved(idx, torch.device("cpu"))
    assert not moved.is_inference() and torch.equal(moved, idx)
    x = torch.randn(2, 5, 3, requires_grad=True)
    x.gather(1, moved[None, :, None].expand(2, 5, 3)).sum().backward()  # gather saves the index for backward


# ----------------------------------------------------------------------------- C3


@pytest.mark.parametrize("visible", [1, 3])
def test_cuda_rng_states_restore_with_another_gpu_count(monkeypatch: pytest.MonkeyPatch, capsys, visible: int) -> None:
    """Saved on 2 GPUs, resumed with 1 (or 3) visible: min(saved, visible) states restored, and said."""
    restored: list[tuple[int, torch.Tensor]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: restored.append((device, state)))
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: pytest.fail("indexes every saved state"))
    saved = [torch.full((4,), i, dtype=torch.uint8) for i in range(2)]
    state = {"python": random.getstate(), "numpy": __import__("numpy").random.get_state(),
             "torch": torch.get_rng_state(), "cuda": saved}
    checkpoint.set_rng_state(state)
    n = min(2, visible)
    assert [d for d, _ in restored] == list(range(n))
    assert all(torch.equal(s, saved[d]) for d, s in restored)
    assert f"restoring the first {n}" in capsys.readouterr().err


# ----------------------------------------------------------------------------- C4


def _watched(values: list[float]) -> FiniteWatch:
    watch = FiniteWatch("cpu")
    for step, v in enumerate(values, 1):
        watch.observe(step, {"ce": torch.tensor(v)}, torch.tensor(v))
    return watch


def test_finite_watch_notes_the_first_non_finite_step_and_its_losses() -> None:
    assert _watched([1.0, 0.5]).first() is None
    step, losses = _watched([1.0, float("nan"), float("inf")]).first()
    assert step == 2 and math.isnan(losses["ce"]) and math.isnan(losses["total"])


def _finite_worker(rank: int, store: Path) -> None:
    """Rank 1 alone holds a NaN loss at step 3; each rank writes what it agreed to store's folder."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    agreed = _watched([0.5, 0.5, float("nan") if rank == 1 else 0.5]).first()
    torch.distributed.destroy_process_group()
    (store.parent / f"agreed.{rank}").write_text(repr(None if agreed is None else (agreed[0], agreed[1] is None)))


@pytest.mark.slow  # two gloo processes; the watch alone: test_finite_watch_notes_the_first_non_finite_step_...
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
def test_the_first_non_finite_step_is_agreed_across_ranks(tmp_path: Path) -> None:
    """A NaN on rank 1 only: both ranks agree on step 3 (so both raise; none waits in DDP's all-reduce); rank 0
    knows the step is another process's."""
    torch.multiprocessing.spawn(_finite_worker, args=(tmp_path / "store",), nprocs=2, join=True)
    assert [(tmp_path / f"agreed.{r}").read_text() for r in range(2)] == ["(3, True)", "(3, False)"]


# ----------------------------------------------------------------------------- C5


def test_get_info_holds_copies_a_later_forward_cannot_change() -> None:
    """Under CUDA graphs the record's tensors live in the graph's pool, overwritten by the next replay: an
    Info holds copies (checked here as aliasing: writing into one Info leaves the record as it was)."""
    model = tokenreduce.apply(_tiny_vit().eval(), "tome(r=2)")
    model(torch.randn(2, 1, 28, 28))
    first = tokenreduce.get_info(model)
    first.index.zero_()
    first.sizes.zero_()
    again = tokenreduce.get_info(model)
    assert again.index.any() and bool((again.sizes > 0).all())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_get_info_under_cuda_graphs_survives_the_next_replay() -> None:
    model = tokenreduce.apply(_tiny_vit().cuda().eval(), "tome(r=2)")
    fast = torch.compile(model, mode="reduce-overhead")
    x, y = torch.randn(2, 1, 28, 28, device="cuda"), torch.randn(2, 1, 28, 28, device="cuda")
    with torch.inference_mode():
        for _ in range(3):  # warm-up, record, replay
            fast(x)
        kept = tokenreduce.get_info(model).sizes
        want = kept.clone()
        fast(y)
    assert torch.equal(kept, want)


# ----------------------------------------------------------------------------- C6


def test_an_attention_without_attn_dim_is_refused_naming_the_timm_minimum() -> None:
    """The adapter reads Attention.attn_dim (timm 1.0.23 on): an older timm's attention is refused with the
    metadata's requirement, not an AttributeError mid-forward."""
    from importlib.metadata import requires

    model = _tiny_vit()
    del model.blocks[1].attn.attn_dim
    wanted = next(r for r in requires("tokenreduce") if r.startswith("timm"))
    with pytest.raises(tokenreduce.UnsupportedModelError, match=f"block 1's Attention has no attn_dim.*{wanted}"):
        tokenreduce.apply(model, "tome(r=2)")
    assert wanted.replace(" ", "").startswith("timm>=1.0.23")


# ----------------------------------------------------------------------------- no host sync per training step


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host syncs are CUDA's")
def test_cropr_warmup_and_per_image_hash_targets_do_not_sync_the_host_each_step() -> None:
    """After their first step (one read of the warm-up's step; one check of the items against the table) a
    training forward of Cropr with a warm-up, and the per-image hash targets, run without a host sync."""
    from tokenreduce.tasks import TaskContext, build_task

    model = tokenreduce.apply(_tiny_vit(), "cropr(r=2, classes=10, warmup_steps=4)").cuda().train()
    task = build_task("hash(bits=8, targets='image', protocol='asym')")
    task.bind(model, TaskContext(classes=[str(i) for i in range(10)], train_labels=torch.arange(20) % 10, seed=0))
    images = torch.randn(4, 1, 28, 28, device="cuda")
    targets = torch.tensor([[1, 1], [3, 13], [4, 4], [9, 19]], device="cuda")  # [label, index]
    task(images, targets)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(2):
            out = task(images, targets)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(out.losses["hash"])


# ----------------------------------------------------------------------------- --device, --amp


COMMANDS = ("eval", "demo", "study", "export", "bench", "train", "experiment", "visualize")


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    return dict(next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices)


@pytest.mark.parametrize("name", COMMANDS)
def test_commands_that_run_a_model_take_device_and_amp(name: str) -> None:
    p = _subparsers()[name]
    text = p.format_help()
    assert "--device" in text and "--amp" in text, name
    amp = next(a for a in p._actions if "--amp" in a.option_strings)
    device = next(a for a in p._actions if "--device" in a.option_strings)
    assert tuple(amp.choices) == ("bf16", "fp16", "off") and device.default is None  # resolved when it runs


def test_amp_field_takes_fp16_and_off_reads_as_none() -> None:
    assert TrainConfig(amp="off").amp is None and TrainConfig(amp="fp16").amp == "fp16"
    assert TrainConfig.from_dict({"amp": None}).amp is None  # an old record's no-autocast


def test_autocast_and_scaler() -> None:
    with autocast("cpu", "bf16"):
        assert (torch.randn(2, 3) @ torch.randn(3, 2)).dtype == torch.bfloat16
    with autocast("cpu", "off"):
        assert (torch.randn(2, 3) @ torch.randn(3, 2)).dtype == torch.float32
    assert grad_scaler("cpu", "fp16").is_enabled() and not grad_scaler("cpu", "bf16").is_enabled()


def test_provenance_records_no_gpu_on_the_cpu() -> None:
    prov = provenance(device="cpu", argv=["tokenreduce"])
    assert prov["gpu"] is None and all(prov[k] is None for k in device_info("cpu"))


def test_train_fp16_autocast_with_grad_scaler(tmp_path: Path) -> None:
    data = str(make_synthetic(tmp_path / "fmnist", n_train=32, n_test=16))
    metrics = train(TrainConfig(model=TINY, data=data, epochs=1, batch_size=16, threads=1, quiet=True, amp="fp16",
                                lr=1e-3, warmup_epochs=0.5, out=str(tmp_path / "run")))
    assert metrics["dtype"] == "fp16" and metrics["steps"] == 2
    # the loss scale is part of the resumable state: a resumed fp16 run goes on with it, not from 2**16 again
    extra = checkpoint.read_checkpoint(tmp_path / "run" / "last.safetensors").header["extra"]
    assert extra["scaler"]["scale"] == grad_scaler("cpu", "fp16").get_scale() and "_growth_tracker" in extra["scaler"]


def test_study_commands_repeat_device_and_amp(tmp_path: Path, capsys) -> None:
    from tokenreduce.cli import main

    assert main(["study", "eet", "--smoke", "--list", "--device", "cpu", "--amp", "bf16", "--out",
                 str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and all("--amp bf16" in line for line in lines)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the case of a machine without the device asked for")
def test_a_study_lists_its_gpu_plan_on_a_machine_without_one(capsys) -> None:
    """``--list`` runs nothing: it prints the ten-epoch runs with ``--device cuda`` for the GPU they are meant for;
    running one here, or a device name torch does not know, is one line."""
    from tokenreduce.cli import main

    assert main(["study", "cropr", "--where", "steps=9370", "--device", "cuda", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and all("-t9370-" in line and "--device cuda" in line for line in lines)
    assert main(["study", "cropr", "--device", "cuda:x", "--list"]) == 2
    assert "unknown device 'cuda:x'" in capsys.readouterr().err
    assert main(["study", "cropr", "--device", "cuda", "--run", "cropr-t9370-s0"]) == 2
    assert "torch sees no cuda device here" in capsys.readouterr().err
