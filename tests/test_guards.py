"""No silent failures: what a newcomer's mistakes and accidents must produce.

Two runs into one --out (the second is refused; a killed run leaves no stale lock), --resume with
settings that contradict the run's (refused, naming them; runtime ones change and are reported),
Ctrl-C (one line, exit 130, the exact --resume command for a training), outputs that cannot be
written and bad --threads / --device / --budgets (refused before any work), a non-finite loss or
metric (the run fails, naming it; JSON stays strict), bench --checkpoint of nothing, the FX-trace
refusal's reason; and a bug of ours keeps its traceback instead of passing for bad input.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch
from conftest import Interrupted, default_sigint, stop_at, wait_for

import tokenreduce
from tokenreduce import TokenReduceError
from tokenreduce.bench import compare, evaluation
from tokenreduce.bench import export as bench_export
from tokenreduce.bench.budgets import find_budgets
from tokenreduce.bench.report import write_json
from tokenreduce.cli import main
from tokenreduce.commands import demo
from tokenreduce.data.fashion_mnist import make_synthetic
from tokenreduce.models import build_model, save_checkpoint
from tokenreduce.tasks.classify import Classify
from tokenreduce.train import lock
from tokenreduce.train.loop import HOLD_ENV, TrainConfig, train

TINY = {"name": "vit_tiny_patch16_224",
        "kwargs": {"img_size": 28, "patch_size": 7, "embed_dim": 32, "depth": 2, "num_heads": 2, "in_chans": 1,
                   "num_classes": 10}}
TINY_FLAGS = ["--model", "vit_tiny_patch16_224", "--img-size", "28", "--patch-size", "7", "--dim", "32", "--depth",
              "2", "--heads", "2", "--in-chans", "1", "--num-classes", "10", "--batch-size", "16", "--threads", "1",
              "--quiet"]
BENCH = ["--model", "test_vit", "--img-size", "64", "--quick"]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(make_synthetic(tmp_path_factory.mktemp("fmnist"), n_train=64, n_test=32))


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    """A tiny untrained classification checkpoint (28x28 grayscale, 49 patches, depth 4)."""
    cfg = {"name": "vit_tiny_patch16_224", "kwargs": {"img_size": 28, "patch_size": 4, "in_chans": 1, "num_classes": 10,
                                                      "embed_dim": 32, "depth": 4, "num_heads": 2}}
    torch.manual_seed(0)
    path = tmp_path / "ref.safetensors"
    save_checkpoint(path, build_model(cfg).eval(), meta={"model": cfg, "spec": None, "data": {"name": "fashion_mnist"}})
    return path


def tiny_config(data: str, out: Path | None = None, **kw) -> TrainConfig:
    base = dict(model=TINY, data=data, epochs=2, batch_size=16, lr=3e-3, warmup_epochs=0.5,
                out=str(out) if out else None, threads=1, quiet=True)
    return TrainConfig(**{**base, **kw})


def one_line(capsys: pytest.CaptureFixture, argv: list[str], match: str, rc: int = 2) -> str:
    """Run ``argv``: exit status ``rc``, no traceback, and one message line (the last on stderr, after any
    progress lines) naming the command and holding ``match``."""
    try:
        got = main(argv)
    except KeyboardInterrupt:  # escaping Ctrl-C would end the whole test session
        pytest.fail("Ctrl-C escaped the command")
    err = capsys.readouterr().err.strip().splitlines()
    messages = [line for line in err if line.startswith(f"tokenreduce {argv[0]}: ")]
    assert got == rc and messages == err[-1:] and not any("Traceback" in line for line in err), err
    assert match in messages[0], err
    return messages[0]


def _never(*args, **kwargs):
    raise AssertionError("the command started working before checking its flags")


# ----------------------------------------------------------------------------- one run per --out, Ctrl-C


@pytest.mark.slow
def test_second_run_into_one_out_is_refused_and_ctrl_c_prints_the_resume_command(data, tmp_path, capsys):
    """The run holds after step 6 (HOLD_ENV: a checkpoint there, then it waits for Ctrl-C), so the second run
    and the SIGINT meet it at a known state whatever the machine's load."""
    out, held = tmp_path / "run", tmp_path / "held"
    flags = [*TINY_FLAGS, "--data", data, "--epochs", "3", "--ckpt-every", "1", "--eval-every", "0",
             "--out", str(out)]
    env = {**os.environ, HOLD_ENV: f"6:{held}"}
    proc = subprocess.Popen([sys.executable, "-m", "tokenreduce.cli", "train", *flags], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, preexec_fn=default_sigint)
    try:
        wait_for(held, proc)
        one_line(capsys, ["train", *flags], f"in use by another training run (pid {proc.pid} on ")
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=600)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130 and not stdout, (stdout, stderr)
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"tokenreduce train: interrupted after step 6, saved in {out / 'last.safetensors'}; continue with: "), stderr
    assert not (out / "model.safetensors").exists()
    assert tokenreduce.train.read_meta(out / "last.safetensors")["step"] == 6  # saved where it stopped
    command = shlex.split(lines[0].split("; continue with: ")[1])
    assert command[:2] == ["tokenreduce", "train"] and "--resume" in command
    assert main(command[1:]) == 0  # the lock died with the process: nothing stale to refuse
    assert tokenreduce.train.read_meta(out / "model.safetensors")["step"] == 3 * 4


