"""timm's other ways into a patched model run the reduction or refuse, never the unreduced blocks:
``forward_intermediates``, ``get_intermediate_layers``, a features_only ``FeatureGetterNet`` and
``torch.jit.script``; and a patched model survives pickle / ``torch.save(model)`` / deepcopy.

The reference for an intermediate after block i is independent of ``forward_intermediates``: the
same model patched with the same spec, then cut after block i (no final norm): its
``forward_features`` returns the tokens leaving block i (one per position with ``dense=True``).
"""

from __future__ import annotations

import copy
import io
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch
from conftest import TINY, make_host

import tokenreduce as tr
from tokenreduce.api import find_info
from tokenreduce.core.errors import TokenReduceError, UnsupportedModelError

SPECS = ["tome(r=8)", "topk(keep=0.5, locs=(1, 2))"]  # a merge and a pruning
HOSTS = ["deit", "distilled", "registers"]  # 1, 2 and 5 prefix tokens


def tokens_after(model: torch.nn.Module, spec: str, block: int, x: torch.Tensor, dense: bool) -> torch.Tensor:
    """(B, N, C): the tokens leaving ``block`` of ``model`` patched with ``spec``, by its forward_features."""
    cut = tr.apply(copy.deepcopy(model), spec, dense=dense)  # the schedule of the whole model
    cut.blocks = cut.blocks[: block + 1]
    cut.norm = torch.nn.Identity()
    with torch.no_grad():
        return cut.forward_features(x)


def as_grid(t: torch.Tensor, p: int) -> torch.Tensor:
    """(B, p + N0, C) dense tokens -> (B, C, 8, 8) patch grid of the tiny hosts."""
    return t[:, p:].reshape(t.shape[0], 8, 8, -1).permute(0, 3, 1, 2)


