"""``tokenreduce eval`` / ``visualize``, the eval engine and the budget rule, on a tiny untrained ViT
checkpoint (28x28 grayscale, 49 patches, depth 4, dim 32) and a few real Fashion-MNIST test images
(or synthetic ones in its file format). Only structure and invariants are checked, never a speed
or an accuracy level; a task's metric must equal that task's own evaluation of the same model."""

from __future__ import annotations

import csv
import json
import math

import pytest
import torch

import tokenreduce
from tokenreduce.bench.accuracy import EvalCase, evaluate_cases, is_stochastic, with_seed
from tokenreduce.bench.budgets import candidates, find_budgets, fit_exponent, in_band, training_free
from tokenreduce.bench.settings import BAND
from tokenreduce.cli import main
from tokenreduce.data import data_config_from_model
from tokenreduce.data.fashion_mnist import CLASSES, SYSTEM_DIR, make_synthetic
from tokenreduce.models import build_model, save_checkpoint
from tokenreduce.tasks import TaskContext, build_task

MODEL = {"name": "vit_tiny_patch16_224",
         "kwargs": {"img_size": 28, "patch_size": 4, "in_chans": 1, "num_classes": 10, "embed_dim": 32, "depth": 4,
                    "num_heads": 2, "mlp_ratio": 2.0}}
LEARNED = "dynamicvit(keep=0.5, locs=(1, 2))"
FAST = ["--subset", "48", "--threads", "1", "--repeats", "1", "--warmup", "0", "--batch-size", "4",
        "--eval-batch-size", "16"]
needs_fmnist = pytest.mark.skipif(not (SYSTEM_DIR / "t10k-images-idx3-ubyte.gz").is_file(),
                                  reason=f"Fashion-MNIST is not installed in {SYSTEM_DIR}")


def tiny_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(MODEL).eval()


@pytest.fixture
def ckpt(tmp_path):
    path = tmp_path / "ref.safetensors"
    save_checkpoint(path, tiny_model(), meta={"model": MODEL, "spec": None, "data": {"name": "fashion_mnist"}})
    return path


