"""The second host: transformers' ViT, DeiT, DINOv2 (with registers) and CLIP vision encoders.

The contract of tests/test_contract.py over hosts x methods on tiny random configs (no hub):
identity at zero reduction (exactly), remove restoring state and outputs exactly, schedules,
prefix tokens, sizes, gradients, batch invariance, MACs; the attention path taken (fused SDPA
wherever nothing needs the probabilities); refusals; and the cross-host equivalence with timm
through the key map (adapters/hf_keys.py). Skipped when transformers is not installed.
"""

from __future__ import annotations

import copy
import io
import json
import pickle
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY as TIMM_TINY
from conftest import supplied
from timm.models.deit import VisionTransformerDistilled
from timm.models.vision_transformer import VisionTransformer

import tokenreduce as tr
from tokenreduce.adapters import hosts
from tokenreduce.adapters.hf_keys import hf_to_timm, timm_to_hf
from tokenreduce.adapters.hf_vit import _resolve
from tokenreduce.bench import count_macs, flop_counter_macs
from tokenreduce.core.method import format_spec

transformers = pytest.importorskip("transformers")

SIZE = dict(image_size=32, patch_size=4, hidden_size=64, num_hidden_layers=4, num_attention_heads=2)
VIT = dict(**SIZE, intermediate_size=256, layer_norm_eps=1e-6, num_labels=10)  # timm's eps: cross-host tests

#: The transformers host matrix: each entry builds a tiny random model of one supported class.
HOSTS = {
    "vit": lambda: transformers.ViTForImageClassification(transformers.ViTConfig(**VIT)),
    "deit": lambda: transformers.DeiTForImageClassificationWithTeacher(transformers.DeiTConfig(**VIT)),
    "dinov2": lambda: transformers.Dinov2ForImageClassification(
        transformers.Dinov2Config(**SIZE, num_labels=10, layerscale_value=0.5)),
    "registers": lambda: transformers.Dinov2WithRegistersModel(
        transformers.Dinov2WithRegistersConfig(**SIZE, num_register_tokens=2)),
    "clip": lambda: transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**SIZE, intermediate_size=256)),
    # no class token; the attention-pooling head (vision_use_head, the default) pools every final token
    "siglip": lambda: transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**SIZE, intermediate_size=256)),
}
PREFIX = {"vit": 1, "deit": 2, "dinov2": 1, "registers": 3, "clip": 1, "siglip": 0}
METHODS = tr.list_methods()
#: every method on every host, but a method that needs a class token on SigLIP (refused: test_contract.py)
CASES = [(m, h) for m in METHODS for h in HOSTS if PREFIX[h] or not tr.get_method(m).needs_class_token]


def make(host: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return HOSTS[host]().eval()


def head(out) -> torch.Tensor:
    """What the model predicts: logits, or the pooled output of a model without a head."""
    return out.logits if getattr(out, "logits", None) is not None else out.pooler_output


def tokens(model: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
    """The base model's last hidden state (the ViTModel inside a ViTForImageClassification...)."""
    return _resolve(model)[0](images).last_hidden_state


def spec(method: str, which: str) -> str:
    return format_spec(method, getattr(tr.get_method(method), which))


@pytest.fixture
def images() -> torch.Tensor:
    return torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))


# ----- the contract ------------------------------------------------------------------------------


@pytest.mark.parametrize("method,host", CASES)
def test_identity_at_zero_reduction(method, host, images):
    model = make(host)
    with torch.no_grad():
        ref, ref_tokens = head(model(images)), tokens(model, images)
        tr.apply(model, spec(method, "zero"))
        out, out_tokens = head(model(images)), tokens(model, images)
    assert (out - ref).abs().max().item() == 0
    assert (out_tokens - ref_tokens).abs().max().item() == 0
    assert tr.get_info(model).tokens_per_block == [64 + PREFIX[host]] * 4


