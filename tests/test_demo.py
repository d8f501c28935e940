"""``tokenreduce demo --quick`` end to end (tiny model trained in seconds, 200 real Fashion-MNIST test
images), and that a second run reuses the trained checkpoint; the threads it runs on."""

from __future__ import annotations

import json
import os

import pytest
import torch
from conftest import Interrupted

import tokenreduce as tr
from tokenreduce.cli import main
from tokenreduce.commands import demo
from tokenreduce.data.fashion_mnist import SYSTEM_DIR

needs_fmnist = pytest.mark.skipif(not (SYSTEM_DIR / "train-images-idx3-ubyte.gz").is_file(),
                                  reason=f"Fashion-MNIST is not installed in {SYSTEM_DIR}")


@pytest.mark.parametrize(("argv", "want"), [([], None), (["--threads", "1"], 1)])
def test_demo_uses_the_cores_torch_has_whatever_the_load_average(tmp_path, monkeypatch, argv, want):
    if hasattr(os, "getloadavg"):  # a machine that looks busy: the demo must not care
        monkeypatch.setattr(os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    default = torch.get_num_threads()
    seen = {}

    def stop(quick: bool, threads: int, bed, *more):
        seen["threads"], seen["torch"] = threads, torch.get_num_threads()
        raise Interrupted

    monkeypatch.setattr(demo, "reference", stop)
    try:
        with pytest.raises(Interrupted):
            main(["demo", "--quick", "--out", str(tmp_path), *argv])
    finally:
        torch.set_num_threads(default)
    assert seen == {"threads": want or default, "torch": want or default}


@pytest.mark.slow  # two demo runs; fast: the same pipeline on the default test bed below
@needs_fmnist
def test_demo_quick_end_to_end_and_reuses_its_model(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TOKENREDUCE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "demo"
    assert main(["demo", "--testbed", "fmnist", "--quick", "--threads", "1", "--out", str(out)]) == 0
    printed, err = capsys.readouterr()
    data = json.loads((out / "results.json").read_text())
    rows = data["results"]
    assert rows[0]["kind"] == "unpatched" and rows[0]["top1_drop"] == 0.0
    methods = {r["method"] for r in rows[1:]}
    assert {"ctp", "evit", "imagepiece", "pitome", "random", "tome", "topk"} <= methods  # the training-free ones
    assert not any(tr.get_method(m).learned for m in methods)  # no learned one, each skipped with its reason:
    assert "dynamicvit" in data["budgets"]["skipped"] and "dynamicvit" in err
    assert set(tr.list_methods()) <= methods | set(data["budgets"]["skipped"])
    for name in methods:
        assert sorted(r["budget"] for r in rows if r["method"] == name) == [1.5, 2.0], name
    assert all(r["spec"] in printed for r in rows[1:])
    assert all(r["n_runs"] == 2 for r in rows if r["method"] == "random")
    assert data["provenance"]["quick"] is True and data["data"]["n"] == 200
    assert (out / "results.csv").is_file() and (out / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    vis = sorted(p.parent.name.split("_")[0] for p in (out / "visualize").rglob("image000.png"))
    assert vis == sorted(methods) and len(list((out / "visualize").rglob("*.png"))) == 2 * len(methods)

    ckpt = tmp_path / "cache" / "demo-quick-fashion_mnist" / "model.safetensors"
    stamp = ckpt.stat().st_mtime_ns
    assert main(["demo", "--testbed", "fmnist", "--quick", "--threads", "1", "--out", str(out), "--budgets", "1.5",
                 "--seeds", "0"]) == 0
    assert ckpt.stat().st_mtime_ns == stamp  # reused, not retrained


@pytest.mark.slow
@needs_fmnist
def test_demo_quick_on_the_scenes_draws_the_object(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TOKENREDUCE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "demo"
    assert main(["demo", "--testbed", "scenes", "--quick", "--threads", "1", "--out", str(out), "--budgets", "1.5",
                 "--seeds", "0"]) == 0
    data = json.loads((out / "results.json").read_text())
    assert data["data"]["name"] == "fmnist_scenes" and data["data"]["n"] == 200
    assert data["reference"]["model"]["kwargs"]["img_size"] == 56
    assert not list((tmp_path / "cache").rglob("scenes-*.npz"))  # a few hundred scenes: made on demand only
    drawn = {p.parent.name.split("_")[0] for p in (out / "visualize").rglob("image000.png")}
    assert drawn == {r["method"] for r in data["results"][1:]}  # one picture per method in the table