def one_line_error(capsys, argv: list[str], match: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith(f"tokenreduce {argv[0]}: error: ") and match in err[-1], err
    assert not any("Traceback" in line for line in err)


# ----------------------------------------------------------------------------- eval command


@needs_fmnist
def test_eval_writes_json_csv_png_with_every_spec(tmp_path, ckpt, capsys):
    tuned = tmp_path / "tuned.safetensors"
    model = tiny_model(1)
    tokenreduce.apply(model, LEARNED)  # a learned reducer: its weights live in the checkpoint
    save_checkpoint(tuned, model, meta={"model": MODEL, "spec": LEARNED, "config": {"seed": 7}})
    specs = ["tome(r=4)", "random(keep=0.5, locs=(1, 2))"]
    out = tmp_path / "out"
    argv = ["eval", "--checkpoint", str(ckpt), "--finetuned", str(tuned), "--budgets", "1.5,2",
            "--methods", "evit,topk", "--seeds", "0,1", "--out", str(out), *FAST]
    for s in specs:
        argv += ["--spec", s]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    data = json.loads((out / "results.json").read_text())
    rows = data["results"]
    labels = [r["label"] for r in rows]
    assert rows[0]["kind"] == "unpatched" and rows[0]["top1_drop"] == 0.0 and rows[0]["speedup"] == 1.0
    for s in specs:
        assert s in labels and s in printed
    assert {r["method"] for r in rows if r["budget"]} == {"evit", "topk"}
    assert sorted(r["budget"] for r in rows if r["method"] == "evit") == [1.5, 2.0]
    tuned_row = next(r for r in rows if r["kind"] == "fine-tuned")
    assert tuned_row["checkpoints"] == [str(tuned)] and tuned_row["seeds"] == [7]
    assert tuned_row["method"] == "dynamicvit" and tuned_row["speedup"] is not None
    rnd = rows[labels.index(specs[1])]
    assert rnd["n_runs"] == 2 and rnd["seeds"] == [0, 1] and rnd["top1_std"] is not None
    assert rows[labels.index("tome(r=4)")]["top1_std"] is None
    for r in rows:
        for key in ("top1", "top1_drop", "macs", "img_per_s", "latency_ms", "speedup", "tokens_per_block", "spec"):
            assert key in r, (r["label"], key)
        assert r["macs"] > 0 and len(r["tokens_per_block"]) == 4 and 0 <= r["top1"] <= 100
        assert math.isclose(r["top1_drop"], rows[0]["top1"] - r["top1"])
        if r["kind"] != "unpatched":
            assert r["macs"] < rows[0]["macs"]
    prov = data["provenance"]
    assert prov["threads"] == 1 and prov["seeds"] == [0, 1] and "eval" in prov["command"] and prov["torch"]
    assert data["data"]["n"] == 48 and data["data"]["of"] == 10000
    with open(out / "results.csv") as f:
        table = list(csv.DictReader(f))
    assert [r["label"] for r in table] == labels and table[0]["top1_drop"] == "0.0"
    assert (out / "pareto.png").read_bytes()[:4] == b"\x89PNG"


@needs_fmnist
@pytest.mark.slow  # exports two models; fast: test_cli_bench times every case on onnxruntime
def test_eval_times_every_row_on_the_chosen_backend(tmp_path, ckpt, capsys, monkeypatch):
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed: pip install 'tokenreduce[export]'")
    pytest.importorskip("onnxscript", reason="onnxscript is not installed: pip install 'tokenreduce[export]'")
    from tokenreduce.bench import backends

    runs = []
    real = backends._OnnxRunner.__call__
    monkeypatch.setattr(backends._OnnxRunner, "__call__", lambda self, x: runs.append(x.shape) or real(self, x))
    out = tmp_path / "out"
    spec = "topk(keep=0.5, locs=(1, 2))"
    assert main(["eval", "--checkpoint", str(ckpt), "--spec", spec, "--backend", "onnxruntime", "--out", str(out),
                 *FAST]) == 0
    assert "backend onnxruntime" in capsys.readouterr().out
    data = json.loads((out / "results.json").read_text())
    assert data["provenance"]["backend"] == "onnxruntime" and data["provenance"]["onnxruntime"]
    assert data["speed"]["backend"] == "onnxruntime"
    assert [r["label"] for r in data["results"]] == ["unpatched", spec]
    assert all(r["speedup"] > 0 for r in data["results"])
    # every timed forward went through onnxruntime: 2 cases, 1 round, batch 4 and batch 1
    assert sorted(shape[0] for shape in runs) == [1, 1, 4, 4]


@needs_fmnist
def test_eval_errors_are_one_line(tmp_path, ckpt, capsys):
    one_line_error(capsys, ["eval", "--checkpoint", str(tmp_path / "missing.safetensors"), "--spec", "tome(r=2)"],
                   "does not exist")
    one_line_error(capsys, ["eval", "--checkpoint", str(ckpt), "--spec", "tome(r=2)", "--data",
                            str(tmp_path / "nodata"), *FAST], "does not exist")
    one_line_error(capsys, ["eval", "--checkpoint", str(ckpt), "--spec", LEARNED, *FAST],
                   "learned parameters")
    one_line_error(capsys, ["eval", "--checkpoint", str(ckpt), "--spec", "dynamicvit()", *FAST],
                   "learned parameters")  # its default locs (block 8) do not fit this model: the real refusal first
    one_line_error(capsys, ["eval", "--checkpoint", str(ckpt), "--spec", "tome(r=", *FAST], "malformed spec")
    one_line_error(capsys, ["eval", "--checkpoint", str(ckpt), "--budgets", "0.5", *FAST], "must be > 1")


def save_task_checkpoint(path, task_spec: str, spec: str | None = None, seed: int = 0) -> dict:
    """A tiny model and ``task_spec`` bound to it, saved as the loop saves them: the model config as
    bound (a task may drop the classifier), the task's own tensors under ``task.``, meta['task'].
    Every owned float tensor is moved off its initial value, so only a loaded copy reproduces it.
    Returns the model and the bound task."""
    model = tiny_model(seed)
    if spec:
        tokenreduce.apply(model, spec)
    task = build_task(task_spec)
    task.bind(model, TaskContext(classes=list(CLASSES), seed=seed))
    with torch.no_grad():
        for v in task.owned_state_dict().values():
            if v.is_floating_point():
                v.mul_(-3.0).add_(0.5)
    config = {**MODEL, "kwargs": {**MODEL["kwargs"], "num_classes": model.num_classes}}
    save_checkpoint(path, model, task_state=task.owned_state_dict(),
                    meta={"model": config, "spec": spec, "task": task.spec(), "classes": list(CLASSES),
                          "config": {"seed": seed}, "data": {"name": "fashion_mnist"}})
    return {"model": model.eval(), "task": task.eval()}


@pytest.mark.parametrize(("task_spec", "metric"), [("hash(bits=8, ks=(1, 5))", "map"), ("segment", "miou")])
def test_eval_reports_the_checkpoints_task_metric_with_its_own_weights(tmp_path, capsys, task_spec, metric):
    data = make_synthetic(tmp_path / "fmnist", n_train=40, n_test=32)
    ref = save_task_checkpoint(tmp_path / "ref.safetensors", task_spec)
    tuned = save_task_checkpoint(tmp_path / "tuned.safetensors", task_spec, spec="tome(r=4)", seed=1)
    out = tmp_path / "out"
    assert main(["eval", "--checkpoint", str(tmp_path / "ref.safetensors"), "--finetuned",
                 str(tmp_path / "tuned.safetensors"), "--spec", "topk(keep=0.5, locs=(1,))", "--data", str(data),
                 "--out", str(out), *FAST]) == 0
    printed = capsys.readouterr().out
    rows = json.loads((out / "results.json").read_text())["results"]
    assert [r["kind"] for r in rows] == ["unpatched", "training-free", "fine-tuned"]
    assert metric in printed.splitlines()[1].split() and "top1 %" not in printed
    for row, made in ((rows[0], ref), (rows[2], tuned)):  # the reference's and the fine-tuned task weights
        task, model = made["task"], made["model"]
        kw = {"data_dir": str(data), **data_config_from_model(model)}
        want = task.evaluate(model, task.dataset("fashion_mnist", "test", train=False, **kw), batch_size=16,
                             database=task.dataset("fashion_mnist", "train", train=False, **kw))
        assert row["metric"] == metric and row["task"] == build_task(task_spec).spec()
        assert row["value"] == row[metric] == pytest.approx(want[metric]), row["label"]
        assert row["metrics"] and all(v == pytest.approx(want[k]) for k, v in row["metrics"].items())
        figures = {p.name for p in task.plot(want, tmp_path / "figures")}
        assert all((out / name).read_bytes()[:4] == b"\x89PNG" for name in figures)  # the task's own figures
    for r in rows:
        assert r["drop"] == r[f"{metric}_drop"] == pytest.approx(rows[0][metric] - r[metric])
        assert "top1_drop" not in r and 0 <= r[metric] <= 100
    with open(out / "results.csv") as f:
        assert next(csv.DictReader(f))["metric"] == metric


def test_eval_adds_default_budgets_only_when_nothing_else_is_asked(tmp_path, ckpt, capsys):
    data = make_synthetic(tmp_path / "fmnist", n_train=40, n_test=32)
    tuned = tmp_path / "tuned.safetensors"
    save_checkpoint(tuned, tiny_model(1), meta={"model": MODEL, "spec": "tome(r=4)", "config": {"seed": 1}})
    base = ["eval", "--checkpoint", str(ckpt), "--data", str(data), *FAST, "--methods", "topk"]
    for more, kinds in (([], ["unpatched", "training-free", "training-free"]),
                        (["--finetuned", str(tuned)], ["unpatched", "fine-tuned"]),
                        (["--finetuned", str(tuned), "--budgets", "2"], ["unpatched", "training-free", "fine-tuned"])):
        out = tmp_path / f"out{len(more)}"
        assert main([*base, *more, "--out", str(out)]) == 0
        capsys.readouterr()
        assert [r["kind"] for r in json.loads((out / "results.json").read_text())["results"]] == kinds, more


def test_eval_match_random_adds_the_random_pruner_at_each_specs_token_counts(tmp_path, ckpt, capsys):
    data = make_synthetic(tmp_path / "fmnist", n_train=20, n_test=16)
    out = tmp_path / "out"
    spec = "topk(keep=0.5, locs=(1, 2))"
    assert main(["eval", "--checkpoint", str(ckpt), "--data", str(data), *FAST, "--spec", spec, "--spec",
                 "random(keep=0.5, locs=(1,))", "--match-random", "--seeds", "0,1", "--out", str(out)]) == 0
    capsys.readouterr()
    rows = {r["label"]: r for r in json.loads((out / "results.json").read_text())["results"]}
    matched = rows[f"random~{spec}"]
    assert matched["tokens_per_block"] == rows[spec]["tokens_per_block"]
    assert matched["method"] == "random" and len(matched["runs"]) == 2  # one run per seed
    assert not any(label.startswith("random~random") for label in rows)  # a random row is its own match


def test_eval_refuses_a_fine_tuned_checkpoint_of_another_task(tmp_path, capsys):
    data = make_synthetic(tmp_path / "fmnist", n_train=20, n_test=12)
    save_task_checkpoint(tmp_path / "ref.safetensors", "classify")
    save_task_checkpoint(tmp_path / "hash.safetensors", "hash(bits=8)", spec="tome(r=4)")
    one_line_error(capsys, ["eval", "--checkpoint", str(tmp_path / "ref.safetensors"), "--finetuned",
                            str(tmp_path / "hash.safetensors"), "--data", str(data), *FAST],
                   "must share the reference's task")


def test_eval_times_a_fine_tune_with_another_stem_on_its_own_model(tmp_path, ckpt, capsys):
    """A fine-tune of the reference with the conv stem swapped in is scored, counted and timed with its stem:
    its MACs exceed the same spec's on the reference by the stem's, and its row says which stem; a checkpoint
    of an unrelated model is refused naming both."""
    from tokenreduce.bench.macs import count_macs
    from tokenreduce.models import ModelSource, make_model, model_config

    data = make_synthetic(tmp_path / "fmnist", n_train=20, n_test=12)
    spec = "tome(r=4)"
    conv = make_model(ModelSource(checkpoint=str(ckpt), config={**MODEL, "stem": "conv"}, spec=spec)).model
    save_checkpoint(tmp_path / "conv.safetensors", conv,
                    meta={"model": model_config(MODEL, stem="conv"), "spec": spec, "data": {"name": "fashion_mnist"}})
    out = tmp_path / "eval"
    assert main(["eval", "--checkpoint", str(ckpt), "--spec", spec, "--finetuned", str(tmp_path / "conv.safetensors"),
                 "--data", str(data), "--out", str(out), *FAST]) == 0
    rows = {r["label"]: r for r in json.loads((out / "results.json").read_text())["results"]}
    tuned = rows["tome(r=4, prop_attn=True) [stem conv(norm='bn'), fine-tuned x1]"]
    plain = rows[spec]
    patched = tokenreduce.apply(tiny_model(), spec)
    stem_macs = count_macs(conv).total - count_macs(patched).total
    assert stem_macs > 0 and tuned["macs"] == plain["macs"] + stem_macs
    assert tuned["macs_speedup"] < plain["macs_speedup"] and tuned["img_per_s"] > 0
    other = {**MODEL, "kwargs": {**MODEL["kwargs"], "depth": 2}}
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "other.safetensors", build_model(other), meta={"model": other, "spec": None})
    one_line_error(capsys, ["eval", "--checkpoint", str(ckpt), "--finetuned", str(tmp_path / "other.safetensors"),
                            "--data", str(data), *FAST], "or it with another stem or added transforms")