@pytest.mark.parametrize("method,host", CASES)
def test_remove_restores_state_and_outputs_exactly(method, host, images):
    model = make(host)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        ref = head(model(images))
        tr.apply(model, spec(method, "example"))
        with supplied(model):
            reduced = head(model(images))
        tr.remove(model)
        back = head(model(images))
    assert not hosts.is_patched(model) and all("forward" not in vars(m) for m in model.modules())
    after = model.state_dict()
    assert list(after) == list(state) and all(torch.equal(after[k], v) for k, v in state.items())
    assert (back - ref).abs().max().item() == 0
    if tr.get_method(method).stage_only:  # alone the identity; as a stage: tests/test_compose.py
        torch.testing.assert_close(reduced, ref, rtol=1e-5, atol=1e-5)
    else:
        assert not torch.allclose(reduced, ref), "the example spec must actually change the computation"


@pytest.mark.parametrize("method,host", CASES)
def test_schedule_counts_prefix_and_sizes(method, host, images):
    model = tr.apply(make(host), spec(method, "example"), trace=True)
    with torch.no_grad(), supplied(model):
        out = model(images)
        assert tokens(model, images).shape[1] == tr.get_info(model).tokens_per_block[-1]
    info = tr.get_info(model)
    p = PREFIX[host]
    assert info.host.num_prefix == p and info.host.family == "transformers"
    assert info.tokens_per_block == info.schedule.tokens_per_block(p)
    assert torch.isfinite(head(out)).all()
    if not info.schedule.locs or tr.get_method(method).stage_only:
        assert info.tokens_per_block == [64 + p] * 4
        return
    assert info.tokens_per_block[-1] < 64 + p
    assert torch.equal(info.index[:, :p], torch.arange(p).expand(3, p)), "prefix tokens stay first, unreduced"
    final = info.snapshots[max(info.snapshots)]
    torch.testing.assert_close(info.sizes, final.sum(-1))
    if tr.build_reducer(info.spec).conserves_patches:
        torch.testing.assert_close(info.sizes[:, p:].sum(1), torch.full((3,), 64.0))


@pytest.mark.parametrize("method", METHODS)
def test_batch_invariance(method, images):
    model = tr.apply(make("deit"), spec(method, "example"))
    with torch.no_grad(), supplied(model):
        full = head(model(images))
        single = torch.cat([head(model(images[i : i + 1])) for i in range(len(images))])
    torch.testing.assert_close(full, single, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("method", METHODS)
def test_gradients_reach_every_parameter(method, images):
    model = tr.apply(make("dinov2").train(), spec(method, "example"))  # DINOv2: LayerScale
    with supplied(model), tr.capture(model) as seen:  # the live record: auxiliary outputs keep their graph
        out = head(model(images))
    loss = out.logsumexp(-1).mean() + sum(seen.last.aux_losses.values(), torch.tensor(0.0))
    loss = loss + sum((o.logsumexp(-1).mean() for o in seen.last.aux_outputs.values()), torch.tensor(0.0))
    loss.backward()
    unused = ("mask_token",)  # DINOv2's masked-image-modelling token: no gradient unpatched either
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None and not n.endswith(unused)]
    assert not missing, f"no gradient for {missing}"


@pytest.mark.parametrize("host", HOSTS)
def test_dense_returns_every_position_and_grad_checkpointing_matches(host, images):
    model = tr.apply(make(host), "tome(r=8)", dense=True)
    with torch.no_grad():
        assert tokens(model, images).shape == (3, 64 + PREFIX[host], 64)
    model = tr.apply(make(host).train(), "evit(keep=0.5, locs=(1, 2))")
    torch.manual_seed(0)
    plain = head(model(images))
    getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()  # v5 renamed it
    torch.manual_seed(0)
    ckpt = head(model(images))
    ckpt.sum().backward()
    torch.testing.assert_close(ckpt, plain)


@pytest.mark.parametrize("host", HOSTS)
def test_macs_are_the_hosts_real_shapes(host):
    """Unpatched, the analytic count equals torch.utils.flop_counter's exactly (as for timm,
    tests/test_bench.py); patched, the declared scoring matches what the forward computes."""
    model = make(host)
    assert count_macs(model).total == flop_counter_macs(model)
    tr.apply(model, "evit(keep=0.5, locs=(1, 2))")
    report = count_macs(model)
    assert report.tokens_per_block == tr.get_info(model).schedule.tokens_per_block(PREFIX[host])
    measured = flop_counter_macs(model) - (report.total - report.scoring)
    assert abs(report.scoring - measured) <= 0.01 * measured


