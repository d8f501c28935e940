"""The command line speaks one vocabulary (commands/vocab.py) and answers ``--help`` without torch.

A flag a subcommand declares itself never takes the spelling of a vocabulary flag (those are tagged
by the ``add_*`` that declared them); old spellings fail with exit status 2 and one line naming the new one;
``tokenreduce --help`` and each ``tokenreduce CMD --help`` import no torch (which is what keeps them
well under a second; no test times them); ``inspect --checkpoint`` reads a tokenreduce checkpoint.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch

import tokenreduce
from tokenreduce.cli import COMMANDS, build_parser, main
from tokenreduce.commands import vocab

SRC = Path(tokenreduce.__file__).resolve().parents[1]


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def vocabulary(parsers: dict[str, argparse.ArgumentParser]) -> set[str]:
    """Every option string commands/vocab.py declares, in any command."""
    return {opt for p in parsers.values() for a in p._actions if getattr(a, vocab.TAG, False)
            for opt in a.option_strings}


def shadowing_flags(name: str, parser: argparse.ArgumentParser, shared: set[str]) -> list[str]:
    """Flags a command declares itself (not through commands/vocab.py) under a vocabulary flag's spelling."""
    return [f"{name} {opt}" for action in parser._actions for opt in action.option_strings
            if not getattr(action, vocab.TAG, False) and opt in shared]


def test_no_command_gives_a_vocabulary_flag_a_meaning_of_its_own():
    parsers = subparsers(build_parser())
    assert sorted(parsers) == sorted(COMMANDS)
    shared = vocabulary(parsers)
    shadowing = [s for name, p in parsers.items() for s in shadowing_flags(name, p, shared)]
    assert not shadowing, f"a command re-declares a vocabulary flag under its own meaning: {shadowing}"


def test_the_check_catches_a_shadowing_flag():
    parsers = subparsers(build_parser())
    p = parsers["train"]
    p.add_argument("--batch", type=int)  # bench's old spelling, declared by the vocabulary
    assert shadowing_flags("train", p, vocabulary(parsers)) == ["train --batch"]


def test_one_threads_default_in_every_command():
    for name, p in subparsers(build_parser()).items():
        for action in p._actions:
            if "--threads" in action.option_strings:
                assert action.default is None and vocab.THREADS_DEFAULT in action.help, name
    from tokenreduce.commands.checks import resolve_threads

    assert resolve_threads(None) == torch.get_num_threads() and resolve_threads(3) == 3


_HELP_PROBE = """
import json, sys
from tokenreduce.cli import COMMANDS, main
seen = {}
for argv in [["--help"], *[[c, "--help"] for c in COMMANDS]]:
    try:
        main(argv)
    except SystemExit:
        pass
    seen[" ".join(argv)] = {"torch": "torch" in sys.modules}
print(json.dumps(seen), file=sys.stderr)
"""


