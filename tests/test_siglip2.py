"""SigLIP 2's tower (transformers' Siglip2VisionModel) through what feeds images to a model: its images
patchified as its own processor does it (``hosts.feed``), bench and inspect on the built-in tiny config,
MACs, and torch.compile as one graph. Tiny random-init configs, no hub; skipped without a transformers
that has SigLIP 2."""

from __future__ import annotations

import pytest
import torch
from conftest import make_host

import tokenreduce as tr
from tokenreduce.adapters import hosts
from tokenreduce.bench import count_macs, flop_counter_macs
from tokenreduce.cli import main

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Siglip2VisionModel"):
    pytest.skip("this transformers has no SigLIP 2", allow_module_level=True)

from transformers.models.siglip2.image_processing_siglip2 import convert_image_to_patches  # noqa: E402

from tokenreduce.models.hf import build_hf_model  # noqa: E402

#: the specs the other transformers hosts are compiled with (tests/test_hf_host.py)
COMPILED = ["topk(keep=0.5, locs=(1, 2), score='received')", "tome(r=8)"]


def tower(seed: int = 0) -> torch.nn.Module:
    """The built-in siglip2-tiny: patch 4, an 8x8 position-embedding grid, 4 layers of width 64."""
    torch.manual_seed(seed)
    return build_hf_model("siglip2-tiny")


def pictures(h: int = 32, w: int = 24, batch: int = 3) -> torch.Tensor:
    return torch.randn(batch, 3, h, w, generator=torch.Generator().manual_seed(1))


def test_feed_patchifies_as_the_image_processor():
    images = pictures()  # 8x6 patches: a grid other than the embeddings' own 8x8
    fed = hosts.feed(tower(), images)
    assert fed.args == ()
    want = torch.stack([convert_image_to_patches(image, 4) for image in images])
    assert torch.equal(fed.kwargs["pixel_values"], want)
    assert fed.kwargs["spatial_shapes"].tolist() == [[8, 6]] * 3
    assert fed.kwargs["pixel_attention_mask"].shape == (3, 48) and bool(fed.kwargs["pixel_attention_mask"].all())
    for other in (make_host("siglip"), transformers.SiglipVisionModel(transformers.SiglipVisionConfig(
            image_size=32, patch_size=4, hidden_size=64, num_hidden_layers=1, num_attention_heads=2))):
        assert hosts.feed(other, images).args[0] is images  # every other host takes the images themselves


def test_feed_refuses_images_off_the_patch_size():
    with pytest.raises(tr.TokenReduceError, match=r"multiples of its patch size 4; got \(3, 3, 30, 32\)"):
        hosts.feed(tower(), pictures(30, 32))


def test_zero_reduction_equals_the_unpatched_tower_on_fed_images():
    model, images = tower(), pictures()
    fed = hosts.feed(model, images)
    with torch.no_grad():
        ref = fed(model)
        for spec in ("tome(r=0)", "topk(keep=1.0, locs=(1, 2), score='received')"):
            tr.apply(model, spec)
            out = fed(model)
            assert torch.equal(out.last_hidden_state, ref.last_hidden_state), spec
            assert torch.equal(out.pooler_output, ref.pooler_output), spec
        assert tr.get_info(model).host.grid == (8, 6)
        tr.remove(model)
        assert torch.equal(fed(model).pooler_output, ref.pooler_output)


def test_macs_count_the_linear_patch_stem():
    """The stem is a Linear on patchified images; the flop counter also sees the position-embedding resize
    (N x G x D, bench/macs.py), which the analytic count leaves out."""
    model = tower()
    report = count_macs(model)
    assert report.stem == 64 * 48 * 64
    assert flop_counter_macs(model) - report.total == 64 * 64 * 64
    tr.apply(model, "tome(r=8)")
    assert count_macs(model).tokens_per_block == [56, 48, 40, 32]


@pytest.mark.slow
@pytest.mark.parametrize("spec", COMPILED)
def test_compiles_as_one_graph(spec):
    """fullgraph: the grid comes from the static token count (the bound grid, else the square one); the
    values of spatial_shapes and the mask are checked in the graph as it runs."""
    torch._dynamo.reset()
    model = tr.apply(tower(), spec)
    fed = hosts.feed(model, pictures(32, 32))
    compiled = torch.compile(model, fullgraph=True, dynamic=False, backend="eager")
    with torch.no_grad():
        want = fed(model).pooler_output
        torch.testing.assert_close(fed(compiled).pooler_output, want, rtol=1e-5, atol=1e-5)
        padded = {**fed.kwargs, "pixel_attention_mask": fed.kwargs["pixel_attention_mask"].clone()}
        padded["pixel_attention_mask"][0, -1] = 0
        with pytest.raises(RuntimeError, match="one patch grid and no padding.*traced for 8x8 patches"):
            compiled(**padded)


@pytest.mark.slow
def test_compile_takes_the_grid_of_an_eager_forward_and_refuses_one_it_cannot_tell():
    torch._dynamo.reset()
    model = tr.apply(tower(), "tome(r=4)")
    fed = hosts.feed(model, pictures(32, 24))  # 48 patches: no square, not the bound 8x8
    compiled = torch.compile(model, fullgraph=True, dynamic=False, backend="eager")
    with torch.no_grad():
        # dynamo carries the refusal it met while tracing (fullgraph: no eager fallback)
        with pytest.raises(torch._dynamo.exc.Unsupported, match="48 patches are no square and not the 8x8 grid the "
                           "reducer is bound to: run the patched model once eagerly on an input of this grid"):
            fed(compiled)
        torch._dynamo.reset()
        want = fed(model).pooler_output  # binds the reducer to 8x6
        torch.testing.assert_close(fed(compiled).pooler_output, want, rtol=1e-5, atol=1e-5)


def test_inspect_and_bench_take_the_builtin_siglip2(capsys):
    assert main(["inspect", "--hf-config", "siglip2-tiny", "--spec", "tome(r=8)"]) == 0
    printed = capsys.readouterr().out
    assert "4 blocks, dim 64, 2 heads, 64 patches (8x8)" in printed and "0 tokens (none)" in printed
    assert "56 48 40 32" in printed and "stem 0.197 M" in printed
    bench = ["bench", "--hf-config", "siglip2-tiny", "--quick", "--threads", "1", "--repeats", "1"]
    assert main([*bench, "--spec", "tome(r=8)"]) == 0
    printed = capsys.readouterr().out
    assert "siglip2-tiny  32x32" in printed and "tome(r=8): 56 48 40 32" in printed
    assert main([*bench, "--img-size", "48"]) == 2
    assert "--img-size: a Siglip2VisionConfig has no image size" in capsys.readouterr().err