# ----------------------------------------------------------------------------- engine


def test_evaluate_cases_puts_unpatched_first_and_seeds_only_stochastic():
    model = tiny_model()
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(12, 1, 28, 28, generator=g), torch.randint(0, 10, (12,),
                                                                                                  generator=g))
    cases = [EvalCase("t", "tome(r=3)"), EvalCase("r", "random(keep=0.5, locs=(1,))")]
    speed = {"batch": 2, "warmup": 0, "repeats": 1, "min_run_s": 0.0}
    rows = evaluate_cases(model, data, cases, seeds=(3, 4, 5), eval_batch=5, speed=speed)
    assert [r["label"] for r in rows] == ["unpatched", "t", "r"]
    assert all(r["metric"] == "top1" and r["value"] == r["top1"] and r["drop"] == r["top1_drop"] for r in rows)
    assert rows[0]["metrics"]["n"] == 12 and rows[2]["value_std"] == rows[2]["top1_std"] is not None
    assert rows[1]["n_runs"] == 1 and rows[1]["seeds"] is None
    assert rows[2]["seeds"] == [3, 4, 5] and [run["spec"] for run in rows[2]["runs"]][0].endswith("seed=3)")
    assert not hasattr(model, "_tokenreduce_patch")


def test_seed_helpers():
    assert is_stochastic("random(keep=0.5, locs=(1,))") and not is_stochastic("tome(r=2)")
    assert with_seed("random(keep=0.5, locs=(1,), seed=0)", 4) == "random(keep=0.5, locs=(1,), seed=4)"