def test_help_imports_no_torch():
    """--help answers at once because it imports no torch (the cause, checked here, rather than a wall-clock
    threshold that a loaded machine would break)."""
    res = subprocess.run([sys.executable, "-c", _HELP_PROBE], capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
    seen = json.loads(res.stderr.strip().splitlines()[-1])
    assert len(seen) == len(COMMANDS) + 1 and "usage: tokenreduce" in res.stdout
    assert not [k for k, v in seen.items() if v["torch"]], f"--help imported torch: {seen}"


def test_the_package_imports_light_and_loads_the_api_on_use():
    probe = ("import sys, tokenreduce; light = 'torch' not in sys.modules\n"
             "from tokenreduce.core.method import list_methods\n"
             "from tokenreduce import apply, parse_spec\n"
             "print(light, len(list_methods()), callable(apply), parse_spec('tome(r=2)'))")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
    assert res.stdout.split()[:3] == ["True", str(len(tokenreduce.list_methods())), "True"], res.stdout
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        tokenreduce.nonsense  # noqa: B018
    assert set(tokenreduce.__all__) <= set(dir(tokenreduce))


@pytest.mark.parametrize(("argv", "new"), [
    (["inspect", "--model", "test_vit", "--method", "tome(r=2)"], "--method is now --spec"),
    (["bench", "--quick", "--batch", "4"], "--batch is now --batch-size"),
    (["bench", "--reference", "fmnist-vit"], "--reference is now --checkpoint"),
    (["bench", "--quick", "--out", "bench.json"], "--out is a folder (the command writes DIR/results.json)"),
    (["bench", "--checkpoint", "deit_small.pth"], "a timm state_dict goes to --weights PATH"),
    (["eval", "--checkpoint", "ref", "--batch", "4"], "--batch is now --batch-size"),
    (["eval", "--checkpoint", "ref", "--eval-batch", "16"], "--eval-batch is now --eval-batch-size"),
    (["eval", "--checkpoint", "ref", "--checkpoint", "tuned"], "fine-tuned checkpoints go to --finetuned PATH"),
    (["export", "--onnx", "m.onnx", "--batch", "2"], "--batch is now --batch-size"),
    (["export", "--onnx", "m.onnx", "--checkpoint", "m.pth"], "--checkpoint is a tokenreduce checkpoint"),
    (["demo", "--data", "scenes"], "--data is now --testbed"),
])
def test_an_old_spelling_fails_with_one_line_naming_the_new_one(argv, new, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"tokenreduce {argv[0]}: error: ") and new in err[0], err


def test_a_foreign_safetensors_given_as_checkpoint_names_weights(tmp_path, capsys):
    from safetensors.torch import save_file

    path = tmp_path / "timm.safetensors"
    save_file(timm.create_model("test_vit", img_size=64).state_dict(), path)
    assert main(["bench", "--checkpoint", str(path), "--quick"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a tokenreduce checkpoint" in err[0] and "--weights PATH" in err[0], err


MODEL = {"name": "vit_tiny_patch16_224",
         "kwargs": {"img_size": 28, "patch_size": 4, "in_chans": 1, "num_classes": 3, "embed_dim": 32, "depth": 4,
                    "num_heads": 2, "mlp_ratio": 2.0}}
LEARNED = "dynamicvit(keep=0.5, locs=(1, 2))"


@pytest.fixture
def tuned(tmp_path) -> Path:
    from tokenreduce.models import build_model, save_checkpoint

    torch.manual_seed(0)
    model = build_model(MODEL).eval()
    tokenreduce.apply(model, LEARNED)
    path = tmp_path / "tuned.safetensors"
    save_checkpoint(path, model, meta={"model": MODEL, "spec": LEARNED, "task": "classify", "epoch": 2, "step": 40,
                                       "classes": ["coat", "shirt", "bag"],
                                       "metrics": {"top1": 81.25, "loss": 0.5, "epochs": 2}})
    return path


def test_inspect_reads_a_tokenreduce_checkpoint(tuned, capsys):
    assert main(["inspect", "--checkpoint", str(tuned.parent)]) == 2  # a directory without model/last.safetensors
    capsys.readouterr()
    assert main(["inspect", "--checkpoint", str(tuned)]) == 0
    out = capsys.readouterr().out
    for want in (f"checkpoint {tuned}", "trained    vit_tiny_patch16_224 img_size 28", "task       classify",
                 "classes    3: coat, shirt, bag", "metrics    top1 81.25  loss 0.5  epochs 2  (epoch 2, step 40)",
                 "model      vit_tiny_patch16_224: 4 blocks, dim 32", "method     dynamicvit(",
                 "49 -> 24 -> 12 non-prefix tokens at blocks [1, 2]", "tokens     50 25 13 13"):
        assert want in out, (want, out)
    assert f"spec       {LEARNED}" in out and "reducer's own 0" not in out
    assert main(["inspect", "--checkpoint", str(tuned), "--spec", "tome(r=2)"]) == 0  # replaces its own spec
    out = capsys.readouterr().out
    assert "method     tome(r=2" in out and "tokens     48 46 44 42" in out and f"spec       {LEARNED}" in out


@pytest.mark.parametrize(("argv", "match"), [
    (["inspect"], "give --spec SPEC (with --model or --hf-config) or --checkpoint PATH"),
    (["inspect", "--checkpoint", "CKPT", "--model", "test_vit"], "--checkpoint brings its own model; leave out"),
    # the default model's name typed is still a model given (it was taken for "no --model")
    (["inspect", "--checkpoint", "CKPT", "--model", "deit_small_patch16_224"], "--checkpoint brings its own model"),
    (["inspect", "--hf-config", "vit-tiny", "--model", "deit_small_patch16_224", "--spec", "tome(r=1)"],
     "give a timm --model or a transformers --hf-config, not both"),
])
def test_inspect_refuses_what_it_cannot_read(argv, match, tuned, capsys):
    assert main([str(tuned) if a == "CKPT" else a for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0], err


def test_list_names_every_recipe(capsys):
    from tokenreduce.train.recipes import RECIPES

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "recipes (tokenreduce train --recipe):" in out
    assert all(f"\n  {name}\n" in out for name in RECIPES)