def test_reapply_replaces_and_copies_are_independent(images):
    model = make("vit")
    with torch.no_grad():
        ref = head(model(images))
        tr.apply(model, "tome(r=4)")
        tr.apply(model, "evit(keep=0.5, locs=(1, 2))")
        assert tr.get_info(model).spec.startswith("evit")
        twin = copy.deepcopy(model)
        tr.remove(twin)
        assert torch.equal(head(twin(images)), ref)
        assert tr.get_info(model).spec.startswith("evit") and tr.get_info(model).tokens_per_block[-1] < 65
        assert not torch.allclose(head(model(images)), ref)
    assert not hosts.is_patched(twin) and all("forward" not in vars(m) for m in twin.modules())


def test_pickle_torch_save_and_deepcopy_keep_the_patch(images):
    model = tr.apply(make("vit"), "dynamicvit(keep=0.5, locs=(1, 2))")
    with torch.no_grad():
        want = head(model(images))
    head(model.train()(images)).sum().backward()  # the last forward's record now holds a training graph
    model.eval()
    buf = io.BytesIO()
    torch.save(model, buf)
    saved = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    for other in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model), saved):
        assert other.vit.forward.args[0] is other.vit  # bound to the copy, not to the original
        assert tr.get_info(other).spec == tr.get_info(model).spec
        with torch.no_grad():
            assert torch.equal(head(other(images)), want)
        assert tr.get_info(other).tokens_per_block == [65, 33, 17, 17]
        tr.remove(other)
        assert not hosts.is_patched(other) and hosts.is_patched(model)  # the original stays patched


def test_script_fx_and_the_classic_onnx_exporter_refuse(tmp_path):
    model = tr.apply(make("vit"), "tome(r=8)")
    with pytest.raises(tr.UnsupportedModelError, match=r"torch\.jit\.script.*tome\(r=8.*unreduced"):
        torch.jit.script(model)
    for root in (model, model.vit):  # transformers >= 5 models do not fx-trace, unpatched either: never a graph
        with pytest.raises((TypeError, torch.fx.proxy.TraceError, tr.TokenReduceError)):
            torch.fx.symbolic_trace(root)
    x = torch.randn(1, 3, 32, 32)
    with pytest.raises(tr.TokenReduceError, match="needs ONNX opset >= 16"):  # a merge's summing scatter
        torch.onnx.export(model, (x,), str(tmp_path / "m.onnx"), dynamo=False, opset_version=15)
    assert not list(tmp_path.iterdir())
    tr.remove(model)
    assert all(name not in vars(model.vit) for name in ("forward", "__prepare_scriptable__"))


# ----- attention path: fused SDPA wherever nothing needs the probabilities --------------------------


def _count_sdpa(monkeypatch) -> list[int]:
    calls = [0]
    real = F.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counted)
    return calls


@pytest.mark.parametrize("method_spec,explicit_blocks", [
    ("tome(r=8)", 0),  # needs the keys: still fused
    ("evit(keep=0.5, locs=(1, 2))", 0),  # the CLS row from q and K beside the fused kernel
    ("topk(keep=0.5, locs=(1, 2))", 0),
    ("bspf(size=1000000, keep=0.5, locs=(1, 2))", 2),  # needs the probabilities at its two blocks
])
@pytest.mark.parametrize("host", ["vit", "clip"])
def test_sdpa_kept_where_no_probabilities_are_needed(method_spec, explicit_blocks, host, images, monkeypatch):
    model = make(host)
    assert model.config._attn_implementation == "sdpa"
    calls = _count_sdpa(monkeypatch)
    with torch.no_grad():
        model(images)
        assert calls[0] == 4, "the unpatched host calls SDPA once per layer"
        tr.apply(model, method_spec)
        model(images)
    assert calls[0] == 4 + 4 - explicit_blocks


# ----- wrappers, refusals, errors -----------------------------------------------------------------


