"""One pipeline underneath the commands: one model builder, one evaluation entry, one provenance,
each checkpoint read once per run, and the training settings declared once (TrainConfig)."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest
import torch
from conftest import TEST_EXPERIMENTS

import tokenreduce
from tokenreduce import TokenReduceError
from tokenreduce.api import find_info
from tokenreduce.bench import evaluation
from tokenreduce.bench.report import PROVENANCE_KEYS, read_provenance
from tokenreduce.cli import build_parser, main
from tokenreduce.commands import demo
from tokenreduce.commands import train as train_cmd
from tokenreduce.data.fashion_mnist import CLASSES, make_synthetic
from tokenreduce.models import ModelSource, build_model, load_model, make_model, save_checkpoint
from tokenreduce.probes import Experiment, RunContext, register_experiment
from tokenreduce.train.config import TrainConfig
from tokenreduce.train.recipes import RECIPES, check_recipe, get_recipe, parse_recipe

SRC = Path(tokenreduce.__file__).resolve().parent
RESULTS = SRC.parents[1] / "results"
TINY = {"name": "vit_tiny_patch16_224",
        "kwargs": {"img_size": 28, "patch_size": 7, "in_chans": 1, "num_classes": 10, "embed_dim": 32, "depth": 2,
                   "num_heads": 2}}
TINY_FLAGS = ["--model", "vit_tiny_patch16_224", "--img-size", "28", "--patch-size", "7", "--dim", "32", "--depth",
              "2", "--heads", "2", "--in-chans", "1", "--num-classes", "10", "--batch-size", "16", "--threads", "1",
              "--quiet"]
X = torch.randn(2, 1, 28, 28, generator=torch.Generator().manual_seed(0))


@register_experiment("pipeline_noop_test", TEST_EXPERIMENTS)
class _Noop(Experiment):
    """A test-only experiment that finds nothing (its results file is what the provenance test reads)."""

    claim = source = "test"

    def run(self, ctx: RunContext) -> dict:
        return {}

    def report(self, result: dict) -> str:
        return "nothing"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(make_synthetic(tmp_path_factory.mktemp("fmnist"), n_train=64, n_test=32))


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    path = tmp_path / "ref.safetensors"
    save_checkpoint(path, build_model(TINY), meta={"model": TINY, "spec": None, "classes": list(CLASSES)})
    return path


def count_reads(monkeypatch: pytest.MonkeyPatch) -> dict[Path, int]:
    """Path -> how many times its bytes were read (every checkpoint reader goes through read_bytes)."""
    reads: dict[Path, int] = {}
    real = Path.read_bytes

    def counted(self: Path) -> bytes:
        reads[self.resolve()] = reads.get(self.resolve(), 0) + 1
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", counted)
    return reads


# ----------------------------------------------------------------------------- 1. one model builder


def test_timm_create_model_is_called_in_the_model_builder_only():
    calls = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "create_model":
                calls.append(str(path.relative_to(SRC)))
    assert calls and set(calls) == {"models/build.py"}, calls
    assert not (SRC / "bench" / "model.py").exists()


def test_make_model_covers_config_checkpoint_weights_and_spec(tmp_path, ckpt):
    base = load_model(ckpt)[0]
    # a tokenreduce checkpoint with a reducer: KEEP keeps it, None removes it, another spec replaces it
    patched = tmp_path / "patched.safetensors"
    model = build_model(TINY)
    tokenreduce.apply(model, "tome(r=2)")
    save_checkpoint(patched, model, meta={"model": TINY, "spec": "tome(r=2)"})
    assert make_model(ModelSource(checkpoint=patched)).spec.startswith("tome(r=2")
    plain = make_model(ModelSource(checkpoint=patched, spec=None))
    assert plain.spec is None and find_info(plain.model) is None
    other = make_model(ModelSource(checkpoint=patched, spec="topk(keep=0.5, locs=(1,))"))
    assert other.spec.startswith("topk(") and other.meta["spec"] == "tome(r=2)"
    # a model config with a local weights file on top: the same function as the checkpoint
    weights = tmp_path / "w.pth"
    torch.save({"model": base.state_dict()}, weights)
    built = make_model(ModelSource(config=TINY, weights=weights))
    assert built.config == TINY and built.spec is None and built.meta == {} and not built.model.training
    with torch.no_grad():
        assert torch.equal(built.model(X), base(X))
    # a checkpoint plus a config that adds a transform: applied on top of the checkpoint's weights
    tied = make_model(ModelSource(config={**TINY, "transforms": ["tie_qk"]}, checkpoint=ckpt))
    assert tied.config["transforms"] == ["tie_qk(init='mean')"]
    with pytest.raises(TokenReduceError, match="differs from the model requested"):
        make_model(ModelSource(config={**TINY, "kwargs": {**TINY["kwargs"], "depth": 3}}, checkpoint=ckpt))
    with pytest.raises(TokenReduceError, match="not both"):
        make_model(ModelSource(config=TINY, hf_config="vit-tiny"))


def test_make_model_builds_a_transformers_config():
    pytest.importorskip("transformers")
    built = make_model(ModelSource(hf_config="vit-tiny", spec="tome(r=2)"))
    assert built.config is None and built.spec.startswith("tome(r=2") and type(built.model).__name__.startswith("ViT")


def test_unknown_timm_name_names_close_ones():
    with pytest.raises(TokenReduceError, match="unknown timm model; close names: deit_small"):
        make_model(ModelSource(config={"name": "deit_smal", "kwargs": {}}))


# ----------------------------------------------------------------------------- 2. one evaluation entry


def test_evaluate_entry_returns_rows_data_and_budgets(ckpt, data):
    res = evaluation.evaluate(evaluation.EvalRequest(
        ckpt, specs=["tome(r=2)"], targets=[1.5], methods=["topk"], rule="macs", seeds=[0], eval_batch=16,
        speed={"batch": 2, "warmup": 0, "repeats": 1, "min_run_s": 0.0, "threads": 1}, data=data, subset=8))
    assert [r["kind"] for r in res.rows][:2] == ["unpatched", "training-free"]
    assert res.rows[1]["label"] == "tome(r=2)" and res.data.info["n"] == 8
    assert res.budgets["targets"] == [1.5] and res.budgets["rule"] == "macs"
    assert [p["method"] for p in res.picks] == ["topk"] and res.ref.task.spec().startswith("classify")


class _Stop(Exception):
    pass


def test_eval_and_demo_are_requests_to_the_one_entry(ckpt, data, tmp_path, monkeypatch):
    seen: list[evaluation.EvalRequest] = []

    def spy(req: evaluation.EvalRequest):
        seen.append(req)
        raise _Stop

    monkeypatch.setattr(evaluation, "evaluate", spy)
    with pytest.raises(_Stop):
        main(["eval", "--checkpoint", str(ckpt), "--spec", "tome(r=2)", "--data", data, "--threads", "1",
              "--out", str(tmp_path / "e")])
    assert seen[-1].specs == ["tome(r=2)"] and seen[-1].targets == [] and seen[-1].data == data
    monkeypatch.setattr(demo, "reference", lambda quick, threads, bed, *more: (ckpt, "tiny", False))
    with pytest.raises(_Stop):
        main(["demo", "--quick", "--threads", "1", "--out", str(tmp_path / "d")])
    req = seen[-1]
    assert req.reference == ckpt and list(req.targets) == [1.5, 2.0] and req.rule == demo.QUICK["rule"]
    assert req.methods is None and req.specs == () and req.subset == demo.QUICK["short_subset"]


# ----------------------------------------------------------------------------- 3. one provenance


def test_every_writer_records_the_same_provenance_keys(ckpt, data, tmp_path):
    runs = tmp_path / "runs"
    assert main(["train", *TINY_FLAGS, "--data", data, "--epochs", "1", "--subset", "32", "--out", str(runs),
                 "--results", str(tmp_path / "train.json")]) == 0
    assert main(["eval", "--checkpoint", str(ckpt), "--spec", "tome(r=2)", "--data", data, "--subset", "8",
                 "--threads", "1", "--repeats", "1", "--warmup", "0", "--batch-size", "2", "--eval-batch-size", "8",
                 "--seeds", "0", "--out", str(tmp_path / "eval")]) == 0
    assert main(["bench", "--model", "test_vit", "--img-size", "32", "--quick", "--threads", "1",
                 "--out", str(tmp_path / "bench")]) == 0
    assert main(["experiment", "pipeline_noop_test", "--threads", "1", "--results", str(tmp_path / "exp.json")]) == 0
    docs = {"train --results": json.loads((tmp_path / "train.json").read_text()),
            "train metrics.json": {"provenance": json.loads((runs / "metrics.json").read_text())["provenance"]},
            "checkpoint meta": {"provenance": load_model(runs)[1]["metrics"]["provenance"]},
            "eval": json.loads((tmp_path / "eval" / "results.json").read_text()),
            "bench": json.loads((tmp_path / "bench" / "results.json").read_text()),
            "experiment": json.loads((tmp_path / "exp.json").read_text())}
    for writer, doc in docs.items():
        prov = doc["provenance"]
        assert set(PROVENANCE_KEYS) <= set(prov), (writer, sorted(set(PROVENANCE_KEYS) - set(prov)))
        assert not {"git_revision", "machine"} & set(prov), writer
        assert read_provenance(doc)["torch"] == torch.__version__
    assert "tokenreduce train" in docs["train --results"]["provenance"]["command"]


def test_stored_results_of_either_old_shape_still_read():
    old_train = next(iter(sorted((RESULTS / "imagepiece" / "fmnist" / "runs").glob("*.json"))))
    old_bench = next(p for p in sorted(RESULTS.rglob("*.json")) if '"git_revision"' in p.read_text())
    for path in (old_train, old_bench):
        prov = read_provenance(json.loads(path.read_text()))
        assert "git" in prov and "git_revision" not in prov and prov["torch"], path
    assert read_provenance({"provenance": {"git_revision": "abc", "torch": "2"}}) == {"git": "abc", "torch": "2"}


# ----------------------------------------------------------------------------- 4. a checkpoint read once per run


def test_a_fine_tune_with_init_and_teacher_of_one_file_reads_it_once(ckpt, data, tmp_path, monkeypatch):
    reads = count_reads(monkeypatch)
    assert main(["train", "--init", str(ckpt), "--teacher", str(ckpt), "--spec", "tome(r=2)", "--data", data,
                 "--epochs", "1", "--subset", "16", "--batch-size", "8", "--threads", "1", "--quiet",
                 "--out", str(tmp_path / "ft")]) == 0
    assert reads.get(ckpt.resolve()) == 1, reads


def test_eval_reads_the_reference_once(ckpt, data, monkeypatch):
    reads = count_reads(monkeypatch)
    evaluation.load_reference(ckpt)
    assert reads.get(ckpt.resolve()) == 1, reads


# ----------------------------------------------------------------------------- 5. the training config declared once


def test_generated_train_flags_reach_the_config():
    """train's flags are generated from TrainConfig's fields: a renamed flag, a switch and a list arrive."""
    args = build_parser().parse_args(["train", "--recipe", "fmnist-vit", "--workers", "2", "--deterministic",
                                      "--distill", "logits, tokens", "--optimizer", "sgd", "--out", "x"])
    cfg = train_cmd.config_from_args(args)
    assert (cfg.num_workers, cfg.deterministic, cfg.distill, cfg.optimizer) == (2, True, ("logits", "tokens"), "sgd")
    with pytest.raises(SystemExit):  # a field's choices are its flag's
        build_parser().parse_args(["train", "--optimizer", "adam"])


def test_distill_tau_flag_reaches_the_config(ckpt, data):
    args = build_parser().parse_args(["train", "--init", str(ckpt), "--teacher", str(ckpt), "--distill-tau", "4",
                                      "--data", data, "--out", "x"])
    assert train_cmd.config_from_args(args).distill_tau == 4.0


def test_recipes_are_checked_against_train_config():
    with pytest.raises(TokenReduceError, match=r"recipe 'mine': unknown training settings \['lr_peak'\]; valid: .*"
                                               r"\blr\b.*\bwarmup_epochs\b"):
        check_recipe("mine", {"description": "x", "lr_peak": 1e-3, "epochs": 2})
    with pytest.raises(TokenReduceError, match="recipe 'mine': training setting 'epochs' must be int, got '2'"):
        parse_recipe("mine", {"epochs": "2"})
    with pytest.raises(TokenReduceError, match="recipe 'mine': lr must be a finite number > 0"):
        parse_recipe("mine", {"lr": -1.0})
    for name in RECIPES:  # every shipped recipe parses, its values as TrainConfig holds them
        fields = get_recipe(name)
        cfg = TrainConfig.from_dict(fields)
        assert all(getattr(cfg, k) == v for k, v in fields.items()), name
    assert dataclasses.is_dataclass(TrainConfig)


def test_train_config_refuses_values_of_the_wrong_type():
    with pytest.raises(TokenReduceError, match="'batch_size' must be int, got 1.5"):
        TrainConfig(batch_size=1.5)
    with pytest.raises(TokenReduceError, match="'deterministic' must be bool"):
        TrainConfig.from_dict({"deterministic": "yes"})
    assert TrainConfig(lr=1, distill=["logits"]).distill == ("logits",)