# ----------------------------------------------------------------------------- budgets


def test_learned_methods_are_not_training_free():
    model = tiny_model()
    assert tokenreduce.get_method("dynamicvit").learned and not tokenreduce.get_method("tome").learned
    free, skipped = training_free(model)
    assert "dynamicvit" in skipped and {"tome", "evit", "topk", "ctp", "random"} <= set(free)


@pytest.mark.parametrize("rule", ["macs", "measured"])
def test_budget_picks_are_monotone_in_the_target(rule):
    model = tiny_model()
    targets = [1.2, 1.5, 2.0, 2.5]
    free, _ = training_free(model)
    speed = {"batch": 2, "warmup": 0, "repeats": 1, "min_run_s": 0.0}
    picks = find_budgets(model, free, targets, rule=rule, speed=speed)
    for name in free:
        mine = [p for p in picks if p.method == name]
        assert mine and [p.target for p in mine] == sorted(p.target for p in mine)
        macs = [p.macs_speedup for p in mine]
        assert macs == sorted(macs) and len(set(macs)) == len(macs), (name, mine)
    assert not hasattr(model, "_tokenreduce_patch")


def test_macs_rule_picks_the_nearest_candidate():
    model = tiny_model()
    for name in ("tome", "evit", "ctp"):
        cs = candidates(model, name)
        ratios = [c.macs_speedup for c in cs]
        assert ratios == sorted(ratios) and ratios[0] > 1.0
        (pick,) = find_budgets(model, [name], [1.5])
        assert abs(math.log(pick.macs_speedup / 1.5)) == min(abs(math.log(r / 1.5)) for r in ratios)


