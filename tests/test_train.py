"""Training: the loss goes down, exact resume after an interruption, fine-tuning a reduced model with
distillation, auxiliary losses reach the loop, the CLI."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import Interrupted, default_sigint, stop_at, wait_for
from torch import Tensor

import tokenreduce
from tokenreduce import TokenReduceError
from tokenreduce.cli import main
from tokenreduce.data.fashion_mnist import make_synthetic
from tokenreduce.methods.random import RandomPrune
from tokenreduce.models import build_model
from tokenreduce.tasks import TaskContext, build_task
from tokenreduce.train import load_model, read_checkpoint
from tokenreduce.train.loop import HOLD_ENV, TrainConfig, WarmupCosine, make_model, seed_all, train

TINY = {"name": "vit_tiny_patch16_224",
        "kwargs": {"img_size": 28, "patch_size": 7, "embed_dim": 32, "depth": 2, "num_heads": 2, "in_chans": 1,
                   "num_classes": 10}}
TINY_FLAGS = ["--model", "vit_tiny_patch16_224", "--img-size", "28", "--patch-size", "7", "--dim", "32", "--depth",
              "2", "--heads", "2", "--in-chans", "1"]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(make_synthetic(tmp_path_factory.mktemp("fmnist"), n_train=64, n_test=32))


def tiny_config(data: str, out: Path | None = None, **kw) -> TrainConfig:
    base = dict(model=TINY, data=data, epochs=2, batch_size=16, lr=3e-3, warmup_epochs=0.5,
                out=str(out) if out else None, threads=1, quiet=True, deterministic=True)
    return TrainConfig(**{**base, **kw})


def _no_time(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "time_s"} for row in history]


def test_training_lowers_the_loss(data: str) -> None:
    metrics = train(tiny_config(data, epochs=6, batch_size=8, augment="none"))
    losses = [row["train_loss"] for row in metrics["history"]]
    assert losses[-1] < losses[0] - 0.3, losses
    assert metrics["top1"] > 30 and metrics["steps"] == 6 * 8 and metrics["n_eval"] == 32  # chance: 10


def test_warmup_cosine() -> None:
    f = WarmupCosine(warmup=4, total=20, min_ratio=0.01)
    assert f(0) == 0.25 and f(3) == 1.0 and math.isclose(f(20), 0.01) and f(10) < f(5)


def test_resume_equals_uninterrupted_run(data: str, tmp_path: Path) -> None:
    # drop_path makes the model consume the global RNG, so the RNG state must be restored too
    model = {**TINY, "kwargs": {**TINY["kwargs"], "drop_path_rate": 0.1}}
    cfg = tiny_config(data, tmp_path / "a", model=model, epochs=3, ckpt_every=3)
    full = train(cfg)
    cut = dataclasses.replace(cfg, out=str(tmp_path / "b"))
    with pytest.raises(Interrupted):
        train(cut, on_step=stop_at(7))  # after the mid-epoch checkpoint at step 6
    assert read_checkpoint(tmp_path / "b" / "last.safetensors").meta["step"] == 6
    with pytest.raises(tokenreduce.TokenReduceError, match="unfinished run"):
        train(cut)
    resumed = train(dataclasses.replace(cut, resume=True))
    assert _no_time(resumed["history"]) == _no_time(full["history"])
    a, b = read_checkpoint(tmp_path / "a").weights, read_checkpoint(tmp_path / "b").weights
    assert all(torch.equal(a[k], b[k]) for k in a)
    # a finished run is reused, not retrained
    assert train(cut)["reused"] is True


@pytest.mark.slow  # three CLI processes; test_resume_equals_uninterrupted_run covers exact resume in-process
def test_resume_after_sigkill(data: str, tmp_path: Path) -> None:
    flags = [*TINY_FLAGS, "--data", data, "--epochs", "4", "--batch-size", "16", "--lr", "3e-3", "--ckpt-every",
             "1", "--threads", "1", "--deterministic", "--quiet", "--drop-path", "0.1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # HOLD_ENV: the run checkpoints at step 7 (mid-epoch) and waits there, so the kill lands at a known state
    proc = subprocess.Popen([sys.executable, "-m", "tokenreduce.cli", "train", *flags, "--out", str(tmp_path / "k")],
                            env={**env, HOLD_ENV: f"7:{tmp_path / 'held'}"}, preexec_fn=default_sigint)
    try:
        wait_for(tmp_path / "held", proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not (tmp_path / "k" / "model.safetensors").exists()
    assert read_checkpoint(tmp_path / "k" / "last.safetensors").meta["step"] == 7
    rc = subprocess.run([sys.executable, "-m", "tokenreduce.cli", "train", *flags, "--out", str(tmp_path / "k"),
                         "--resume"], env=env).returncode
    assert rc == 0
    assert main(["train", *flags, "--out", str(tmp_path / "ref")]) == 0
    a, b = read_checkpoint(tmp_path / "ref").weights, read_checkpoint(tmp_path / "k").weights
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_finetune_reduced_model_with_distillation(data: str, tmp_path: Path) -> None:
    train(tiny_config(data, tmp_path / "teacher", epochs=1))
    teacher = str(tmp_path / "teacher" / "model.safetensors")
    cfg = tiny_config(data, tmp_path / "student", epochs=1, init=teacher, spec="evit(keep=0.5, locs=(1,))",
                      teacher=teacher, distill=("logits", "tokens"))
    metrics = train(cfg)
    row = metrics["history"][-1]
    assert {"train_ce", "train_distill_logits", "train_distill_tokens"} <= set(row)
    model, meta = load_model(tmp_path / "student")
    assert meta["spec"].startswith("evit(") and tokenreduce.get_info(model).spec == meta["spec"]
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


def test_learned_reducer_trains_through_the_generic_loop(data: str, tmp_path: Path) -> None:
    """DynamicViT: predictors learn from CE + its ratio loss + logit and token distillation, with no
    method branch in the loop; the fine-tuned checkpoint carries the predictors."""
    train(tiny_config(data, tmp_path / "teacher", epochs=1))
    teacher = str(tmp_path / "teacher" / "model.safetensors")
    spec = "dynamicvit(keep=0.5, locs=(0,))"
    kw = dict(epochs=1, init=teacher, spec=spec, teacher=teacher, distill=("logits", "tokens"))
    row = train(tiny_config(data, tmp_path / "student", **kw))["history"][-1]
    assert {"train_ce", "train_aux/ratio", "train_distill_logits", "train_distill_tokens"} <= set(row)
    seed_all(0)  # the loop seeds before building the model: this rebuilds its initial predictors
    initial = {k: v for k, v in make_model(tiny_config(data, None, **kw))[0].state_dict().items()
               if k.startswith("tokenreduce.")}
    model, meta = load_model(tmp_path / "student")
    assert meta["spec"] == tokenreduce.get_info(model).spec
    learned = {k: v for k, v in model.state_dict().items() if k.startswith("tokenreduce.")}
    assert learned.keys() == initial.keys() and learned
    assert any(not torch.equal(learned[k], initial[k]) for k in learned), "the predictors did not learn"


def test_bad_training_settings_are_clear_errors(data: str) -> None:
    for kw, words in [({"lr": 0.0}, "lr must be a finite number > 0"), ({"lr": math.inf}, "got inf"),
                      ({"lr": math.nan}, "got nan"), ({"epochs": 0}, "epochs must be >= 1"),
                      ({"batch_size": 0}, "batch size"), ({"label_smoothing": 1.0}, "label smoothing")]:
        with pytest.raises(TokenReduceError, match=words):
            tiny_config(data, None, **kw)


class _AuxRandom(RandomPrune):
    """A learned-looking reducer that emits an auxiliary loss (a stand-in for DynamicViT's)."""

    def bind(self, host):
        self.w = torch.nn.Parameter(torch.ones(()))
        return super().bind(host)

    def reduce(self, x: Tensor, state, info, count: int) -> Tensor:
        state.aux_losses["ratio"] = (self.w - 2).pow(2)
        return super().reduce(x, state, info, count)


def test_task_returns_named_losses_including_aux() -> None:
    torch.manual_seed(0)
    model = build_model(TINY)
    tokenreduce.apply(model, _AuxRandom(RandomPrune.Config(keep=0.5, locs=(1,))))
    task = build_task("classify")
    task.bind(model, TaskContext(label_smoothing=0.1))
    out = task(torch.randn(4, 1, 28, 28), torch.tensor([0, 1, 2, 3]))
    assert set(out.losses) == {"ce", "aux/ratio"} and out.logits.shape == (4, 10) and set(out.stats) == {"acc"}
    sum(out.losses.values()).backward()
    assert model.tokenreduce.w.grad is not None  # the loop's single backward reaches the reducer


def test_cli_train_and_errors(data: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out, results = tmp_path / "cli", tmp_path / "res.json"
    rc = main(["train", *TINY_FLAGS, "--data", data, "--epochs", "1", "--batch-size", "16", "--quiet", "--threads",
               "1", "--out", str(out), "--results", str(results)])
    assert rc == 0 and (out / "model.safetensors").exists() and (out / "metrics.json").exists()
    record = json.loads(results.read_text())
    assert record["command"].startswith("tokenreduce train") and "top1" in record["metrics"]
    capsys.readouterr()
    assert main(["train", *TINY_FLAGS, "--data", data, "--spec", "evit(keep=", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tokenreduce train: error:") and len(err.splitlines()) == 1
    assert main(["train", *TINY_FLAGS, "--data", data]) == 2  # no --out
    assert main(["train", "--recipe", "nope"]) == 2
    assert main(["train", *TINY_FLAGS, "--data", str(tmp_path / "none"), "--out", str(tmp_path / "y")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_task_that_ignores_auxiliary_predictions_refuses_them(data: str) -> None:
    """Cropr's routers learn only through the auxiliary heads the task scores: under a task that
    scores none (hash) they would silently not train, so the loop stops at the first step."""
    with pytest.raises(TokenReduceError, match=r"task 'hash' does not score the auxiliary predictions.*classify"):
        train(tiny_config(data, epochs=1, task="hash(bits=8)", spec="cropr(r=2, classes=10)"))
