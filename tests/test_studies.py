"""Studies (study/declare.py, runner.py, tables.py, page.py): every registered study's smoke end to end,
an interrupted plan continued, the per-run commands against the in-process runner (``--jobs``: test_study_runner.py),
a study on a timm model with local weights and an image folder, the report rebuilt byte-identical, the EET
study's committed tables regenerated from its stored runs, and benches (the bench command's pipeline as a
study's run; the bench studies' committed tables regenerated from the stored bench outputs)."""

from __future__ import annotations

import dataclasses
import json
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import TEST_STUDIES

from tokenreduce.cli import main
from tokenreduce.core.errors import SpecError, TokenReduceError
from tokenreduce.studies.beds import SCENES, TINY_FMNIST, scene_smoke
from tokenreduce.studies.readme import headline
from tokenreduce.study import (
    Arm,
    Axis,
    Bed,
    Col,
    Expect,
    Probe,
    Study,
    Timing,
    execute,
    get_study,
    list_studies,
    register_study,
)
from tokenreduce.study.figures import colours, pyplot, set_title
from tokenreduce.study.page import build_report
from tokenreduce.study.plan import Layout, layout_for
from tokenreduce.study.records import load_runs
from tokenreduce.study.runner import Runner
from tokenreduce.study.tables import summary, verdicts
from tokenreduce.study.testbed import Testbed as Where
from tokenreduce.tasks.items import decode  # not Test*: pytest would collect it

ROOT = Path(__file__).resolve().parents[1]


def _runner(study: Study, out: Path) -> Runner:
    return Runner(study, layout_for(study, str(out)), threads=1, flags=["--smoke", "--out", str(out)],
                  log=lambda msg: None)


EET_FMNIST = get_study("eet").beds["fmnist"]


def _tiny_bed(**over: Any) -> dict[str, Bed]:
    """A test-only two-arm cut of the EET study's fmnist bed (fast kill-and-continue checks), ``over`` changed."""
    bed = Bed(testbed=EET_FMNIST.testbed, recipe=EET_FMNIST.recipe,
              arms={"a": Arm("(a)", options={"task": "eet(dkt=False, drg=False)"}),
                    "b": Arm("(b)", options={"task": "eet(dkt=False, drg=False)"}, spec="ctp()")},
              baseline="a", grid=(Axis("bits", (8,), "b"), Axis("seed", (0, 1), "s")), columns=EET_FMNIST.columns[:1],
              smoke=EET_FMNIST.smoke)
    return {"fmnist": dataclasses.replace(bed, **over)}


@register_study("tiny_eet_test", TEST_STUDIES)
class _TinyEET(Study):
    claim, source = "test", "test"
    expect = (Expect("b below a", "test", arm="b", baseline="a", metric="map_asym", direction=-1),)
    beds = _tiny_bed()