def test_clip_model_vision_tower(images):
    torch.manual_seed(0)
    cfg = transformers.CLIPConfig(vision_config=dict(**SIZE, intermediate_size=256),
                                  text_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                   intermediate_size=64, vocab_size=50))
    model = transformers.CLIPModel(cfg).eval()
    with torch.no_grad():
        ref = model.get_image_features(images).pooler_output
        tr.apply(model, "tome(r=0)")
        assert torch.equal(model.get_image_features(images).pooler_output, ref)
        tr.apply(model, "tome(r=8)")
        assert not torch.allclose(model.get_image_features(images).pooler_output, ref)
        assert tr.get_info(model).tokens_per_block == [57, 49, 41, 33]
    with pytest.raises(tr.TokenReduceError, match="already patched"):
        tr.apply(model.vision_model, "tome(r=4)")
    tr.remove(model)
    with torch.no_grad():
        assert torch.equal(model.get_image_features(images).pooler_output, ref)


@pytest.mark.parametrize("wrapper", ["SiglipModel", "SiglipForImageClassification"])
def test_siglip_wrappers_reduce_their_vision_tower(wrapper, images):
    """The vision tower of SigLIP's wrappers, no class token: exact at zero reduction, the reduced tokens and
    their sizes for what comes next (a VLM projector), remove restoring it; a class-token score refused."""
    torch.manual_seed(0)
    cfg = transformers.SiglipConfig(vision_config=dict(**SIZE, intermediate_size=256),
                                    text_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                     intermediate_size=64, vocab_size=50))
    model = getattr(transformers, wrapper)(cfg).eval()
    tower = model.vision_model
    predict = model if wrapper != "SiglipModel" else tower  # SiglipModel's forward wants text too
    with torch.no_grad():
        ref, ref_tokens = head(predict(pixel_values=images)), tower(images).last_hidden_state
        tr.apply(model, "topk(keep=1.0, locs=(1,))")
        assert torch.equal(tower(images).last_hidden_state, ref_tokens)
        tr.apply(model, "tome(r=8)")
        out = tower(images)
    info = tr.get_info(model)
    assert info.host.num_prefix == 0 and not info.host.has_class_token
    assert out.last_hidden_state.shape[1] == info.tokens_per_block[-1] == 32 == info.sizes.shape[1]
    assert torch.equal(info.sizes.sum(1), torch.full((3,), 64.0))
    with pytest.raises(tr.UnsupportedModelError, match=r"^topk scores tokens by class-token attention but "
                       f"{wrapper} has no class token; give it score='shift' or score='received'"):
        tr.apply(model, "topk(score='cls')")
    tr.remove(model)
    with torch.no_grad():
        assert torch.equal(head(predict(pixel_values=images)), ref)


@pytest.mark.slow
@pytest.mark.parametrize("spec_", ["topk(keep=0.5, locs=(1, 2), score='received')", "tome(r=8)"])
def test_siglip_compiles_as_one_graph(spec_, images):
    """The class-token-free tower, attention-pool head included, traces as one graph (fullgraph=True)."""
    torch._dynamo.reset()
    model = tr.apply(make("siglip"), spec_)
    with torch.no_grad():
        want = model(images).pooler_output
        got = torch.compile(model, fullgraph=True, dynamic=False, backend="eager")(images).pooler_output
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def siglip2(images: torch.Tensor) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """A tiny Siglip2VisionModel and its inputs for ``images``: patchified as its processor does
    (``hosts.feed``, checked against the processor in tests/test_siglip2.py), one 8x8 grid, no padding."""
    torch.manual_seed(0)
    cfg = transformers.Siglip2VisionConfig(patch_size=4, hidden_size=64, num_hidden_layers=4, num_attention_heads=2,
                                           num_patches=64, intermediate_size=256)
    model = transformers.Siglip2VisionModel(cfg).eval()
    return model, hosts.feed(model, images).kwargs


