"""Shipped reference checkpoints: written with their provenance, handed out only when the hash matches."""

from __future__ import annotations

import json

import pytest

from tokenreduce.models import load_model
from tokenreduce.models.checkpoint import CheckpointError
from tokenreduce.models.references import list_shipped, ship, shipped, shipped_provenance
from tokenreduce.models.variants import FREE_KWARGS
from tokenreduce.train.config import TrainConfig
from tokenreduce.train.loop import train
from tokenreduce.train.recipes import get_recipe

TINY = {"name": "vit_tiny_patch16_224",
        "kwargs": {"img_size": 28, "patch_size": 7, "in_chans": 1, "num_classes": 10, "embed_dim": 16, "depth": 2,
                   "num_heads": 2}}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from tokenreduce.data.fashion_mnist import make_synthetic

    root = tmp_path_factory.mktemp("ref")
    data = make_synthetic(root / "data", n_train=32, n_test=16)
    cfg = TrainConfig(model=TINY, data=str(data), epochs=1, batch_size=16, out=str(root / "run"), quiet=True,
                      warmup_epochs=0.0)
    train(cfg)
    return root / "run"


def test_ship_then_load(run, tmp_path):
    record_path = ship(run, "tiny-ref", command="tokenreduce train ...", root=tmp_path)
    record = json.loads(record_path.read_text())
    assert list_shipped(tmp_path) == ["tiny-ref"]
    assert record["command"] == "tokenreduce train ..." and record["file"] == "tiny-ref.safetensors"
    assert "top1" in record["metrics"] and record["model"]["kwargs"]["embed_dim"] == 16
    path = shipped("tiny-ref", tmp_path)
    model, meta = load_model(path)
    assert meta["model"] == record["model"]
    assert shipped_provenance("tiny-ref", tmp_path)["sha256"] == record["sha256"]
    assert shipped("absent", tmp_path) is None


def test_damaged_shipped_file_is_refused(run, tmp_path):
    ship(run, "tiny-ref", command="x", root=tmp_path)
    f = tmp_path / "tiny-ref.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="SHA-256"):
        shipped("tiny-ref", tmp_path)


def test_scene_recipes_run_the_papers_schedules_unchanged():
    from tokenreduce.api import apply, get_info
    from tokenreduce.models import build_model

    model = build_model(get_recipe("scenes-vit")["model"])
    for spec in ("evit(keep=0.7, locs=(3, 6, 9))", "ctp()", "tome(r=13)", "topk(keep=0.7, locs=(3, 6, 9))"):
        apply(model, spec)
        info = get_info(model)
        assert info.host.num_patches == 196 and info.host.depth == 12
        from tokenreduce.api import remove

        remove(model)
    apply(model, "ctp()")
    assert [get_info(model).schedule.counts[b] for b in (3, 7, 9)] == [98, 49, 12]


# ----------------------------------------------------------------------------- the shipped scene reference

SCENES = "scenes-vit"
#: the scene references: classification, the dense task's (scenes-vit with a segmentation head) and the
#: class-token-free variant (scenes-vit without its class token, a pooled head, fine-tuned)
SCENE_REFS = (SCENES, "scenes-vit-seg", "scenes-vit-free")


def _needs_fmnist():
    from tokenreduce.data.fashion_mnist import SYSTEM_DIR

    if not (SYSTEM_DIR / "t10k-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"Fashion-MNIST is not installed in {SYSTEM_DIR}")


@pytest.mark.parametrize("name", SCENE_REFS)
def test_the_scene_references_ship_and_their_hashes_match(name):
    assert name in list_shipped()
    record = shipped_provenance(name)
    _, meta = load_model(shipped(name))  # shipped() checks the SHA-256 first
    assert meta["model"] == record["model"] and meta["config"]["recipe"] == name
    assert record["command"].startswith(f"tokenreduce train --recipe {name} ")
    if "model" in get_recipe(name):
        assert meta["model"] == get_recipe(name)["model"]


@pytest.mark.parametrize("name", SCENE_REFS)
@pytest.mark.parametrize("n", [100, pytest.param(500, marks=pytest.mark.slow)])
def test_the_scene_references_reach_their_recorded_metric(name, n):
    from tokenreduce.bench.evaluation import reference_metric

    _needs_fmnist()
    recorded = shipped_provenance(name)["checks"][str(n)]
    assert abs(reference_metric(shipped(name), subset=n) - recorded) <= 1.0


def test_the_class_token_free_reference_is_the_scene_reference_without_its_class_token():
    model, meta = load_model(shipped("scenes-vit-free"))
    scenes = shipped_provenance(SCENES)["model"]
    assert meta["model"] == {**scenes, "kwargs": {**scenes["kwargs"], **FREE_KWARGS}}
    assert model.cls_token is None and model.pos_embed.shape[1] == model.patch_embed.num_patches
