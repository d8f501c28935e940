"""Faults and bad inputs that once ended in a silent wrong result, lost work or a traceback: each test is the
reproduction. Records and checkpoints are checked whole when read (a record of another study, a non-numeric
metric, a flipped bit in a checkpoint's metadata are refused, naming the file); ``--force`` moves the previous run
aside first; ``--resume`` keeps the run's threads and refuses a changed training set or an empty folder; a NaN
model is not scored; one writer per output; records hold no machine paths.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from conftest import Interrupted, stop_at
from PIL import Image
from test_guards import TINY, TINY_FLAGS, data, one_line, tiny_config  # noqa: F401 - data: a fixture
from test_study_scenes import oracle_smoke  # noqa: F401 - a fixture

import tokenreduce
from tokenreduce import TokenReduceError
from tokenreduce.cli import BROKEN_PIPE, main
from tokenreduce.models import (
    CheckpointError,
    build_model,
    checkpoint,
    read_checkpoint,
    read_meta,
    resolve,
    save_checkpoint,
)
from tokenreduce.models.checkpoint import SIGNED, UNVERIFIED
from tokenreduce.models.references import SHIPPED_DIR, file_sha256
from tokenreduce.study import records, stats
from tokenreduce.study.declare import get_study
from tokenreduce.study.plan import Layout, layout_for
from tokenreduce.study.records import load_runs
from tokenreduce.study.runner import Runner
from tokenreduce.study.tables import ci_text, p_text, verdicts, word
from tokenreduce.tasks.items import decode, encode, item_pair, metric_of
from tokenreduce.train import loop
from tokenreduce.train.loop import train

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"


# ----------------------------------------------------------------------------- 1. --force, --resume


def test_an_interrupted_force_retrain_resumes_with_the_command_it_printed(data, tmp_path, monkeypatch, capsys):  # noqa: F811
    out = tmp_path / "x"
    train(tiny_config(data, out, epochs=1))  # the finished run --force replaces
    real = loop.train

    def interrupted(cfg, **kw):  # Ctrl-C after step 5 (a checkpoint every step: it is saved there)
        def ctrl_c(step: int) -> None:
            if step == 5:
                raise KeyboardInterrupt
        return real(cfg, on_step=ctrl_c)

    monkeypatch.setattr(loop, "train", interrupted)
    flags = [*TINY_FLAGS, "--data", data, "--lr", "3e-3", "--warmup-epochs", "0.5", "--ckpt-every", "1",
             "--out", str(out)]
    assert main(["train", *flags, "--epochs", "3", "--force"]) == 130
    err = capsys.readouterr().err
    assert f"moved the previous run in {out} to {out / 'previous-run'}" in err
    assert read_meta(out / "previous-run" / "model.safetensors")["config"]["epochs"] == 1  # kept, not lost
    assert not (out / "model.safetensors").exists()  # the old finished run is not read as this one
    command = shlex.split(err.strip().splitlines()[-1].split("; continue with: ")[1])
    monkeypatch.setattr(loop, "train", real)
    assert main([a for a in command[1:] if a != "--quiet"]) == 0  # --quiet: no progress, nor the resume line
    got = capsys.readouterr()
    assert f"resuming {out} at epoch 2, step 5" in got.err and "reused" not in got.out
    meta = read_meta(out / "model.safetensors")
    assert meta["config"]["epochs"] == 3 and meta["step"] == 12


def test_force_and_resume_together_are_refused(data, tmp_path, capsys):  # noqa: F811
    one_line(capsys, ["train", *TINY_FLAGS, "--data", data, "--out", str(tmp_path / "r"), "--force", "--resume"],
             "give one of them")


@pytest.mark.parametrize("folder", ["empty", "missing"])
def test_resume_of_an_empty_or_unknown_folder_is_refused(folder, data, tmp_path, capsys):  # noqa: F811
    out = tmp_path / folder
    if folder == "empty":
        out.mkdir()
    err = one_line(capsys, ["train", "--out", str(out), "--resume"], f"--resume: {out}")
    assert "nothing to resume" in err
    one_line(capsys, ["train", *TINY_FLAGS, "--data", data, "--out", str(out), "--resume"], "nothing to resume")
    assert not (out / "last.safetensors").exists()


def test_resume_keeps_the_runs_pace(data, tmp_path, capsys):  # noqa: F811
    """A bare --resume keeps the run's thread count and checkpoint interval (train.config.RESUME_KEEPS);
    a flag given still changes them."""
    out = tmp_path / "run"
    with pytest.raises(Interrupted):
        train(tiny_config(data, out, ckpt_every=1, threads=1), on_step=stop_at(3))
    assert main(["train", "--out", str(out), "--resume"]) == 0
    err = capsys.readouterr().err
    assert "resuming" in err and "threads" not in err and "ckpt_every" not in err  # nothing changed
    config = read_meta(out / "model.safetensors")["config"]
    assert (config["threads"], config["ckpt_every"]) == (1, 1)
    with pytest.raises(Interrupted):
        train(tiny_config(data, tmp_path / "again", ckpt_every=1, threads=1), on_step=stop_at(3))
    assert main(["train", "--out", str(tmp_path / "again"), "--resume", "--ckpt-every", "7"]) == 0
    assert "ckpt_every 7 (was 1)" in capsys.readouterr().err
    # the library: a pace field left None (not given) is the run's own
    with pytest.raises(Interrupted):
        train(tiny_config(data, tmp_path / "lib", ckpt_every=1, threads=1, num_workers=0), on_step=stop_at(3))
    done = train(tiny_config(data, tmp_path / "lib", ckpt_every=1, threads=None, num_workers=None, resume=True))
    config = read_meta(done["checkpoint"])["config"]
    assert (config["threads"], config["num_workers"]) == (1, 0)


# ----------------------------------------------------------------------------- 6. a changed training set


def _folder(root: Path, n: int = 4) -> Path:
    g = torch.Generator().manual_seed(0)
    for split, count in (("train", n), ("val", 2)):
        for c in ("ant", "bee", "cat"):
            (root / split / c).mkdir(parents=True)
            for i in range(count):
                pixels = (torch.rand(16, 16, 3, generator=g) * 255).to(torch.uint8).numpy()
                Image.fromarray(pixels).save(root / split / c / f"{i}.png")
    return root


def test_resume_over_a_changed_training_set_is_refused_naming_the_difference(tmp_path):
    root = _folder(tmp_path / "imgs")
    model = {"name": "vit_tiny_patch16_224", "kwargs": {"img_size": 16, "patch_size": 8, "embed_dim": 16, "depth": 1,
                                                        "num_heads": 2, "in_chans": 3}}
    cfg = dict(model=model, data=str(root), epochs=2, batch_size=4, out=str(tmp_path / "run"), threads=1,
               quiet=True, ckpt_every=1, augment="none")
    with pytest.raises(Interrupted):
        train(loop.TrainConfig(**cfg), on_step=stop_at(1))
    (root / "train" / "cat" / "3.png").unlink()  # what fixing an unreadable image does
    with pytest.raises(TokenReduceError, match=r"training set of the run in .* changed since it started \(12 items "
                                               r"then, 11 now; class 'cat': 4 -> 3\).*--allow-data-change"):
        train(loop.TrainConfig(**cfg, resume=True))
    assert "checkpoint" in train(loop.TrainConfig(**cfg, resume=True, allow_data_change=True))


def test_an_unreadable_image_met_mid_run_says_how_to_go_on(tmp_path):
    """The file is found when the sampler reaches it: the error names it, the step, and the way on."""
    from tokenreduce.data import DataError

    root = _folder(tmp_path / "imgs")
    (root / "train" / "cat" / "3.png").write_bytes(b"not a png")
    model = {"name": "vit_tiny_patch16_224", "kwargs": {"img_size": 16, "patch_size": 8, "embed_dim": 16, "depth": 1,
                                                        "num_heads": 2, "in_chans": 3}}
    cfg = dict(model=model, data=str(root), epochs=2, batch_size=4, out=str(tmp_path / "run"), threads=1,
               quiet=True, ckpt_every=1, augment="none")
    with pytest.raises(DataError, match=r"cannot read image .*3\.png.* \(at step \d+\); after fixing or removing the "
                                        r"file, --resume --allow-data-change goes on from the run's last checkpoint"):
        train(loop.TrainConfig(**cfg))
    (root / "train" / "cat" / "3.png").unlink()
    assert "checkpoint" in train(loop.TrainConfig(**cfg, resume=True, allow_data_change=True))


def test_an_empty_class_folder_is_refused_naming_it(tmp_path):
    from tokenreduce.data import DataError, build_dataset

    root = _folder(tmp_path / "imgs", n=1)
    (root / "train" / "dog").mkdir()
    with pytest.raises(DataError, match=f"class folder {root / 'train' / 'dog'} holds no images"):
        build_dataset(str(root), "train")


# ----------------------------------------------------------------------------- 2, 3, 9. run records


@pytest.fixture
def eet(tmp_path: Path) -> Path:
    """A copy of the committed eet records, both test beds (results/eet/<bed>/runs/)."""
    shutil.copytree(RESULTS / "eet", tmp_path / "eet")
    return tmp_path


def _edit(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc, indent=2))


def _runs(root: Path, bed: str = "scenes"):
    study = get_study("eet")(bed)
    return load_runs(Layout(root / study.key, root / study.key), study)


def test_the_committed_records_read_and_hold_no_machine_paths():
    for path in sorted(RESULTS.glob("*/*/runs/*.json")):
        text = path.read_text()
        found = re.findall(r'"(/(?:work|home|tmp|root|Users)/[^"]*)"', text) + re.findall(r" (/(?:work|home)/\S+)",
                                                                                             text)
        assert not found, (path, found[:3])
    stored = list((RESULTS / "eet" / "scenes" / "runs").glob("*.json"))
    assert len(_runs(RESULTS)) == len(stored) > 0  # every record of the study reads, checked


def test_a_record_of_another_study_copied_in_is_refused_by_runner_summarize_and_report(eet, capsys):
    target = eet / "eet" / "scenes" / "runs" / "b_ctp-b16-s0.json"
    shutil.copy(eet / "eet" / "fmnist" / "runs" / "b_ctp-b16-s0.json", target)
    with pytest.raises(records.RecordError, match=f"{target}: field 'bed' is 'fmnist', not 'scenes'"):
        _runs(eet)
    one_line(capsys, ["study", "eet", "--out", str(eet / "eet" / "scenes"), "--summarize"], f"{target}: field 'bed'")
    one_line(capsys, ["report", "--out", str(eet), "--readme", ""], f"{target}: field 'bed'")


@pytest.mark.parametrize(("value", "field"), [
    ("43.0", "metrics.map_asym"), (None, "metrics.map_asym"), (True, "metrics.map_asym"),
    ("missing", "metrics.map_asym"), ([], "metrics"), ("no metrics", "metrics"),
])
def test_a_non_numeric_metric_is_refused_not_dropped_or_counted(value, field, eet):
    path = eet / "eet" / "scenes" / "runs" / "b_ctp-b16-s0.json"

    def change(doc):
        if value == "missing":
            del doc["metrics"]["map_asym"]
        elif value == "no metrics":
            del doc["metrics"]
        elif field == "metrics":
            doc["metrics"] = value
        else:
            doc["metrics"]["map_asym"] = value

    _edit(path, change)
    with pytest.raises(records.RecordError, match=f"{re.escape(str(path))}: field '{re.escape(field)}'"):
        _runs(eet)


@pytest.mark.parametrize("damage", ["truncated", "empty", "conflict", "nan", "list"])
def test_a_broken_record_is_one_line_naming_the_file(damage, eet, capsys):
    path = eet / "eet" / "scenes" / "runs" / "b_ctp-b16-s0.json"
    text = path.read_text()
    path.write_text({"truncated": text[: len(text) // 2], "empty": "",
                     "conflict": "<<<<<<< HEAD\n" + text + "=======\n" + text + ">>>>>>> other\n",
                     "nan": text.replace('"map_asym": 4', '"map_asym": NaN, "x": 4', 1),
                     "list": "[1, 2, 3]"}[damage])
    one_line(capsys, ["study", "eet", "--out", str(path.parent.parent), "--summarize"], str(path))
    one_line(capsys, ["report", "--out", str(eet), "--readme", ""], str(path))


@pytest.mark.slow
def test_per_item_results_over_other_test_items_are_one_line_naming_both_records(eet, capsys):
    path = eet / "eet" / "scenes" / "runs" / "e_oracle-t937-b16-s1.json"

    def drop_last_item(doc):  # the metric kept consistent with its items: only the pairing is wrong
        values = decode(doc["metrics"]["items"]["map_asym"])[:-1]
        doc["metrics"]["items"]["map_asym"] = encode(values)
        doc["metrics"]["map_asym"] = metric_of(values)

    _edit(path, drop_last_item)
    one_line(capsys, ["report", "--out", str(eet), "--readme", ""],
             "eet/scenes/e_oracle-t937-b16-s1 and eet/scenes/b_ctp-t937-b16-s1: map_asym over 9999 and 10000 "
             "test items")


def test_per_item_results_pair_only_over_the_same_number_of_test_items():
    """The one check the runner applies when an evaluated arm runs and the tables when they read records."""
    def record(rid, n):
        return {"id": rid, "metrics": {"items": {"top1": encode(torch.ones(n, dtype=torch.bool))}}}

    a, b = item_pair(record("oracle-s0", 32), record("ctp-s0", 32), "top1")
    assert a.shape == b.shape == (32,)
    assert item_pair({"id": "oracle-s0", "metrics": {"top1": 50.0}}, record("ctp-s0", 32), "top1") is None
    with pytest.raises(TokenReduceError, match=r"^oracle-s0 and ctp-s0: top1 over 16 and 32 test items"):
        item_pair(record("oracle-s0", 16), record("ctp-s0", 32), "top1")


def test_a_run_outside_the_plan_and_a_wrong_kind_are_refused(eet):
    runs = eet / "eet" / "scenes" / "runs"
    shutil.copy(runs / "b_ctp-b16-s0.json", runs / "zz_extra.json")
    _edit(runs / "zz_extra.json", lambda d: d.update(id="eet/scenes/zz_extra", run="zz_extra"))
    with pytest.raises(records.RecordError, match="'zz_extra' is not a run of study eet/scenes"):
        _runs(eet)
    (runs / "zz_extra.json").unlink()
    _edit(runs / "b_ctp-b16-s0.json", lambda d: d.update(kind="nonsense"))
    with pytest.raises(records.RecordError, match="field 'kind' is 'nonsense'; valid kinds: train, evaluate"):
        _runs(eet)


def test_temporary_files_of_a_killed_write_are_not_records(eet):
    runs = eet / "eet" / "scenes" / "runs"
    before = len(_runs(eet))
    (runs / ".b_ctp-b16-s0.json.abc123.tmp").write_text('{"half": ')
    assert len(_runs(eet)) == before > 0


# ----------------------------------------------------------------------------- records and statistics that lied


@pytest.fixture
def diffrate(tmp_path: Path) -> Path:
    """A copy of the committed DiffRate records (off the shelf, per-item results, the test items as the unit)."""
    shutil.copytree(RESULTS / "diffrate", tmp_path / "diffrate")
    return tmp_path


def _diffrate_runs(root: Path):
    study = get_study("diffrate")("scenes")
    return study, load_runs(Layout(root / study.key, root / study.key), study)


def _set_items(path: Path, metric: str, values) -> None:
    _edit(path, lambda d: d["metrics"]["items"].update({metric: encode(values)}))


@pytest.mark.parametrize("items", ["all correct", "values 3.0", "another run's"])
def test_per_item_results_that_do_not_reproduce_their_metric_are_refused(items, diffrate, capsys):
    path = diffrate / "diffrate" / "scenes" / "runs" / "diffrate-s0.json"
    n = len(decode(json.loads(path.read_text())["metrics"]["items"]["top1"]))
    if items == "all correct":  # the metric left at 59.60: the claims flipped to "reproduced" at p 1e-198
        _set_items(path, "top1", torch.ones(n, dtype=torch.bool))
    elif items == "values 3.0":
        _set_items(path, "top1", torch.full((n,), 3.0))
    else:
        other = json.loads((path.parent / "merge_only-s0.json").read_text())["metrics"]["items"]["top1"]
        _edit(path, lambda d: d["metrics"]["items"].update(top1=other))
    with pytest.raises(records.RecordError, match=f"{re.escape(str(path))}: field 'metrics.items.top1'"):
        _diffrate_runs(diffrate)
    one_line(capsys, ["study", "diffrate", "--out", str(path.parent.parent), "--summarize"],
             f"{path}: field 'metrics.items.top1'")


@pytest.mark.parametrize(("damage", "why"), [
    ("n", "3336 values stored, 3339 declared"), ("base64", "not an encoded entry"), ("dtype", "unknown dtype 'int8'"),
    ("nan", "does not reproduce metrics.top1"), ("all nan", "no item has a value"),
])
def test_a_malformed_per_item_entry_is_one_line_naming_the_record_and_field(damage, why, diffrate, capsys):
    path = diffrate / "diffrate" / "scenes" / "runs" / "diffrate-s0.json"
    values = decode(json.loads(path.read_text())["metrics"]["items"]["top1"])

    def change(doc):
        entry = doc["metrics"]["items"]["top1"]
        if damage == "n":
            entry["n"] = 3339
        elif damage == "base64":
            entry["data"] = "not base64!"
        elif damage == "dtype":
            entry["dtype"] = "int8"
        else:  # a float32 entry with NaN in it (every other value, or all): was a traceback in --summarize
            nan = values.copy()
            nan[::2 if damage == "nan" else 1] = float("nan")
            doc["metrics"]["items"]["top1"] = encode(nan)

    _edit(path, change)
    one_line(capsys, ["study", "diffrate", "--out", str(path.parent.parent), "--summarize"],
             f"{path}: field 'metrics.items.top1': " if damage in ("n", "base64", "dtype") else
             f"{path}: field 'metrics.items.top1' ")
    with pytest.raises(records.RecordError, match=re.escape(why)):
        _diffrate_runs(diffrate)


@pytest.mark.parametrize(("field", "value", "why"), [
    ("map_asym", 1945.6, "not a number in [0, 100]"), ("map_asym", 1.5e308, "not a number in [0, 100]"),
    ("top1", -0.5, "not a number in [0, 100]"), ("n_query", 2000.5, "not an integer >= 0"),
    ("train_time_s", -1.0, "not a number >= 0"), ("latency_ms", 0, "not a number > 0"),
])
def test_an_impossible_metric_is_refused_naming_its_range(field, value, why, eet, capsys):
    path = eet / "eet" / "scenes" / "runs" / "b_ctp-b16-s0.json"
    _edit(path, lambda d: d["metrics"].update({field: value}))
    with pytest.raises(records.RecordError, match=re.escape(f"{path}: field 'metrics.{field}' is {value!r}, {why}")):
        _runs(eet)
    if value == 1.5e308:  # was an OverflowError in the statistics
        one_line(capsys, ["study", "eet", "--out", str(path.parent.parent), "--summarize"], f"{path}: field")


def test_an_impossible_speed_in_a_measure_is_refused(eet):
    path = eet / "eet" / "scenes" / "runs" / "speed.json"
    _edit(path, lambda d: d["result"]["results"][1].update(speedup=-1.4))
    with pytest.raises(records.RecordError, match=re.escape(f"{path}: field 'result.results[1].speedup' is -1.4")):
        _runs(eet)


@pytest.mark.parametrize("edited", [("id", "run"), ("id", "run", "point")])
def test_a_record_copied_to_another_seeds_name_is_refused(edited, eet):
    runs = eet / "eet" / "scenes" / "runs"
    shutil.copy(runs / "b_ctp-b16-s1.json", runs / "b_ctp-b16-s0.json")

    def relabel(doc):
        doc.update(id="eet/scenes/b_ctp-b16-s0", run="b_ctp-b16-s0")
        if "point" in edited:
            doc["point"]["seed"] = 0

    _edit(runs / "b_ctp-b16-s0.json", relabel)
    field = "config.seed" if "point" in edited else "point"
    with pytest.raises(records.RecordError, match=f"b_ctp-b16-s0.json: field '{field}' is"):
        _runs(eet)


def test_an_evaluated_record_copied_to_another_seeds_name_is_refused(eet):
    runs = eet / "eet" / "scenes" / "runs"
    shutil.copy(runs / "e_oracle-b16-s1.json", runs / "e_oracle-b16-s0.json")
    _edit(runs / "e_oracle-b16-s0.json", lambda d: (d.update(id="eet/scenes/e_oracle-b16-s0", run="e_oracle-b16-s0"),
                                                    d["point"].update(seed=0)))
    with pytest.raises(records.RecordError, match="field 'evaluates' is 'b_ctp-b16-s1', not 'b_ctp-b16-s0'"):
        _runs(eet)


def test_differences_without_spread_decide_nothing():
    v = stats.verdict([-0.01, -0.01], direction=-1, effect=-2.0)  # was "reproduced" at p 0
    assert v.word == "inconclusive" and v.tests == () and v.interval is None and "no variance" in v.why
    zero = stats.verdict([0.0, 0.0], direction=-1, effect=-1.95)  # the smoke's "not reproduced" from 0.00 ± 0.00
    assert zero.word == "inconclusive" and zero.p("effect") is None


def test_a_claim_whose_seeds_differ_by_the_same_amount_reads_inconclusive(eet):
    runs = eet / "eet" / "scenes" / "runs"
    for seed in (0, 1, 2):
        base = json.loads((runs / f"a_unpruned-b64-s{seed}.json").read_text())["metrics"]["map_asym"]
        _edit(runs / f"b_ctp-b64-s{seed}.json", lambda d, base=base: d["metrics"].update(map_asym=base - 0.01))
    study = get_study("eet")("scenes")
    judged = next(j for j in verdicts(study, _runs(eet)) if j.expect.at == {"bits": 64}
                  and (j.expect.arm, j.expect.baseline) == ("b_ctp", "a_unpruned"))
    assert word(judged) == "inconclusive" and p_text(judged) == "-" and ci_text(judged) == "-"
    assert "no variance" in judged.why


def test_per_item_results_missing_from_one_fold_are_named(diffrate, eet):
    path = diffrate / "diffrate" / "scenes" / "runs" / "diffrate-s0.json"
    _edit(path, lambda d: d["metrics"].pop("items"))
    study, runs = _diffrate_runs(diffrate)
    judged = [j for j in verdicts(study, runs) if j.verdict and j.expect.arm == "diffrate"]
    assert judged and all("left out: diffrate/scenes/diffrate-s0 hold no per-item top1" in j.why for j in judged)
    _edit(eet / "eet" / "scenes" / "runs" / "b_ctp-t937-b16-s0.json", lambda d: d["metrics"].pop("items"))
    eet_study = get_study("eet")("scenes")
    j = next(j for j in verdicts(eet_study, _runs(eet)) if j.expect.at.get("steps") == 937
             and (j.expect.arm, j.expect.baseline) == ("b_ctp", "a_unpruned"))
    assert j.items is None and j.items_why == ("seed-level only: eet/scenes/b_ctp-t937-b16-s0 hold no per-item "
                                               "map_asym (the other seeds' records do)")


def test_an_evaluated_arm_refuses_a_swapped_checkpoint_and_records_what_it_read(oracle_smoke, tmp_path):  # noqa: F811
    runner, runs = oracle_smoke
    trained, oracle = runs["b_ctp-b8-s0"], runs["e_oracle-b8-s0"]
    path = records.resolve(trained["metrics"]["checkpoint"], runner.layout)
    assert trained["checkpoint_sha256"] == file_sha256(path)  # the digest of the checkpoint it wrote
    assert oracle["read"] == [{"path": "{checkpoints}/b_ctp-b8-s0/model.safetensors",
                               "sha256": trained["checkpoint_sha256"]}]
    shutil.copytree(runner.layout.results, tmp_path / "s")  # a copy: the fixture's study stays as it is
    copy = Runner(runner.study, layout_for(runner.study, str(tmp_path / "s")), threads=1, log=lambda m: None)
    shutil.copy(copy.layout.checkpoints / "a_unpruned-b8-s0" / "model.safetensors",
                copy.layout.checkpoints / "b_ctp-b8-s0" / "model.safetensors")  # another run's weights
    copy.layout.json("e_oracle-b8-s0").unlink()
    with pytest.raises(TokenReduceError, match=r"b_ctp-b8-s0/model.safetensors is not the checkpoint run "
                                               r"b_ctp-b8-s0 wrote: its SHA-256 is"):
        copy.run()
    assert not copy.layout.json("e_oracle-b8-s0").exists()


def test_one_seed_with_per_item_results_says_the_interval_needs_two_seeds(eet):
    runs = eet / "eet" / "scenes" / "runs"
    for arm in ("a_unpruned", "b_ctp"):
        for seed in (1, 2):
            (runs / f"{arm}-t937-b16-s{seed}.json").unlink()
    judged = next(j for j in verdicts(get_study("eet")("scenes"), _runs(eet)) if j.expect.at.get("steps") == 937
                  and (j.expect.arm, j.expect.baseline) == ("b_ctp", "a_unpruned"))
    assert judged.items_why == "seed-level only: a seeds x items interval needs at least 2 seeds (n = 1)"


def test_a_bed_whose_records_were_all_deleted_loses_its_old_verdicts_and_figure(diffrate):
    from tokenreduce.study.page import build_report

    shutil.copytree(RESULTS / "figures", diffrate / "figures")
    for path in (diffrate / "diffrate" / "scenes" / "runs").glob("*.json"):
        path.unlink()
    build_report(diffrate, names=["diffrate"])
    text = (diffrate / "diffrate" / "scenes" / "summary.md").read_text()
    assert "**reproduced**" not in text and "**contradicted**" not in text and "**not run**" in text
    assert not (diffrate / "figures" / "diffrate-scenes.png").exists()
    assert (diffrate / "figures" / "pitome-scenes.png").exists()  # another study's figure stays


# ----------------------------------------------------------------------------- 7. paths in records


def test_records_hold_paths_relative_to_the_study_and_a_copy_reads_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENREDUCE_CACHE", str(tmp_path / "cache"))
    first = Layout(tmp_path / "s1", tmp_path / "s1" / "checkpoints")
    ckpt = first.checkpoints / "a-s0" / "model.safetensors"
    doc = {"testbed": {"data": str(tmp_path / "s1" / "checkpoints" / "data")},
           "metrics": {"checkpoint": str(ckpt), "figures": [str(ckpt.parent / "pr.png")]},
           "config": {"init": str(SHIPPED_DIR / "scenes-vit.safetensors"), "teacher": str(tmp_path / "cache" / "t")},
           "provenance": {"command": f"tokenreduce study eet --run a-s0 --out {tmp_path / 's1'} --threads 1"}}
    rel = records.relative(doc, first)
    assert rel["metrics"] == {"checkpoint": "{checkpoints}/a-s0/model.safetensors",
                              "figures": ["{checkpoints}/a-s0/pr.png"]}
    assert rel["config"] == {"init": "{references}/scenes-vit.safetensors", "teacher": "{cache}/t"}
    assert rel["provenance"]["command"] == "tokenreduce study eet --run a-s0 --out {study} --threads 1"
    assert rel["testbed"] == doc["testbed"]  # compared as it is, never rewritten
    copy = Layout(tmp_path / "s2", tmp_path / "s2" / "checkpoints")  # cp -r s1 s2
    assert records.resolve(rel["metrics"]["checkpoint"], copy) == str(copy.checkpoints / "a-s0" / "model.safetensors")
    assert records.resolve(rel["config"]["init"], copy) == str(SHIPPED_DIR / "scenes-vit.safetensors")
    assert records.resolve("runs/old/a-s0/model.safetensors", copy) == "runs/old/a-s0/model.safetensors"  # older


def test_provenance_names_the_program_not_its_path():
    from tokenreduce.bench.report import command_text

    assert command_text(["/work/x/.venv/bin/tokenreduce", "study", "eet"]) == "tokenreduce study eet"
    assert command_text(["/work/x/src/tokenreduce/cli.py", "report"]) == "tokenreduce report"


# ----------------------------------------------------------------------------- 4. checkpoint metadata


def _flip(path: Path, old: bytes, new: bytes) -> None:
    raw = path.read_bytes()
    assert raw.count(old) >= 1 and len(old) == len(new)
    path.write_bytes(raw.replace(old, new, 1))


@pytest.mark.parametrize(("old", "new"), [
    (b"tome(r=4", b"tome(r=5"),  # one bit: the stored spec
    (b'num_heads\\": 2', b'num_heads\\": 3'),  # one bit: another model from the same weights
    (b'lr\\": 0.003', b'lr\\": 0.002'),  # the recorded config
])
def test_a_flipped_bit_in_a_checkpoints_metadata_is_refused(old, new, tmp_path, capsys):
    torch.manual_seed(0)
    model = build_model(TINY)
    tokenreduce.apply(model, "tome(r=4)")
    path = tmp_path / "m.safetensors"
    save_checkpoint(path, model, meta={"model": TINY, "spec": "tome(r=4)", "config": {"lr": 0.003}})
    assert read_checkpoint(path).meta["spec"] == "tome(r=4)"
    _flip(path, old, new)
    with pytest.raises(CheckpointError, match=f"{path}: metadata checksum mismatch"):
        read_checkpoint(path)
    one_line(capsys, ["inspect", "--checkpoint", str(path)], f"{path}: metadata checksum mismatch")


def test_shipped_references_written_before_the_metadata_digest_still_load_and_are_checked_by_path(tmp_path):
    for name in ("scenes-vit", "scenes-vit-seg"):
        ckpt = read_checkpoint(SHIPPED_DIR / f"{name}.safetensors")
        assert ckpt.header["version"] == 1 and ckpt.meta["model"]
        assert resolve(name) == SHIPPED_DIR / f"{name}.safetensors"  # eval/inspect --checkpoint scenes-vit
    for suffix in (".safetensors", ".reference.json"):
        shutil.copy(SHIPPED_DIR / f"scenes-vit{suffix}", tmp_path / f"scenes-vit{suffix}")
    copy = tmp_path / "scenes-vit.safetensors"
    read_checkpoint(copy)
    _flip(copy, b'num_heads\\": 3', b'num_heads\\": 2')
    with pytest.raises(CheckpointError, match="differs from its record scenes-vit.reference.json"):
        read_checkpoint(copy)


def _downgrade(path: Path, meta_edit: tuple[str, str]) -> None:
    """Rewrite ``path``'s header as a version-1 file would be (no ``header_sha256``), one metadata value edited."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    doc = json.loads(raw[8 : 8 + n])
    header = json.loads(doc["__metadata__"]["tokenreduce"])
    header["version"] = 1
    del header["header_sha256"]
    header["meta"] = json.loads(json.dumps(header["meta"]).replace(*meta_edit))
    doc["__metadata__"]["tokenreduce"] = json.dumps(header)
    text = json.dumps(doc).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n:])