@pytest.mark.skipif(not hasattr(transformers, "Siglip2VisionModel"), reason="this transformers has no SigLIP 2")
@pytest.mark.parametrize("method", METHODS)
def test_siglip2_every_method_exact_at_zero_reduction_and_removed(method, images):
    model, inputs = siglip2(images)
    with torch.no_grad():
        ref = model(**inputs)
        tr.apply(model, spec(method, "zero"))
        out = model(**inputs)
        assert torch.equal(out.pooler_output, ref.pooler_output)
        assert torch.equal(out.last_hidden_state, ref.last_hidden_state)
        tr.apply(model, spec(method, "example"))
        with supplied(model):
            reduced = model(**inputs)
        assert reduced.last_hidden_state.shape[1] == tr.get_info(model).tokens_per_block[-1]
        tr.remove(model)
        assert torch.equal(model(**inputs).pooler_output, ref.pooler_output)
    assert tr.get_method(method).stage_only or not torch.allclose(reduced.pooler_output, ref.pooler_output)


@pytest.mark.skipif(not hasattr(transformers, "Siglip2VisionModel"), reason="this transformers has no SigLIP 2")
def test_siglip2_refuses_padding_and_mixed_grids(images):
    model, inputs = siglip2(images)
    tr.apply(model, "tome(r=4)")
    padded = {**inputs, "pixel_attention_mask": inputs["pixel_attention_mask"].clone()}
    padded["pixel_attention_mask"][0, -4:] = 0
    with pytest.raises(tr.TokenReduceError, match="one patch grid and no padding"):
        model(**padded)
    with pytest.raises(tr.TokenReduceError, match="one patch grid and no padding"):
        model(**{**inputs, "spatial_shapes": torch.tensor([[8, 8], [8, 8], [4, 16]])})


def test_unsupported_transformers_classes_are_refused_by_name():
    with pytest.raises(tr.UnsupportedModelError, match="does not patch transformers' ViTForMaskedImageModeling; "
                       "supported: .*CLIPModel.*ViTForImageClassification"):
        tr.apply(transformers.ViTForMaskedImageModeling(transformers.ViTConfig(**VIT, encoder_stride=4)), "tome(r=4)")
    bert = transformers.BertModel(transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                          intermediate_size=64, vocab_size=50))
    with pytest.raises(tr.UnsupportedModelError, match="BertModel"):
        tr.apply(bert, "tome(r=4)")
    with pytest.raises(tr.UnsupportedModelError, match="timm VisionTransformer models .* and transformers ViT"):
        tr.apply(torch.nn.Linear(2, 2), "tome(r=4)")
    other_layout = make("dinov2")
    del other_layout.dinov2.encoder.layer[1].layer_scale1  # as if another transformers version
    with pytest.raises(tr.UnsupportedModelError, match="has no layer_scale1 in layer 1: transformers .* >= 5"):
        tr.apply(other_layout, "tome(r=4)")


def test_a_method_declared_for_other_hosts_is_refused_with_the_reason(images):
    class TimmOnly(tr.get_method("topk")):
        hosts = frozenset({"timm"})

    reducer = lambda: TimmOnly(TimmOnly.Config(keep=0.5, locs=(1,)))  # noqa: E731
    model = make("vit")
    with pytest.raises(tr.UnsupportedModelError, match="runs on timm models only, and ViTForImageClassification "
                       "is a transformers model"):
        tr.apply(model, reducer())
    assert not hosts.is_patched(model)
    tr.apply(VisionTransformer(**TIMM_TINY).eval(), reducer())  # its own host takes it
    compose = tr.build_reducer("tome(r=2) + llf()")
    assert compose.hosts is None


def test_bad_calls_are_errors_naming_the_problem(images):
    model = tr.apply(make("vit"), "tome(r=4)")
    with pytest.raises(tr.TokenReduceError, match="attention masks"):
        model.vit(images, attention_mask=torch.ones(3, 65))
    with pytest.raises(tr.TokenReduceError, match="output_attentions is not available"):
        model(images, output_attentions=True)
    with pytest.raises(ValueError, match=r"Input image size \(64\*64\) doesn't match model"):  # transformers' own
        model(torch.randn(1, 3, 64, 64))
    with pytest.raises(tr.TokenReduceError, match="not patched"):
        tr.remove(make("clip"))


