"""The ``bench`` and ``inspect`` commands end to end on a tiny timm ViT (test_vit at 64x64: 16 patches,
6 blocks, dim 64). Only the structure of the output is checked, never a speed."""

from __future__ import annotations

import json

import pytest
import timm
import torch

from tokenreduce.cli import main

TINY = ["--model", "test_vit", "--img-size", "64"]
SPECS = ["evit(keep=0.7, locs=(1, 3))", "tome(r=2)", "ctp()"]


def one_line_error(capsys, argv: list[str], match: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    errors = [line for line in err.splitlines() if "error" in line]
    assert "Traceback" not in err and len(errors) == 1 and errors[0] == err.splitlines()[-1], err
    assert errors[0].startswith(f"tokenreduce {argv[0]}: error: ") and match in errors[0], err


def test_bench_end_to_end_writes_every_spec(tmp_path, capsys):
    out = tmp_path / "results.json"
    argv = ["bench", *TINY, "--quick", "--threads", "1", "--match-random", "--out", str(tmp_path)]
    for spec in SPECS:
        argv += ["--spec", spec]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    rows = {r["label"]: r for r in data["results"]}
    assert [r["kind"] for r in data["results"]][:2] == ["unpatched", "control"]
    for spec in SPECS:
        assert spec in rows and f"random~{spec}" in rows and spec in printed
        assert rows[f"random~{spec}"]["tokens_per_block"] == rows[spec]["tokens_per_block"]
        assert rows[spec]["ratio_vs_random"] > 0 and rows[spec]["latency_vs_random"] > 0
    assert "lat vs random" in printed
    for row in data["results"]:
        for key in ("img_per_s", "latency_ms", "macs", "tokens_per_block", "speedup", "latency_speedup"):
            assert row[key] is not None, (row["label"], key)
        assert len(row["tokens_per_block"]) == 6 and len(row["img_per_s_runs"]) == 3
    assert rows["unpatched"]["speedup"] == 1.0
    assert rows["control tome(r=0)"]["macs"] == rows["unpatched"]["macs"]
    assert rows["tome(r=2)"]["macs"] < rows["unpatched"]["macs"]
    prov = data["provenance"]
    assert prov["threads"] == 1 and prov["batch_sizes"] == [4, 1] and "bench" in prov["command"]


def test_bench_stem_counts_and_times_the_stem_against_the_plain_model(tmp_path, capsys):
    """--stem conv: the model with the conv stem, unreduced and with each spec, beside the plain rows; their MACs
    are the plain rows' plus the stem's, their tokens the same, their speed-ups against the plain unpatched model."""
    from tokenreduce.bench.macs import count_macs
    from tokenreduce.models import build_stem

    spec = "tome(r=2)"
    assert main(["bench", *TINY, "--quick", "--threads", "1", "--spec", spec, "--stem", "conv",
                 "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    rows = {r["label"]: r for r in data["results"]}
    stem, tuned = rows["stem conv(norm='bn')"], rows[f"{spec} [stem conv(norm='bn')]"]
    plain = timm.create_model("test_vit", img_size=64)
    extra = count_macs(build_stem("conv", timm.create_model("test_vit", img_size=64))).total - count_macs(plain).total
    assert extra > 0 and stem["macs"] == rows["unpatched"]["macs"] + extra
    assert tuned["macs"] == rows[spec]["macs"] + extra
    assert tuned["tokens_per_block"] == rows[spec]["tokens_per_block"] and stem["kind"] == "stem"
    assert data["settings"]["stem"] == "conv(norm='bn')" and rows["unpatched"]["speedup"] == 1.0
    assert stem["speedup"] > 0 and f"{spec} [stem conv(norm='bn')]" in capsys.readouterr().out
    one_line_error(capsys, ["bench", *TINY, "--quick", "--stem", "hexagon"], "valid stems")
    one_line_error(capsys, ["bench", *TINY, "--quick", "--spec", "topk(keep=0.5, locs=(1,)) + llf()",
                            "--match-random"], "brings tokens back (LLF)")


def test_bench_loads_a_checkpoint(tmp_path, capsys):
    model = timm.create_model("test_vit", img_size=64)
    good, bad = tmp_path / "good.pth", tmp_path / "bad.pth"
    torch.save({"model": model.state_dict()}, good)
    sd = model.state_dict()
    sd.pop("head.weight")
    torch.save(sd, bad)
    assert main(["bench", *TINY, "--quick", "--repeats", "1", "--weights", str(good)]) == 0
    capsys.readouterr()
    one_line_error(capsys, ["bench", *TINY, "--quick", "--weights", str(bad)], "missing 1 keys (e.g. head.weight)")
    one_line_error(capsys, ["bench", *TINY, "--weights", str(tmp_path / "none.pth")], "does not exist")


def test_inspect_prints_schedule_and_macs(capsys):
    assert main(["inspect", *TINY, "--spec", "evit(keep=0.5, locs=(1, 3))"]) == 0
    out = capsys.readouterr().out
    assert "16 -> 9 -> 6 non-prefix tokens at blocks [1, 3] (attn)" in out
    assert "tokens     17 10 10 7 7 7" in out
    assert "MACs/image unpatched" in out and "ratio" in out and "1 token (cls)" in out


@pytest.mark.parametrize(("argv", "match"), [
    (["bench", "--model", "deit_smal", "--quick"], "close names: deit_small"),
    (["inspect", "--model", "deit_smal", "--spec", "tome"], "unknown timm model"),
    (["bench", *TINY, "--quick", "--spec", "evit(keep="], "malformed spec"),
    (["bench", *TINY, "--quick", "--spec", "nosuch(r=1)"], "unknown method"),
    (["inspect", *TINY, "--spec", "evit(locs=(3, 9))"], "beyond the model's depth 6"),
    (["inspect", *TINY, "--spec", "tome(r=(1, 2))"], "r has 2 entries"),
    (["bench", *TINY, "--quick", "--batch-size", "0"], "--batch-size"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, match):
    one_line_error(capsys, argv, match)


def test_list_names_every_registered_method_and_task(capsys):
    from tokenreduce import list_methods
    from tokenreduce.tasks import get_task, list_tasks

    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    specs = [line.strip() for line in lines if line.startswith("  ") and not line.startswith("    ")]
    for name in list_methods() + list_tasks():
        assert any(s == name or s.startswith(f"{name}(") for s in specs), name
    for name in list_tasks():
        assert any(line.strip().startswith(f"metric {get_task(name).metric};") for line in lines), name


@pytest.mark.slow  # the compiled graphs themselves: tests/test_compile.py (one graph per method, eager outputs)
def test_bench_backend_compile_times_every_case_compiled(tmp_path, capsys, monkeypatch):
    import functools

    # dynamo's capture with its 'eager' backend: the same runners and guards as inductor, without
    # the code generation (tens of seconds per graph on 2 cores); inductor itself: tests/test_compile.py
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    out = tmp_path / "results.json"
    assert main(["bench", *TINY, "--quick", "--batch-size", "1", "--repeats", "2", "--threads", "1", "--backend",
                 "compile", "--spec", "tome(r=2)", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert "backend compile" in printed and data["provenance"]["backend"] == "compile"
    assert [r["backend"] for r in data["results"]] == ["compile"] * 3
    assert data["results"][0]["speedup"] == 1.0 and all(r["speedup"] > 0 for r in data["results"])


@pytest.mark.slow
def test_bench_backend_onnxruntime_runs_exported_files(monkeypatch):
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed: pip install 'tokenreduce[export]'")
    pytest.importorskip("onnxscript", reason="onnxscript is not installed: pip install 'tokenreduce[export]'")
    from tokenreduce.bench import backends, measure_speed
    from tokenreduce.bench.speed import Case

    runs = []
    real = backends._OnnxRunner.__call__
    monkeypatch.setattr(backends._OnnxRunner, "__call__", lambda self, x: runs.append(x.shape) or real(self, x))
    model = timm.create_model("test_vit", img_size=32, depth=2).eval()
    res = measure_speed(model, [Case("tome", "tome(r=1)")], batch=1, warmup=1, repeats=2, min_run_s=0.0,
                        backend="onnxruntime", threads=1)
    assert [r.label for r in res] == ["unpatched", "tome"] and {r.backend for r in res} == {"onnxruntime"}
    assert res[0].speedup == 1.0 and res[1].speedup > 0 and len(res[1].img_per_s_runs) == 2
    assert len(runs) == 2 * 3 * 2  # every forward went through onnxruntime: 2 cases, 3 rounds, batch B and 1


@pytest.mark.parametrize(("argv", "match"), [
    (["--backend", "onnxruntime", "--dtype", "bfloat16"], "float32 on the CPU"),
])
def test_bench_backend_errors(capsys, argv, match):
    one_line_error(capsys, ["bench", *TINY, "--quick", *argv], match)


def test_bench_times_the_model_of_a_tokenreduce_checkpoint(tmp_path, capsys, monkeypatch):
    from tokenreduce.models import build_model, save_checkpoint

    cfg = {"name": "vit_tiny_patch16_224", "kwargs": {"img_size": 28, "patch_size": 7, "in_chans": 1,
                                                      "embed_dim": 32, "depth": 2, "num_heads": 2, "num_classes": 10}}
    ckpt = tmp_path / "ref.safetensors"
    save_checkpoint(ckpt, build_model(cfg), meta={"model": cfg, "spec": None})
    out = tmp_path / "results.json"
    assert main(["bench", "--checkpoint", str(ckpt), "--quick", "--repeats", "1", "--spec", "tome(r=2)",
                 "--out", str(tmp_path)]) == 0
    data = json.loads(out.read_text())
    assert data["model"]["reference"] == str(ckpt) and data["model"]["img_size"] == [28, 28]
    assert data["results"][-1]["tokens_per_block"] == [15, 13]
    assert "vit_tiny_patch16_224  28x28" in capsys.readouterr().out
    one_line_error(capsys, ["bench", "--checkpoint", str(ckpt), "--model", "test_vit"], "leave out --model")
    monkeypatch.setenv("TOKENREDUCE_CACHE", str(tmp_path / "cache"))
    one_line_error(capsys, ["bench", "--checkpoint", "fmnist-vit", "--quick"], "no trained fmnist-vit checkpoint")



def test_the_bench_command_and_a_studys_bench_build_one_request(monkeypatch, capsys):
    """The command builds the library's BenchRequest from its flags, the request a study builds from a declared
    bench (study/grid.py), and runs it through bench.compare.run_bench: the same model, specs and settings make
    the same request."""
    from tokenreduce.bench import compare
    from tokenreduce.study.declare import Timing, get_study

    made = []

    def run_bench(request, **where):
        made.append(request)
        return {"model": {"name": "test_vit", "img_size": [64, 64]}, "provenance": {}, "results": []}

    monkeypatch.setattr(compare, "run_bench", run_bench)
    assert main(["bench", *TINY, "--spec", "tome(r=2)", "--match-random", "--threads", "1", "--quick"]) == 0
    bench = Timing("tiny", model={"name": "test_vit", "kwargs": {"img_size": 64}}, specs=("tome(r=2)",),
                   settings={"match_random": True, "batch": 4, "warmup": 1, "repeats": 3, "min_run_s": 0.0})
    declared = compare.BenchRequest(**get_study("deit_bench")().bench_run(bench), argv=made[0].argv)
    defaults = {"backend": "eager", "compile_mode": "default", "dtype": "float32", "seed": 0}
    assert made == [compare.BenchRequest(**{**vars(declared), "speed": {**defaults, **declared.speed}})]