@pytest.fixture(scope="module")
def eet_smoke(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The EET study's smoke on its fmnist bed, run once in-process."""
    out = tmp_path_factory.mktemp("eet-smoke")
    _runner(get_study("eet")("fmnist", smoke=True), out).run()
    return out


@pytest.mark.slow
def test_eet_smoke_runs_end_to_end(eet_smoke: Path):
    study = get_study("eet")("fmnist", smoke=True)
    runs = load_runs(Layout(eet_smoke, eet_smoke / "checkpoints"))
    assert set(runs) == {u.id for u in Runner(study, Layout(eet_smoke, eet_smoke), threads=1).units}
    doc = runs["d_eet-b8-s1"]
    assert doc["id"] == "eet/fmnist/d_eet-b8-s1" and doc["bed"] == "fmnist"
    assert doc["point"] == {"bits": 8, "seed": 1} and doc["smoke"]
    assert doc["config"]["spec"] == "ctp()" and doc["metrics"]["bits"] == 8 and doc["provenance"]["torch"]
    aps = decode(doc["metrics"]["items"]["map_asym"])  # the final evaluation's per-query results
    assert aps.shape == (doc["metrics"]["n_query"],)
    assert runs["speed"]["result"]["results"][0]["label"] == "unpatched"
    assert runs["recall"]["result"]["blocks"]
    judged = verdicts(study, runs)
    assert judged and all(j.verdict is not None and j.verdict.n == 2 for j in judged)
    text = summary(study, runs)
    assert "### 8 bits" in text and "## Verdicts" in text and "not run" not in text


@pytest.mark.slow
@pytest.mark.parametrize(("name", "bed"), [(n, b) for n in list_studies() for b in get_study(n).beds])
def test_every_registered_study_runs_its_smoke(name: str, bed: str, tmp_path: Path,
                                               request: pytest.FixtureRequest):
    study = get_study(name)(bed, smoke=True)
    if (name, bed) == ("eet", "fmnist"):  # already run by the fixture the other EET tests share
        out = request.getfixturevalue("eet_smoke")
    else:
        out = tmp_path
        _runner(study, out).run()
    runs = load_runs(layout_for(study, str(out)))
    assert set(runs) == {u.id for u in _runner(study, out).units}
    assert all(j.verdict is not None for j in verdicts(study, runs)) and "not run" not in summary(study, runs)


def _comparable(doc: Any) -> Any:
    """``doc`` without what differs between two executions of the same run: provenance (also the git
    revision train() records in the metrics), times, paths (a probe's spec names its checkpoint), checkpoint
    digests (a checkpoint file holds its own path and provenance)."""
    drop = {"provenance", "git", "command", "experiment", "out", "checkpoint", "figures", "data", "time_s",
            "checkpoint_sha256", "sha256",
            "train_time_s", "threads",
            "img_per_s", "img_per_s_iqr", "latency_ms", "latency_ms_iqr", "speedup", "latency_speedup", "runs",
            "img_per_s_runs", "latency_ms_runs", "speed", "reference", "wall_s"}
    if isinstance(doc, dict):
        return {k: _comparable(v) for k, v in doc.items() if k not in drop}
    if isinstance(doc, list):
        return [_comparable(v) for v in doc]
    return doc


@pytest.mark.slow
def test_listed_commands_give_the_in_process_results(eet_smoke: Path, tmp_path: Path, capsys):
    out = tmp_path / "by-command"
    assert main(["study", "eet", "--testbed", "fmnist", "--smoke", "--list", "--out", str(out), "--threads", "1"]) == 0
    commands = capsys.readouterr().out.splitlines()
    assert len(commands) == 10
    assert all(c.startswith("tokenreduce study eet --testbed fmnist --run ") for c in commands)
    for line in commands:  # what a scheduler would run, one at a time
        assert main(shlex.split(line)[1:]) == 0
    mine, theirs = load_runs(Layout(out, out)), load_runs(Layout(eet_smoke, eet_smoke))
    assert mine.keys() == theirs.keys()
    for run_id in mine:
        a, b = mine[run_id], theirs[run_id]
        if a["kind"] == "measure":  # a timing differs between any two runs: compare what it computed
            def computed(doc: dict) -> list:
                return [(r["label"], r["value"], r["macs"], r["tokens_per_block"]) for r in doc["result"]["results"]]

            assert computed(a) == computed(b)
            a, b = {k: v for k, v in a.items() if k != "result"}, {k: v for k, v in b.items() if k != "result"}
        assert _comparable(a) == _comparable(b), run_id


def test_a_killed_study_continues_and_does_each_run_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from tokenreduce.train.config import TrainConfig

    done: list[str] = []
    real = execute.EXECUTORS[TrainConfig]

    def counting(cfg: TrainConfig, ctx: Any) -> dict[str, Any]:
        if len(done) == 2:  # the third run is killed in its first steps, a checkpoint left behind
            from tokenreduce.train.loop import train

            def kill(step: int) -> None:
                if step == 1:
                    raise KeyboardInterrupt

            done.append("killed")
            train(cfg, on_step=kill)
        out = real(cfg, ctx)
        done.append(Path(cfg.out).name)
        return out

    monkeypatch.setitem(execute.EXECUTORS, TrainConfig, counting)
    study = get_study("tiny_eet_test")(smoke=True)
    with pytest.raises(KeyboardInterrupt):
        _runner(study, tmp_path).run()
    assert done == ["a-b8-s0", "b-b8-s0", "killed"]
    assert (tmp_path / "checkpoints" / "a-b8-s1" / "last.safetensors").is_file()
    _runner(study, tmp_path).run()  # continues: the killed run resumes, the finished ones are skipped
    assert done == ["a-b8-s0", "b-b8-s0", "killed", "a-b8-s1", "b-b8-s1"]
    _runner(study, tmp_path).run()
    assert len(done) == 5 and len(load_runs(Layout(tmp_path, tmp_path))) == 2 + 2


def test_a_run_made_on_another_test_bed_is_refused(tmp_path: Path):
    study = get_study("tiny_eet_test")(smoke=True)
    runner = _runner(study, tmp_path)
    path = runner.layout.json("a-b8-s0")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"testbed": {"reference": "fmnist-vit"}}))
    with pytest.raises(TokenReduceError, match="another --out"):
        runner.run()


def test_the_tests_studies_are_found_by_name_and_never_listed():
    assert "tiny_eet_test" in TEST_STUDIES.names() and get_study("tiny_eet_test") is _TinyEET
    assert not set(TEST_STUDIES.names()) & set(list_studies())  # the report and `tokenreduce study` list the real ones


def test_the_smallest_study_of_the_docs_declares_and_plans():
    """docs/extending.md's example study, as written there, registers (into the tests' registry) and plans."""
    code = (ROOT / "docs" / "extending.md").read_text().split("## A study", 1)[1].split("```python\n", 1)[1]
    code = code.split("```", 1)[0].replace('register_study("topk_vs_random")',
                                           'register_study("topk_vs_random", TEST_STUDIES)')
    exec(compile(code, "docs/extending.md", "exec"), {"TEST_STUDIES": TEST_STUDIES})
    study = get_study("topk_vs_random")(smoke=True)
    assert [p.id for p in study.points()] == ["random-s0", "topk-s0", "random-s1", "topk-s1"]
    assert [e.arm for e in study.expect] == ["topk"] and "topk_vs_random" not in list_studies()
    assert study.title == "Top-k against random at the same token counts, fine-tuned"  # a bed's, not the class's