@pytest.mark.slow
def test_transformers_is_imported_only_for_a_transformers_model():
    code = ("import sys, timm, tokenreduce as tr; m = timm.create_model('vit_tiny_patch16_224', img_size=32, "
            "patch_size=4, depth=2); tr.apply(m, 'tome(r=2)'); tr.get_info(m); tr.remove(m); "
            "print('transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_missing_transformers_names_the_extra(monkeypatch):
    from tokenreduce.adapters.hf_vit import require_transformers
    from tokenreduce.models.hf import build_hf_model

    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    for call in (require_transformers, lambda: build_hf_model("vit-tiny")):
        with pytest.raises(tr.TokenReduceError, match=r"pip install 'tokenreduce\[hf\]'"):
            call()


# ----- cross-host equivalence: the same weights on timm and transformers -----------------------------

TRAINING_FREE = [m for m in METHODS if not tr.get_method(m).learned]
TWINS = {  # timm model, transformers model with the same architecture
    "vit": (lambda: VisionTransformer(**TIMM_TINY), HOSTS["vit"]),
    "deit": (lambda: VisionTransformerDistilled(**TIMM_TINY), HOSTS["deit"]),
}


@pytest.mark.parametrize("direction", ["timm_to_hf", "hf_to_timm"])
@pytest.mark.parametrize("twin", TWINS)
def test_cross_host_equivalence_under_every_training_free_method(twin, direction, images):
    torch.manual_seed(0)
    timm_model, hf_model = (make_model().eval() for make_model in TWINS[twin])
    if direction == "timm_to_hf":
        hf_model.load_state_dict(timm_to_hf(timm_model.state_dict()), strict=True)
    else:
        timm_model.load_state_dict(hf_to_timm(hf_model.state_dict()), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(head(hf_model(images)), timm_model(images), rtol=0, atol=1e-5)
        for method in TRAINING_FREE:
            for model in (timm_model, hf_model):
                tr.apply(model, spec(method, "example"))
            with supplied(hf_model), supplied(timm_model):
                hf_out, timm_out = head(hf_model(images)), timm_model(images)
            assert tr.get_info(hf_model).tokens_per_block == tr.get_info(timm_model).tokens_per_block
            torch.testing.assert_close(hf_out, timm_out, rtol=0, atol=1e-5, msg=method)
    assert set(hf_to_timm(timm_to_hf(timm_model.state_dict()))) == set(timm_model.state_dict())


def test_key_map_refuses_a_part_the_other_host_lacks():
    with pytest.raises(tr.TokenReduceError, match="reg_token"):
        timm_to_hf(VisionTransformer(**TIMM_TINY, reg_tokens=2).state_dict())


# ----- the commands -------------------------------------------------------------------------------


def test_inspect_and_bench_take_a_transformers_config(tmp_path, capsys):
    from tokenreduce.cli import main

    folder = tmp_path / "deit"
    make("deit").save_pretrained(folder)
    assert main(["inspect", "--hf-config", str(folder), "--spec", "tome(r=8)"]) == 0
    printed = capsys.readouterr().out
    assert "4 blocks, dim 64, 2 heads, 64 patches (8x8)" in printed and "2 tokens (cls, dist)" in printed
    assert "58 50 42 34" in printed
    assert main(["inspect", "--hf-config", str(folder), "--pretrained", "--spec", "tome(r=8)"]) == 0
    bench = ["bench", "--hf-config", "dinov2-tiny", "--quick", "--threads", "1"]
    assert main([*bench, "--spec", "evit(keep=0.5, locs=(1, 2))"]) == 0
    assert "dinov2-tiny  32x32" in capsys.readouterr().out
    assert main(["bench", "--hf-config", "nope", "--quick"]) == 2
    assert "built-in: vit-tiny" in capsys.readouterr().err
    masked = tmp_path / "masked"
    masked.mkdir()
    config = json.loads((folder / "config.json").read_text())
    (masked / "config.json").write_text(json.dumps({**config, "architectures": ["DeiTForMaskedImageModeling"]}))
    assert main(["inspect", "--hf-config", str(masked), "--spec", "tome(r=8)"]) == 2
    err = capsys.readouterr().err
    assert "DeiTForMaskedImageModeling: not a class tokenreduce drives" in err and "DeiTModel" in err
    assert main([*bench, "--backend", "onnxruntime"]) == 2
    assert "exports timm models only" in capsys.readouterr().err
