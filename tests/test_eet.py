"""The ``eet`` task (tasks/eet.py): DRG's mask, DKT's stop-gradient, the teacher and its probe, FISH
targets solved once and kept, a tiny run that trains, resumes bit-identically and evaluates
through the commands; ``--bits``; a frozen teacher exported from a run."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from conftest import Interrupted, make_host, stop_at

import tokenreduce
from tokenreduce import SpecError, TokenReduceError
from tokenreduce.cli import main
from tokenreduce.data.fashion_mnist import make_synthetic
from tokenreduce.methods.ctp import importance
from tokenreduce.models import load_model, read_checkpoint, task_weights
from tokenreduce.tasks import TaskContext, build_task, fish
from tokenreduce.tasks import eet as E
from tokenreduce.train.config import TrainConfig
from tokenreduce.train.loop import train

CLASSES = [str(i) for i in range(10)]
PRUNE = "ctp(counts=(32, 16), locs=(1, 2))"  # on the 8x8-patch host of conftest
TINY = {"name": "vit_tiny_patch16_224",
        "kwargs": {"img_size": 28, "patch_size": 7, "embed_dim": 32, "depth": 2, "num_heads": 2, "in_chans": 1,
                   "num_classes": 10}}
TINY_FLAGS = ["--model", "vit_tiny_patch16_224", "--img-size", "28", "--patch-size", "7", "--dim", "32", "--depth",
              "2", "--heads", "2", "--in-chans", "1"]
TINY_PRUNE = "ctp(counts=(8,), locs=(0,))"  # 16 patches -> 8 after block 0


def bound(spec: str = "eet(bits=8)", prune: str | None = PRUNE, n: int = 20, **ctx):
    model = make_host("deit")
    if prune:
        tokenreduce.apply(model, prune)
    task = build_task(spec)
    task.bind(model, TaskContext(classes=CLASSES, train_labels=torch.arange(n) % 10, seed=0, **ctx))
    return task.train()


def batch(b: int = 4):
    x = torch.randn(b, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    return x, torch.stack([torch.arange(b) % 10, torch.arange(b)], 1)  # [label, index]


# ----------------------------------------------------------------------------- DRG: the mask


def test_mask_patches_zeroes_exactly_the_chosen_patches_in_both_orientations():
    """A 4x4 grid of 2x2-pixel patches: patch 6 is row 1, column 2 (grid) and the transposed row 2,
    column 1 (the official code's); patch 3 is row 0, column 3 / row 3, column 0."""
    images = torch.arange(1, 2 * 64 + 1, dtype=torch.float).view(1, 2, 8, 8)  # no zero pixel
    idx = torch.tensor([[6, 3]])
    for mask, cells in (("grid", [(1, 2), (0, 3)]), ("official", [(2, 1), (3, 0)])):
        out = E.mask_patches(images, idx, (4, 4), mask)
        want = torch.ones(8, 8, dtype=torch.bool)
        for r, c in cells:
            want[2 * r:2 * r + 2, 2 * c:2 * c + 2] = False
        assert torch.equal(out == 0, ~want.expand(1, 2, 8, 8)), mask
        assert torch.equal(out[:, :, want], images[:, :, want])  # everything else untouched
    # per image: image 0 loses patch 0, image 1 patch 15; a non-square grid in both orientations
    two = torch.ones(2, 1, 4, 8)
    out = E.mask_patches(two, torch.tensor([[0], [7]]), (2, 4))
    assert out[0, 0, :2, :2].eq(0).all() and out[0].sum() == 32 - 4
    assert out[1, 0, 2:, 6:].eq(0).all() and out[1].sum() == 32 - 4
    with pytest.raises(TokenReduceError, match="square grid"):
        E.mask_patches(two, torch.tensor([[0], [7]]), (2, 4), "official")
    with pytest.raises(TokenReduceError, match="choose from grid, official"):
        E.mask_patches(two, torch.tensor([[0], [7]]), (2, 4), "rows")


def test_drg_masks_the_teachers_top_patches_by_the_ctp_score(monkeypatch):
    task = bound("eet(bits=8, w=3)")
    x, y = batch()
    seen = {}
    real = E.mask_patches

    def spy(images, idx, grid, mask="grid"):
        seen.update(idx=idx, grid=grid, images=images)
        return real(images, idx, grid, mask)

    monkeypatch.setattr(E, "mask_patches", spy)
    task(x, y)
    # the probe's importance is CTP's score of the teacher's last block: the top-3 patches a CTP
    # patch on a copy of the teacher keeps at that block are the 3 masked
    ref = E._unpatched_copy(task.teacher)
    tokenreduce.apply(ref, "ctp(counts=(3,), locs=(3,))")
    ref.train()  # the teacher's importance comes from its training-mode forward
    ref(x)
    kept = tokenreduce.get_info(ref).index[:, 1:] - 1  # (B, 3) patch ids kept after the last block
    assert seen["grid"] == (8, 8) and seen["images"] is x
    assert torch.equal(seen["idx"].sort(1).values, kept.sort(1).values)


def test_probe_reduces_nothing_and_gives_the_ctp_importance():
    teacher = make_host("deit")
    plain = teacher(torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)))
    probe = E.ImportanceProbe()
    tokenreduce.apply(teacher, probe)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(teacher(x), plain, atol=1e-6)  # the output of the unpatched model
    assert tokenreduce.get_info(teacher).tokens_per_block == [65] * 4
    # by hand: the last block's attention, CLS row and per-head output norms
    blk = teacher.blocks[-1]
    h = x
    with torch.no_grad():
        tokens = teacher.norm_pre(teacher._pos_embed(teacher.patch_embed(h)))
        for b in teacher.blocks[:-1]:
            tokens = b(tokens)
        z = blk.norm1(tokens)
        B, N, _ = z.shape
        q, k, v = blk.attn.qkv(z).reshape(B, N, 3, 2, 32).permute(2, 0, 3, 1, 4)
        a = (q @ k.transpose(-2, -1) * blk.attn.scale).softmax(-1)  # (B, H, N, N)
        want = importance((a @ v).norm(dim=-1), a[:, :, 0], 1)
    assert probe.importance.shape == (2, 64) and torch.allclose(probe.importance, want, atol=1e-6)


