"""The scene studies' machinery: evaluated arms (a run that reads another arm's checkpoint, paired by
seed), the oracle at a trained pruner's counts on the same weights, the synthetic scene test bed."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from conftest import TEST_STUDIES

from tokenreduce.core.errors import SpecError
from tokenreduce.studies.beds import SMOKE_MEASURE, SPEED_COLUMNS, scene_smoke
from tokenreduce.study import Arm, Study, Timing, get_study, register_study
from tokenreduce.study.plan import layout_for
from tokenreduce.study.records import load_runs
from tokenreduce.study.runner import Runner
from tokenreduce.study.tables import machines_text, paired_by_seed, paired_items, summary
from tokenreduce.study.testbed import Testbed as Where
from tokenreduce.tasks.items import decode


def _runner(study, out: Path) -> Runner:
    return Runner(study, layout_for(study, str(out)), threads=1, flags=["--smoke", "--out", str(out)],
                  log=lambda msg: None)


def _scenes(name: str, new: str, keep: tuple[str, ...] | None = None, **over) -> type[Study]:
    """Register ``new``: the study ``name`` on its scene bed alone, with only the arms ``keep`` (and their
    claims) and the bed's fields ``over`` changed."""
    cls = get_study(name)
    bed = cls.beds["scenes"]
    if keep is not None:
        over["arms"] = {k: bed.arms[k] for k in keep}
    bed = dataclasses.replace(bed, **over)
    expect = tuple(e for e in cls.expect if {e.arm, e.baseline} <= set(bed.arms))
    return register_study(new, TEST_STUDIES)(type(new, (cls,), {"beds": {"scenes": bed}, "expect": expect}))


#: two trained arms and the evaluated oracle arm of the scene EET study, one seed
_scenes("eet", "tiny_oracle_test", ("a_unpruned", "b_ctp", "e_oracle"), evaluations=(),
        smoke=dict(get_study("eet").beds["scenes"].smoke, grid={"bits": (8,), "seed": (0,),
                                                                                "steps": (100,)}))


@pytest.fixture(scope="module")
def oracle_smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[Runner, dict]:
    out = tmp_path_factory.mktemp("oracle-smoke")
    runner = _runner(get_study("tiny_oracle_test")(smoke=True), out)
    runner.run()
    return runner, load_runs(runner.layout)


def test_an_evaluated_arm_reads_its_source_run_after_it(oracle_smoke):
    runner, runs = oracle_smoke
    unit = runner.unit("e_oracle-b8-s0")
    assert unit.kind == "evaluate" and unit.needs == ("b_ctp-b8-s0",)
    order = [u.id for u in runner.units]
    assert order.index("e_oracle-b8-s0") > order.index("b_ctp-b8-s0")
    doc = runs["e_oracle-b8-s0"]
    assert doc["kind"] == "evaluate" and doc["evaluates"] == "b_ctp-b8-s0"
    assert {k: v for k, v in doc["metrics"].items() if k != "items"} == doc["result"]["rows"]["object_first"]


def test_the_oracle_runs_at_the_trained_pruners_counts_on_its_weights_and_items(oracle_smoke):
    runner, runs = oracle_smoke
    result, source = runs["e_oracle-b8-s0"]["result"], runs["b_ctp-b8-s0"]["metrics"]
    assert result["counts"] == [98, 49, 12] and result["locs"] == [3, 7, 9]
    assert result["oracle_spec"].startswith("oracle(counts=(98, 49, 12), locs=(3, 7, 9), where='block'")
    # the "own" row re-evaluates the trained run: the same weights on the same test items and database
    for key in ("map_asym", "map_sym", "top1"):
        assert result["rows"]["own"][key] == pytest.approx(source[key], abs=1e-9)
    assert result["rows"]["object_first"]["map_asym"] != result["rows"]["own"]["map_asym"]
    study = runner.study
    assert list(paired_by_seed(study, runs, "e_oracle", "b_ctp", "map_asym", {}).values()) == pytest.approx(
        [result["rows"]["object_first"]["map_asym"] - source["map_asym"]])


