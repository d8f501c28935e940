"""A patched model behaves like the model it patches: gradient checkpointing through the host's own
mechanism, forward hooks on its blocks, any input resolution, ``return_dict``, ``save_pretrained``.

On both hosts (a tiny timm VisionTransformer, tiny transformers ViT / DINOv2 / CLIP vision models):

- checkpointing: the host's checkpoint function is called once per block (transformers: the layer's
  ``_gradient_checkpointing_func`` with the user's kwargs; timm: its ``checkpoint``), the bytes
  saved for backward (``torch.autograd.graph.saved_tensors_hooks``) drop under a real reduction, and
  outputs and gradients equal those without checkpointing (random draws and reducer state replayed);
- hooks: a forward hook and a pre-hook on each block fire once per forward, seeing the tokens as
  they enter the block and leave it, with and without reduction, with checkpointing too;
- resolution: one patched model runs at several grids with the schedule compiled for each, equals the
  unpatched model at zero reduction at each, and refuses explicit counts a grid cannot hold.
"""

from __future__ import annotations

import pytest
import timm
import torch
from conftest import TINY
from timm.models.vision_transformer import VisionTransformer

import tokenreduce as tr
from tokenreduce.adapters import hosts, timm_vit
from tokenreduce.adapters.hf_vit import _resolve
from tokenreduce.bench.macs import count_macs, flop_counter_macs

transformers = pytest.importorskip("transformers")

SIZE = dict(image_size=32, patch_size=4, hidden_size=64, num_hidden_layers=4, num_attention_heads=2)
DROP = dict(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)  # random draws to replay


def timm_model(**extra) -> torch.nn.Module:
    torch.manual_seed(0)
    return VisionTransformer(**TINY, **extra).eval()


def hf_model(kind: str = "vit", **extra) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "vit":
        return transformers.ViTForImageClassification(
            transformers.ViTConfig(**SIZE, intermediate_size=256, num_labels=10, **extra)).eval()
    if kind == "vitmodel":
        return transformers.ViTModel(transformers.ViTConfig(**SIZE, intermediate_size=256, **extra)).eval()
    if kind == "dinov2":
        return transformers.Dinov2Model(transformers.Dinov2Config(**SIZE, layerscale_value=0.5, **extra)).eval()
    return transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**SIZE, intermediate_size=256, **extra)).eval()


def blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The host's blocks: timm's ``blocks``, a transformers base model's layers."""
    if isinstance(model, VisionTransformer):
        return list(model.blocks)
    base = _resolve(model)[0]
    return list(base.layers if hasattr(base, "layers") else base.encoder.layers if hasattr(base.encoder, "layers")
                else base.encoder.layer)


def predict(model: torch.nn.Module, x: torch.Tensor, **kw) -> torch.Tensor:
    out = model(x, **kw)
    if isinstance(out, torch.Tensor):
        return out
    return out.logits if getattr(out, "logits", None) is not None else out.pooler_output


def enable_checkpointing(model: torch.nn.Module, **kwargs) -> None:
    if isinstance(model, VisionTransformer):
        model.set_grad_checkpointing(True)
    elif hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5's name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs or None)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs or None)


@pytest.fixture
def images() -> torch.Tensor:
    return torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))


# ----- gradient checkpointing ---------------------------------------------------------------------


def saved_mib(model: torch.nn.Module, x: torch.Tensor) -> float:
    """MiB of tensors saved for backward in one training forward (what activation memory is)."""
    total = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = predict(model, x).sum()
    loss.backward()  # outside: a reentrant recomputation saves its tensors in the backward pass
    return total[0] / 2**20


HOST_CKPT = [("timm", {}), ("transformers", {}), ("transformers", {"use_reentrant": True})]


@pytest.mark.parametrize("host,kwargs", HOST_CKPT)
def test_checkpointing_runs_each_block_once_through_the_host_and_saves_memory(host, kwargs, monkeypatch):
    x = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    model = tr.apply(timm_model() if host == "timm" else hf_model(), "tome(r=8)").train()
    plain = saved_mib(model, x)  # about 10 MiB; checkpointed about 0.6 (what the stem and head save)
    enable_checkpointing(model, **kwargs)
    calls: list[int] = []

    def counted(real):
        return lambda fn, *args: calls.append(1) or real(fn, *args)

    if host == "timm":  # timm checkpoints a block with timm.models.checkpoint
        monkeypatch.setattr(timm_vit, "checkpoint", counted(timm_vit.checkpoint))
    else:
        for layer in blocks(model):
            layer._gradient_checkpointing_func = counted(layer._gradient_checkpointing_func)
    ckpt = saved_mib(model, x)
    assert len(calls) == 4, f"the host's checkpoint function ran {len(calls)} times for 4 blocks"
    assert tr.get_info(model).tokens_per_block == [57, 49, 41, 33]
    assert ckpt < 0.5 * plain, f"saved for backward: {ckpt:.2f} MiB checkpointed, {plain:.2f} MiB without"