def test_a_killed_holder_leaves_no_stale_lock(data, tmp_path):
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import sys\nfrom tokenreduce.train.lock import hold\n"
                               "with hold(sys.argv[1]):\n    print('held', flush=True)\n    sys.stdin.read()",
                               str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"  # holds the lock until its stdin closes or it is killed
        with pytest.raises(TokenReduceError, match=f"{out} is in use by another training run \\(pid {holder.pid} on"):
            train(tiny_config(data, out, epochs=1))
    finally:
        holder.kill()
        holder.wait()
    assert "checkpoint" in train(tiny_config(data, out, epochs=1))
    with lock.hold(out):  # released at the end of the run
        pass


@pytest.mark.parametrize("argv", [
    ["eval", "--checkpoint", "CKPT", "--spec", "tome(r=2)"],
    ["bench", *BENCH],
    ["demo", "--quick"],
])
def test_ctrl_c_in_other_commands_is_one_line_and_exit_130(argv, ckpt, tmp_path, monkeypatch, capsys):
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    for module, name in [(evaluation, "load_reference"), (compare, "make_model"), (demo, "reference")]:
        monkeypatch.setattr(module, name, interrupt)
    argv = [str(ckpt) if a == "CKPT" else a for a in argv]
    out = ["--out", str(tmp_path / "out")]
    one_line(capsys, [*argv, *out], f"tokenreduce {argv[0]}: interrupted", rc=130)


# ----------------------------------------------------------------------------- --resume keeps the run's settings


def test_resume_refuses_contradicting_flags_and_applies_runtime_ones(data, tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(Interrupted):
        train(tiny_config(data, out, ckpt_every=1), on_step=stop_at(3))
    base = [*TINY_FLAGS, "--data", data, "--epochs", "2", "--lr", "3e-3", "--warmup-epochs", "0.5", "--out", str(out)]
    err = one_line(capsys, ["train", *base, "--resume", "--epochs", "1", "--lr", "0.5"], "--resume continues")
    assert "--epochs 1 (the run has 2)" in err and "--lr 0.5 (the run has 0.003)" in err
    assert not (out / "model.safetensors").exists()
    # the directory alone resumes it with its own settings; a runtime flag changes and is reported
    assert main(["train", "--out", str(out), "--resume", "--threads", "2"]) == 0
    assert "with threads 2 (was 1)" in capsys.readouterr().err
    # a finished run is not reused under contradicting settings either
    one_line(capsys, ["train", *base, "--resume", "--epochs", "3"], "--epochs 3 (the run has 2)")


# ----------------------------------------------------------------------------- non-finite numbers


def test_a_nan_metric_fails_the_run_and_nothing_records_it(data, tmp_path, capsys, monkeypatch):
    real = Classify.evaluate

    def diverged(self, *args, **kwargs):
        return {**real(self, *args, **kwargs), "loss": float("nan")}

    monkeypatch.setattr(Classify, "evaluate", diverged)
    out = tmp_path / "run"
    err = one_line(capsys, ["train", *TINY_FLAGS, "--data", data, "--epochs", "1", "--out", str(out), "--results",
                            str(tmp_path / "res.json")], "training diverged: test loss nan in the evaluation after "
                                                         "epoch 1")
    assert "lower --lr" in err
    assert not (out / "model.safetensors").exists() and not (out / "metrics.json").exists()
    assert not (tmp_path / "res.json").exists()


def test_a_non_finite_loss_names_the_loss_and_the_step(data):
    with pytest.raises(TokenReduceError, match=r"training diverged: ce loss (nan|inf).* at step 2 \(epoch 1\)"):
        train(tiny_config(data, lr=1e30, warmup_epochs=0.0, min_lr=0.0, grad_clip=None, epochs=3))


def test_results_json_is_strict_with_non_finite_values_as_null(tmp_path):
    path = write_json(tmp_path / "r.json", {"a": float("nan"), "b": [float("inf"), -float("inf"), 1.5]})
    assert json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"bare {c}")) == {
        "a": None, "b": [None, None, 1.5]}