def test_a_checkpoint_edited_to_look_like_version_1_says_its_metadata_is_unverified(tmp_path, capsys):
    torch.manual_seed(0)
    model = build_model(TINY)
    path = tmp_path / "m.safetensors"
    save_checkpoint(path, model, meta={"model": TINY, "spec": None})
    assert read_checkpoint(path).verified == SIGNED and "note:" not in capsys.readouterr().err
    _downgrade(path, ('"num_heads": 2', '"num_heads": 1'))
    ckpt = read_checkpoint(path)
    assert ckpt.meta["model"]["kwargs"]["num_heads"] == 1  # nothing in a version-1 file can tell
    assert ckpt.verified == UNVERIFIED
    assert f"note: {path} is a version-1 checkpoint: its weights are checked, its metadata" in capsys.readouterr().err
    assert main(["inspect", "--checkpoint", str(path)]) == 0
    assert f"metadata   {UNVERIFIED}" in capsys.readouterr().out
    shipped = read_checkpoint(SHIPPED_DIR / "scenes-vit.safetensors")
    assert shipped.verified == "whole file against scenes-vit.reference.json"
    assert "note:" not in capsys.readouterr().err


# ----------------------------------------------------------------------------- 5, 8. eval


@pytest.fixture
def nan_ckpt(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    model = build_model(TINY)
    with torch.no_grad():
        model.head.weight[0, 0] = float("nan")
    path = tmp_path / "nan.safetensors"
    save_checkpoint(path, model, meta={"model": TINY, "spec": None, "data": {"name": "fashion_mnist"}})
    return path


def test_a_model_with_a_nan_weight_is_not_scored(nan_ckpt, tmp_path, capsys):
    one_line(capsys, ["eval", "--checkpoint", str(nan_ckpt), "--spec", "tome(r=2)", "--out", str(tmp_path / "e")],
             f"{nan_ckpt} holds non-finite weights")
    assert not (tmp_path / "e" / "results.json").exists()


def test_eval_never_writes_into_a_training_run_and_one_eval_per_out(data, tmp_path, capsys):  # noqa: F811
    from tokenreduce.train import lock

    run = tmp_path / "run"
    train(tiny_config(data, run, epochs=1))
    one_line(capsys, ["eval", "--checkpoint", str(run), "--spec", "tome(r=2)", "--out", str(run)],
             f"--out {run} is a training run's folder")
    out = tmp_path / "e"
    with lock.hold(out, what="eval"):  # the first eval, working there
        one_line(capsys, ["eval", "--checkpoint", str(run), "--spec", "tome(r=2)", "--out", str(out)],
                 f"{out} is in use by another eval (pid ")


def test_two_timing_runs_of_one_study_are_refused(tmp_path, capsys):
    from tokenreduce.train import lock

    with lock.hold(tmp_path / "s", what="timing run speed"):
        one_line(capsys, ["study", "eet", "--smoke", "--run", "speed", "--out", str(tmp_path / "s")],
                 "is in use by another timing run speed")


@pytest.mark.parametrize("held, run", [("study run b_ctp-b8-s1", "speed"), ("timing run speed", "a_unpruned-b8-s0")],
                         ids=["timing-while-training", "training-while-timing"])
def test_a_timing_and_another_run_into_one_study_output_exclude_each_other(held, run, tmp_path, capsys):
    """Two studies into one --out: a timing run holds the output alone, or its speed-ups read low, silently."""
    from tokenreduce.train import lock

    with lock.hold(tmp_path / "s", what=held, shared=held.startswith("study")):
        one_line(capsys, ["study", "eet", "--smoke", "--run", run, "--out", str(tmp_path / "s")],
                 f"is in use by another {held} (pid ")
    assert not (tmp_path / "s" / "runs").exists()


def test_runs_that_train_share_a_study_output(tmp_path):
    from tokenreduce.study.runner import Runner
    from tokenreduce.train import lock

    study = get_study("eet")(smoke=True)
    runner = Runner(study, layout_for(study, str(tmp_path / "s")), threads=1, log=lambda msg: None)
    with lock.hold(tmp_path / "s", what="study run b_ctp-b8-s1", shared=True):  # another study's training run
        assert runner.run_one(runner.unit("a_unpruned-b8-s0"))["kind"] == "train"


# ----------------------------------------------------------------------------- unclear ones made clear


def test_report_and_study_outputs_that_cannot_be_written_are_one_line(eet, capsys):
    one_line(capsys, ["report", "--out", str(eet / "nothing"), "--readme", ""], "no results folder there")
    folder = eet / "eet" / "scenes"
    (folder / "summary.md").unlink()
    (folder / "summary.md").mkdir()  # in the way of the file
    one_line(capsys, ["study", "eet", "--out", str(folder), "--summarize"], f"cannot write {folder / 'summary.md'}")


def test_unknown_study_names_the_studies(capsys):
    one_line(capsys, ["study", "nosuchstudy", "--smoke"], "valid studies: ")


def test_a_forced_run_cleans_temporaries_a_killed_write_left(data, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    out.mkdir()
    (out / ".last.json.abc.tmp").write_text("half")
    train(tiny_config(data, out, epochs=1))
    assert not list(out.glob(".*.tmp"))


def test_a_hand_edited_sidecar_is_named_on_resume(data, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "run"
    with pytest.raises(Interrupted):
        train(tiny_config(data, out, ckpt_every=1), on_step=stop_at(3))
    _edit(out / "last.json", lambda d: d["meta"]["config"].update(lr=0.5))
    train(tiny_config(data, out, ckpt_every=1, resume=True))
    err = capsys.readouterr().err
    assert f"note: {out / 'last.json'} does not match last.safetensors (edited by hand" in err
    assert read_meta(out / "model.safetensors")["config"]["lr"] == 0.003  # the checkpoint's, verified


def test_an_image_folder_without_val_names_the_folders_looked_for(tmp_path):
    from tokenreduce.data import DataError, build_dataset

    root = _folder(tmp_path / "imgs", n=1)
    shutil.rmtree(root / "val")
    with pytest.raises(DataError, match="has no 'test' or 'val' or 'validation' directory"):
        build_dataset(str(root), "test")


def test_an_hf_config_with_a_field_of_the_wrong_type_is_one_line(tmp_path, capsys):
    pytest.importorskip("transformers")
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "vit", "hidden_size": "thirty-two"}))
    one_line(capsys, ["inspect", "--hf-config", str(folder), "--spec", "tome(r=1)"],
             f"could not read {folder / 'config.json'}")