# ----------------------------------------------------------------------------- DKT, the teacher, the losses


def test_losses_and_dkt_gives_no_gradient_to_the_teacher():
    task = bound()
    x, y = batch()
    out = task(x, y)
    assert set(out.losses) == {"ce", "ce_masked", "hash", "dkt", "teacher/ce", "teacher/hash"}
    assert set(out.stats) == {"acc", "bit_acc", "teacher_acc"}
    out.losses["dkt"].backward(retain_graph=True)
    teacher = [*task.teacher.parameters(), *task.teacher_head.parameters()]
    assert all(p.grad is None for p in teacher), "DKT reached the teacher"
    assert task.head.weight.grad.abs().sum() > 0 and task.model.blocks[0].attn.qkv.weight.grad.abs().sum() > 0
    task.zero_grad(set_to_none=True)
    (out.losses["teacher/ce"] + out.losses["teacher/hash"]).backward(retain_graph=True)
    assert all(p.grad is None for p in [*task.model.parameters(), *task.head.parameters()]), "teacher loss hit student"
    assert all(p.grad is not None for p in teacher)
    task.zero_grad(set_to_none=True)
    out.losses["ce_masked"].backward()
    assert all(p.grad is None for p in teacher)  # DRG only reads the teacher's importance
    # the EET loss: 0.1 (CE + CE masked) + MSE + DKT, with DKT = mean(1 - cos(h, h_teacher))
    with torch.no_grad():
        h = task.head(task.model(x))
        ht = task.teacher_head(task.teacher(x))
    dkt = (1 - torch.nn.functional.cosine_similarity(h, ht, dim=-1)).mean()
    assert out.losses["dkt"].item() == pytest.approx(dkt.item(), rel=1e-5)
    t = task.image_codes[y[:, 1]].float()
    assert out.losses["hash"].item() == pytest.approx(torch.nn.functional.mse_loss(h, t).item(), rel=1e-5)


def test_teacher_is_the_unpruned_copy_with_the_same_weights():
    task = bound()
    assert tokenreduce.get_info(task.model).spec.startswith("ctp(")
    assert tokenreduce.get_info(task.teacher).spec == "importance_probe"  # not the student's pruner
    s, t = task.model.state_dict(), task.teacher.state_dict()
    assert s.keys() == t.keys() and all(torch.equal(s[k], t[k]) for k in s)
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(task.model.parameters(), task.teacher.parameters(),
                                                            strict=True))
    owned = set(task.owned_state_dict())
    assert {"teacher_head.weight", "image_codes", "codes_solved", "head.weight"} <= owned
    assert {f"teacher.{k}" for k in t} <= owned


