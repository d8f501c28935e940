"""The contract every registered method keeps, on every host of the matrix.

Parametrised over list_methods(), so a newly registered method is covered automatically; each
method supplies ``zero`` (reduces nothing) and ``example`` (reduces on a 4-block model).
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import HOSTS, make_host

import tokenreduce as tr

METHODS = tr.list_methods()


def spec_of(name: str, params: dict) -> str:
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in params.items())})"


def supported(method: str, host: str) -> bool:
    return not (tr.get_method(method).needs_class_token and host == "avgpool")


CASES = [(m, h) for m in METHODS for h in HOSTS if supported(m, h)]


@pytest.mark.parametrize("method,host", CASES)
def test_identity_at_zero_reduction(method, host, images):
    model = make_host(host)
    with torch.no_grad():
        ref = model(images)
        tr.apply(model, spec_of(method, tr.get_method(method).zero))
        out = model(images)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert tr.get_info(model).tokens_per_block == [65 + model.num_prefix_tokens - 1] * 4


@pytest.mark.parametrize("method,host", CASES)
def test_round_trip_restores_the_model(method, host, images):
    model = make_host(host)
    keys = set(model.state_dict())
    with torch.no_grad():
        ref = model(images)
        tr.apply(model, spec_of(method, tr.get_method(method).example))
        reduced = model(images)
        tr.remove(model)
        back = model(images)
    assert "forward_features" not in vars(model)
    assert set(model.state_dict()) == keys
    torch.testing.assert_close(back, ref, rtol=0, atol=0)
    assert not torch.allclose(reduced, ref), "the example spec must actually change the computation"


@pytest.mark.parametrize("method,host", CASES)
def test_schedule_counts_prefix_and_sizes(method, host, images):
    model = make_host(host)
    tr.apply(model, spec_of(method, tr.get_method(method).example), trace=True)
    with torch.no_grad():
        out = model(images)
    info = tr.get_info(model)
    p = model.num_prefix_tokens
    assert info.tokens_per_block == info.schedule.tokens_per_block(p)
    assert info.tokens_per_block[-1] < 64 + p
    assert torch.isfinite(out).all()
    # prefix tokens are never reduced and stay first
    assert torch.equal(info.index[:, :p], torch.arange(p).expand(3, p))
    for block, source in info.snapshots.items():
        assert source.shape[1] == info.tokens_per_block[block]
        assert (source.sum(1) <= 1).all(), "an original token belongs to at most one token"
    final = info.snapshots[max(info.snapshots)]
    torch.testing.assert_close(info.sizes, final.sum(-1))
    if tr.get_method(method).Config.__name__ in ("ToMeConfig", "EViTConfig"):  # nothing is dropped
        torch.testing.assert_close(info.sizes[:, p:].sum(1), torch.full((3,), 64.0))


@pytest.mark.parametrize("method", METHODS)
def test_batch_invariance(method, images):
    model = tr.apply(make_host("deit"), spec_of(method, tr.get_method(method).example))
    with torch.no_grad():
        full = model(images)
        single = torch.cat([model(images[i : i + 1]) for i in range(len(images))])
    torch.testing.assert_close(full, single, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("method", METHODS)
def test_gradients_reach_every_parameter(method, images):
    model = tr.apply(make_host("layerscale").train(), spec_of(method, tr.get_method(method).example))
    loss = model(images).logsumexp(-1).mean() + sum(tr.get_info(model).aux_losses.values(), torch.tensor(0.0))
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, f"no gradient for {missing}"
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("method", METHODS)
def test_reapply_replaces_and_copies_are_independent(method, images):
    model = make_host("deit")
    tr.apply(model, "tome(r=4)")
    tr.apply(model, spec_of(method, tr.get_method(method).example))
    assert tr.get_info(model).spec.startswith(method)
    twin = copy.deepcopy(model)
    tr.remove(twin)
    assert tr.get_info(model).spec.startswith(method)
