"""The resolved training settings of every recipe and of every study's runs are what they were before the
recipes were declared as a base plus differences: the expected values below were generated once
from the code before that change, not from the code under test.

A recipe is compared field by field; a study's runs (every point of every bed, smoke included: its
``train_fields``) by one digest per bed, since they are ~900 dicts."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

import tokenreduce
import tokenreduce.studies  # noqa: F401  (registers the studies)
from tokenreduce.study.declare import get_study, list_studies
from tokenreduce.train.recipes import RECIPES, get_recipe

EXPECTED_RECIPES: dict[str, dict[str, Any]] = {
    'fmnist-bspf': {
        'augment': 'crop_flip', 'batch_size': 128, 'ckpt_every': 50, 'data': 'fashion_mnist', 'epochs': 1,
        'eval_subset': 10000, 'grad_clip': 1.0, 'init': '<cache>/fmnist-vit/model.safetensors',
        'label_smoothing': 0.1, 'lr': 0.0003, 'min_lr': 1e-06, 'recipe': 'fmnist-bspf', 'subset': 20000,
        'threads': 2, 'warmup_epochs': 0.2, 'weight_decay': 0.05,
    },
    'fmnist-cropr': {
        'augment': 'crop_flip', 'batch_size': 128, 'ckpt_every': 50, 'data': 'fashion_mnist', 'epochs': 1,
        'eval_subset': 10000, 'grad_clip': 1.0, 'init': '<cache>/fmnist-vit/model.safetensors',
        'label_smoothing': 0.1, 'lr': 0.001, 'min_lr': 1e-06, 'recipe': 'fmnist-cropr', 'subset': 20000,
        'task': 'classify(backbone_lr=0.3)', 'threads': 2, 'warmup_epochs': 0.2, 'weight_decay': 0.05,
    },
    'fmnist-cropr-seg': {
        'augment': 'crop_flip', 'batch_size': 64, 'ckpt_every': 50, 'data': 'fashion_mnist', 'epochs': 3,
        'eval_batch_size': 250, 'eval_subset': 2500, 'grad_clip': 1.0, 'label_smoothing': 0.0, 'lr': 0.002,
        'min_lr': 1e-05,
        'model': {'kwargs': {'depth': 6, 'drop_path_rate': 0.0, 'embed_dim': 128, 'img_size': 56, 'in_chans': 1, 'mlp_ratio': 2.0, 'num_classes': 10, 'num_heads': 4, 'patch_size': 4}, 'name': 'vit_tiny_patch16_224'},  # noqa: E501
        'recipe': 'fmnist-cropr-seg', 'subset': 6000, 'task': "segment(background=True, upsample='bilinear')",
        'threads': 2, 'warmup_epochs': 0.3, 'weight_decay': 0.05,
    },
    'fmnist-eet': {
        'augment': 'crop_flip', 'batch_size': 64, 'ckpt_every': 50, 'data': 'fashion_mnist', 'epochs': 1,
        'eval_subset': 10000, 'grad_clip': None, 'init': '<cache>/fmnist-vit/model.safetensors',
        'label_smoothing': 0.0, 'lr': 0.01, 'min_lr': 0.0, 'momentum': 0.9, 'optimizer': 'sgd',
        'recipe': 'fmnist-eet', 'subset': 10000,
        'task': "eet(bits=32, dkt=True, drg=True, w=4, mask='grid', teacher='joint', ce_weight=0.1, hash_weight=1.0, dkt_weight=1.0, code_seed=None, fish_sigma=1.0, fish_delta=0.0001, fish_iters=15, protocol='both', db_subset=None, ks=(1, 10, 100, 1000))",  # noqa: E501
        'threads': 2, 'warmup_epochs': 0.06, 'weight_decay': 0.0,
    },
    'fmnist-hash': {
        'augment': 'crop_flip', 'batch_size': 128, 'ckpt_every': 50, 'data': 'fashion_mnist', 'epochs': 1,
        'eval_subset': 10000, 'grad_clip': 1.0, 'init': '<cache>/fmnist-vit/model.safetensors',
        'label_smoothing': 0.0, 'lr': 0.0003, 'min_lr': 1e-06, 'recipe': 'fmnist-hash', 'subset': 20000,
        'task': "hash(bits=32, targets='class', protocol='both', hash_weight=1.0, ce_weight=0.1, code_seed=None, db_subset=None, ks=(1, 10, 100, 1000))",  # noqa: E501
        'threads': 2, 'warmup_epochs': 0.2, 'weight_decay': 0.05,
    },
    'fmnist-seg': {
        'augment': 'crop_flip', 'batch_size': 64, 'ckpt_every': 50, 'data': 'fashion_mnist', 'epochs': 3,
        'eval_batch_size': 250, 'eval_subset': 2500, 'grad_clip': 1.0, 'label_smoothing': 0.0, 'lr': 0.002,
        'min_lr': 1e-05,
        'model': {'kwargs': {'depth': 6, 'drop_path_rate': 0.0, 'embed_dim': 128, 'img_size': 56, 'in_chans': 1, 'mlp_ratio': 2.0, 'num_classes': 10, 'num_heads': 4, 'patch_size': 4}, 'name': 'vit_tiny_patch16_224'},  # noqa: E501
        'recipe': 'fmnist-seg', 'subset': 6000, 'task': "segment(background=True, upsample='bilinear')",
        'threads': 2, 'warmup_epochs': 0.3, 'weight_decay': 0.05,
    },
    'fmnist-vit': {
        'augment': 'crop_flip', 'batch_size': 128, 'ckpt_every': 200, 'data': 'fashion_mnist', 'epochs': 17,
        'grad_clip': 1.0, 'label_smoothing': 0.1, 'lr': 0.002, 'min_lr': 1e-05,
        'model': {'kwargs': {'depth': 6, 'drop_path_rate': 0.0, 'embed_dim': 128, 'img_size': 28, 'in_chans': 1, 'mlp_ratio': 2.0, 'num_classes': 10, 'num_heads': 4, 'patch_size': 4}, 'name': 'vit_tiny_patch16_224'},  # noqa: E501
        'recipe': 'fmnist-vit', 'threads': 2, 'warmup_epochs': 1.0, 'weight_decay': 0.05,
    },
    'fmnist-vit-ft': {
        'augment': 'crop_flip', 'batch_size': 128, 'ckpt_every': 200, 'data': 'fashion_mnist', 'distill': ['logits'],
        'epochs': 3, 'grad_clip': 1.0, 'init': '<cache>/fmnist-vit/model.safetensors', 'label_smoothing': 0.1,
        'lr': 0.0003, 'min_lr': 1e-06, 'recipe': 'fmnist-vit-ft', 'teacher': '<cache>/fmnist-vit/model.safetensors',
        'threads': 2, 'warmup_epochs': 0.2, 'weight_decay': 0.05,
    },
    'fmnist-vit-short': {
        'augment': 'crop_flip', 'batch_size': 128, 'ckpt_every': 100, 'data': 'fashion_mnist', 'epochs': 4,
        'eval_every': 4, 'eval_subset': 10000, 'grad_clip': 1.0, 'label_smoothing': 0.1, 'lr': 0.002,
        'min_lr': 1e-05,
        'model': {'kwargs': {'depth': 6, 'drop_path_rate': 0.0, 'embed_dim': 128, 'img_size': 28, 'in_chans': 1, 'mlp_ratio': 2.0, 'num_classes': 10, 'num_heads': 4, 'patch_size': 4}, 'name': 'vit_tiny_patch16_224'},  # noqa: E501
        'recipe': 'fmnist-vit-short', 'subset': 20000, 'threads': 2, 'warmup_epochs': 0.5, 'weight_decay': 0.05,
    },
    'fmnist-vit-smoke': {
        'augment': 'crop_flip', 'batch_size': 64, 'data': 'fashion_mnist', 'epochs': 1, 'eval_subset': 500,
        'lr': 0.001,
        'model': {'kwargs': {'depth': 6, 'drop_path_rate': 0.0, 'embed_dim': 128, 'img_size': 28, 'in_chans': 1, 'mlp_ratio': 2.0, 'num_classes': 10, 'num_heads': 4, 'patch_size': 4}, 'name': 'vit_tiny_patch16_224'},  # noqa: E501
        'recipe': 'fmnist-vit-smoke', 'subset': 1024, 'warmup_epochs': 0.2,
    },
    'scenes-vit': {
        'augment': 'crop_flip', 'batch_size': 64, 'ckpt_every': 100, 'data': 'fmnist_scenes', 'epochs': 6,
        'eval_subset': 2000, 'grad_clip': 1.0, 'label_smoothing': 0.1, 'lr': 0.0015, 'min_lr': 1e-05,
        'model': {'kwargs': {'depth': 12, 'drop_path_rate': 0.0, 'embed_dim': 72, 'img_size': 56, 'in_chans': 1, 'mlp_ratio': 2.0, 'num_classes': 10, 'num_heads': 3, 'patch_size': 4}, 'name': 'vit_tiny_patch16_224'},  # noqa: E501
        'recipe': 'scenes-vit', 'threads': 2, 'warmup_epochs': 0.3, 'weight_decay': 0.05,
    },
    'scenes-vit-free': {
        'augment': 'crop_flip', 'batch_size': 64, 'ckpt_every': 100, 'data': 'fmnist_scenes', 'epochs': 1,
        'eval_subset': 2000, 'grad_clip': 1.0, 'init': '<cache>/scenes-vit-free-init/model.safetensors',
        'label_smoothing': 0.1, 'lr': 0.0003, 'min_lr': 1e-05, 'recipe': 'scenes-vit-free',
        'threads': 2, 'warmup_epochs': 0.1, 'weight_decay': 0.05,
    },
    'scenes-vit-seg': {
        'augment': 'crop_flip', 'batch_size': 64, 'ckpt_every': 100, 'data': 'fmnist_scenes_seg', 'epochs': 1,
        'eval_subset': 2000, 'grad_clip': 1.0, 'init': '<pkg>/references/scenes-vit.safetensors',
        'label_smoothing': 0.0, 'lr': 0.001, 'min_lr': 1e-05, 'recipe': 'scenes-vit-seg',
        'task': "segment(background=True, upsample='bilinear')", 'threads': 2, 'warmup_epochs': 0.1,
        'weight_decay': 0.05,
    },
    'scenes-vit-smoke': {
        'augment': 'crop_flip', 'batch_size': 32, 'data': 'fmnist_scenes', 'epochs': 1, 'eval_subset': 128,
        'lr': 0.001,
        'model': {'kwargs': {'depth': 12, 'drop_path_rate': 0.0, 'embed_dim': 72, 'img_size': 56, 'in_chans': 1, 'mlp_ratio': 2.0, 'num_classes': 10, 'num_heads': 3, 'patch_size': 4}, 'name': 'vit_tiny_patch16_224'},  # noqa: E501
        'recipe': 'scenes-vit-smoke', 'subset': 256, 'warmup_epochs': 0.2,
    },
}
EXPECTED_STUDY_RUNS: dict[str, str] = {
    'baselines/fmnist': '9dc607d0209be945', 'baselines/fmnist/smoke': '7395ee33afb8be32',
    'baselines/scenes': '1664d77205ca63fc', 'baselines/scenes/smoke': '1a16f1b16caaa68a',
    'bspf/fmnist': '30decde2d28eb738', 'bspf/fmnist/smoke': 'f7e2356407109890', 'bspf/scenes': '8e6e7e74d12ee371',
    'bspf/scenes/smoke': '6465d1c9b3dfea08', 'cropr/fmnist': 'c87abee8626524b2',
    'cropr/fmnist/smoke': '806089aceab3d181', 'cropr/scenes': '9e78723d80ba2877',
    'cropr/scenes/smoke': '8b8c4418390504d0', 'cropr_seg/fmnist': '01478243a5e13432',
    'cropr_seg/fmnist/smoke': '70bb9859b4a52275', 'cropr_seg/scenes': '0619f1180c024ecc',
    'cropr_seg/scenes/smoke': '6ace7beb89cc2816', 'diffrate/scenes': '2ff4f8019bd33723',
    'diffrate/scenes/smoke': 'e2ff76952740f905', 'eet/fmnist': '653653ec8c265ef4',
    'eet/fmnist/smoke': '8b693d9d13f98387', 'eet/scenes': 'f34d665d03899944', 'eet/scenes/smoke': '3a91d1cc644f891e',
    'imagepiece/fmnist': '12e47337cd31600f', 'imagepiece/fmnist/smoke': 'a10e224f0f902021',
    'imagepiece/scenes': 'd00d57fc30de02d6', 'imagepiece/scenes/smoke': '388a7eb691c102b1',
    'pitome/scenes': 'de1ee3f5e1cfb6df', 'pitome/scenes/smoke': 'df8a1c8838510b41',
    'platform/fmnist': '4903688ee4e558b2', 'platform/fmnist/smoke': '800ed8d0d6478957',
    'reference/fmnist': 'a503e5931dd0f6ba', 'reference/fmnist/smoke': '0be47f1788411b6f',
    'saint/scenes': '141c39dd005717a9', 'saint/scenes/smoke': '2578ad9aefabf970',
    'saint/scenes_free': '0102230bc1ef09c0', 'saint/scenes_free/smoke': '0580f1fefefc79e1',
}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache holding a stand-in fmnist-vit checkpoint (a study's Fashion-MNIST bed starts from it)."""
    root = tmp_path / "cache"
    (root / "fmnist-vit").mkdir(parents=True)
    (root / "fmnist-vit" / "model.safetensors").write_bytes(b"")
    monkeypatch.setenv("TOKENREDUCE_CACHE", str(root))
    return root


