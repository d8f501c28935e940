"""The task contract, for every registered task on a tiny model and synthetic Fashion-MNIST: one
step reaches every task parameter, checkpoints hold the task's own tensors, a resumed run ends
bit-identical, evaluation reports the primary metric. Also: optimizers, parameter groups, specs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from conftest import Interrupted, stop_at

import tokenreduce
from tokenreduce import SpecError, TokenReduceError
from tokenreduce.cli import main
from tokenreduce.core.method import Reducer, format_spec
from tokenreduce.data import data_config_from_model
from tokenreduce.data.fashion_mnist import make_synthetic
from tokenreduce.models import build_model, load_model, read_checkpoint, task_weights
from tokenreduce.tasks import Task, TaskContext, build_task, dataset_labels, get_task, list_tasks
from tokenreduce.train.config import TrainConfig
from tokenreduce.train.loop import _check_groups, train

TINY = {"name": "vit_tiny_patch16_224",
        "kwargs": {"img_size": 28, "patch_size": 7, "embed_dim": 32, "depth": 2, "num_heads": 2, "in_chans": 1,
                   "num_classes": 10}}
TINY_FLAGS = ["--model", "vit_tiny_patch16_224", "--img-size", "28", "--patch-size", "7", "--dim", "32", "--depth",
              "2", "--heads", "2", "--in-chans", "1"]
TASKS = list_tasks()


def example_spec(name: str) -> str:
    return format_spec(name, get_task(name).example)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(make_synthetic(tmp_path_factory.mktemp("fmnist"), n_train=128, n_test=32))


def tiny_config(data: str, out: Path | None, **kw) -> TrainConfig:
    base = dict(model=TINY, data=data, epochs=2, batch_size=8, subset=64, lr=3e-3, warmup_epochs=0.5, ckpt_every=3,
                out=str(out) if out else None, threads=1, quiet=True, deterministic=True)
    return TrainConfig(**{**base, **kw})


def bound(spec: str, data: str, model_spec: str | None = None) -> tuple[Task, torch.utils.data.Dataset]:
    """A task bound to a fresh tiny model (as the loop binds it), and its training set."""
    torch.manual_seed(0)
    model = build_model(TINY).train()
    if model_spec:
        tokenreduce.apply(model, model_spec)
    task = build_task(spec)
    ds = task.dataset(data, "train", train=True, **data_config_from_model(model))
    task.bind(model, TaskContext(classes=list(ds.classes), label_smoothing=0.1, train_labels=dataset_labels(ds)))
    return task.train(), ds


def _no_time(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "time_s"} for row in history]


def _interrupted_and_resumed(cfg: TrainConfig, tmp_path: Path) -> tuple[dict, dict]:
    """(metrics of an uninterrupted run in tmp/a, of a run stopped after step 5 and resumed in tmp/b)."""
    full = train(dataclasses.replace(cfg, out=str(tmp_path / "a")))
    cut = dataclasses.replace(cfg, out=str(tmp_path / "b"))
    with pytest.raises(Interrupted):
        train(cut, on_step=stop_at(5))  # after the checkpoint at step 3 (and 4 where an epoch has 4 steps)
    assert 3 <= read_checkpoint(tmp_path / "b" / "last.safetensors").meta["step"] < 5
    return full, train(dataclasses.replace(cut, resume=True))


# ----------------------------------------------------------------------------- the contract, per task


@pytest.mark.parametrize("name", TASKS)
def test_one_step_reaches_every_task_parameter(name: str, data: str) -> None:
    task, ds = bound(example_spec(name), data)
    loader = torch.utils.data.DataLoader(ds, batch_size=8)
    images, targets = next(iter(loader))
    out = task(images, targets)
    assert out.losses and all(v.dim() == 0 for v in out.losses.values())
    assert all(isinstance(float(v), float) for v in (out.stats or {}).values())
    sum(out.losses.values()).backward()
    params = {n: p for n, p in task.named_parameters() if p.requires_grad}
    missing = [n for n, p in params.items() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing, f"{name}: no (finite) gradient for {missing[:5]}"
    groups = task.param_groups(1e-3, 0.05)
    _check_groups(task, groups)  # the optimizer covers every trainable parameter exactly once
    assert sum(len(g["params"]) for g in groups) == len(params)


@pytest.mark.parametrize("name", TASKS)
def test_checkpoint_resume_and_metric(name: str, data: str, tmp_path: Path) -> None:
    spec = example_spec(name)
    task = get_task(name)
    owned = set(bound(spec, data)[0].owned_state_dict())
    full, resumed = _interrupted_and_resumed(tiny_config(data, None, task=spec), tmp_path)
    # the evaluator reports the task's primary metric, in the final metrics and every history row
    assert isinstance(full[task.metric], float) and full["metric"] == task.metric
    assert all(task.metric in row for row in full["history"])
    assert _no_time(resumed["history"]) == _no_time(full["history"])
    for path in ("a/model.safetensors", "a/last.safetensors", "b/model.safetensors"):
        ckpt = read_checkpoint(tmp_path / path)
        assert set(task_weights(ckpt)) == owned, f"{path} holds other task tensors than the task owns"
        assert ckpt.meta["task"] == build_task(spec).spec()
    a, b = read_checkpoint(tmp_path / "a").weights, read_checkpoint(tmp_path / "b").weights
    assert a.keys() == b.keys() and {f"task.{k}" for k in owned} <= set(a)
    assert all(torch.equal(a[k], b[k]) for k in a), "a resumed run ends with other weights"
    load_model(tmp_path / "a")  # the model config recorded is the model trained (whatever bind did to it)


def test_init_from_a_run_of_the_same_task_starts_its_tensors(data: str, tmp_path: Path) -> None:
    owning = [n for n in TASKS if bound(example_spec(n), data)[0].owned_state_dict()]
    if not owning:
        pytest.skip("no registered task owns tensors")
    spec = example_spec(owning[0])
    train(tiny_config(data, tmp_path / "first", task=spec, epochs=1, subset=16))
    first = task_weights(read_checkpoint(tmp_path / "first"))
    # a second run from it, at a negligible learning rate: its task tensors start from the first run's
    train(tiny_config(data, tmp_path / "second", task=spec, epochs=1, subset=16, model=None, lr=1e-12, min_lr=0.0,
                      init=str(tmp_path / "first")))
    second = task_weights(read_checkpoint(tmp_path / "second"))
    assert first.keys() == second.keys()
    assert all(torch.allclose(first[k].float(), second[k].float(), atol=1e-6) for k in first)


# ----------------------------------------------------------------------------- optimizers and groups


def test_sgd_with_momentum_resumes_exactly(data: str, tmp_path: Path) -> None:
    cfg = tiny_config(data, None, optimizer="sgd", momentum=0.8, lr=0.05)
    full, resumed = _interrupted_and_resumed(cfg, tmp_path)
    last = read_checkpoint(tmp_path / "a" / "last.safetensors")
    names = list(last.state)
    assert any("momentum_buffer" in k for k in names) and not any("exp_avg" in k for k in names)
    assert {g["momentum"] for g in last.header["optimizer"]["param_groups"]} == {0.8}
    assert _no_time(resumed["history"]) == _no_time(full["history"])
    a, b = read_checkpoint(tmp_path / "a").weights, read_checkpoint(tmp_path / "b").weights
    assert all(torch.equal(a[k], b[k]) for k in a)


LEARNED = "dynamicvit(keep=0.5, locs=(0,))"  # a reducer with parameters (its predictors)


def test_backbone_lr_scale_groups(data: str) -> None:
    task, _ = bound("classify(backbone_lr=0.01)", data, model_spec=LEARNED)
    reducer = {id(p) for m in task.modules() if isinstance(m, Reducer) for p in m.parameters()}
    assert reducer, "the reducer has no parameters"
    groups = task.param_groups(1e-3, 0.05)
    _check_groups(task, groups)
    for g in groups:
        want = {1.0 if id(p) in reducer else 0.01 for p in g["params"]}
        assert want == {g["lr_scale"]}
    assert {g["lr_scale"] for g in groups} == {0.01, 1.0}
    assert {g["weight_decay"] for g in groups} == {0.0, 0.05}


def test_the_loop_applies_lr_scale(data: str, tmp_path: Path) -> None:
    cfg = tiny_config(data, tmp_path, task="classify(backbone_lr=0.01)", spec=LEARNED, epochs=1, lr=2e-3)
    train(cfg)
    groups = read_checkpoint(tmp_path / "last.safetensors").header["optimizer"]["param_groups"]
    assert sorted({(g["lr_scale"], g["initial_lr"]) for g in groups}) == [(0.01, 2e-3 * 0.01), (1.0, 2e-3)]


def test_param_groups_must_cover_every_parameter(data: str) -> None:
    task, _ = bound("classify", data)
    groups = task.param_groups(1e-3, 0.05)
    with pytest.raises(TokenReduceError, match="every trainable parameter"):
        _check_groups(task, groups[:-1])
    with pytest.raises(TokenReduceError, match="repeated"):
        _check_groups(task, [*groups, groups[0]])


# ----------------------------------------------------------------------------- specs, configs, CLI


def test_task_specs() -> None:
    assert "classify" in TASKS and build_task("classify").spec() == build_task("classify()").spec()
    assert TrainConfig(task="classify").task == build_task("classify").spec()  # stored canonically
    with pytest.raises(SpecError, match="valid tasks: " + ", ".join(TASKS)):
        build_task("nope")
    with pytest.raises(SpecError, match="valid parameters: backbone_lr"):
        build_task("classify(bits=3)")
    with pytest.raises(SpecError, match="backbone_lr must be > 0"):
        build_task("classify(backbone_lr=0)")
    with pytest.raises(TokenReduceError, match="unknown optimizer 'adam'; choose from adamw, sgd"):
        TrainConfig(optimizer="adam")


def test_configs_written_before_tasks_still_read() -> None:
    old = {k: v for k, v in TrainConfig(model=TINY).to_dict().items() if k not in ("task", "optimizer", "momentum")}
    cfg = TrainConfig.from_dict({**old, "extra": {}})
    assert cfg.identity() == TrainConfig(model=TINY).identity()
    with pytest.raises(TokenReduceError, match="unknown training settings"):
        TrainConfig.from_dict({**old, "extra": {"x": 1}})


def test_cli_task_and_optimizer(data: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    common = [*TINY_FLAGS, "--data", data, "--epochs", "1", "--batch-size", "8", "--subset", "32", "--quiet",
              "--threads", "1"]
    assert main(["train", *common, "--task", "nope(x=1)", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tokenreduce train: error:") and len(err.splitlines()) == 1 and "classify" in err
    assert main(["train", *common, "--task", "classify(backbone_lr=0.5)", "--optimizer", "sgd", "--momentum", "0.5",
                 "--out", str(tmp_path / "ok")]) == 0
    assert capsys.readouterr().out.startswith("top1 ")
    meta = read_checkpoint(tmp_path / "ok").meta
    assert meta["task"] == "classify(backbone_lr=0.5)"
    assert (meta["config"]["optimizer"], meta["config"]["momentum"]) == ("sgd", 0.5)


def test_cli_stem_and_transforms_are_recorded_and_reload(data: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    common = [*TINY_FLAGS, "--data", data, "--epochs", "1", "--batch-size", "8", "--subset", "16", "--quiet",
              "--threads", "1"]
    assert main(["train", *common, "--stem", "nope", "--out", str(tmp_path / "x")]) == 2
    assert "valid stems" in capsys.readouterr().err
    assert main(["train", *common, "--patch-size", "4", "--stem", "conv", "--transform", "tie_qk(init='q')",
                 "--out", str(tmp_path / "ok")]) == 0
    meta = read_checkpoint(tmp_path / "ok").meta["model"]
    assert meta["stem"] == "conv(norm='bn')" and meta["transforms"] == ["tie_qk(init='q')"]
    model, _ = load_model(tmp_path / "ok")
    attn = model.blocks[0].attn
    assert type(model.patch_embed.proj).__name__ == "ConvStem" and type(attn.qkv).__name__ == "TiedQKV"
