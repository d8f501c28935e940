"""One home per fact: each fact below is declared once and every other place reads it; a test
fails when a second home comes back (a literal restated in the code) or the value drifts from its source."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import tokenreduce
import tokenreduce.studies  # noqa: F401  (registers the studies)
from tokenreduce.bench import settings
from tokenreduce.data.fashion_mnist import SIZES, SYSTEM_DIR, FashionMNIST
from tokenreduce.data.scenes import EVAL_SUBSET
from tokenreduce.study.declare import get_study, list_studies

SRC = Path(tokenreduce.__file__).resolve().parent
#: where the scene bed's sizes were restated before they had one home
SCENE_BED_READERS = ("studies", "train/recipes.py", "probes/oracle_at_counts.py")


def _sources(*parts: str) -> list[Path]:
    return sorted(p for part in parts for p in ([SRC / part] if part.endswith(".py") else (SRC / part).glob("*.py")))


def _constants(path: Path) -> list[ast.Constant]:
    return [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)]


def test_the_scene_bed_sizes_are_read_from_their_one_home_not_restated():
    sizes = {EVAL_SUBSET, SIZES["train"]}
    found = []
    for path in _sources(*SCENE_BED_READERS):
        for c in _constants(path):
            if type(c.value) is int and c.value in sizes:
                found.append(f"{path.relative_to(SRC)}:{c.lineno}: {c.value}")
            elif isinstance(c.value, str) and re.search(r"\b(images|subset)=\d", c.value):
                found.append(f"{path.relative_to(SRC)}:{c.lineno}: {c.value!r}")
        tree = ast.parse(path.read_text())
        found += [f"{path.relative_to(SRC)}:{n.lineno}: eval_subset {v.value}" for n in ast.walk(tree)
                  if isinstance(n, ast.Dict) for k, v in zip(n.keys, n.values, strict=True)
                  if isinstance(k, ast.Constant) and k.value == "eval_subset" and isinstance(v, ast.Constant)
                  and type(v.value) is int and v.value == SIZES["test"]]
    assert not found, "a scene bed size or a data set's size restated instead of read from data/:\n" + "\n".join(found)


def test_the_scene_bed_scores_every_run_on_its_declared_test_scenes():
    from tokenreduce.probes.oracle_at_counts import OracleAtCountsConfig
    from tokenreduce.studies import beds
    from tokenreduce.train.recipes import get_recipe

    assert beds.SHORT["eval_subset"] == EVAL_SUBSET
    assert get_recipe("scenes-vit")["eval_subset"] == get_recipe("scenes-vit-seg")["eval_subset"] == EVAL_SUBSET
    assert OracleAtCountsConfig(tiny=True).subset == EVAL_SUBSET
    assert beds.EPOCH_STEPS == SIZES["train"] // beds.BATCH


@pytest.mark.skipif(not SYSTEM_DIR.is_dir(), reason="the real Fashion-MNIST files are not installed")
def test_the_declared_split_sizes_are_the_data_sets():
    assert {split: len(FashionMNIST(split)) for split in SIZES} == SIZES


def test_the_amp_choices_have_one_home_that_the_cli_the_config_and_precision_read():
    """The choices are spelled once for the command line (bench/settings.py, torch-free); the one other listing
    is models/precision.py's map to torch dtypes, which sits below bench and so cannot read it: held equal here."""
    from tokenreduce.commands import vocab
    from tokenreduce.models.precision import AMP_DTYPES, amp_dtype
    from tokenreduce.train.config import TrainConfig

    assert tuple(AMP_DTYPES) == settings.AMP_CHOICES and amp_dtype("off") is None
    assert TrainConfig.__dataclass_fields__["amp"].metadata["choices"] is settings.AMP_CHOICES
    assert vocab.AMP_CHOICES is settings.AMP_CHOICES
    spelled = [f"{p.relative_to(SRC)}:{n.lineno}" for p in SRC.rglob("*.py")
               if p.relative_to(SRC).as_posix() not in ("bench/settings.py", "models/precision.py")
               for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, (ast.Tuple, ast.List, ast.Set, ast.Dict))
               and {"bf16", "fp16"} <= {c.value for c in ast.walk(n) if isinstance(c, ast.Constant)}]
    assert not spelled, f"the --amp choices listed outside bench/settings.py: {spelled}"


def test_no_study_restates_the_default_timing_settings():
    restated = []
    for name in list_studies():
        for bed_name, bed in get_study(name).beds.items():
            for b in bed.benches:
                same = {k: v for k, v in b.settings.items() if settings.SPEED.get(k) == v}
                restated += [f"{name}/{bed_name} bench {b.name}: {same}"] if same else []
    assert not restated, "bench/settings.SPEED is the one home of the default timing:\n" + "\n".join(restated)


def test_a_compute_plan_is_declared_once_as_numbers_and_the_page_writes_its_sentence():
    from tokenreduce.study.page import budget_text

    assert budget_text(((20, "training", 4), (1, "speed", 3))) == \
        "20 training runs x 4 min + 1 speed run x 3 min: about 83 min planned"
    assert budget_text(((30, "training", 4), (12, "937-step training", 205 / 12))) == \
        "30 training runs x 4 min + 12 937-step training runs x 17.1 min: about 5.4 h planned"
    for name in list_studies():
        for bed_name, bed in get_study(name).beds.items():
            assert bed.budget and all(type(n) is int and n > 0 and isinstance(kind, str) and minutes > 0
                                      for n, kind, minutes in bed.budget), (name, bed_name, bed.budget)
    stated = [p.name for p in _sources("studies") if re.search(r"(?i)compute plan|budget:|\d+ min\b",
                                                               ast.get_docstring(ast.parse(p.read_text())) or "")]
    assert not stated, f"a study's compute plan restated in its docstring (Bed.budget is its home): {stated}"


def test_each_shared_training_setting_is_declared_once_in_the_recipes():
    entries: dict[tuple[str, object], list[str]] = {}
    for path in _sources("train/recipes.py", "studies"):
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.Dict):
                for k, v in zip(n.keys, n.values, strict=True):
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant):
                        entries.setdefault((k.value, v.value), []).append(f"{path.relative_to(SRC)}:{n.lineno}")
    for setting in (("augment", "crop_flip"), ("threads", 2), ("data", "fashion_mnist")):
        assert len(entries.get(setting, [])) == 1, (setting, entries.get(setting))