def test_summarize_of_a_folder_without_records_says_so(tmp_path, capsys):
    one_line(capsys, ["study", "eet", "--smoke", "--out", str(tmp_path / "typo"), "--summarize"],
             f"--summarize: {tmp_path / 'typo'} holds no run records")
    assert not (tmp_path / "typo").exists()


@pytest.mark.slow
def test_a_copied_study_folder_reads_its_own_checkpoints(tmp_path):
    from tokenreduce.study.runner import Runner

    study = get_study("eet")(smoke=True)
    first = Runner(study, layout_for(study, str(tmp_path / "s1")), threads=1, log=lambda msg: None)
    first.run_one(first.unit("a_unpruned-b8-s0"))
    record = json.loads(first.layout.json("a_unpruned-b8-s0").read_text())
    assert record["metrics"]["checkpoint"] == "{checkpoints}/a_unpruned-b8-s0/model.safetensors"
    assert str(tmp_path) not in json.dumps(record)  # no machine path
    shutil.copytree(tmp_path / "s1", tmp_path / "s2")  # cp -r s1 s2
    copy = Runner(study, layout_for(study, str(tmp_path / "s2")), threads=1, log=lambda msg: None)
    own = tmp_path / "s2" / "checkpoints" / "a_unpruned-b8-s0" / "model.safetensors"
    assert copy._checkpoint("a_unpruned-b8-s0")["path"] == str(own)
    shutil.rmtree(own.parent)  # gone in the copy: made again there, never read from s1
    assert copy._checkpoint("a_unpruned-b8-s0")["path"] == str(own) and own.is_file()