# ----------------------------------------------------------------------------- flags checked before any work


@pytest.mark.parametrize(("argv", "match"), [
    (["train", "--threads", "0"], "--threads must be >= 1, got 0"),
    (["train", "--device", "tpu9"], "unknown device 'tpu9'; use cpu, cuda, cuda:N or mps"),
    (["train", "--device", "cuda:99"], "device 'cuda:99' requested but torch sees"),
    (["train", "--out", "FILE/run"], "cannot write to the output directory"),
    (["train", "--results", "FILE/res.json"], "--results"),
])
def test_train_flags_are_checked_first(argv, match, data, tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("a file, not a folder")
    monkeypatch.setattr(Classify, "bind", _never)
    argv = [a.replace("FILE", str(tmp_path / "file")) for a in argv]
    out = [] if "--out" in argv else ["--out", str(tmp_path / "run")]
    one_line(capsys, [argv[0], *TINY_FLAGS, "--data", data, "--epochs", "1", *out, *argv[1:]], match)


@pytest.mark.parametrize(("argv", "match"), [
    (["eval", "--checkpoint", "CKPT", "--threads", "0"], "--threads must be >= 1"),
    (["eval", "--checkpoint", "CKPT", "--out", "FILE/out"], "cannot be written (a file is in the way)"),
    (["eval", "--checkpoint", "CKPT", "--budgets", "1"], "must be > 1"),
    (["eval", "--checkpoint", "CKPT", "--budgets", "inf"], "must be > 1"),
    (["bench", *BENCH, "--threads", "0"], "--threads must be >= 1"),
    (["bench", *BENCH, "--device", "nonsense"], "unknown device 'nonsense'"),
    (["bench", *BENCH, "--out", "FILE/r"], "cannot be written (a file is in the way)"),
    (["demo", "--quick", "--threads", "0"], "--threads must be >= 1"),
    (["demo", "--quick", "--out", "FILE/demo"], "cannot be written"),
    (["demo", "--quick", "--budgets", "0.9"], "must be > 1"),
    (["export", "--model", "test_vit", "--img-size", "64", "--onnx", "FILE/m.onnx"], "its folder"),
    (["visualize", "--checkpoint", "CKPT", "--spec", "tome(r=2)", "--out", "FILE/v"], "cannot be written"),
])
def test_output_and_resource_flags_are_checked_before_any_work(argv, match, ckpt, tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("a file, not a folder")
    for module, name in [(evaluation, "load_reference"), (tokenreduce.models, "make_model"), (compare, "make_model"),
                         (demo, "reference"), (bench_export, "load_for_export"),
                         (tokenreduce.models, "load_model")]:
        monkeypatch.setattr(module, name, _never)
    argv = [str(ckpt) if a == "CKPT" else a.replace("FILE", str(tmp_path / "file")) for a in argv]
    one_line(capsys, argv, match)


def test_unreachable_budgets_are_refused_and_tables_show_the_picks_speed_up(ckpt, tmp_path, capsys):
    data = make_synthetic(tmp_path / "fmnist", n_train=32, n_test=32)
    fast = ["--checkpoint", str(ckpt), "--data", str(data), "--methods", "evit,tome", "--seeds", "0", "--threads",
            "1", "--repeats", "1", "--warmup", "0", "--batch-size", "4", "--eval-batch-size", "16"]
    err = one_line(capsys, ["eval", *fast, "--budgets", "100", "--out", str(tmp_path / "x")],
                   "no training-free method reaches 100x on this model")
    assert "choose --budgets up to" in err and not (tmp_path / "x" / "results.json").exists()
    # 3x: beyond evit's strongest candidate (2.21x MACs), within tome's (2.86x); evit's row shows what it gives
    assert main(["eval", *fast, "--budgets", "3", "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    rows = json.loads((tmp_path / "out" / "results.json").read_text())["results"]
    evit = next(r for r in rows if r["method"] == "evit")
    assert evit["budget"] == 3.0 and evit["budget_speedup"] == pytest.approx(evit["macs_speedup"])
    assert evit["budget_speedup"] < 3 / 1.15
    line = next(li for li in printed.splitlines() if li.startswith(evit["label"]))
    assert f" {evit['budget_speedup']:.2f}x " in line and " 3x " not in printed


def test_find_budgets_refuses_a_target_no_method_reaches():
    torch.manual_seed(0)
    model = timm.create_model("test_vit", img_size=64).eval()
    with pytest.raises(TokenReduceError, match=r"no training-free method reaches 100x .* strongest candidate"):
        find_budgets(model, ["evit", "tome"], [1.5, 100.0])
    with pytest.raises(TokenReduceError, match="must be > 1"):
        find_budgets(model, ["evit"], [float("nan")])


def test_bench_checkpoint_that_is_neither_a_path_nor_a_recipe(tmp_path, capsys):
    err = one_line(capsys, ["bench", "--checkpoint", str(tmp_path / "does/not/exist"), "--quick"],
                   "no such file or directory, and not a recipe name")
    assert "fmnist-vit-smoke" in err


# ----------------------------------------------------------------------------- the real reasons


def test_fx_tracing_is_refused_for_what_it_is():
    model = timm.create_model("test_vit", img_size=64).eval()
    tokenreduce.apply(model, "tome(r=2)")
    with pytest.raises(TokenReduceError, match="torch.fx symbolic tracing .* cannot follow a token-reduced forward"):
        torch.fx.symbolic_trace(model)
    assert model(torch.zeros(1, 3, 64, 64)).shape == (1, 1000)  # untouched by the refused trace


@pytest.mark.parametrize(("target", "argv"), [
    ("tokenreduce.models.build.build_model", ["bench", *BENCH]),  # a bug while building the model
    ("torch.load", ["bench", *BENCH, "--weights", "CKPT_PTH"]),  # a bug while reading a state_dict
    ("tokenreduce.models.checkpoint.st_load", ["eval", "--checkpoint", "CKPT", "--spec", "tome(r=2)"]),  # reading
])
def test_a_bug_of_ours_keeps_its_traceback(target, argv, ckpt, tmp_path, monkeypatch, capsys):
    """Only the user-error family becomes the one-line exit-2 message: an internal error (here a
    KeyError injected where a wrapper used to catch everything) surfaces as itself."""
    pth = tmp_path / "sd.pth"
    torch.save(timm.create_model("test_vit", img_size=64).state_dict(), pth)
    argv = [str(ckpt) if a == "CKPT" else str(pth) if a == "CKPT_PTH" else a for a in argv]

    def bug(*args, **kwargs):
        raise KeyError("a bug of ours")

    module, name = target.rsplit(".", 1)
    monkeypatch.setattr(f"{module}.{name}", bug)
    with pytest.raises(KeyError, match="a bug of ours"):
        main([*argv, "--out", str(tmp_path / "out")])
    assert "error:" not in capsys.readouterr().err


def test_the_cli_turns_only_project_errors_into_one_line(monkeypatch, capsys):
    from tokenreduce.commands import list as list_command

    def raises(error: Exception):
        def run(args):
            raise error
        return run

    monkeypatch.setattr(list_command, "run", raises(AssertionError("internal")))  # register reads it anew
    with pytest.raises(AssertionError, match="internal"):
        main(["list"])
    monkeypatch.setattr(list_command, "run", raises(TokenReduceError("bad input")))
    one_line(capsys, ["list"], "tokenreduce list: error: bad input")