def test_the_oracle_record_holds_its_per_item_results_paired_with_the_trained_arms(oracle_smoke):
    runner, runs = oracle_smoke
    oracle, trained = runs["e_oracle-b8-s0"]["metrics"], runs["b_ctp-b8-s0"]["metrics"]
    for key in ("map_asym", "top1"):
        values = decode(oracle["items"][key])
        assert len(values) == len(decode(trained["items"][key])) == runs["e_oracle-b8-s0"]["result"]["items"]
        assert 100.0 * values.mean() == pytest.approx(oracle[key], abs=1e-4)
    claim = next(e for e in runner.study.expect if (e.arm, e.baseline) == ("e_oracle", "b_ctp"))
    differences = paired_items(runner.study, runs, claim)
    assert len(differences) == runs["e_oracle-b8-s0"]["result"]["items"]
    assert sum(differences) / len(differences) == pytest.approx(oracle["map_asym"] - trained["map_asym"], abs=1e-3)


def test_bad_evaluated_arms_are_refused():
    base = {"a_unpruned": get_study("eet").beds["scenes"].arms["a_unpruned"]}
    oracle = "oracle_at_counts"
    cases = [({"e": Arm("e", kind="evaluated", reads="a_unpruned")}, "evaluated .it trains nothing.*its spec"),
             ({"e": Arm("e", oracle, kind="evaluated")}, "reads= .* goes with the kinds 'after' and 'evaluated'"),
             ({"e": Arm("e", oracle, reads="a_unpruned")}, "goes with the kinds .* .its kind: 'trained'"),
             ({"e": Arm("e", oracle, kind="evaluated", reads="nope")}, "not another of its trained arms"),
             ({"e": Arm("e", oracle, kind="evaluated", reads="a_unpruned"),
               "f": Arm("f", oracle, kind="evaluated", reads="e")}, "not another of its trained arms"),
             ({"e": Arm("e", oracle, kind="evaluated", reads="a_unpruned", options={"task": "eet()"})},
              "trains nothing"),
             ({"e": Arm("e", oracle, kind="evaluate")}, "is of kind 'evaluate'; choose from trained, after, ")]
    for i, (arms, match) in enumerate(cases):
        with pytest.raises(SpecError, match=match):
            _scenes("eet", f"bad_evaluated_{i}", arms={**base, **arms}, evaluations=())


def test_a_synthetic_scene_bed_builds_the_named_data_from_synthetic_images(tmp_path: Path):
    bed = Where(model="vit_tiny_patch16_224", data="fmnist_scenes", synthetic=True)
    fields = bed.train_fields(tmp_path)
    assert fields["data"] == "fmnist_scenes" and Path(fields["data_dir"]).is_dir()
    assert not bed.fmnist() and "fmnist_scenes from synthetic" in bed.text()
    assert Where(model="vit_tiny_patch16_224", synthetic=True).fmnist()


def test_a_second_phase_starts_from_the_first_phases_checkpoint(tmp_path: Path):
    study = get_study("bspf")(smoke=True)
    runner = _runner(study, tmp_path)
    unit = runner.unit("bspf_tied2-s0")
    assert unit.kind == "train" and unit.needs == ("tied_full-s0",)
    with pytest.raises(Exception, match="not done"):
        runner.run_one(unit)
    first = runner.run_one(runner.unit("tied_full-s0"))
    second = runner.run_one(unit)
    assert second["config"]["init"] == first["metrics"]["checkpoint"]
    assert second["config"]["model"]["transforms"] == ["tie_qk"]


def test_bad_second_phases_are_refused():
    arms = get_study("bspf").beds["scenes"].arms
    for i, arm in enumerate([Arm("x", kind="after", reads="nope"), Arm("x", kind="after", reads="x")]):
        with pytest.raises(SpecError, match="reads .*, which is not another of its trained arms"):
            _scenes("bspf", f"bad_after_{i}", arms={**arms, "x": arm},
                    evaluations=get_study("bspf").beds["scenes"].measures)


def test_a_pending_reason_is_printed_where_runs_are_missing(tmp_path: Path):
    from tokenreduce.study.page import build_report
    from tokenreduce.study.tables import summary

    study = _scenes("eet", "pending_test", pending="scheduled for the next sitting")()
    assert "60 of 60 runs not run (steps 100: 36, 937: 12, 9370: 12): scheduled for the next sitting." in \
        summary(study, {})
    done = {p.id: {"metrics": {}} for p in study.points() if p.values["steps"] != 9370}  # which are missing, counted
    assert "12 of 60 runs not run (steps 9370: 12): scheduled for the next sitting." in summary(study, done)
    text = build_report(tmp_path, names=["pending_test"]).read_text()
    assert "not run: scheduled for the next sitting." in text


