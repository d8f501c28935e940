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
    argv = ["bench", *TINY, "--quick", "--threads", "1", "--match-random", "--out", str(out)]
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
        assert rows[spec]["ratio_vs_random"] > 0
    for row in data["results"]:
        for key in ("img_per_s", "latency_ms", "macs", "tokens_per_block", "speedup", "latency_speedup"):
            assert row[key] is not None, (row["label"], key)
        assert len(row["tokens_per_block"]) == 6 and len(row["img_per_s_runs"]) == 3
    assert rows["unpatched"]["speedup"] == 1.0
    assert rows["control tome(r=0)"]["macs"] == rows["unpatched"]["macs"]
    assert rows["tome(r=2)"]["macs"] < rows["unpatched"]["macs"]
    prov = data["provenance"]
    assert prov["threads"] == 1 and prov["batch_sizes"] == [4, 1] and "bench" in prov["command"]


def test_bench_loads_a_checkpoint(tmp_path, capsys):
    model = timm.create_model("test_vit", img_size=64)
    good, bad = tmp_path / "good.pth", tmp_path / "bad.pth"
    torch.save({"model": model.state_dict()}, good)
    sd = model.state_dict()
    sd.pop("head.weight")
    torch.save(sd, bad)
    assert main(["bench", *TINY, "--quick", "--repeats", "1", "--checkpoint", str(good)]) == 0
    capsys.readouterr()
    one_line_error(capsys, ["bench", *TINY, "--quick", "--checkpoint", str(bad)], "missing 1 keys (e.g. head.weight)")
    one_line_error(capsys, ["bench", *TINY, "--checkpoint", str(tmp_path / "none.pth")], "does not exist")


def test_inspect_prints_schedule_and_macs(capsys):
    assert main(["inspect", *TINY, "--method", "evit(keep=0.5, locs=(1, 3))"]) == 0
    out = capsys.readouterr().out
    assert "16 -> 9 -> 6 non-prefix tokens at blocks [1, 3] (attn)" in out
    assert "tokens     17 10 10 7 7 7" in out
    assert "MACs/image unpatched" in out and "ratio" in out and "1 token (cls)" in out


@pytest.mark.parametrize(("argv", "match"), [
    (["bench", "--model", "deit_smal", "--quick"], "close names: deit_small"),
    (["inspect", "--model", "deit_smal", "--method", "tome"], "unknown timm model"),
    (["bench", *TINY, "--quick", "--spec", "evit(keep="], "malformed spec"),
    (["bench", *TINY, "--quick", "--spec", "nosuch(r=1)"], "unknown method"),
    (["inspect", *TINY, "--method", "evit(locs=(3, 9))"], "beyond the model's depth 6"),
    (["inspect", *TINY, "--method", "tome(r=20)"], "too large"),
    (["bench", *TINY, "--quick", "--batch", "0"], "--batch"),
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