def test_bad_declarations_are_refused():
    with pytest.raises(SpecError, match="unknown training settings"):
        @register_study("bad_recipe_test", TEST_STUDIES)
        class _Bad(_TinyEET):
            beds = _tiny_bed(recipe={"learning_rate": 0.1})
    with pytest.raises(SpecError, match="baseline"):
        @register_study("bad_baseline_test", TEST_STUDIES)
        class _Bad2(_TinyEET):
            beds = _tiny_bed(baseline="z")
    with pytest.raises(SpecError, match=r"its smoke sets unknown keys \['recipes'\]; choose from"):
        @register_study("bad_smoke_test", TEST_STUDIES)
        class _Bad3(_TinyEET):
            beds = _tiny_bed(smoke={**EET_FMNIST.smoke, "recipes": {}})
    with pytest.raises(SpecError, match="declares a power plan, whose pilot is .*; it is there itself"):
        @register_study("bad_power_test", TEST_STUDIES)
        class _Bad4(_TinyEET):
            expect = (dataclasses.replace(_TinyEET.expect[0], power=1.0),)
    with pytest.raises(TokenReduceError, match="no run"):
        _runner(get_study("tiny_eet_test")(smoke=True), Path("unused")).unit("nope")



_ONLY_ARMS = {**_TinyEET.beds["fmnist"].arms,
              "c": Arm("(c)", options={"task": "eet(dkt=False, drg=False, fish_delta=0.01)"}, only={"bits": (16,)})}


def _only_bed(**arms: Arm) -> dict[str, Bed]:
    """_TinyEET with two code lengths and a third arm at the second only (and ``arms`` added)."""
    return _tiny_bed(arms={**_ONLY_ARMS, **arms}, grid=(Axis("bits", (8, 16), "b"), Axis("seed", (0, 1), "s")),
                     split=("bits", "{} bits"))


@register_study("only_test", TEST_STUDIES)
class _Only(_TinyEET):
    beds = _only_bed()


def test_an_arm_runs_only_where_it_says():
    study = get_study("only_test")()
    assert [p.id for p in study.points() if p.arm == "c"] == ["c-b16-s0", "c-b16-s1"]
    assert len(study.points()) == 2 * 2 * 2 + 2
    runs = {p.id: {"metrics": {"map_asym": 50.0 + i}} for i, p in enumerate(study.points())}
    text = summary(study, runs)
    eight, sixteen = text.split("### 16 bits")
    assert "| (c) | 0, 1 |" in sixteen and "(c)" not in eight and "not run" not in text
    smoke = get_study("only_test")(smoke=True)  # its grid has 8 bits only: c runs there, like every arm
    assert {p.id for p in smoke.points() if p.arm == "c"} == {"c-b8-s0", "c-b8-s1"}
    with pytest.raises(SpecError, match="runs only at"):
        @register_study("bad_only_test", TEST_STUDIES)
        class _Bad(_Only):
            beds = _only_bed(d=Arm("(d)", only={"bits": (32,)}))
    with pytest.raises(SpecError, match=r"arm e reads arm c at \{'bits': 8, 'seed': 0\}, where it has no runs"):
        @register_study("bad_only_source_test", TEST_STUDIES)
        class _Bad2(_Only):
            beds = _only_bed(e=Arm("(e)", "oracle_at_counts", kind="evaluated", reads="c"))
    with pytest.raises(SpecError, match=r"probe p reads arm c at \{'bits': 8\}, where it has no runs"):
        @register_study("bad_only_probe_test", TEST_STUDIES)
        class _Bad4(_Only):
            beds = {"fmnist": dataclasses.replace(_Only.beds["fmnist"], evaluations=(
                Probe("p", "recall_at_kept", arm="c", at={"bits": 8}),))}
    with pytest.raises(SpecError, match="it fixes the seed"):  # a claim pairs by seed: it reads every seed
        Expect("c below a", "test", arm="c", baseline="a", metric="map_asym", direction=-1, at={"seed": 0})
    with pytest.raises(SpecError, match=r"no test bed has the arms \(at the grid point\) of the claims"):
        @register_study("bad_only_expect_test", TEST_STUDIES)
        class _Bad3(_Only):
            expect = (Expect("c below a", "test", arm="c", baseline="a", metric="map_asym", direction=-1,
                             at={"bits": 8}),)