@pytest.mark.parametrize("host", HOSTS)
@pytest.mark.parametrize("spec", SPECS)
def test_forward_intermediates_runs_the_reduced_forward(spec, host, images):
    model = make_host(host)
    ref = copy.deepcopy(model)
    p = model.num_prefix_tokens
    tr.apply(model, spec)
    with torch.no_grad():
        final, tokens = model.forward_intermediates(images, indices=[0, 1, 3], output_fmt="NLC",
                                                    return_prefix_tokens=True)
        grids = model.forward_intermediates(images, indices=2, intermediates_only=True)  # NCHW: the last 2
        torch.testing.assert_close(final, model.forward_features(images), rtol=0, atol=0)
    counts = tr.get_info(model).tokens_per_block
    assert counts == tr.get_info(model).schedule.tokens_per_block(p) and counts[-1] < 64 + p
    for (patches, prefix), block in zip(tokens, [0, 1, 3], strict=True):
        want = tokens_after(ref, spec, block, images, dense=False)  # (B, N_block, C), reduced
        assert patches.shape == (3, counts[block] - p, 64)
        torch.testing.assert_close(patches, want[:, p:], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(prefix, want[:, :p], rtol=1e-5, atol=1e-5)
    for grid, block in zip(grids, [2, 3], strict=True):
        assert grid.shape == (3, 64, 8, 8)
        torch.testing.assert_close(grid, as_grid(tokens_after(ref, spec, block, images, dense=True), p),
                                   rtol=1e-5, atol=1e-5)


def test_get_intermediate_layers_is_reduced_too(images):
    model = tr.apply(make_host("deit"), "tome(r=8)")
    with torch.no_grad():
        flat = model.get_intermediate_layers(images, n=2, norm=True)
        grid = model.get_intermediate_layers(images, n=[3], reshape=True)
        tokens = model.forward_features(images)  # the final norm applied
    assert [t.shape[1] for t in flat] == [41 - 1, 33 - 1]
    torch.testing.assert_close(flat[-1], tokens[:, 1:], rtol=0, atol=0)
    with torch.no_grad():
        normed = model.get_intermediate_layers(images, n=[3], reshape=True, norm=True)[0]
        dense = tr.apply(model, "tome(r=8)", dense=True).forward_features(images)  # normed too
    assert grid[0].shape == (3, 64, 8, 8) and not torch.allclose(grid[0], normed)
    torch.testing.assert_close(normed, as_grid(dense, 1), rtol=0, atol=0)


def test_forward_intermediates_with_dense_and_stop_early(images):
    model = tr.apply(make_host("deit"), "topk(keep=0.5, locs=(1, 2))", dense=True)
    with torch.no_grad():
        out = model.forward_intermediates(images, indices=[1], output_fmt="NLC", stop_early=True,
                                          intermediates_only=True)
    assert out[0].shape == (3, 64, 64)  # dense: one token per patch position
    assert tr.get_info(model).tokens_per_block == [65, 33]  # stopped after block 1
    with pytest.raises(TokenReduceError, match="output_fmt"):
        model.forward_intermediates(images, output_fmt="NHWC")


def features_only() -> torch.nn.Module:
    torch.manual_seed(0)
    kwargs = {k: v for k, v in TINY.items() if k != "num_classes"}
    return timm.create_model("vit_tiny_patch16_224", features_only=True, out_indices=(1, 3), **kwargs).eval()


def test_features_only_is_refused_at_apply_and_reduced_through_its_model(images):
    net = features_only()
    with pytest.raises(UnsupportedModelError, match=r"features_only.*\.model"):
        tr.apply(net, "tome(r=8)")
    with torch.no_grad():
        plain = net(images)
        tr.apply(net.model, "tome(r=8)")
        maps = net(images)
    ref = features_only().model  # same weights: same seed
    for got, unreduced, block in zip(maps, plain, (1, 3), strict=True):
        want = as_grid(tokens_after(ref, "tome(r=8)", block, images, dense=True), 1)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(got, unreduced, atol=1e-3)
    assert tr.get_info(net.model).tokens_per_block == [57, 49, 41, 33]


def test_torch_jit_script_of_a_patched_model_raises_ours():
    model = tr.apply(make_host("deit"), "tome(r=8)")
    with pytest.raises(UnsupportedModelError, match=r"torch\.jit\.script.*tome\(r=8.*unreduced"):
        torch.jit.script(model)
    net = features_only()
    tr.apply(net.model, "topk(keep=0.5, locs=(1,))")
    with pytest.raises(UnsupportedModelError, match=r"torch\.jit\.script.*topk"):
        torch.jit.script(net)  # the wrapper scripts its model too
    tr.remove(model)
    assert isinstance(torch.jit.script(model), torch.jit.ScriptModule)  # the unpatched model scripts


PICKLED = ["tome(r=8)", "dynamicvit(keep=0.5, locs=(1, 2))", "imagepiece(locs=(0, 1), merge=0.1, keep=0.7) + tome(r=4)"]

LOAD = """
import sys, torch, tokenreduce as tr
for path in sys.argv[1:]:
    saved = torch.load(path, weights_only=False)
    model, x, want, spec = saved["model"], saved["x"], saved["want"], saved["spec"]
    assert tr.get_info(model).spec == spec, (tr.get_info(model).spec, spec)
    with torch.no_grad():
        assert torch.equal(model(x), want), path
    assert tr.get_info(model).tokens_per_block == saved["counts"], path
print("ok", len(sys.argv) - 1)
"""


@pytest.mark.slow
def test_torch_save_of_a_patched_model_loads_in_a_fresh_process(tmp_path, images):
    paths = []
    for i, spec in enumerate(PICKLED):
        model = tr.apply(make_host("deit"), spec).eval()
        with torch.no_grad():
            want = model(images)
        path = tmp_path / f"model{i}.pt"
        torch.save({"model": model, "x": images, "want": want, "spec": tr.get_info(model).spec,
                    "counts": tr.get_info(model).tokens_per_block}, path)
        paths.append(str(path))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(tr.__file__).parents[1]),
                                                         os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", LOAD, *paths], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["ok", str(len(PICKLED))]


def test_pickle_and_deepcopy_keep_the_patch(images):
    model = tr.apply(make_host("deit"), "dynamicvit(keep=0.5, locs=(1, 2))").eval()
    with torch.no_grad():
        want = model(images)
    model.train()(images).sum().backward()  # the last forward's record now holds tensors of a training graph
    model.eval()
    for other in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        assert other.forward_features.args[0] is other  # bound to the copy, not to the original
        with torch.no_grad():
            assert torch.equal(other(images), want)
        assert tr.get_info(other).tokens_per_block == [65, 33, 17, 17]
        tr.remove(other)
        assert find_info(other) is None and tr.get_info(model).spec  # the original stays patched
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)  # the state_dict route is unchanged
    assert any(k.startswith("tokenreduce.") for k in torch.load(io.BytesIO(buf.getvalue())))