def test_a_recipe_distils_from_the_test_beds_reference(tmp_path: Path):
    from tokenreduce.core.errors import TokenReduceError
    from tokenreduce.train.recipes import reference_checkpoint

    study = get_study("baselines")()
    fields = study.train_fields(study.point("tome-1.5x", {"seed": 0}), tmp_path)
    assert fields["teacher"] == str(reference_checkpoint("scenes-vit")) == fields["init"]
    assert fields["spec"] == "tome(r=(17, 17, 17, 17, 17, 17, 17, 17, 17, 17, 13, 6))"
    matched = study.train_fields(study.point("random~tome-1.5x", {"seed": 2}), tmp_path)["spec"]
    assert matched.endswith("where='attn', seed=2)")
    scratch = get_study("baselines")(testbed=Where(model="vit_tiny_patch16_224", data="fmnist_scenes"))
    with pytest.raises(TokenReduceError, match="distils from the test bed's reference"):
        scratch.train_fields(scratch.point("tome-1.5x", {"seed": 0}), tmp_path)


def test_a_measure_scores_the_runs_test_items(tmp_path: Path):
    full, smoke = get_study("eet")(), get_study("eet")(smoke=True)
    assert full.eval_items(tmp_path) == (None, 2000)  # the reference's own scenes, the recipe's 2 000
    data_dir, n = smoke.eval_items(tmp_path)
    assert n == 16 and Path(data_dir).is_dir()  # the synthetic images the smoke's runs were trained on


def test_a_stem_arm_swaps_the_stem_into_the_reference(tmp_path: Path):
    """The stem-only control on the scene bed: the reference's own architecture with the conv stem, starting
    from the reference's weights (models/build.py swaps the stem in fresh)."""
    from tokenreduce.models import model_config
    from tokenreduce.train.loop import TrainConfig, make_model
    from tokenreduce.train.recipes import get_recipe, reference_checkpoint

    study = get_study("imagepiece")()
    fields = study.train_fields(study.point("conv", {"seed": 0}), tmp_path)
    assert fields["init"] == str(reference_checkpoint("scenes-vit"))
    assert fields["model"] == {**get_recipe("scenes-vit")["model"], "stem": "conv"} and fields["spec"] is None
    with_ip = study.train_fields(study.point("conv_imagepiece", {"seed": 0}), tmp_path)
    assert with_ip["model"] == fields["model"] and with_ip["spec"].startswith("imagepiece(")
    model, cfg, _ = make_model(TrainConfig(init=fields["init"], model=fields["model"]))
    assert cfg == model_config(get_recipe("scenes-vit")["model"], stem="conv")
    assert type(model.patch_embed.proj).__name__ == "ConvStem"


def test_an_arm_table_heading_names_the_schedule_a_study_changed():
    from tokenreduce.train.recipes import get_recipe, recipe_text

    said = "fmnist-cropr, schedule changed: 1 epoch(s) of 6400 training items, batch 64"
    assert recipe_text(get_study("cropr").beds["scenes"].recipe) == said
    assert recipe_text(get_recipe("fmnist-cropr")) == "fmnist-cropr" and recipe_text({}) == "recipe"


def test_a_measure_over_two_arms_of_one_model_and_spec_is_refused():
    """The evaluation groups checkpoints by model and spec: two such arms would silently share one row."""
    both = Timing("speed", at={"seed": 0}, finetuned=("bspf_mirrored", "bspf_untied2"))
    with pytest.raises(SpecError, match="bspf_mirrored and bspf_untied2, which carry the same model and spec"):
        _scenes("bspf", "bad_measure", evaluations=(both, *get_study("bspf").beds["scenes"].probes))


#: two fine-tuned arms, one on its own model (the conv stem), and a measure over both, one seed
_scenes("imagepiece", "tiny_records_test", ("none", "imagepiece", "conv_imagepiece"),
        evaluations=(Timing("speed", at={"seed": 0}, finetuned=("imagepiece", "conv_imagepiece"),
                             columns=SPEED_COLUMNS),),
        smoke=scene_smoke(grid={"seed": (0,)}, measure=SMOKE_MEASURE))


