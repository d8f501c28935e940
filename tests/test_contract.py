"""The contract every registered method keeps, on every host of the matrix.

Parametrised over list_methods(), so a newly registered method is covered automatically; each
method supplies ``zero`` (reduces nothing) and ``example`` (reduces on a 4-block model), and a
method that needs inputs from outside the model (the oracle's priority) supplies them for a forward
through its ``example_inputs()`` hook (conftest ``supplied``). What a
method declares about itself (``learned``, ``conserves_patches``, ``where``, ``scoring_macs``,
``budget_family``) is held to what it does; no test here knows a method by name.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from conftest import CLASS_TOKEN_FREE, DEVICES, HOSTS, make_host, supplied

import tokenreduce as tr
from tokenreduce.adapters.timm_vit import check_host
from tokenreduce.bench import count_macs, flop_counter_macs
from tokenreduce.core.method import NEED_MACS, NEEDS, AttnInfo, format_spec
from tokenreduce.core.scores import ScoredPruner

METHODS = tr.list_methods()


def spec_of(name: str, params: dict) -> str:
    return format_spec(name, params)


def supported(method: str, host: str) -> bool:
    return not (tr.get_method(method).needs_class_token and host in CLASS_TOKEN_FREE)


CASES = [(m, h) for m in METHODS for h in HOSTS if supported(m, h)]


def class_token_specs() -> list[str]:
    """Specs that need a class token: the example of a method that always does, and of a pruner that takes
    a score (core/scores.py), with the class token's ('cls')."""
    out = []
    for m in METHODS:
        cls = tr.get_method(m)
        scored = issubclass(cls, ScoredPruner)
        if cls.needs_class_token or scored:
            out.append(spec_of(m, {**cls.example, **({"score": "cls"} if scored else {})}))
    return out


@pytest.mark.parametrize("host", sorted(CLASS_TOKEN_FREE))
@pytest.mark.parametrize("spec", class_token_specs())
def test_a_class_token_spec_on_a_host_without_one_is_refused_in_one_line(spec, host):
    """Every registered method runs on every host of the matrix (CASES), or, asked for what needs a class
    token the host lacks, is refused at apply with one line naming the method, the model and what to use."""
    model = make_host(host)
    with pytest.raises(tr.UnsupportedModelError) as e:
        tr.apply(model, spec)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"{tr.parse_spec(spec)[0]} scores tokens by class-token")
    assert "VisionTransformer has no class token; " in message and ("score='shift'" in message or "use " in message)
    assert not tr.is_patched(model)


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
        with supplied(model):
            reduced = model(images)
        tr.remove(model)
        back = model(images)
    assert "forward_features" not in vars(model)
    assert set(model.state_dict()) == keys
    torch.testing.assert_close(back, ref, rtol=0, atol=0)
    if tr.get_method(method).stage_only:  # alone the identity; as a stage: tests/test_compose.py
        torch.testing.assert_close(reduced, ref, rtol=1e-5, atol=1e-5)
        return
    assert not torch.allclose(reduced, ref), "the example spec must actually change the computation"


@pytest.mark.parametrize("method,host", CASES)
def test_schedule_counts_prefix_and_sizes(method, host, images):
    model = make_host(host)
    tr.apply(model, spec_of(method, tr.get_method(method).example), trace=True)
    with torch.no_grad(), supplied(model):
        out = model(images)
    info = tr.get_info(model)
    p = model.num_prefix_tokens
    assert info.tokens_per_block == info.schedule.tokens_per_block(p)
    assert info.schedule.where == tr.build_reducer(info.spec).where, "where has one declaration: Reducer.where"
    assert torch.isfinite(out).all()
    if not info.schedule.locs or tr.get_method(method).stage_only:  # every token stays in place
        assert info.tokens_per_block == [64 + p] * 4 and not info.snapshots
        assert torch.equal(info.index, torch.arange(64 + p).expand(3, -1))
        return
    assert info.tokens_per_block[-1] < 64 + p
    # prefix tokens are never reduced and stay first
    assert torch.equal(info.index[:, :p], torch.arange(p).expand(3, p))
    for block, source in info.snapshots.items():
        assert source.shape[1] == info.tokens_per_block[block]
        assert (source.sum(1) <= 1).all(), "an original token belongs to at most one token"
    final = info.snapshots[max(info.snapshots)]
    torch.testing.assert_close(info.sizes, final.sum(-1))
    if tr.build_reducer(info.spec).conserves_patches:  # merged or fused, never dropped
        torch.testing.assert_close(info.sizes[:, p:].sum(1), torch.full((3,), 64.0))