@pytest.mark.parametrize(("spec", "losses", "teacher"), [
    ("eet(bits=8, dkt=False, drg=False)", {"ce", "hash"}, False),
    ("eet(bits=8, drg=False)", {"ce", "hash", "dkt", "teacher/ce", "teacher/hash"}, True),
    ("eet(bits=8, dkt=False)", {"ce", "ce_masked", "hash", "teacher/ce", "teacher/hash"}, True),
])
def test_flags_give_the_arms(spec, losses, teacher):
    task = bound(spec)
    assert set(task(*batch()).losses) == losses
    assert hasattr(task, "teacher") == teacher and any(k.startswith("teacher") for k in task.owned_state_dict()) \
        == teacher


@pytest.mark.parametrize(("spec", "match"), [("eet(w=0)", "w "), ("eet(mask='rows')", "takes 'grid' or 'official'"),
                                             ("eet(teacher='big')", "teacher takes 'joint' or 'frozen'"),
                                             ("eet(bits=1)", "bits must be"), ("eet(dkt=1)", "True or False"),
                                             ("eet(targets='class')", "unknown parameter")])
def test_bad_specs_are_clear_errors(spec, match):
    with pytest.raises(SpecError, match=match):
        build_task(spec)


def test_bad_teachers_are_clear_errors():
    with pytest.raises(TokenReduceError, match="drop --teacher"):
        bound(teacher=make_host("deit"))
    with pytest.raises(TokenReduceError, match="outputs 10 values"):
        bound("eet(bits=8, teacher='frozen')", teacher=make_host("deit"))
    with pytest.raises(TokenReduceError, match="drop --distill"):
        bound(distill=("logits",))
    with pytest.raises(TokenReduceError, match="w=99"):
        bound("eet(bits=8, w=99)")


# ----------------------------------------------------------------------------- FISH targets, solved once


def test_fish_targets_are_solved_once_and_kept_in_the_checkpoint(monkeypatch):
    task = bound()
    assert not bool(task.codes_solved)
    task(*batch())
    want = fish.fish_codes(torch.arange(20) % 10, 8, num_classes=10, seed=0).codes
    assert bool(task.codes_solved) and torch.equal(task.image_codes.cpu(), want)
    saved = task.owned_state_dict()
    # bound again (resume, evaluation) and loaded: the codes come from the checkpoint, never re-solved
    monkeypatch.setattr(E, "fish_codes", lambda *a, **k: pytest.fail("FISH targets solved again"))
    for labels in (torch.arange(20) % 10, None):
        again = build_task("eet(bits=8)")
        again.bind(make_host("deit"), TaskContext(classes=CLASSES, train_labels=labels, seed=0))
        again.load_owned_state_dict(saved)
        again.train()
        if labels is not None:
            again(*batch())
        assert torch.equal(again.image_codes, want)


# ----------------------------------------------------------------------------- through the loop and the commands


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(make_synthetic(tmp_path_factory.mktemp("fmnist"), n_train=96, n_test=24))


def _no_time(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "time_s"} for row in history]


def test_tiny_eet_run_trains_resumes_bit_identically_and_evaluates(data: str, tmp_path: Path):
    cfg = TrainConfig(model=TINY, spec=TINY_PRUNE, task="eet(bits=8, ks=(1, 5))", data=data, epochs=2, batch_size=8,
                      subset=48, optimizer="sgd", lr=0.01, min_lr=0.0, warmup_epochs=0.2, label_smoothing=0.0,
                      ckpt_every=4, out=str(tmp_path / "a"), threads=1, quiet=True, deterministic=True)
    full = train(cfg)
    losses = full["history"][0]
    assert {"train_ce", "train_ce_masked", "train_hash", "train_dkt", "train_teacher/ce",
            "train_teacher/hash"} <= set(losses)
    assert 0 <= full["map"] <= 100 and full["map"] == full["map_asym"] and "map_sym" in full
    cut = dataclasses.replace(cfg, out=str(tmp_path / "b"))
    with pytest.raises(Interrupted):
        train(cut, on_step=stop_at(9))  # after the checkpoint at step 8 (epoch 2)
    resumed = train(dataclasses.replace(cut, resume=True))
    assert _no_time(resumed["history"]) == _no_time(full["history"])
    a, b = read_checkpoint(tmp_path / "a").weights, read_checkpoint(tmp_path / "b").weights
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert "task.image_codes" in a and "task.teacher.blocks.0.attn.qkv.weight" in a
    # the evaluation command reads the run's own task tensors (head, FISH codes) and gives the same mAP
    out = tmp_path / "eval"
    assert main(["eval", "--checkpoint", str(tmp_path / "a" / "model.safetensors"), "--spec", TINY_PRUNE, "--data",
                 data, "--out", str(out), "--threads", "1", "--repeats", "1", "--warmup", "0", "--batch-size", "4",
                 "--eval-batch-size", "16"]) == 0
    rows = json.loads((out / "results.json").read_text())["results"]
    mine = [r for r in rows if r["kind"] == "training-free" and r["spec"] == TINY_PRUNE]
    assert mine and mine[0]["metric"] == "map" and mine[0]["map"] == pytest.approx(full["map"])


