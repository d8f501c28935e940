"""Checkpoints: round trip, training state, atomic writes, clear errors, never a half-loaded model."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import tokenreduce
from tokenreduce.models import (
    CheckpointError,
    build_model,
    load_model,
    load_weights,
    read_checkpoint,
    restore_training_state,
    save_checkpoint,
)

CFG = {"name": "vit_tiny_patch16_224",
       "kwargs": {"img_size": 28, "patch_size": 7, "embed_dim": 32, "depth": 2, "num_heads": 2, "in_chans": 1,
                  "num_classes": 10}}
X = torch.randn(3, 1, 28, 28, generator=torch.Generator().manual_seed(0))


def _model(spec: str | None = None, **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    m = build_model({**CFG, "kwargs": {**CFG["kwargs"], **kw}})
    if spec:
        tokenreduce.apply(m, spec)
    return m.eval()


@pytest.mark.parametrize("spec", [None, "tome(r=2)"])
def test_round_trip(tmp_path: Path, spec: str | None) -> None:
    model = _model(spec)
    path = tmp_path / "m.safetensors"
    save_checkpoint(path, model, meta={"model": CFG, "spec": spec, "epoch": 3, "step": 30})
    loaded, meta = load_model(path)
    assert meta["epoch"] == 3 and meta["step"] == 30 and meta["spec"] == spec
    assert torch.equal(loaded(X), model(X)) and not loaded.training
    side = json.loads(path.with_suffix(".json").read_text())
    assert side["meta"] == meta and side["weights"] == "m.safetensors"


def test_directory_lookup(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "last.safetensors", _model(), meta={"model": CFG, "spec": None})
    assert load_model(tmp_path)[1]["model"] == CFG
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no checkpoint in directory"):
        load_model(tmp_path / "empty")


def test_training_state_round_trip(tmp_path: Path) -> None:
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)
    model(X).sum().backward()
    opt.step()
    sched.step()
    save_checkpoint(tmp_path / "c.safetensors", model, meta={"model": CFG, "spec": None}, optimizer=opt,
                    scheduler=sched, extra={"sums": torch.arange(3.0), "batch": 7})
    expected = torch.rand(4)  # what the RNG gives right after the save
    ckpt = read_checkpoint(tmp_path / "c.safetensors")
    assert ckpt.has_training_state and not any(k.startswith("_state/") for k in ckpt.weights)
    model2 = _model()
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-3)
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, 2)
    load_weights(model2, ckpt)
    extra = restore_training_state(ckpt, opt2, sched2)
    assert torch.equal(torch.rand(4), expected)
    assert extra["batch"] == 7 and torch.equal(extra["sums"], torch.arange(3.0))
    assert sched2.state_dict() == sched.state_dict()
    s1, s2 = opt.state_dict(), opt2.state_dict()
    assert s1["param_groups"] == s2["param_groups"]
    for k, v in s1["state"].items():
        assert all(torch.equal(v[n], s2["state"][k][n]) for n in v)


def test_corrupted_and_truncated_files(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_checkpoint(path, _model(), meta={"model": CFG, "spec": None})
    raw = bytearray(path.read_bytes())
    raw[-10] ^= 0xFF  # a flipped bit in the weights
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        load_model(path)
    path.write_bytes(bytes(raw[: len(raw) // 2]))
    with pytest.raises(CheckpointError, match="corrupted or truncated"):
        load_model(path)
    path.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError):
        load_model(path)
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, tmp_path / "plain.safetensors")
    with pytest.raises(CheckpointError, match="not a tokenreduce checkpoint"):
        load_model(tmp_path / "plain.safetensors")
    with pytest.raises(CheckpointError, match="does not exist"):
        load_model(tmp_path / "absent.safetensors")


def test_mismatch_never_half_loads(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_checkpoint(path, _model(), meta={"model": CFG, "spec": None})
    other = _model(depth=3)
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(CheckpointError, match="does not match this model.*unexpected|missing"):
        load_weights(other, read_checkpoint(path))
    wide = _model(embed_dim=48)
    with pytest.raises(CheckpointError, match="shape mismatches"):
        load_weights(wide, read_checkpoint(path))
    assert all(torch.equal(before[k], v) for k, v in other.state_dict().items())
    bad = json.loads(path.with_suffix(".json").read_text())["meta"]
    bad["model"] = {"name": "no_such_model_xyz", "kwargs": {}}
    save_checkpoint(tmp_path / "b.safetensors", _model(), meta=bad)
    with pytest.raises(CheckpointError, match="cannot build timm model"):
        load_model(tmp_path / "b.safetensors")
    with pytest.raises(CheckpointError, match="meta\\['model'\\]"):
        save_checkpoint(tmp_path / "c.safetensors", _model(), meta={"spec": None})
    with pytest.raises(CheckpointError, match="must end with .safetensors"):
        save_checkpoint(tmp_path / "c.pt", _model(), meta={"model": CFG})


def test_atomic_write_keeps_old_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.safetensors"
    save_checkpoint(path, _model(), meta={"model": CFG, "spec": None, "step": 1})

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # the process dies before the rename

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, _model(depth=3), meta={"model": CFG, "spec": None, "step": 2})
    monkeypatch.undo()
    assert load_model(path)[1]["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json", "m.safetensors"]  # no temp files left
