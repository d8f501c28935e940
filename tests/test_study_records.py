"""The committed run records against the studies that declare them: every stored training run is the run
its study declares today (spec, seed, schedule, stem), so the records moved into one study per paper
unchanged; and what particular studies read (a probe on an arm's run, a measure on records alone)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenreduce.core.method import build_reducer
from tokenreduce.study import get_study, list_studies
from tokenreduce.study.plan import Layout, plan
from tokenreduce.study.records import load_runs
from tokenreduce.study.runner import Runner

ROOT = Path(__file__).resolve().parents[1]
_SCHEDULE = ("epochs", "subset", "lr", "batch_size", "eval_subset", "seed", "spec")


def _canonical(key: str, value):
    """A spec with every parameter spelled out (a converted record spells them all); '' and None alike."""
    if key == "spec" and value:
        return build_reducer(value).spec()
    return value or None


def _stored(key: str) -> dict[str, dict]:
    return load_runs(Layout(ROOT / "results" / key, ROOT / "runs" / key))


@pytest.mark.parametrize(("name", "bed"), [(n, b) for n in list_studies() for b in get_study(n).beds])
def test_every_stored_run_is_a_run_its_study_declares(name: str, bed: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch):
    from tokenreduce.train import recipes

    monkeypatch.setattr(recipes, "reference_checkpoint", lambda recipe="fmnist-vit": tmp_path / f"{recipe}.st")
    study = get_study(name)(bed)
    runs = _stored(study.key)
    planned = {u.id: u for u in plan(study)}
    assert set(runs) <= set(planned), study.key  # nothing the study does not declare
    implicit = {a.name: a.implicit for a in study.axes() if a.implicit is not None}
    elsewhere = bool(study.pending) and not study.arms and not runs  # a GPU's benches, not made yet
    for u in planned.values():  # every run is stored but those of a length the study added since
        waits = bool(study.pending) and u.point is None  # a measure the bed says is not run yet (e.g. timing)
        assert elsewhere or waits or u.id in runs or (u.point is not None and any(
            u.point.values[k] != v for k, v in implicit.items())), u.id
    for p in study.points():
        if p.id not in runs:
            continue
        doc = runs[p.id]
        made = {k: v for k, v in p.values.items() if k in doc["point"] or implicit.get(k, object()) != v}
        assert (doc["study"], doc["bed"], doc["arm"], doc["point"]) == (name, bed, p.arm, made)
        if doc["kind"] != "train":
            continue
        fields, stored = study.train_fields(p, tmp_path), doc.get("config") or doc["metrics"]  # converted
        assert {k: _canonical(k, fields.get(k)) for k in _SCHEDULE if k in stored} == \
            {k: _canonical(k, stored[k]) for k in _SCHEDULE if k in stored}, p.id
        assert (fields.get("model") or {}).get("stem") == (stored.get("model") or {}).get("stem"), p.id


def test_a_probe_on_an_arm_reads_that_arms_run():
    needs = {u.id: u.needs for u in plan(get_study("bspf")("fmnist"))}
    assert needs["symmetry_tied_s1"] == ("bspf_tied-s1",) and needs["symmetry_reference_tied"] == ()


def test_the_tied_arm_is_the_reference_tied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from tokenreduce.train import recipes

    monkeypatch.setattr(recipes, "reference_checkpoint", lambda recipe="fmnist-vit": tmp_path / "ref.safetensors")
    study = get_study("bspf")("fmnist")
    fields = study.train_fields(study.point("bspf_tied", {"seed": 0}), tmp_path)
    assert fields["model"]["transforms"] == ["tie_qk"] and fields["init"] == str(tmp_path / "ref.safetensors")
    assert study.train_fields(study.point("full", {"seed": 0}), tmp_path)["model"] is None  # untouched arms


def test_the_random_arm_prunes_with_the_runs_seed(tmp_path: Path):
    study = get_study("cropr")("fmnist", smoke=True)
    for p in study.points():
        if p.arm == "random":
            assert study.train_fields(p, tmp_path)["spec"].endswith(f"seed={p.values['seed']})")


def test_a_measure_reads_the_test_bed_reference_every_seed_of_its_arms_and_its_backend(tmp_path: Path, monkeypatch):
    study = get_study("baselines")("fmnist")
    monkeypatch.setattr(type(study.bed), "checkpoint", lambda self: "REF")
    runner = Runner(study, Layout(tmp_path, tmp_path / "checkpoints"), threads=1, log=lambda msg: None)
    unit = runner.unit("matched-onnxruntime")
    assert unit.needs == tuple(f"{a}-s{s}" for a in ("random-1.5x", "topk-1.5x", "random~topk-1.5x")
                               for s in (0, 1, 2))
    model = {"name": "vit_tiny_patch16_224", "kwargs": {"depth": 1}}
    for run_id in unit.needs:  # records whose checkpoints are gone: a measure reads the records only
        path = runner.layout.json(run_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"id": f"{study.key}/{run_id}", "study": study.name, "bed": study.bed_name,
                                    "run": run_id, "kind": "train", "testbed": study.bed.describe(),
                                    "point": {"seed": int(run_id[-1])}, "config": {"model": model,
                                                                                   "seed": int(run_id[-1])},
                                    "metrics": {"checkpoint": f"gone/{run_id}", "top1": 50.0, "task": "classify"}}))
    request, read = runner.request(unit)
    assert request.reference == "REF" and request.specs == ("random(keep=0.55, locs=(1, 3, 4))",)
    assert [(r.name, r.model, r.seed, r.task) for r in request.recorded] == [(n, model, int(n[-1]), "classify")
                                                                            for n in unit.needs]
    assert request.speed["backend"] == "onnxruntime" and read == []


def test_a_measure_whose_reference_arm_is_fine_tuned_too_records_that_run_as_well(tmp_path: Path):
    """The reference run of a measure timed at seed 0 is also one of its fine-tuned runs there: it is both the
    checkpoint whose specs are timed and a recorded evaluation."""
    import dataclasses

    base = get_study("baselines")
    bed = base.beds["fmnist"]
    matched = dataclasses.replace(next(m for m in bed.measures if m.name == "matched"), model="random-1.5x",
                                  at={"seed": 0})

    class Reread(base):
        beds = {"fmnist": dataclasses.replace(bed, evaluations=(matched,))}

    study = Reread("fmnist")
    runner = Runner(study, Layout(tmp_path, tmp_path / "checkpoints"), threads=1, log=lambda msg: None)
    unit = runner.unit("matched")
    tuned = [f"{a}-s0" for a in ("random-1.5x", "topk-1.5x", "random~topk-1.5x")]
    assert unit.reads == "random-1.5x-s0" and set(unit.needs) == set(tuned)
    for run_id in tuned:
        checkpoint = tmp_path / "checkpoints" / run_id / "model.safetensors"
        checkpoint.parent.mkdir(parents=True)
        checkpoint.write_text(run_id)
        path = runner.layout.json(run_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"id": f"{study.key}/{run_id}", "study": study.name, "bed": study.bed_name,
                                    "run": run_id, "kind": "train", "testbed": study.bed.describe(),
                                    "point": {"seed": 0}, "config": {"model": {"name": "m"}, "seed": 0},
                                    "metrics": {"checkpoint": str(checkpoint), "top1": 50.0, "task": "classify"}}))
    request, read = runner.request(unit)
    assert request.reference == read[0]["path"] == str(tmp_path / "checkpoints" / tuned[0] / "model.safetensors")
    assert [r.name for r in request.recorded] == tuned
