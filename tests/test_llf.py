"""Last Layer Fusion: every pruned token back at its original position before the final block, with
the value it had when pruned; the identity at zero reduction and alone; composite schedules; Cropr
with LLF on a dense task and deployed."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from conftest import make_host
from timm.models.vision_transformer import VisionTransformer

import tokenreduce as tr
from tokenreduce.data.fashion_mnist import CLASSES
from tokenreduce.models import deploy, export_inference, load_model, save_checkpoint
from tokenreduce.tasks import TaskContext, build_task
from tokenreduce.tasks.segment import make_dense


def _images(n: int = 3) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(2))


def test_llf_returns_every_token_to_its_position_with_its_pruned_value() -> None:
    model = make_host("deit")
    plain = copy.deepcopy(model)
    tr.apply(model, "random(keep=0.5, locs=(0,), where='block') + llf()")
    keep = tr.reducer_of(model).stages[0]._keep[0]  # (1 + 32,) positions kept at block 0, cls first
    images = _images()
    with torch.no_grad():
        out = model(images)
        x = plain.norm_pre(plain._pos_embed(plain.patch_embed(images)))
        x = plain.blocks[0](x)  # (B, 65, C): the pruned tokens' values when pruned
        kept = plain.blocks[2](plain.blocks[1](x[:, keep]))
        full = x.clone()
        full[:, keep] = kept  # back in place, the others as pruned
        want = plain.forward_head(plain.norm(plain.blocks[3](full)))
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    info = tr.get_info(model)
    assert info.tokens_per_block == [33, 33, 65, 65]
    assert torch.equal(info.index, torch.arange(65).expand(3, 65))


@pytest.mark.parametrize("host", ["deit", "registers", "avgpool"])
def test_llf_after_several_prunings_restores_the_original_order(host: str) -> None:
    model = make_host(host)
    p = model.num_prefix_tokens
    tr.apply(model, "random(counts=(50, 40, 30), locs=(0, 1, 2), seed=3) + llf(at=2)", trace=True)
    with torch.no_grad():
        model(_images())
    info = tr.get_info(model)
    assert info.tokens_per_block == [50 + p, 40 + p, 64 + p, 64 + p]
    assert torch.equal(info.index, torch.arange(64 + p).expand(3, -1))
    assert torch.equal(info.sizes, torch.ones(3, 64 + p))


@pytest.mark.parametrize("spec", ["random(keep=1.0, locs=(0,)) + llf()", "cropr(r=0, first=0, classes=10) + llf()",
                                  "llf()", "llf(at=0)"])
def test_zero_reduction_is_the_identity(spec: str) -> None:
    model = make_host("distilled")
    images = _images()
    with torch.no_grad():
        ref = model(images)
        tr.apply(model, spec)
        out = model(images)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert tr.get_info(model).tokens_per_block == [66] * 4


def test_composite_schedules_grow_back_to_the_patch_count() -> None:
    model = make_host("deit")
    cases = {
        "topk(keep=0.5, locs=(1,)) + llf()": (64, 32, 64, 64),  # topk acts after attention, llf after the block
        "cropr(r=8, classes=10, locs=(0, 1)) + llf()": (55, 47, 64, 64),
        "evit(keep=0.5, locs=(1,)) + llf()": (64, 33, 33, 33),  # fused, not pruned: nothing comes back
        "evit(counts=(50, 40), locs=(0, 1)) + llf()": (50, 40, 40, 40),  # explicit counts, the fused token included
    }
    for spec, counts in cases.items():
        tr.apply(model, spec)
        with torch.no_grad():
            model(_images())
        info = tr.get_info(model)
        assert info.schedule.counts == counts, spec
        assert info.tokens_per_block == info.schedule.tokens_per_block(1), spec
    with pytest.raises(tr.SpecError, match="at=4 is not a block"):
        tr.apply(model, "topk(keep=0.5, locs=(1,)) + llf(at=4)")


def test_cropr_with_llf_on_the_dense_task_trains_and_deploys(tmp_path: Path) -> None:
    torch.manual_seed(0)
    cfg = {"name": "vit_tiny_patch16_224", "kwargs": {"img_size": 56, "patch_size": 8, "in_chans": 1,
                                                      "embed_dim": 32, "depth": 4, "num_heads": 2, "num_classes": 0}}
    vit = VisionTransformer(**cfg["kwargs"])  # 7 x 7 = 49 patches
    spec = "cropr(r=10, queries=49, classes=11, locs=(0, 1)) + llf()"
    model = tr.apply(vit, spec)
    task = build_task("segment")
    task.bind(model, TaskContext(classes=list(CLASSES)))
    images, masks = torch.randn(2, 1, 56, 56), torch.randint(0, 11, (2, 56, 56))
    out = task(images, masks)
    assert set(out.losses) == {"ce", "aux/cropr0", "aux/cropr1"}
    assert tr.get_info(model).tokens_per_block == [39, 29, 50, 50]
    sum(out.losses.values()).backward()
    model.eval()
    with torch.no_grad():
        ref = task.pixel_logits(model, images)
    assert ref.shape == (2, 11, 56, 56)
    save_checkpoint(tmp_path / "train.safetensors", model, meta={"model": cfg, "spec": tr.get_info(model).spec},
                    task_state=task.owned_state_dict())
    export_inference(tmp_path / "train.safetensors", tmp_path / "infer.safetensors")
    deployed, meta = load_model(tmp_path / "infer.safetensors")
    assert meta["spec"].endswith(" + llf(at=-2)") and "inference=True" in meta["spec"]
    assert not list(deployed.tokenreduce.parameters())
    with torch.no_grad():
        torch.testing.assert_close(task.pixel_logits(make_dense(deployed), images), ref, rtol=1e-5, atol=1e-5)
    deploy(model)  # in place, the dense output kept
    assert tr.get_info(model).dense
    with torch.no_grad():
        torch.testing.assert_close(task.pixel_logits(model, images), ref, rtol=1e-5, atol=1e-5)