def test_fit_exponent_is_the_median_slope_through_one_and_refuses_a_falling_one():
    assert fit_exponent([(x, x**0.7) for x in (1.2, 1.6, 2.4)]) == pytest.approx((0.7, 0.7, 0.7))
    assert fit_exponent([(1.2, 0.9), (2.0, 0.8)]) is None  # slower the more it removes: nothing to fit
    assert fit_exponent([(0.95, 1.1)]) is None  # removes no MACs: says nothing about the exponent
    assert fit_exponent([(1.5, 1.9), (2.0, 2.6)]) == (1.0, 1.0, 1.0)  # faster than the MACs ratio: noise, capped
    # two rounds of five slowed 3x by other work move the quartiles, not the median
    low, mid, high = fit_exponent([(2.0, 2.0**0.5)] * 3 + [(2.0, 3 * 2.0**0.5), (2.0, 2.0**0.5 / 3)])
    assert mid == pytest.approx(0.5) and low <= mid <= high
    # a reading that cannot be a speed-up (no valid round) is left out, not fitted
    assert fit_exponent([(1.5, 1.5**0.5), (2.0, float("nan")), (3.0, 0.0)]) == pytest.approx((0.5, 0.5, 0.5))


# A 12-block, 196-patch ViT (the scene reference's shape) with a tiny width: fine families, cheap MACs.
WIDE = {"name": "vit_tiny_patch16_224",
        "kwargs": {"img_size": 56, "patch_size": 4, "in_chans": 1, "num_classes": 10, "embed_dim": 24, "depth": 12,
                   "num_heads": 2, "mlp_ratio": 2.0}}