def normalised(obj: Any, **places: Path) -> Any:
    """``obj`` through JSON with each of ``places``' paths written as ``<name>``, and a trained recipe's
    checkpoint in any cache as ``<cache>/RECIPE/model.safetensors`` (the studies resolve their recipes when
    they are imported, under whatever cache was set then)."""
    text = json.dumps(obj, sort_keys=True, default=str)
    for name, path in places.items():
        text = text.replace(str(path), f"<{name}>")
    return json.loads(re.sub(r'"[^"<]*/([\w.-]+/model\.safetensors)"', r'"<cache>/\1"', text))


def test_every_recipe_resolves_as_before(cache: Path) -> None:
    pkg = Path(tokenreduce.__file__).parent
    assert sorted(RECIPES) == sorted(EXPECTED_RECIPES)
    for name, expected in EXPECTED_RECIPES.items():
        assert normalised(get_recipe(name), cache=cache, pkg=pkg) == expected, name


def test_every_study_run_trains_as_before(cache: Path, tmp_path: Path) -> None:
    pkg, scratch = Path(tokenreduce.__file__).parent, tmp_path / "scratch"
    got = {}
    for name in list_studies():
        cls = get_study(name)
        for bed, decl in cls.beds.items():
            for smoke in (False, True)[: 1 + (decl.smoke is not None)]:
                study = cls(bed, smoke=smoke)
                if study.arms:
                    runs = {p.id: normalised(study.train_fields(p, scratch), scratch=scratch, cache=cache, pkg=pkg)
                            for p in study.points()}
                    digest = hashlib.sha256(json.dumps(runs, sort_keys=True).encode()).hexdigest()[:16]
                    got[f"{name}/{bed}{'/smoke' if smoke else ''}"] = digest
    assert got == EXPECTED_STUDY_RUNS