@register_study("off_the_shelf_test", TEST_STUDIES)
class _OffTheShelf(Study):
    """Two training-free arms evaluated on the bed's reference (a smoke: the model at its initialisation)."""

    claim, source = "test", "test"
    expect = (Expect("tome above random", "test", arm="tome", baseline="random", metric="top1", direction=1),)
    beds = {"scenes": Bed(
        testbed=SCENES, recipe={"eval_subset": 2000}, baseline="tome", grid=(Axis("seed", (0, 1), "s"),),
        arms={"tome": Arm("(tome)", spec="tome(r=8)", kind="off_the_shelf"),
              "random": Arm("(random)", spec="random(keep=0.5, locs=(3,), seed={seed})", kind="off_the_shelf")},
        columns=(Col("top1", "top-1 %"),), smoke=scene_smoke())}


def test_arms_evaluated_off_the_shelf_are_scored_per_item_on_disjoint_folds(tmp_path: Path):
    """An off-the-shelf arm trains nothing: its seeds score disjoint folds of the test items, and its claims
    are tested over the per-item differences (n = the test items, not the seeds)."""
    study = get_study("off_the_shelf_test")(smoke=True)
    runner = _runner(study, tmp_path)
    runner.run()
    runs = load_runs(runner.layout, study)
    folds = [runs[f"tome-s{s}"]["fold"] for s in (0, 1)]
    assert folds == [[0, 2], [1, 2]] and all(runs[i]["kind"] == "evaluate" for i in runs)
    items = [decode(runs[f"tome-s{s}"]["metrics"]["items"]["top1"]) for s in (0, 1)]
    assert [len(x) for x in items] == [8, 8]  # 16 smoke test items, two folds
    judged = verdicts(study, runs)[0]  # the random pruner draws another mask per fold: the folds are the unit
    assert judged.verdict is not None and judged.verdict.n == 2 and judged.items_why.startswith("the folds are the")
    fixed = dataclasses.replace(study.arms["random"], spec="random(keep=0.5, locs=(3,), seed=0)")
    study.arms["random"] = fixed  # one mask for every fold: the test items are the unit
    judged = verdicts(study, runs)[0]
    assert judged.verdict is not None and judged.verdict.n == 16 and judged.items_why == "the test items are the unit"
    with pytest.raises(SpecError, match="arm x is off_the_shelf .it trains nothing.; it takes a label, its spec"):
        @register_study("bad_off_the_shelf_test", TEST_STUDIES)
        class _Bad(_OffTheShelf):
            beds = {"scenes": dataclasses.replace(_OffTheShelf.beds["scenes"],
                                                  arms={**_OffTheShelf.beds["scenes"].arms,
                                                        "x": Arm("(x)", kind="off_the_shelf")})}


def test_a_whole_run_writes_its_summary(tmp_path: Path, capsys):
    out = tmp_path / "study"
    assert main(["study", "tiny_eet_test", "--smoke", "--out", str(out), "--threads", "1"]) == 0
    printed = capsys.readouterr().out
    assert (out / "summary.md").read_text() == printed and "## Verdicts" in printed
    (out / "summary.md").unlink()
    assert main(["study", "tiny_eet_test", "--smoke", "--out", str(out), "--summarize"]) == 0
    assert (out / "summary.md").read_text() == capsys.readouterr().out == printed
    record = sorted((out / "runs").glob("*.json"))[-1]
    before = record.read_bytes()
    assert main(["study", "tiny_eet_test", "--smoke", "--out", str(out), "--run", record.stem]) == 0
    assert f"run {record.stem} is done: {record}" in capsys.readouterr().err and record.read_bytes() == before


def _image_folder(root: Path) -> Path:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", 12), ("val", 6)):
        for k, cls in enumerate(("cat", "dog")):
            (root / split / cls).mkdir(parents=True)
            for i in range(n):
                img = rng.integers(0, 60, (28, 28, 3), dtype=np.uint8)
                img[4 + 10 * k: 12 + 10 * k] = 220  # a learnable band per class
                Image.fromarray(img).save(root / split / cls / f"{i}.png")
    return root


@pytest.mark.slow
def test_a_study_on_a_timm_model_with_local_weights_and_an_image_folder(tmp_path: Path):
    import timm
    import torch
    from safetensors.torch import save_file

    kwargs = {k: v for k, v in TINY_FMNIST.items() if k != "num_classes"}
    torch.manual_seed(0)
    weights = tmp_path / "tiny.safetensors"
    save_file(timm.create_model("vit_tiny_patch16_224", **kwargs).state_dict(), str(weights))
    bed = Where(model="vit_tiny_patch16_224", kwargs=kwargs, weights=str(weights),
                  data=str(_image_folder(tmp_path / "folder")))
    study = get_study("tiny_eet_test")(testbed=bed, smoke=True)
    out = tmp_path / "out"
    _runner(study, out).run()
    runs = load_runs(Layout(out, out))
    assert len(runs) == 4 and runs["a-b8-s0"]["testbed"]["weights"] == str(weights)
    assert runs["a-b8-s0"]["metrics"]["n_query"] == 12  # the folder's val split, 2 classes x 6
    from safetensors.torch import load_file

    from tokenreduce.models import build_model

    start = build_model(runs["a-b8-s0"]["config"]["model"]).state_dict()  # what every run started from
    assert torch.equal(start["pos_embed"], load_file(str(weights))["pos_embed"])
    assert verdicts(study, runs)[0].verdict is not None
    assert "tiny.safetensors" in summary(study, runs)


