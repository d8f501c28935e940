"""models/: stems (patch, conv), transforms (tie_qk), build/load with the config recorded in checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import TINY, make_host
from timm.models.vision_transformer import VisionTransformer
from torch import nn

import tokenreduce
from tokenreduce import SpecError
from tokenreduce.bench.macs import count_macs, flop_counter_macs
from tokenreduce.data import data_config_from_model
from tokenreduce.models import (
    CheckpointError,
    ConvStem,
    TiedQKV,
    apply_transform,
    atomic_write,
    build_model,
    build_stem,
    list_stems,
    list_transforms,
    load_model,
    load_weights,
    model_config,
    read_checkpoint,
    save_checkpoint,
    task_weights,
)

CFG = {"name": "vit_tiny_patch16_224",
       "kwargs": {"img_size": 32, "patch_size": 4, "embed_dim": 32, "depth": 2, "num_heads": 2, "in_chans": 1,
                  "num_classes": 10}}
X1 = torch.randn(3, 1, 32, 32, generator=torch.Generator().manual_seed(0))


def _vit(seed: int = 0, **kw) -> VisionTransformer:
    torch.manual_seed(seed)
    return VisionTransformer(**{**TINY, **kw}).eval()


def _qk(attn: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, k) (B, H, N, d) of timm's Attention for tokens x, as its forward computes them."""
    B, N, _ = x.shape
    q, k, _ = attn.qkv(x).reshape(B, N, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    return attn.q_norm(q), attn.k_norm(k)


def test_registries() -> None:
    assert {"patch", "conv"} <= set(list_stems()) and "tie_qk" in list_transforms()
    with pytest.raises(SpecError, match="unknown stem 'convv'; valid stems: .*conv.*patch"):
        build_stem("convv", _vit())
    with pytest.raises(SpecError, match="unknown parameter 'width'; valid parameters: norm"):
        build_stem("conv(width=3)", _vit())
    with pytest.raises(SpecError, match="norm='ln' is invalid; norm takes 'bn' or 'none'"):
        build_stem("conv(norm='ln')", _vit())
    with pytest.raises(SpecError, match="unknown transform 'tie_qv'; valid transforms: .*tie_qk"):
        apply_transform("tie_qv", _vit())
    with pytest.raises(SpecError, match="init='v' is invalid; init takes 'q', 'k' or 'mean'"):
        apply_transform("tie_qk(init='v')", _vit())


# ----------------------------------------------------------------------------- stems


@pytest.mark.parametrize(("patch", "img", "stride2"), [(2, 16, 1), (4, 32, 2), (8, 32, 3), (16, 64, 4)])
def test_conv_stem_keeps_the_grid(patch: int, img: int, stride2: int) -> None:
    plain = _vit(img_size=img, patch_size=patch)
    model = build_stem("conv", _vit(img_size=img, patch_size=patch))
    stem = model.patch_embed.proj
    assert isinstance(stem, ConvStem) and stem.in_channels == 3 and stem.out_channels == TINY["embed_dim"]
    convs = [m for m in stem.modules() if isinstance(m, nn.Conv2d)]
    assert [c.kernel_size for c in convs] == [(3, 3)] * 4 + [(1, 1)]
    assert [c.stride[0] for c in convs[:4]].count(2) == stride2 and convs[-1].out_channels == TINY["embed_dim"]
    assert [c.out_channels for c in convs[:4]] == [8, 16, 32, 64]
    assert sum(isinstance(m, nn.BatchNorm2d) for m in stem.modules()) == 4
    x = torch.randn(2, 3, img, img)
    assert model.patch_embed(x).shape == plain.patch_embed(x).shape == (2, (img // patch) ** 2, TINY["embed_dim"])
    assert tuple(model.patch_embed.grid_size) == (img // patch,) * 2
    assert model(x).shape == (2, TINY["num_classes"])


def test_conv_stem_unreachable_patch_sizes() -> None:
    with pytest.raises(SpecError, match="patch sizes 2, 4, 8, 16 .* not 6"):
        build_stem("conv", _vit(img_size=36, patch_size=6))
    with pytest.raises(SpecError, match="square patches, this model has 4x8; supported patch sizes: 2, 4, 8, 16"):
        build_stem("conv", _vit(img_size=32, patch_size=(4, 8)))
    with pytest.raises(SpecError, match="divisible by 8"):
        build_stem("conv", _vit(embed_dim=36, num_heads=2))


def test_patch_stem_is_timm_unchanged() -> None:
    model = _vit()
    proj = model.patch_embed.proj
    assert build_stem("patch", model).patch_embed.proj is proj


def test_conv_stem_trains_one_step() -> None:
    model = build_model({**CFG, "stem": "conv"}).train()
    stem = model.patch_embed.proj
    before = {k: v.clone() for k, v in stem.state_dict().items()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = nn.functional.cross_entropy(model(X1), torch.tensor([0, 1, 2]))
    loss.backward()
    for name, p in stem.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    opt.step()
    after = stem.state_dict()
    assert all(not torch.equal(before[k], after[k]) for k in before if not k.endswith("num_batches_tracked"))


def test_conv_stem_data_config_and_macs() -> None:
    model = build_model({**CFG, "stem": "conv"}).eval()
    assert data_config_from_model(model)["in_chans"] == 1
    report, plain = count_macs(model), count_macs(build_model(CFG))
    assert report.stem > plain.stem  # four 3x3 convolutions and a 1x1 cost more than one 4x4 patchify
    assert report.total == flop_counter_macs(model)
    assert [b.total for b in report.blocks] == [b.total for b in plain.blocks]  # same grid, same blocks


# ----------------------------------------------------------------------------- tie_qk


@pytest.mark.parametrize("host", ["deit", "qknorm", "registers"])
def test_tie_qk_shares_q_and_k(host: str, images: torch.Tensor) -> None:
    model = make_host(host)
    untied = make_host(host)
    x = model.patch_embed(images)
    s = _qk(untied.blocks[0].attn, x)
    assert not torch.allclose(s[0] @ s[1].transpose(-1, -2), (s[0] @ s[1].transpose(-1, -2)).transpose(-1, -2))
    apply_transform("tie_qk", model)
    for blk in model.blocks:
        qkv = blk.attn.qkv
        assert isinstance(qkv, TiedQKV) and qkv.q.weight is qkv.k.weight and qkv.q.bias is qkv.k.bias
        assert torch.equal(qkv.q.weight, qkv.k.weight) and torch.equal(qkv.q.bias, qkv.k.bias)
        assert blk.attn.q_norm is blk.attn.k_norm or host != "qknorm"
        q, k = _qk(blk.attn, x)
        torch.testing.assert_close(q, k, rtol=0, atol=1e-6)
        logits = q @ k.transpose(-1, -2)  # (B, H, N, N)
        torch.testing.assert_close(logits, logits.transpose(-1, -2), rtol=0, atol=1e-5)
    assert model(images).shape == (3, TINY["num_classes"])
    with pytest.raises(SpecError, match="already tied"):
        apply_transform("tie_qk", model)


@pytest.mark.parametrize("init", ["q", "k", "mean"])
def test_tie_qk_init(init: str) -> None:
    ref, model = _vit(), apply_transform(f"tie_qk(init={init!r})", _vit())
    A = TINY["embed_dim"]
    for r, blk in zip(ref.blocks, model.blocks, strict=True):
        wq, wk, wv = r.attn.qkv.weight.split(A)
        bq, bk, bv = r.attn.qkv.bias.split(A)
        want_w, want_b = {"q": (wq, bq), "k": (wk, bk), "mean": ((wq + wk) / 2, (bq + bk) / 2)}[init]
        assert torch.equal(blk.attn.qkv.q.weight, want_w) and torch.equal(blk.attn.qkv.q.bias, want_b)
        assert torch.equal(blk.attn.qkv.v.weight, wv) and torch.equal(blk.attn.qkv.v.bias, bv)
        if init == "q":  # the queries and values are the untied model's
            x = torch.randn(2, 5, A)
            q_ref, _, v_ref = r.attn.qkv(x).split(A, -1)
            q, _, v = blk.attn.qkv(x).split(A, -1)
            torch.testing.assert_close(q, q_ref)
            torch.testing.assert_close(v, v_ref)


def test_tie_qk_trains_one_shared_weight(images: torch.Tensor) -> None:
    untied = _vit()
    model = apply_transform("tie_qk", _vit())
    A, D = TINY["embed_dim"], TINY["embed_dim"]
    n = sum(p.numel() for p in model.parameters())
    assert n == sum(p.numel() for p in untied.parameters()) - TINY["depth"] * (A * D + A)
    model.train()
    model(images).sum().backward()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.step()
    for blk in model.blocks:
        assert blk.attn.qkv.q.weight.grad.abs().sum() > 0
        assert torch.equal(blk.attn.qkv.q.weight, blk.attn.qkv.k.weight)


def test_tie_qk_counts_the_same_macs() -> None:
    untied, tied = _vit(), apply_transform("tie_qk", _vit())
    a, b = count_macs(untied), count_macs(tied)
    assert [x.qkv for x in a.blocks] == [x.qkv for x in b.blocks] and a.total == b.total
    assert flop_counter_macs(tied) == flop_counter_macs(untied) == b.total


def test_tie_qk_rejects_unknown_attention() -> None:
    model = _vit()
    model.blocks[1].attn.qkv = nn.Linear(64, 64)
    with pytest.raises(tokenreduce.UnsupportedModelError, match="block 1's attention has no fused qkv"):
        apply_transform("tie_qk", model)


# ----------------------------------------------------------------------------- config and checkpoints


def test_model_config_is_canonical() -> None:
    assert model_config(CFG) == CFG  # a plain model's config is what it always was
    assert model_config({**CFG, "stem": "patch", "transforms": []}) == CFG
    cfg = model_config(CFG, stem="conv", transforms=["tie_qk(init='q')"])
    assert cfg == {**CFG, "stem": "conv(norm='bn')", "transforms": ["tie_qk(init='q')"]}
    assert model_config(cfg) == cfg and CFG.get("stem") is None  # idempotent, input untouched
    with pytest.raises(SpecError, match="valid stems"):
        model_config(CFG, stem="vit")
    with pytest.raises(tokenreduce.TokenReduceError, match="list of spec strings"):
        build_model({**CFG, "transforms": "tie_qk"})


@pytest.mark.parametrize(("stem", "transforms", "spec"), [
    ("conv", [], None), ("patch", ["tie_qk"], None), ("conv(norm='none')", ["tie_qk(init='k')"], "tome(r=2)"),
])
def test_save_load_rebuilds_stem_and_transforms(tmp_path: Path, stem: str, transforms: list[str],
                                                spec: str | None) -> None:
    cfg = model_config(CFG, stem=stem, transforms=transforms)
    model = build_model(cfg).train()
    model(X1)  # moves the BN running statistics away from their initial values
    if spec:
        tokenreduce.apply(model, spec)
    model.eval()
    path = tmp_path / "m.safetensors"
    save_checkpoint(path, model, meta={"model": cfg, "spec": spec})
    loaded, meta = load_model(path)
    assert meta["model"] == cfg
    assert type(loaded.patch_embed.proj) is type(model.patch_embed.proj)
    assert all(isinstance(b.attn.qkv, TiedQKV) == bool(transforms) for b in loaded.blocks)
    assert torch.equal(loaded(X1), model(X1))


@pytest.mark.parametrize(("start", "swap", "kind"), [("patch", "conv", ConvStem), ("conv", "patch", nn.Conv2d)])
def test_a_stem_swapped_onto_a_checkpoint_is_fresh_and_the_rest_kept(tmp_path: Path, start: str, swap: str,
                                                                      kind: type) -> None:
    """--init CKPT --stem S: S in place of the checkpoint's stem, freshly initialised; every other weight is
    the checkpoint's; the run's checkpoint rebuilds with S."""
    from tokenreduce.cli import build_parser
    from tokenreduce.commands.train import config_from_args
    from tokenreduce.train.loop import make_model

    torch.manual_seed(0)
    cfg = model_config(CFG, stem=start)
    ref = build_model(cfg).eval()
    path = tmp_path / "ref.safetensors"
    save_checkpoint(path, ref, meta={"model": cfg, "spec": None})
    args = build_parser().parse_args(["train", "--init", str(path), "--stem", swap, "--out", str(tmp_path / "r")])
    train_cfg = config_from_args(args)
    model, model_cfg, _ = make_model(train_cfg)
    assert model_cfg == model_config(CFG, stem=swap) and type(model.patch_embed.proj) is kind
    before, after = ref.state_dict(), model.state_dict()
    rest = [k for k in before if not k.startswith("patch_embed.proj")]
    assert rest and all(torch.equal(before[k], after[k]) for k in rest)
    assert not any(k.startswith("patch_embed.proj") and k in before and before[k].shape == v.shape
                   and torch.equal(before[k], v) for k, v in after.items())
    save_checkpoint(tmp_path / "tuned.safetensors", model, meta={"model": model_cfg, "spec": None})
    loaded, _ = load_model(tmp_path / "tuned.safetensors")
    assert torch.equal(loaded(X1), model.eval()(X1))


def test_old_meta_without_stem_loads(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = build_model(CFG).eval()
    save_checkpoint(tmp_path / "m.safetensors", model, meta={"model": CFG, "spec": None})
    loaded, meta = load_model(tmp_path / "m.safetensors")
    assert "stem" not in meta["model"] and isinstance(loaded.patch_embed.proj, nn.Conv2d)
    assert torch.equal(loaded(X1), model(X1))


def test_unknown_stem_or_transform_in_checkpoint(tmp_path: Path) -> None:
    model = build_model(CFG)
    for key, value, valid in [("stem", "hexagon", "valid stems"), ("transforms", ["tie_qv"], "valid transforms")]:
        path = tmp_path / f"{key}.safetensors"
        save_checkpoint(path, model, meta={"model": {**CFG, key: value}, "spec": None})
        with pytest.raises(CheckpointError, match=f"cannot rebuild its model.*{valid}"):
            load_model(path)


def test_task_tensors_are_not_the_models(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = build_model(CFG).eval()
    owned = {"head.weight": torch.randn(16, 32), "teacher.blocks.0.w": torch.arange(3.0)}
    path = tmp_path / "m.safetensors"
    save_checkpoint(path, model, meta={"model": CFG, "spec": None}, task_state=owned)
    ckpt = read_checkpoint(path)
    assert {k for k in ckpt.weights if k.startswith("task.")} == {"task.head.weight", "task.teacher.blocks.0.w"}
    got = task_weights(ckpt)
    assert got.keys() == owned.keys() and all(torch.equal(got[k], owned[k]) for k in owned)
    loaded, _ = load_model(path)
    assert torch.equal(loaded(X1), model(X1))
    deeper = build_model({**CFG, "kwargs": {**CFG["kwargs"], "depth": 3}})
    with pytest.raises(CheckpointError, match="missing 12 keys"):  # strict over every other key
        load_weights(deeper, ckpt)
    save_checkpoint(tmp_path / "plain.safetensors", model, meta={"model": CFG, "spec": None})
    assert task_weights(read_checkpoint(tmp_path / "plain.safetensors")) == {}

    class Clash(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.task = nn.Linear(2, 2)

    with pytest.raises(CheckpointError, match="may not start with"):
        save_checkpoint(tmp_path / "c.safetensors", Clash(), meta={"model": CFG})


def test_atomic_write(tmp_path: Path) -> None:
    path = atomic_write(tmp_path / "new" / "dir" / "f.bin", b"abc")
    assert path.read_bytes() == b"abc"
    atomic_write(path, b"defg")
    assert path.read_bytes() == b"defg" and [p.name for p in path.parent.iterdir()] == ["f.bin"]


# ----------------------------------------------------------------------------- variants


def test_without_class_token_keeps_every_weight_but_the_class_tokens(tmp_path: Path) -> None:
    from tokenreduce.models.variants import FREE_KWARGS, without_class_token

    torch.manual_seed(0)
    src = build_model(CFG).eval()
    save_checkpoint(tmp_path / "cls.safetensors", src, meta={"model": CFG, "spec": None, "classes": list("abcdefghij")})
    out = without_class_token(tmp_path / "cls.safetensors", tmp_path / "free.safetensors")
    model, meta = load_model(out)
    assert meta["model"]["kwargs"] == {**CFG["kwargs"], **FREE_KWARGS} and meta["classes"] == list("abcdefghij")
    assert model.cls_token is None and model.num_prefix_tokens == 0 and isinstance(model.norm, nn.LayerNorm)
    old, new = src.state_dict(), model.state_dict()
    assert set(old) - set(new) == {"cls_token"} and set(new) <= set(old)
    assert new["pos_embed"].shape == (1, 64, 32) and torch.equal(new["pos_embed"], old["pos_embed"][:, 1:])
    assert all(torch.equal(new[k], old[k]) for k in new if k != "pos_embed")
    with torch.no_grad():
        dense = model(X1)
        tokens = model.norm(model.blocks(model.patch_embed(X1) + model.pos_embed))
        assert torch.allclose(dense, model.head(tokens.mean(1)), atol=1e-6)  # the head reads the mean of normed tokens
        for spec in ("tome(r=0)", "topk(keep=1.0, locs=(0,), score='shift')"):
            tokenreduce.apply(model, spec)
            assert torch.equal(model(X1), dense), spec
            tokenreduce.remove(model)
    with pytest.raises(CheckpointError, match="no class token already"):
        without_class_token(out, tmp_path / "again.safetensors")