@pytest.mark.parametrize("method", METHODS)
def test_batch_invariance(method, images):
    model = tr.apply(make_host("deit"), spec_of(method, tr.get_method(method).example))
    with torch.no_grad(), supplied(model):
        full = model(images)
        single = torch.cat([model(images[i : i + 1]) for i in range(len(images))])
    torch.testing.assert_close(full, single, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("method", METHODS)
def test_gradients_reach_every_parameter(method, images):
    model = tr.apply(make_host("layerscale").train(), spec_of(method, tr.get_method(method).example))
    with supplied(model), tr.capture(model) as seen:  # the live record: auxiliary outputs keep their graph
        out = model(images)
    loss = out.logsumexp(-1).mean() + sum(seen.last.aux_losses.values(), torch.tensor(0.0))
    # auxiliary predictions (a task scores them; any differentiable function of them reaches their heads)
    loss = loss + sum((o.logsumexp(-1).mean() for o in seen.last.aux_outputs.values()), torch.tensor(0.0))
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


# ----------------------------------------------------------------------------- declarations


@pytest.mark.parametrize("method", METHODS)
def test_what_a_method_asks_of_the_attention_is_priced_and_delivered(method):
    """The method's own declarations (``needs``, per block ``needs_at`` and ``observes`` on a tiny host)
    name only side products that have a price (``NEED_MACS``) and a field the adapter fills (AttnInfo)."""
    delivered = {f.name for f in dataclasses.fields(AttnInfo)}
    reducer = tr.build_reducer(format_spec(method, tr.get_method(method).example))
    reducer.bind(check_host(make_host("deit")))
    asked = set(reducer.needs).union(*(reducer.needs_at(b) | reducer.observes(b) for b in range(4)))
    assert asked <= set(NEED_MACS) and asked <= delivered, asked - (set(NEED_MACS) & delivered)
    assert NEEDS == set(NEED_MACS) == delivered  # one table: NEEDS is read off NEED_MACS


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("which", ["example", "zero"])
def test_the_canonical_spec_rebuilds_the_same_reducer(method, which):
    """format_spec -> build_reducer -> spec() -> build_reducer: the spec a checkpoint records rebuilds
    the configuration that wrote it, with the parameters given."""
    params = getattr(tr.get_method(method), which)
    first = tr.build_reducer(format_spec(method, params))
    assert {k: getattr(first.cfg, k) for k in params} == params
    again = tr.build_reducer(first.spec())
    assert again.cfg == first.cfg and again.spec() == first.spec()
    assert format_spec(method, {}) == method and tr.parse_spec(method) == (method, {})
    with pytest.raises(tr.SpecError, match="identifier"):
        format_spec(f"{method}(x=1)", {})


@pytest.mark.parametrize("method", METHODS)
def test_learned_is_declared_truthfully(method):
    """``learned`` (read by bench to leave a method out of training-free budgets) holds exactly when the
    method, bound to a model, has trainable parameters of its own."""
    cls = tr.get_method(method)
    assert isinstance(cls.learned, bool)
    model = tr.apply(make_host("deit"), spec_of(method, cls.example))
    own = [n for n, prm in model.named_parameters() if n.startswith("tokenreduce.") and prm.requires_grad]
    assert bool(own) == cls.learned, own


@pytest.mark.parametrize("host", ["deit", "registers"])
@pytest.mark.parametrize("method", METHODS)
def test_declared_scoring_macs_match_flop_counter(method, host):
    """What a method declares its scoring costs (``scoring_macs``, summed by bench/macs.py) is what its
    forward computes: torch.utils.flop_counter's count of the patched forward minus the analytic count
    of everything but the scoring (exact on unpatched models, tests/test_bench.py), within 1%."""
    cls = tr.get_method(method)
    if not supported(method, host):
        pytest.skip("needs a class token")
    model = tr.apply(make_host(host), spec_of(method, cls.example))
    report = count_macs(model)
    with supplied(model):
        measured = flop_counter_macs(model) - (report.total - report.scoring)
    assert abs(report.scoring - measured) <= 0.01 * measured, (report.scoring, measured)


@pytest.mark.parametrize("method", METHODS)
def test_budget_family_is_valid_and_mildest_first(method):
    """Every member of ``budget_family`` is a spec of the method; the members a model accepts come
    mildest first (their MACs speed-up never falls); a family, if any, reaches a real reduction."""
    cls = tr.get_method(method)
    model = make_host("deit")
    family = cls.budget_family(check_host(model))
    assert isinstance(family, list)
    for spec in family:
        assert tr.parse_spec(spec)[0] == method
    base, ordered = count_macs(model).total, []
    for spec in family:
        try:
            tr.apply(model, spec)
        except tr.TokenReduceError:
            continue
        ordered.append(base / count_macs(model).total)
        tr.remove(model)
    assert ordered == sorted(ordered), "budget_family must list the mildest spec first"
    assert not family or ordered[-1] > 1.0



@pytest.mark.parametrize("amp", ["off", "bf16"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", METHODS)
def test_runs_on_each_device_and_precision(method, device, amp, images):
    """The example on ``device`` under ``--amp``'s autocast: the compiled counts, finite logits near the
    float32 ones; the zero spec equal to the unpatched model run the same way."""
    from tokenreduce.models.precision import autocast

    cls = tr.get_method(method)
    model, x = make_host("deit").to(device), images.to(device)
    with torch.no_grad(), autocast(device, amp):
        ref = model(x)
        tr.apply(model, spec_of(method, cls.zero))
        torch.testing.assert_close(model(x), ref, rtol=1e-2 if amp == "bf16" else 1e-5,
                                   atol=5e-2 if amp == "bf16" else 1e-5)
        tr.remove(model)
        tr.apply(model, spec_of(method, cls.example))
        with supplied(model):
            out = model(x)
    assert out.shape == ref.shape and out.device.type == device and bool(torch.isfinite(out).all())
    info = tr.get_info(model)
    assert info.tokens_per_block == info.schedule.tokens_per_block(info.host.num_prefix)