def _fine_tuned(doc: dict) -> dict[str, dict]:
    return {r["label"]: r for r in doc["result"]["results"] if r["kind"] == "fine-tuned"}


@pytest.mark.slow
def test_a_measure_reads_the_runs_records_and_needs_no_checkpoint(tmp_path: Path):
    """A measure takes each run's final evaluation from its record (what evaluating its checkpoint on the
    same items gives) and counts its model and spec afresh (the trained model's MACs), so it runs after
    the checkpoints are gone: a study spread over checkouts keeps only its records."""
    from tokenreduce.bench import evaluation as ev
    from tokenreduce.bench.accuracy import evaluate_cases

    runner = _runner(get_study("tiny_records_test")(smoke=True), tmp_path)
    runner.run()
    runs = load_runs(runner.layout)
    rows = _fine_tuned(runs["speed"])
    notes = {label.split(" [")[1] for label in rows}
    assert notes == {"fine-tuned x1]", "stem conv(norm='bn'), fine-tuned x1]"}
    from tokenreduce.study.records import resolve

    def checkpoint(run: str) -> str:  # a record's path, written from the study's checkpoint folder
        return resolve(runs[run]["metrics"]["checkpoint"], runner.layout)

    ref = ev.load_reference(checkpoint("none-s0"))  # the smoke bed's reference: its baseline
    data = ev.load_data(ref, data_dir=runner.study.eval_items(runner.layout.checkpoints)[0], subset=16)
    paths = [checkpoint(f"{a}-s0") for a in ("imagepiece", "conv_imagepiece")]
    direct = evaluate_cases(ref.model, data.test, ev.finetuned_cases(paths, ref), task=ref.task,
                            speed={"batch": 2, "warmup": 0, "repeats": 1, "threads": 1})
    for row in (r for r in direct if r["kind"] == "fine-tuned"):
        assert rows[row["label"]]["top1"] == pytest.approx(row["top1"], abs=1e-9)
        assert rows[row["label"]]["macs"] == row["macs"]  # its own model, built from its config, costs the same
    for path in paths:
        Path(path).unlink()
    runner.layout.json("speed").unlink()
    again = _fine_tuned(runner.run_one(runner.unit("speed")))
    assert {s: (r["top1"], r["macs"]) for s, r in again.items()} == {s: (r["top1"], r["macs"]) for s, r in rows.items()}


@pytest.mark.slow
def test_a_lost_checkpoint_is_made_again_and_a_changed_result_replaces_its_record(tmp_path: Path):
    import json

    from tokenreduce.core.errors import TokenReduceError

    runner = _runner(get_study("bspf")(smoke=True), tmp_path)
    first = runner.run_one(runner.unit("tied_full-s0"))
    ckpt = Path(first["metrics"]["checkpoint"])
    ckpt.unlink()
    runner.run_one(runner.unit("bspf_tied2-s0"))  # reads tied_full-s0's checkpoint: made again, reproduced
    assert ckpt.is_file() and "replaces" not in json.loads(runner.layout.json("tied_full-s0").read_text())

    record = runner.layout.json("tied_full-s0")
    doc = json.loads(record.read_text())
    doc["metrics"]["top1"] = 0.5  # as if made on a machine whose arithmetic differs (its items would too)
    doc["metrics"].pop("items", None)
    record.write_text(json.dumps(doc))
    ckpt.unlink()
    with pytest.raises(TokenReduceError, match=r"its record now holds the new run\), and the done runs "
                                               r"\['bspf_tied2-s0'\] read the old run"):
        runner.run_one(runner.unit("bspf_tied2-s0"))
    assert json.loads(record.read_text())["replaces"]["metrics"] == {"top1": 0.5}

    record.write_text(json.dumps(doc))
    ckpt.unlink()
    runner.layout.json("bspf_tied2-s0").unlink()
    runner.run_one(runner.unit("bspf_tied2-s0"))
    replaced = json.loads(record.read_text())
    assert replaced["metrics"]["top1"] == first["metrics"]["top1"]
    assert replaced["replaces"]["metrics"] == {"top1": 0.5} and "did not reproduce" in replaced["replaces"]["why"]
    text = summary(runner.study, load_runs(runner.layout))
    assert f"tied_full-s0 was made again (its checkpoint was gone and running it again did not reproduce its " \
           f"metric): top1 {first['metrics']['top1']:.2f}" in text and "in place of 0.50" in text

    older = {**doc, "provenance": {k: v for k, v in doc["provenance"].items() if k != "cpu"}}  # as records made
    older["metrics"] = {k: v for k, v in doc["metrics"].items() if k not in ("metric", "provenance")}  # before
    record.write_text(json.dumps(older))  # they named their metric and machine: made again all the same
    ckpt.unlink()
    runner.layout.json("bspf_tied2-s0").unlink()
    runner.run_one(runner.unit("bspf_tied2-s0"))
    assert json.loads(record.read_text())["replaces"] | {"provenance": None} == {
        "why": replaced["replaces"]["why"], "metrics": {"top1": 0.5}, "provenance": None, "cpu": None}
    assert "in place of 0.50 (its machine not recorded)." in summary(runner.study, load_runs(runner.layout))