#: the fake machine's true speed-up of a spec: its MACs ratio ** this, per method
EXPONENTS = {"tome": 0.6, "evit": 0.8, "topk": 1.0}


def speed_table(model: torch.nn.Module, noise: int | None, rounds: int = 5):
    """A Timer (bench/budgets.py) for ``model`` that knows each spec's true speed-up (``truth``) and,
    with a ``noise`` seed, reads it as a busy machine would: every round off by a log-normal 5%, and two
    rounds of every spec hit by other work that slows the spec or the unpatched model 1.5x to 3x."""
    macs = {c.spec: c.macs_speedup for name in EXPONENTS for c in candidates(model, name)}

    def truth(spec: str) -> float:
        return macs[spec] ** EXPONENTS[tokenreduce.build_reducer(spec).name]

    def timer(specs):
        gen = torch.Generator().manual_seed(noise or 0)
        out = {}
        for spec in specs:
            jitter = torch.exp(0.05 * torch.randn(rounds, generator=gen)) if noise is not None else torch.ones(rounds)
            if noise is not None:
                hit = torch.randperm(rounds, generator=gen)[:2]
                burst = 1.5 + 1.5 * torch.rand(2, generator=gen)
                sign = torch.where(torch.rand(2, generator=gen) < 0.5, -1.0, 1.0)
                jitter[hit] *= burst**sign
            out[spec] = [truth(spec) * float(j) for j in jitter]
        return out

    return timer, truth


def test_calibrated_picks_stay_within_the_band_whatever_the_timer_noise():
    torch.manual_seed(0)
    model = build_model(WIDE).eval()
    targets = [1.5, 2.0]
    clean_timer, truth = speed_table(model, None)
    clean = {(p.method, p.target): p for p in find_budgets(model, list(EXPONENTS), targets, rule="measured",
                                                           timer=clean_timer)}
    on_target = {k for k, p in clean.items() if in_band(truth(p.spec), p.target)}
    assert len(on_target) >= 5, clean  # the calibrated rule finds specs the fake machine runs at the target
    for k in on_target:  # a noiseless reading: the expected speed-up is the true one
        assert clean[k].reached and math.isclose(clean[k].expected_speedup, truth(clean[k].spec))
    # the MACs rule, which the calibration replaces, misses where the speed-up is well below the MACs ratio
    by_macs = find_budgets(model, ["tome"], [2.0], rule="macs")
    assert not in_band(truth(by_macs[0].spec), 2.0)
    for seed in range(10):
        noisy_timer, _ = speed_table(model, seed)
        for p in find_budgets(model, list(EXPONENTS), targets, rule="measured", timer=noisy_timer):
            if (p.method, p.target) in on_target:
                assert abs(truth(p.spec) - p.target) <= BAND, (seed, p)
            assert p.expected_low <= p.expected_speedup <= p.expected_high  # the stated uncertainty


def test_the_macs_rule_never_times_and_a_pick_names_where_its_schedule_was_searched():
    torch.manual_seed(0)
    model = build_model(WIDE).eval()

    def no_timer(specs):
        raise AssertionError("the 'macs' rule timed something")

    picks = find_budgets(model, ["diffrate", "evit"], [1.5], timer=no_timer)
    origin = {p.method: p.schedule_origin for p in picks}
    assert origin["evit"] is None  # a family fitted to the host
    assert origin["diffrate"].startswith("DiffRate schedule searched for ") and " GMACs" in origin["diffrate"]
    assert picks[0].expected_low is None  # no timing, no range
    assert tokenreduce.build_reducer("diffrate(schedule='mae_b-8.7')").schedule_origin() == (
        "DiffRate schedule searched for ViT-B (MAE) at 8.7 GMACs")
    assert tokenreduce.build_reducer("diffrate(prune=(60, 50, 40, 30))").schedule_origin() is None
    assert tokenreduce.build_reducer("evit() + diffrate()").schedule_origin().endswith("DeiT-S at 2.9 GMACs")