def test_cli_train_with_bits_and_recipe(data: str, tmp_path: Path, capsys: pytest.CaptureFixture):
    from tokenreduce.cli import build_parser
    from tokenreduce.commands.train import config_from_args

    parser = build_parser()
    cfg = config_from_args(parser.parse_args(["train", "--recipe", "fmnist-eet", "--bits", "16", "--spec",
                                              TINY_PRUNE, "--out", str(tmp_path / "r")]))
    assert cfg.task == build_task("eet(bits=16)").spec() and cfg.optimizer == "sgd" and cfg.lr == 0.01
    assert cfg.subset == 10000 and cfg.batch_size == 64 and cfg.spec == TINY_PRUNE
    results = tmp_path / "res.json"
    rc = main(["train", *TINY_FLAGS, "--data", data, "--task", "eet(bits=8, drg=False)", "--bits", "6", "--spec",
               TINY_PRUNE, "--epochs", "1", "--batch-size", "16", "--subset", "32", "--optimizer", "sgd", "--lr",
               "0.01", "--quiet", "--threads", "1", "--out", str(tmp_path / "cli"), "--results", str(results)])
    assert rc == 0
    record = json.loads(results.read_text())
    assert record["metrics"]["bits"] == 6 and "--bits 6" in record["command"]
    saved = read_checkpoint(tmp_path / "cli" / "model.safetensors").meta["task"]
    assert saved == build_task("eet(bits=6, drg=False)").spec()
    capsys.readouterr()
    assert main(["train", *TINY_FLAGS, "--data", data, "--bits", "8", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "task 'classify' has no bits parameter" in err and "eet" in err and "hash" in err


def test_frozen_teacher_exported_from_a_run(data: str, tmp_path: Path):
    base = dict(model=TINY, data=data, epochs=1, batch_size=8, subset=16, optimizer="sgd", lr=0.01, min_lr=0.0,
                warmup_epochs=0.2, threads=1, quiet=True, deterministic=True)
    train(TrainConfig(**base, task="eet(bits=8, dkt=False, drg=False, ks=(1,))", out=str(tmp_path / "t")))
    path = E.export_teacher(tmp_path / "t" / "model.safetensors", tmp_path / "teacher.safetensors")
    teacher, _ = load_model(path)
    run, _ = load_model(tmp_path / "t" / "model.safetensors")
    head = task_weights(read_checkpoint(tmp_path / "t" / "model.safetensors"))
    x = torch.randn(3, 1, 28, 28)
    with torch.no_grad():
        want = torch.nn.functional.linear(run(x), head["head.weight"], head["head.bias"])
        assert torch.allclose(teacher(x), want, atol=1e-5)  # its output is the run's continuous code
    metrics = train(TrainConfig(**base, task="eet(bits=8, teacher='frozen', ks=(1,))", spec=TINY_PRUNE,
                                teacher=str(path), out=str(tmp_path / "s")))
    assert {"train_dkt", "train_ce_masked"} <= set(metrics["history"][0])
    assert not any(k.startswith("train_teacher") for k in metrics["history"][0])
    owned = task_weights(read_checkpoint(tmp_path / "s" / "model.safetensors"))
    assert not any(k.startswith("teacher") for k in owned)  # the frozen teacher is not saved with the run
    with pytest.raises(TokenReduceError, match="needs a teacher"):
        train(TrainConfig(**base, task="eet(bits=8, teacher='frozen', ks=(1,))", out=str(tmp_path / "u")))