def test_a_summary_says_when_its_runs_were_made_on_several_machines():
    runs = {f"full-s{i}": {"kind": "train", "metrics": {"provenance": {"cpu": cpu}}}
            for i, cpu in enumerate(["AMD EPYC", "AMD EPYC", "Intel Xeon"])}
    assert "made on 2 machines (AMD EPYC: 2 runs; Intel Xeon: 1 run)" in "".join(machines_text(runs))
    assert machines_text({k: runs[k] for k in ("full-s0", "full-s1")}) == []


#: Cropr against top-k at both fine-tune lengths, two seeds, tiny (studies/beds.py LENGTH, lengths.py)
_scenes("cropr", "tiny_lengths_test", ("cropr", "topk"), baseline="topk",
        smoke=dict(get_study("cropr").beds["scenes"].smoke,
                                  grid={"seed": (0, 1), "steps": (100, 937)}))  # two lengths of the three


@pytest.mark.slow
def test_the_length_axis_runs_each_length_and_the_report_shows_them_side_by_side(tmp_path: Path):
    from tokenreduce.studies.beds import EPOCH_STEPS, STEPS
    from tokenreduce.study.page import build_report

    study = get_study("tiny_lengths_test")(smoke=True)
    long = study.point("cropr", {"steps": EPOCH_STEPS, "seed": 1})
    assert long.id == f"cropr-t{EPOCH_STEPS}-s1" and study.point("cropr", {"seed": 1}).id == "cropr-s1"
    fields = study.train_fields(long, tmp_path)
    assert fields["subset"] is None and fields["eval_subset"] is None  # one epoch, every test item
    assert study.train_fields(study.point("cropr", {"seed": 1}), tmp_path)["subset"] == 32  # the smoke's short
    runner = _runner(study, tmp_path / "study")
    runner.run()
    runs = load_runs(runner.layout)
    assert runs[long.id]["point"] == {"steps": EPOCH_STEPS, "seed": 1}
    assert len(runs) == 2 * 2 * 2  # arms x lengths x seeds
    assert runs[long.id]["metrics"]["items"]["top1"]["n"] == runs[long.id]["metrics"]["n_eval"]
    text = summary(study, runs)
    assert f"| Token Cropr (steps {EPOCH_STEPS}) | 0, 1 |" in text and "| Token Cropr | 0, 1 |" in text
    root = tmp_path / "results"
    key = root / study.key / "runs"
    key.mkdir(parents=True)
    bed = get_study("tiny_lengths_test")().bed.describe()  # the report reads the study on its own bed
    for p in runner.layout.results.joinpath("runs").glob("*.json"):
        (key / p.name).write_text(json.dumps({**json.loads(p.read_text()), "testbed": bed}))
    page = build_report(root, names=["tiny_lengths_test"]).read_text()
    over = page.split("### Over the fine-tune length", 1)[1]
    row = next(line for line in over.splitlines() if line.startswith("| Cropr beats topk at the same counts | -"))
    assert row.count("**") == 2 and " steps" in row.split("|")[-2]  # the verdict stated at the longest length
    assert f"Δ at {STEPS} steps" in over and f"Δ at {EPOCH_STEPS} steps" in over
    assert (root / "figures" / "tiny_lengths_test-scenes-lengths.png").stat().st_size > 0