def train_step(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    torch.manual_seed(3)
    model.zero_grad()
    with tr.capture(model) as seen:  # the live record: auxiliary losses keep their graph
        out = predict(model, x)
    loss = out.square().mean() + sum(seen.last.aux_losses.values(), torch.tensor(0.0))
    loss.backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


CKPT_SPECS = [
    "tome(r=8)",
    "dynamicvit(keep=0.5, locs=(1, 2))",  # a Gumbel keep policy: random draws, state carried between blocks
    "topk(keep=0.5, locs=(1, 2)) + llf()",  # pruned tokens kept aside in the state, brought back later
    "random(keep=0.5, locs=(1,))",
]


@pytest.mark.parametrize("spec", CKPT_SPECS)
@pytest.mark.parametrize("host,kwargs", HOST_CKPT)
def test_checkpointing_gives_equal_outputs_and_gradients(spec, host, kwargs, images):
    model = timm_model(drop_path_rate=0.1, attn_drop_rate=0.1) if host == "timm" else hf_model(**DROP)
    tr.apply(model, spec).train()
    out, grads = train_step(model, images)
    enable_checkpointing(model, **kwargs)
    out_ckpt, grads_ckpt = train_step(model, images)
    torch.testing.assert_close(out_ckpt, out, rtol=0, atol=1e-6)
    assert grads_ckpt.keys() == grads.keys()
    for name, g in grads.items():
        torch.testing.assert_close(grads_ckpt[name], g, rtol=1e-5, atol=1e-6, msg=name)


def test_a_reducers_own_state_is_replayed_not_advanced_by_the_recomputation(images):
    """Cropr's warm-up step counter (a buffer advanced once per training forward) reads the same in
    the recomputation and ends advanced once: the same kept set, the same gradients."""
    spec = "cropr(r=10, classes=10, queries=2, warmup_steps=4)"
    model = tr.apply(timm_model(), spec).train()
    train_step(model, images)
    out, grads = train_step(model, images)
    model.set_grad_checkpointing(True)
    reducer = tr.reducer_of(model)
    reducer.load_state_dict({**reducer.state_dict(), "step": torch.tensor(1)})  # back one step (as a resume sets it)
    out_ckpt, grads_ckpt = train_step(model, images)
    assert int(tr.reducer_of(model).step) == 2
    torch.testing.assert_close(out_ckpt, out, rtol=0, atol=1e-6)
    for name, g in grads.items():
        torch.testing.assert_close(grads_ckpt[name], g, rtol=1e-5, atol=1e-6, msg=name)


# ----- hooks --------------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["timm", "transformers"])
@pytest.mark.parametrize("spec", [None, "tome(r=0)", "tome(r=8)", "tome(r=8) checkpointed"])
def test_block_hooks_fire_once_per_forward_seeing_the_tokens_in_and_out(host, spec, images):
    model = timm_model() if host == "timm" else hf_model()
    if spec is not None:
        tr.apply(model, spec.split()[0])
    if spec is not None and spec.endswith("checkpointed"):
        model.train()
        enable_checkpointing(model)
    seen: list[tuple[str, int, int]] = []
    for i, blk in enumerate(blocks(model)):
        blk.register_forward_pre_hook(lambda m, args, i=i: seen.append(("in", i, args[0].shape[1])))
        blk.register_forward_hook(lambda m, args, out, i=i: seen.append(("out", i, out.shape[1])))
    predict(model, images).sum().backward()
    counts = tr.get_info(model).tokens_per_block if spec is not None else [65] * 4
    want = [e for i in range(4) for e in (("in", i, ([65] + counts)[i]), ("out", i, counts[i]))]
    assert seen == want


# ----- any resolution -----------------------------------------------------------------------------


def tome_counts(patches: int, r: int = 8, prefix: int = 1) -> list[int]:
    return [patches - r * (i + 1) + prefix for i in range(4)]


def test_one_timm_model_runs_every_grid_with_its_own_schedule():
    model = timm_model(dynamic_img_size=True)
    ref = {}
    sizes = [(32, 32), (48, 48), (32, 48), (32, 32)]
    with torch.no_grad():
        for h, w in sizes:
            ref[h, w] = model(torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(h + w)))
        tr.apply(model, "tome(r=0)")
        for h, w in sizes:  # zero reduction equals the unpatched model at every size
            out = model(torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(h + w)))
            torch.testing.assert_close(out, ref[h, w], rtol=1e-5, atol=1e-5)
            assert tr.get_info(model).tokens_per_block == [h * w // 16 + 1] * 4
        tr.apply(model, "tome(r=8)")
        for h, w in sizes:
            model(torch.randn(2, 3, h, w))
            info = tr.get_info(model)
            assert info.tokens_per_block == tome_counts(h * w // 16) and info.host.grid == (h // 4, w // 4)
        tr.apply(model, "random(keep=0.5, locs=(1,))")  # the draw at a grid is the same whenever it comes back
        x = torch.randn(2, 3, 32, 32)
        first = model(x)
        model(torch.randn(2, 3, 48, 48))
        assert tr.get_info(model).tokens_per_block == [145, 73, 73, 73]
        assert torch.equal(model(x), first) and tr.get_info(model).tokens_per_block == [65, 33, 33, 33]


@pytest.mark.parametrize("kind", ["vit", "dinov2", "clip"])
def test_one_transformers_model_runs_every_grid_with_its_own_schedule(kind):
    model = hf_model(kind)
    kw = {} if kind == "dinov2" else {"interpolate_pos_encoding": True}  # DINOv2 always interpolates
    sizes = [(32, 32), (48, 48), (48, 32)]
    x = {s: torch.randn(2, 3, *s, generator=torch.Generator().manual_seed(sum(s))) for s in sizes}
    with torch.no_grad():
        ref = {s: predict(model, x[s], **kw) for s in sizes}
        tr.apply(model, "tome(r=0)")
        for s in sizes:
            torch.testing.assert_close(predict(model, x[s], **kw), ref[s], rtol=1e-5, atol=1e-5)
            assert tr.get_info(model).tokens_per_block == [s[0] * s[1] // 16 + 1] * 4
        tr.apply(model, "tome(r=8)")
        for s in sizes:
            predict(model, x[s], **kw)
            assert tr.get_info(model).tokens_per_block == tome_counts(s[0] * s[1] // 16)


def test_explicit_counts_a_grid_cannot_hold_are_refused_naming_it(images):
    model = tr.apply(timm_model(dynamic_img_size=True), "topk(counts=(40, 20), locs=(1, 2))")
    with torch.no_grad():
        want = model(images)
        with pytest.raises(tr.SpecError, match=r"does not fit this input's 4x4 patch grid \(16 patches\).*40 of 16"):
            model(torch.randn(1, 3, 16, 16))
        assert tr.get_info(model).host.grid == (8, 8)  # still bound where it was
        torch.testing.assert_close(model(images), want, rtol=0, atol=0)
        model(torch.randn(1, 3, 48, 48))  # counts that fit a larger grid are kept as given
    assert tr.get_info(model).tokens_per_block == [145, 41, 21, 21]


def test_a_compiled_forward_is_one_static_graph_at_the_grid_it_runs(images):
    torch._dynamo.reset()
    model = tr.apply(timm_model(dynamic_img_size=True), "tome(r=8)")
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        model(images)
        want = model(x)  # binds the 12x12 grid eagerly
        got = torch.compile(model, fullgraph=True, dynamic=False, backend="eager")(x)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_hybrid_timm_vit_is_served_its_cnn_stem_taking_the_images(dynamic):
    """vit_*_r*_ / vit_*_resnet* put a CNN before the projection (timm's HybridEmbed): the images have the
    CNN's channels (3), not the projection's input width, and each token stands for the CNN's stride times
    the projection's patch, a grid the schedule follows like any other; the stem's cost is measured."""
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_r_s16_p8_224", pretrained=False, img_size=64, depth=2,
                              dynamic_img_size=dynamic).eval()
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(x)
        tr.apply(model, "tome(r=0)")
        torch.testing.assert_close(model(x), want, rtol=1e-5, atol=1e-5)
        tr.apply(model, "tome(r=2)")
        model(x)
        assert tr.get_info(model).tokens_per_block == [3, 2]
        assert count_macs(model).total == flop_counter_macs(model)
        with pytest.raises(tr.TokenReduceError, match="expects 3 input channels, got 1"):
            model(x[:, :1])
        if dynamic:
            model(torch.randn(1, 3, 96, 96))
            assert tr.get_info(model).host.grid == (3, 3) and tr.get_info(model).tokens_per_block == [8, 6]
        else:
            with pytest.raises(tr.TokenReduceError, match="96x96 does not match the 64x64"):
                model(torch.randn(1, 3, 96, 96))


# ----- transformers: return_dict and save_pretrained ----------------------------------------------


@pytest.mark.parametrize("kind", ["vitmodel", "clip"])  # (transformers' own wrappers fail with it, unpatched too)
def test_config_return_dict_false_gives_a_tuple_like_unpatched(kind, images):
    model = hf_model(kind)
    model.config.return_dict = False
    with torch.no_grad():
        ref = model(images)
        tr.apply(model, "tome(r=0)")
        out = model(images)
        assert isinstance(ref, tuple) and isinstance(out, tuple) and len(out) == len(ref)
        for a, b in zip(out, ref, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        model.config.return_dict = True
        assert isinstance(model(images, return_dict=False), tuple)


def test_save_pretrained_round_trip_gives_the_unpatched_model(tmp_path, images):
    model = tr.apply(hf_model(), "tome(r=8)")
    with torch.no_grad():
        reduced = predict(model, images)
        model.save_pretrained(tmp_path)
        back = transformers.ViTForImageClassification.from_pretrained(tmp_path).eval()
        assert not hosts.is_patched(back)
        torch.testing.assert_close(predict(back, images), predict(tr.remove(model), images), rtol=0, atol=0)
        tr.apply(back, "tome(r=8)")  # the way back to the patched model
        torch.testing.assert_close(predict(back, images), reduced, rtol=0, atol=0)