def test_a_long_figure_title_wraps_inside_the_figure_and_many_arms_get_distinct_colours():
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.6), layout="constrained")
    ax.legend(handles=[ax.bar([0], [1], label="an arm")[0]], loc="upper left", bbox_to_anchor=(1.01, 1.0))
    title = set_title(fig, "Token Cropr on the scene test bed (classification): the learned router against fixed "
                           "scorers: each claim's difference over the fine-tune length")
    fig.canvas.draw()
    box = title.get_window_extent()
    assert "\n" in title.get_text() and box.x0 >= 0 and box.x1 <= fig.bbox.width
    plt.close(fig)
    for n in (3, 14, 24):
        assert len(set(colours(n))) == n


def _copy_results(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    shutil.copytree(ROOT / "results" / "eet" / "fmnist" / "runs", root / "eet" / "fmnist" / "runs")
    return root


def test_report_rebuilds_byte_identical_and_shows_missing_runs(tmp_path: Path):
    root = _copy_results(tmp_path)
    page = build_report(root, names=["eet"], readme=None)
    first = page.read_bytes(), (root / "figures" / "eet-fmnist.png").read_bytes()
    again = build_report(root, names=["eet"], readme=None)
    assert (again.read_bytes(), (root / "figures" / "eet-fmnist.png").read_bytes()) == first
    text = first[0].decode()
    assert "58.30 -> 63.45" in text and "tokenreduce study eet --testbed fmnist" in text
    assert "| 95% t-interval | p raw / adjusted | verdict |" in text and "## What changed" in text
    assert "[^eet-fmnist]: Provenance:" in text and "record no git revision" in text  # its records carry none
    assert str(ROOT) not in text and "/work/" not in text
    for p in (root / "eet" / "fmnist" / "runs").glob("b_ctp-b64-*.json"):
        p.unlink()
    (root / "eet" / "fmnist" / "runs" / "speed.json").unlink()
    text = build_report(root, names=["eet"], readme=None).read_text()
    assert "| (b) CTP only | not run: no run JSON | not run |" in text
    assert "not run: no run JSON for speed" in text


def test_a_study_without_results_says_not_run(tmp_path: Path):
    text = build_report(tmp_path, names=["eet"], readme=None).read_text()
    assert "not run: no run JSON under `eet/fmnist/runs/`" in text and "| eet | CTP alone lowers mAP |" in text
    assert "not run: by plan, the 937-step runs are made on CPU cores" in text  # the scene bed says why
    assert "**not run**" in text


def test_command_lists_studies_and_refuses_bad_flags(capsys):
    assert main(["study"]) == 0
    assert "eet" in capsys.readouterr().out
    assert main(["study", "eet", "--data", "somewhere"]) == 2
    assert "--data needs --model" in capsys.readouterr().err
    assert main(["study", "eet", "--jobs", "0", "--list"]) == 2
    capsys.readouterr()
    assert main(["study", "no_such_study"]) == 2
    assert "unknown study 'no_such_study'" in capsys.readouterr().err


def test_where_runs_and_lists_one_slice_of_the_grid(tmp_path: Path, capsys, monkeypatch):
    assert main(["study", "bspf", "--where", "steps=937", "--list"]) == 0
    ids = [line.split("--run ")[1].split()[0] for line in capsys.readouterr().out.splitlines()]
    assert len(ids) == 6 * 3 and all("-t937-" in i for i in ids)  # the one-epoch arms x seeds, no measure or probe
    assert main(["study", "bspf", "--where", "seed=0", "--where", "steps=100,937", "--list"]) == 0
    ids = [line.split("--run ")[1].split()[0] for line in capsys.readouterr().out.splitlines()]
    assert "speed" in ids and "symmetry_tied2_s0" in ids and "symmetry_tied2_s1" not in ids  # reads only seed 0
    assert all(i.endswith("-s0") for i in ids if "t937" in i) and not any("t9370" in i for i in ids)
    study = get_study("eet")("fmnist", smoke=True)
    ran: list[str] = []
    monkeypatch.setattr(Runner, "run_one", lambda self, unit: ran.append(unit.id))
    runner = Runner(study, layout_for(study, str(tmp_path)), threads=1, where={"seed": {"1"}}, log=lambda m: None)
    runner.run()
    assert ran and all(r.endswith("-s1") for r in ran) and runner.unit("b_ctp-b8-s0")  # --run still finds any
    bspf, said = get_study("bspf")(), []
    Runner(bspf, layout_for(bspf, str(tmp_path / "bspf")), threads=1, log=said.append).run()
    assert "  to do by steps: 100: 30, 937: 18, 9370: 18 (--where steps=V runs one)" in said  # before any run


@pytest.mark.parametrize("where, message", [
    (["step=937"], "study bspf has no grid axis 'step'; its axes: steps, seed"),
    (["steps=93"], "steps=93 is not on its grid; valid: steps=100,937,9370"),
    (["steps"], "--where takes AXIS=VALUE[,VALUE...], e.g. --where steps=937; got 'steps'"),
    (["seed=0", "seed=1"], "--where names the axis 'seed' twice"),
])
def test_where_refuses_what_the_grid_lacks_naming_the_choices(where: list[str], message: str, capsys):
    assert main(["study", "bspf", "--list", *(a for w in where for a in ("--where", w))]) == 2
    assert message in capsys.readouterr().err
    assert main(["study", "bspf", "--where", "seed=0", "--summarize"]) == 2
    assert "does not combine with --summarize" in capsys.readouterr().err


def test_an_unwritable_out_is_refused_before_any_run(tmp_path: Path, capsys):
    (tmp_path / "file").write_text("")
    assert main(["study", "eet", "--smoke", "--out", str(tmp_path / "file"), "--threads", "1"]) == 2
    assert f"--out {tmp_path / 'file'} cannot be written (a file is in the way)" in capsys.readouterr().err


# ----------------------------------------------------------------------------- benches


def _bench_block(text: str, title: str) -> list[str]:
    """The lines of the table (fenced) under the heading ``## title`` of a summary."""
    after = text.split(f"## {title}\n", 1)[1]
    return after.split("```\n", 2)[1].rstrip("\n").splitlines()


@register_study("tiny_bench_test", TEST_STUDIES)
class _TinyBench(Study):
    """A test-only bench on test_vit at 64x64, the model tests/test_cli_bench.py times with the command."""

    claim, source = "test", "test"
    beds = {"cpu": Bed(evaluations=(Timing("tiny", model={"name": "test_vit", "kwargs": {"img_size": 64}},
                                       specs=("evit(keep=0.7, locs=(1, 3))", "tome(r=2)"),
                                       settings={"match_random": True, "batch": 2, "warmup": 0, "repeats": 1,
                                                 "min_run_s": 0.0}),))}


def test_a_bench_runs_the_bench_commands_pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from tokenreduce.bench import compare

    calls: list[str] = []
    real = compare.bench_document
    monkeypatch.setattr(compare, "bench_document", lambda *a, **kw: calls.append(kw["argv"][1]) or real(*a, **kw))
    study = get_study("tiny_bench_test")()
    _runner(study, tmp_path / "study").run()
    doc = load_runs(Layout(tmp_path / "study", tmp_path))["tiny"]
    assert main(["bench", "--model", "test_vit", "--img-size", "64", "--spec", "evit(keep=0.7, locs=(1, 3))",
                 "--spec", "tome(r=2)", "--match-random", "--batch-size", "2", "--warmup", "0", "--repeats", "1",
                 "--threads", "1", "--out", str(tmp_path / "command")]) == 0
    command = json.loads((tmp_path / "command" / "results.json").read_text())
    assert calls == ["study", "bench"]  # one function behind both
    mine = doc["result"]
    assert mine.keys() == command.keys() == {"provenance", "model", "settings", "results"}
    assert mine["settings"] == {**command["settings"], "min_run_s": 0.0}  # the command's --warmup 0 keeps 0.05
    computed = ("label", "kind", "spec", "macs", "tokens_per_block", "batch", "backend")
    assert [{k: r[k] for k in computed} for r in mine["results"]] == \
        [{k: r[k] for k in computed} for r in command["results"]]
    assert mine["model"]["params"] == command["model"]["params"] and mine["model"]["img_size"] == [64, 64]
    assert doc["kind"] == "bench" and doc["command"] == "tokenreduce study tiny_bench_test --run tiny --smoke " \
        "--out {study} --threads 1"  # the study folder, wherever it is (records.relative)
    text = summary(study, load_runs(Layout(tmp_path / "study", tmp_path)))
    assert "test_vit (64x64, random weights), batch 2 (latency: batch 1), 0 warm-up + 1 timed rounds" in text
    assert _bench_block(text, "tiny")[0].split() == ["case", "GMACs", "img/s", "iqr", "lat", "ms", "iqr", "speedup",
                                                     "lat", "speedup", "vs", "random", "lat", "vs", "random"]


def test_the_folded_fields_read_as_before_and_refuse_what_does_not_fit():
    e = Expect("b beats a", "s", arm="b", baseline="a", metric="m", direction=1, reported=(0.79, "+0.79 top-1"))
    assert (e.effect, e.published) == (0.79, "+0.79 top-1")  # the source's effect and its figures, one field
    assert (dataclasses.replace(e, reported=None).effect, dataclasses.replace(e, reported=None).published) == (None, "")
    assert Axis("steps", (100, 937, 9370), "t", sets={937: {}, 9370: {}}).implicit == 100  # the value it leaves alone
    assert Axis("seed", (0, 1), "s").implicit is None
    with pytest.raises(SpecError, match=r"axis steps: its sets= names every value but one .* \[100, 200\]"):
        Axis("steps", (100, 200, 937), "t", sets={937: {}})
    assert [Col(m, "h").text(v) for m, v in [("label", "tome"), ("gmacs", 1.23456), ("img_per_s", 812.6),
                                              ("macs", 1234567), ("top1", 81.234)]] == \
        ["tome", "1.2346", "813", "1,234,567", "81.23"]
    arm = Arm("x", options={"task": "eet", "stem": "conv", "transforms": ("tie_qk",)})
    assert (arm.task, arm.stem, arm.transforms) == ("eet", "conv", ("tie_qk",))
    with pytest.raises(SpecError, match=r"arm 'x': its options name unknown keys \['stems'\]; choose from"):
        Arm("x", options={"stems": "conv"})
    with pytest.raises(SpecError, match="its columns are its arm tables'"):  # a bench table needs a bed of benches
        @register_study("bad_bench_table_with_arms_test", TEST_STUDIES)
        class _Bad(_TinyEET):
            beds = _tiny_bed(columns={"t": (Col("label", "spec"), Col("tiny", "b2 / b1"))})


def test_a_bench_only_study_is_declared_without_arms_and_strict_otherwise(capsys):
    with pytest.raises(SpecError, match="has no arms: it trains nothing.*grid"):
        @register_study("bad_bench_grid_test", TEST_STUDIES)
        class _Bad(_TinyBench):
            beds = {"cpu": dataclasses.replace(_TinyBench.beds["cpu"], grid=(Axis("seed", (0,), "s"),))}
    with pytest.raises(SpecError, match="no benches"):
        @register_study("bad_nothing_test", TEST_STUDIES)
        class _Bad2(Study):
            claim = "nothing"
            beds = {"cpu": Bed()}
    with pytest.raises(SpecError, match="distinct names"):
        @register_study("bad_names_test", TEST_STUDIES)
        class _Bad3(_TinyBench):
            beds = {"cpu": Bed(evaluations=_TinyBench.beds["cpu"].benches * 2)}
    with pytest.raises(SpecError, match=r"timing 'tiny': its settings name unknown keys \['batch_size'\]"):
        dataclasses.replace(_TinyBench.beds["cpu"].benches[0], settings={"batch_size": 2})
    with pytest.raises(SpecError, match=r"timing 't': a bench \(a model off the grid\) reads no runs"):
        Timing("t", model={"name": "test_vit"}, finetuned=("a",))
    with pytest.raises(SpecError, match=r"timing 't': its settings name unknown keys \['match_random'\]"):
        Timing("t", settings={"match_random": True})  # a measure times the study's runs: no matched random
    with pytest.raises(SpecError, match=r"bench table 'x' needs its label column, then columns of the benches it "
                                        r"declares \(unknown: \['nope'\]\)"):
        @register_study("bad_bench_table_test", TEST_STUDIES)
        class _Bad6(_TinyBench):
            beds = {"cpu": Bed(evaluations=_TinyBench.beds["cpu"].benches,
                               columns={"x": (Col("label", "spec"), Col("tiny", "b2 / b1"), Col("nope", "b2"))})}
    with pytest.raises(SpecError, match="'seed' axis"):  # a study with arms still needs its seeds
        @register_study("bad_seedless_test", TEST_STUDIES)
        class _Bad4(_TinyEET):
            beds = _tiny_bed(grid=(Axis("bits", (8,), "b"),), smoke=None)
    assert main(["study", "backends", "--model", "vit_tiny_patch16_224", "--list"]) == 2
    assert "trains nothing" in capsys.readouterr().err
    assert main(["study", "backends", "--list", "--threads", "2"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0] == "tokenreduce study backends --run deit_small-eager --threads 2" and len(listed) == 6


def test_the_report_shows_the_bench_studies(tmp_path: Path):
    root = tmp_path / "results"
    for key in ("deit_bench/deit_s", "backends/cpu"):
        shutil.copytree(ROOT / "results" / key / "runs", root / key / "runs")
    text = build_report(root, names=["deit_bench", "backends"], readme=None).read_text()
    assert "## Backends: every method against the unreduced model" in text
    assert "- test bed `cpu`: each bench's own model (it trains nothing)" in text
    assert "- runs: 6 of 6 stored under `backends/cpu/runs/`" in text and "- runs: 1 of 1 stored" in text
    assert "### The Fashion-MNIST reference at the 1.5x picks, onnxruntime" in text
    assert "the trained fmnist-vit), batch 32" in text and not (root / "figures").exists()  # no arms: no bars
    (root / "backends" / "cpu" / "runs" / "deit_small-compile.json").unlink()
    text = build_report(root, names=["backends"], readme=None).read_text()
    assert "- runs: 5 of 6 stored" in text and text.count("not run: no run JSON for deit_small-compile") == 2


def test_each_claim_row_of_the_report_says_where_it_was_tested(tmp_path: Path):
    """A claim tested at several fine-tune lengths is one row per length, each naming its length (the
    shortened schedule too, where the claim names none), so that no two rows read alike."""
    root = tmp_path / "results"
    shutil.copytree(ROOT / "results" / "baselines" / "scenes" / "runs", root / "baselines" / "scenes" / "runs")
    text = build_report(root, names=["baselines"], readme=None).read_text()
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| baselines | ")]
    assert rows and len({(r[1], r[2], r[-1]) for r in rows}) == len(rows)
    where = {r[2] for r in rows if r[1].startswith("dynamicvit-1.5x:") and r[-1] == "scenes |"}
    assert where == {"steps 100", "steps 937", "steps 9370"}


@pytest.mark.slow
def test_the_committed_report_summaries_and_readme_table_regenerate_from_the_records(tmp_path: Path):
    """`tokenreduce report` on a copy of results/ and the README gives the committed files, byte for byte:
    every generated number in the repository is the run records'."""
    root = tmp_path / "results"
    shutil.copytree(ROOT / "results", root)
    readme = tmp_path / "README.md"
    shutil.copy(ROOT / "README.md", readme)
    build_report(root, readme=(readme, headline))
    for path in sorted(root.rglob("*")):
        if path.is_file() and "/runs/" not in str(path):
            assert path.read_bytes() == (ROOT / path.relative_to(tmp_path)).read_bytes(), path
    assert readme.read_bytes() == (ROOT / "README.md").read_bytes()


@pytest.mark.slow
def test_the_readme_table_gains_a_column_per_longer_fine_tune_with_paired_records(tmp_path: Path):
    """A verdict that turns with training (DynamicViT against random: behind at 100 steps, ahead after one
    epoch) shows in the README's own table, read from the records; without a paired longer record no column."""
    root = tmp_path / "results"
    for key in ("baselines/scenes", "deit_bench/deit_s"):
        shutil.copytree(ROOT / "results" / key / "runs", root / key / "runs")
    head = next(line for line in headline(root) if line.startswith("| pick"))
    assert head.endswith("| Δ vs random at its counts | Δ after 937 steps |")
    dv = next(line for line in headline(root) if line.startswith("| dynamicvit-1.5x |"))
    assert dv.count("|") == 7 and not dv.endswith("| - |")
    intro = headline(root)[0]
    assert "fine-tuned for 937 steps (all training scenes, scored on 10000 test scenes; seeds 0, 1, 2):" in intro
    assert "100 steps of 64: 6400 training scenes, scored on 2000 test scenes" in intro  # what else differs
    assert "chosen once by a measured budget search" in intro
    assert dv.endswith("[+2.96, +3.46] reproduced |")  # each row's interval and verdict
    for record in (root / "baselines" / "scenes" / "runs").glob("random~*-t937-s2.json"):
        record.unlink()  # the intro names the seeds the cells are over
    assert "seeds 0, 1):" in headline(root)[0]
    for record in (root / "baselines" / "scenes" / "runs").glob("random~*-t937-*.json"):
        record.unlink()  # the arm's longer runs alone pair with nothing
    assert all("937" not in line for line in headline(root))


def test_a_study_section_says_what_its_runs_cost_as_run_per_fine_tune_length():
    from tokenreduce.studies.beds import one_epoch_budget
    from tokenreduce.study.page import as_run

    scenes, fmnist = get_study("bspf")(), get_study("bspf")("fmnist")
    runs = {"full-s0": {"kind": "train", "point": {"seed": 0}, "metrics": {"train_time_s": 90.0}},
            "full-s1": {"kind": "train", "point": {"steps": 100, "seed": 1}, "metrics": {"train_time_s": 150.0}},
            "full-t937-s0": {"kind": "train", "point": {"steps": 937, "seed": 0}, "metrics": {"train_time_s": 600.0}},
            "speed": {"kind": "measure", "metrics": {"train_time_s": 1e6}}}
    assert as_run(scenes, runs) == "as run: 100 steps: 2 runs, 4 min; 937 steps: 1 run, 10 min of training wall " \
                                   "time summed"
    assert as_run(fmnist, {"full-s0": runs["full-s0"]}) == "as run: 1 run, 2 min of training wall time summed"
    assert as_run(scenes, {}) == ""
    assert scenes.budget[-1] == one_epoch_budget(18, 105) == (18, "937-step training", 105 / 18)


def test_the_arm_tables_heading_says_what_each_length_trains_on_and_is_scored_on():
    """A grid with the fine-tune length: the heading names the recipe's training pool and test set, and those of
    each marked length (every item), so a (steps 937) row is never read as trained on the recipe's subset."""
    scenes = get_study("baselines")("scenes")
    head = summary(scenes, {}).splitlines()[0]
    recipe = scenes.recipe
    assert f"{recipe['subset']} training items, batch {recipe['batch_size']}, scored on {recipe['eval_subset']} " \
           "test items; a row marked (steps 937): 1 epoch(s) of every training item, scored on every test item" in head
    assert "a row marked (steps 9370): 10 epoch(s) of every training item" in head
    assert "row marked" not in summary(get_study("baselines")("fmnist"), {}).splitlines()[0]  # no length axis there