def test_rows_measured_outside_the_band_are_flagged_in_the_table_and_the_plot(tmp_path, monkeypatch):
    import matplotlib.axes

    from tokenreduce.bench import evaluation
    from tokenreduce.bench.pareto import plot_pareto

    def row(label: str, budget: float | None, speedup: float, origin: str | None = None) -> dict:
        return {"label": label, "method": label.split("(")[0], "kind": "unpatched" if budget is None else
                "training-free", "metric": "top1", "value": 80.0, "budget": budget, "budget_speedup": budget and 1.0,
                "speedup": speedup, "schedule_origin": origin}

    rows = [row("unpatched", None, 1.0), row("tome(r=3)", 1.5, 1.08), row("tome(r=5)", 2.0, 2.1),
            row("diffrate(schedule='mae_b-8.7')", 1.5, 1.4 + BAND / 2, "searched for ViT-B (MAE)")]
    evaluation.mark_band(rows)
    assert [r.get("in_band") for r in rows] == [None, False, True, True]
    assert in_band(1.5 - BAND, 1.5) and not in_band(1.5 - BAND - 0.01, 1.5) and not in_band(None, 1.5)
    text = evaluation.table(rows)
    flags = {li.split()[0]: li for li in text.splitlines()[2:6]}
    assert " NO " in flags["tome(r=3)"] and " yes " in flags["tome(r=5)"]
    assert flags["diffrate(schedule='mae_b-8.7')"].endswith("searched for ViT-B (MAE)")
    assert text.splitlines()[-1].endswith(": tome(r=3) measured 1.08x, target 1.5x")  # named, with its target
    assert evaluation.off_target(rows[2:]) is None
    drawn: list[tuple] = []
    for name in ("plot", "errorbar"):
        real = getattr(matplotlib.axes.Axes, name)
        monkeypatch.setattr(matplotlib.axes.Axes, name, lambda ax, *a, real=real, **kw: drawn.append(
            (list(a[0]), kw.get("label"))) or real(ax, *a, **kw))
    plot_pareto(tmp_path / "p.png", rows)
    # the off-target pick is drawn on its own, marked, not on its method's line with the pick on target
    assert ([1.08], "tome: measured off target (not comparable)") in drawn
    assert ([2.1], "tome") in drawn and not any(1.08 in xs and 2.1 in xs for xs, _ in drawn)


# ----------------------------------------------------------------------------- visualize command


@pytest.mark.slow
@needs_fmnist
def test_visualize_command_writes_a_png_per_image_and_spec(tmp_path, ckpt, capsys):
    out = tmp_path / "vis"
    assert main(["visualize", "--checkpoint", str(ckpt), "--spec", "tome(r=4)", "--spec",
                 "evit(keep=0.5, locs=(1, 2))", "--index", "0,5", "--out", str(out)]) == 0
    pngs = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.png"))
    assert pngs == ["evit_keep_0.5_locs_1_2/image000.png", "evit_keep_0.5_locs_1_2/image001.png",
                    "tome_r_4/image000.png", "tome_r_4/image001.png"]
    assert main(["visualize", "--checkpoint", str(ckpt), "--spec", "tome(r=4)", "--index", "0", "--out",
                 str(out / "bf16"), "--device", "cpu", "--amp", "bf16"]) == 0  # the decisions at bf16
    assert (out / "bf16" / "tome_r_4" / "image000.png").is_file()
    capsys.readouterr()
    model = tiny_model(2)
    tokenreduce.apply(model, LEARNED)
    tuned = tmp_path / "tuned.safetensors"
    save_checkpoint(tuned, model, meta={"model": MODEL, "spec": LEARNED, "data": {"name": "fashion_mnist"}})
    assert main(["visualize", "--checkpoint", str(tuned), "--images", "1", "--out", str(out / "trained")]) == 0
    assert [p.parent.name for p in (out / "trained").rglob("*.png")] == [
        "dynamicvit_keep_0.5_locs_1_2_ratio_weight_2.0_tau_1.0"]
    one_line_error(capsys, ["visualize", "--checkpoint", str(ckpt)], "carries no reducer")
    one_line_error(capsys, ["visualize", "--checkpoint", str(ckpt), "--spec", "tome(r=4)", "--index", "99999"],
                   "outside the test set")