# ----------------------------------------------------------------------------- lost work, a full disk, tracebacks


def test_each_force_keeps_the_run_before_it(data, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "r"
    for seed in (1, 2, 3):  # the first run, then two --force
        train(tiny_config(data, out, epochs=1, seed=seed, force=seed > 1))
    err = capsys.readouterr().err
    assert f"to {out / 'previous-run'}\n" in err and f"to {out / 'previous-run-2'}\n" in err
    kept = ("previous-run", "previous-run-2", ".")
    seeds = [read_meta(out / d / "model.safetensors")["config"]["seed"] for d in kept]
    assert seeds == [1, 2, 3]  # the first run is not lost under the second --force


@pytest.mark.parametrize("pixels", [900, 150], ids=["error", "warning-as-error"])
def test_a_decompression_bomb_in_an_image_folder_is_a_data_error_naming_it(pixels, tmp_path, monkeypatch):
    from tokenreduce.data import DataError, build_dataset

    root = _folder(tmp_path / "imgs", n=1)
    bomb = root / "train" / "ant" / "big.png"
    Image.new("L", (pixels, 1)).save(bomb)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # over 2x: PIL's error; between 1x and 2x: its warning
    ds = build_dataset(str(root), "train", img_size=16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(DataError, match=rf"cannot read image {re.escape(str(bomb))}: .*decompression bomb"):
            ds[[p for p, _ in ds.samples].index(bomb)]


@pytest.mark.slow
def test_a_closed_stdout_pipe_ends_quietly():
    """``tokenreduce study eet --smoke --list | head -1``: the reader is gone before the output is written."""

    proc = subprocess.Popen([sys.executable, "-m", "tokenreduce.cli", "study", "eet", "--smoke", "--list"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait() == BROKEN_PIPE and err == ""


def test_a_full_disk_at_a_checkpoint_is_one_line_and_the_run_resumes_bit_identical(data, tmp_path, monkeypatch,  # noqa: F811
                                                                                    capsys):

    full, real_fsync = [False], os.fsync

    def fsync(fd: int) -> None:  # the disk fills up after step 3: the next checkpoint does not fit
        if full[0]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    def filling(cfg, **kw):
        return real_train(cfg, on_step=lambda step: full.__setitem__(0, step >= 3))

    real_train = loop.train
    monkeypatch.setattr(checkpoint.os, "fsync", fsync)
    monkeypatch.setattr(loop, "train", filling)
    out = tmp_path / "run"
    flags = [*TINY_FLAGS, "--data", data, "--epochs", "2", "--ckpt-every", "1", "--out", str(out)]
    line = one_line(capsys, ["train", *flags], f"cannot write {out / 'last.safetensors'}: No space left on device")
    assert "last.safetensors is as it was" in line and "continue from the last checkpoint with: " in line
    assert read_meta(out / "last.safetensors")["step"] == 3 and not list(out.glob(".*.tmp"))
    monkeypatch.setattr(loop, "train", real_train)
    full[0] = False
    assert main([*shlex.split(line.split(" with: ")[1])[1:]]) == 0
    assert main(["train", *flags[:-1], str(tmp_path / "whole")]) == 0  # the same run, never interrupted
    resumed, whole = (read_checkpoint(p / "model.safetensors").weights for p in (out, tmp_path / "whole"))
    assert resumed.keys() == whole.keys() and all(torch.equal(resumed[k], whole[k]) for k in whole)


def test_a_full_disk_in_a_study_is_one_line(tmp_path, monkeypatch, capsys):

    def fsync(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint.os, "fsync", fsync)
    out = tmp_path / "s"
    one_line(capsys, ["study", "eet", "--smoke", "--run", "a_unpruned-b8-s0", "--out", str(out), "--threads", "1"],
             "No space left on device")
    assert not list(out.rglob(".*.tmp"))


def test_resume_over_idx_files_rewritten_with_the_same_class_counts_is_refused_naming_the_file(tmp_path):
    from tokenreduce.data.fashion_mnist import make_synthetic

    folder = make_synthetic(tmp_path / "d", seed=0)
    cfg = tiny_config(str(folder), tmp_path / "run", ckpt_every=1)
    with pytest.raises(Interrupted):
        train(cfg, on_step=stop_at(2))
    make_synthetic(folder, seed=7)  # other images (in another order), the same number of each class
    with pytest.raises(TokenReduceError, match=r"changed since it started \(train-images-idx3-ubyte holds other "
                                               r"content; train-labels-idx1-ubyte holds other content\).*"
                                               r"--allow-data-change"):
        train(dataclasses.replace(cfg, resume=True))


def test_a_checkpoint_fingerprinted_before_content_digests_still_resumes(data, tmp_path, monkeypatch):  # noqa: F811
    cfg = tiny_config(data, tmp_path / "run", ckpt_every=1)
    real = loop.fingerprint
    monkeypatch.setattr(loop, "fingerprint", lambda ds: {k: v for k, v in real(ds).items() if k != "content"})
    with pytest.raises(Interrupted):
        train(cfg, on_step=stop_at(2))
    assert "content" not in read_meta(tmp_path / "run" / "last.safetensors")["data_fingerprint"]
    monkeypatch.setattr(loop, "fingerprint", real)
    assert "checkpoint" in train(dataclasses.replace(cfg, resume=True))


@pytest.mark.parametrize("load_1min, warned", [(5.0, True), (0.5, False)])
def test_a_timing_records_the_machines_load_and_says_when_it_was_loaded(load_1min, warned, tmp_path, monkeypatch):
    from tokenreduce.bench import load
    from tokenreduce.study import execute
    from tokenreduce.study.runner import Runner

    monkeypatch.setattr(load.os, "getloadavg", lambda: (load_1min, 0.0, 0.0))
    monkeypatch.setitem(execute.EXECUTORS, execute.BenchRequest,  # the timing itself is not under test
                        lambda request, ctx: {"result": {"results": []}})
    study = get_study("deit_bench")(smoke=True)
    logged: list[str] = []
    runner = Runner(study, layout_for(study, str(tmp_path)), threads=2, log=logged.append)
    doc = runner.run_one(runner.unit("deit_small"))
    assert doc["provenance"]["load_1min"] == {"before": load_1min, "after": load_1min}
    warnings_ = [m for m in logged if m.startswith("warning: the machine was loaded")]
    assert len(warnings_) == warned and (not warned or "above the 2 threads it used" in warnings_[0])
    assert records.read_record(runner.layout.json("deit_small"), study)["provenance"]["load_1min"]


def test_bench_into_a_study_output_holds_its_lock_and_records_the_load(tmp_path, monkeypatch, capsys):
    from tokenreduce.bench import load
    from tokenreduce.train import lock

    out = tmp_path / "s"
    argv = ["bench", "--model", "test_vit", "--img-size", "64", "--quick", "--spec", "tome(r=2)", "--threads", "1",
            "--out", str(out)]
    with lock.hold(out, what="study run b_ctp-b8-s1", shared=True):
        one_line(capsys, argv, "is in use by another study run b_ctp-b8-s1")
    monkeypatch.setattr(load.os, "getloadavg", lambda: (3.5, 0.0, 0.0))
    assert main(argv) == 0
    assert "warning: the machine was loaded during this timing" in capsys.readouterr().err
    assert json.loads((out / "results.json").read_text())["provenance"]["load_1min"] == {"before": 3.5, "after": 3.5}


@pytest.mark.parametrize("command", ["inspect", "bench", "export"])
@pytest.mark.parametrize("size, nearest", [(8, "16"), (70, "64 or 80")])
def test_an_img_size_that_is_not_whole_patches_is_one_line_naming_the_valid_sizes(command, size, nearest, tmp_path,
                                                                                  capsys):
    """Below one patch (bench: a conv2d traceback, inspect: 0 patches) or between two multiples (inspect
    floored silently, bench and export pointed at a setting the CLI lacks): one error, the same everywhere."""
    out = {"export": ["--onnx", str(tmp_path / "m.onnx")], "bench": ["--quick"]}.get(command, [])
    one_line(capsys, [command, "--model", "test_vit", "--img-size", str(size), "--spec", "tome(r=1)", *out],
             f"cannot take {size}x{size} images: its patches are 16x16, so the input size (--img-size) must be a "
             f"multiple of 16, from 16 up (nearest: {nearest})")
    assert not (tmp_path / "m.onnx").exists()


def test_a_run_made_again_inside_a_timing_runs_under_the_timings_hold(tmp_path, monkeypatch):
    """A measure whose reference checkpoint is gone trains it again (Runner._checkpoint) while it holds the output
    alone: that run must not be refused by its own process's hold (training and the timing faked)."""
    from tokenreduce.study import execute
    from tokenreduce.study.runner import Runner
    from tokenreduce.train.config import TrainConfig

    def fake_train(cfg, ctx):
        path = Path(cfg.out) / "model.safetensors"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(cfg.out)
        return {"config": cfg.to_dict(), "metrics": {"checkpoint": str(path), "metric": "map_asym", "map_asym": 50.0},
                "checkpoint_sha256": file_sha256(path)}

    study = get_study("eet")(smoke=True)
    runner = Runner(study, layout_for(study, str(tmp_path / "s")), threads=1, log=lambda msg: None)
    monkeypatch.setitem(execute.EXECUTORS, TrainConfig, fake_train)
    for run in runner.unit("speed").needs:
        runner.run_one(runner.unit(run))
    reference = runner.layout.checkpoints / "a_unpruned-b8-s0" / "model.safetensors"
    reference.unlink()
    monkeypatch.setattr(runner, "_measure", lambda unit, source: source)  # the measure's request: its reference
    monkeypatch.setitem(execute.EXECUTORS, str, lambda made_again, ctx: {"made_again": made_again})
    assert runner.run_one(runner.unit("speed"))["made_again"] == str(reference) and reference.is_file()


def test_a_disk_full_before_a_run_starts_is_one_line(data, tmp_path, monkeypatch, capsys):  # noqa: F811
    from tokenreduce.train import lock

    real = os.write

    def write(fd: int, data: bytes) -> int:  # no room even for the lock file's line
        if b"(pid " in data:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data)

    monkeypatch.setattr(lock.os, "write", write)
    out = tmp_path / "run"
    one_line(capsys, ["train", *TINY_FLAGS, "--data", data, "--out", str(out)],
             f"cannot write to the output directory {out}: No space left on device")
    assert not (out / "last.safetensors").exists()
