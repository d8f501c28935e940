"""The public host interface (tokenreduce.api over adapters/hosts.py): is_patched, reducer_of, patched,
reapply, capture, and get_info's detached record: after a forward the model holds no tensor of an autograd
graph, and a training loss reads the live record from ``capture``."""

from __future__ import annotations

import copy
import types

import pytest
import torch
from conftest import make_host

import tokenreduce as tr

LEARNED = "dynamicvit(keep=0.5, locs=(1, 2))"  # emits an auxiliary loss ('ratio') in training
TOME = tr.build_reducer("tome(r=4)").spec()  # canonical


def graph_tensors(root: object) -> list[str]:
    """Paths (attribute by attribute) of the tensors reachable from ``root`` that carry an autograd graph."""
    seen, found, stack = set(), [], [(root, "model")]
    while stack:
        obj, path = stack.pop()
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType, types.FunctionType)):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.grad_fn is not None:
                found.append(path)
            continue
        if isinstance(obj, dict):
            items = obj.items()
        elif isinstance(obj, (list, tuple, set, frozenset)):
            items = enumerate(obj)
        elif hasattr(obj, "__dict__"):
            items = vars(obj).items()
        else:
            continue
        stack += [(v, f"{path}.{k}") for k, v in items]
    return found


def test_graph_walk_finds_a_stored_graph():
    holder = types.SimpleNamespace(record={"loss": [torch.ones(2, requires_grad=True) * 2]})
    assert graph_tensors(holder) == ["model.record.loss.0"]


def test_the_model_keeps_no_autograd_graph_after_a_training_forward(images):
    model = tr.apply(make_host("deit"), LEARNED).train()
    model(images).sum().backward()
    assert graph_tensors(model) == []
    info = tr.get_info(model)
    assert info.aux_losses and info.keep_mask is not None  # the record is there, detached
    tensors = [info.sizes, info.index, info.keep_mask, *info.aux_losses.values(), *info.aux_outputs.values()]
    assert all(t.grad_fn is None and not t.requires_grad for t in tensors)
    copy.deepcopy(model)  # nothing to refuse: a copy of a trained-on model needs no workaround


def test_capture_hands_the_live_record_to_the_loss(images):
    model = tr.apply(make_host("deit"), LEARNED).train()
    with tr.capture(model) as seen:
        model(images)
    ratio = seen.last.aux_losses["ratio"]
    assert ratio.grad_fn is not None
    ratio.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in tr.reducer_of(model).parameters())
    assert graph_tensors(model) == []  # the capture held it, not the model
    with tr.capture(make_host("deit")) as none:  # an unpatched model records nothing
        pass
    assert none.last is None


def test_patched_applies_for_the_block_and_always_undoes(images):
    model = make_host("deit")
    with tr.patched(model, "tome(r=4)") as m:
        assert m is model and tr.get_info(model).spec == TOME
    assert not tr.is_patched(model)
    with pytest.raises(RuntimeError, match="boom"), tr.patched(model, "tome(r=4)"):
        raise RuntimeError("boom")
    assert not tr.is_patched(model)
    with tr.patched(model, None):  # None: the unpatched model
        assert not tr.is_patched(model)


def test_patched_gives_a_patched_model_its_own_patch_back():
    model = tr.apply(make_host("deit"), LEARNED, dense=True)
    reducer = tr.reducer_of(model)
    with tr.patched(model, "tome(r=4)"):
        assert tr.reducer_of(model) is not reducer
    assert tr.reducer_of(model) is reducer and tr.get_info(model).dense
    with tr.patched(model, None):
        assert not tr.is_patched(model)
    assert tr.reducer_of(model) is reducer


def test_reapply_changes_one_option_and_keeps_the_reducer():
    model = tr.apply(make_host("deit"), LEARNED, trace=True)
    reducer = tr.reducer_of(model)
    tr.reapply(model, dense=True)
    info = tr.get_info(model)
    assert tr.reducer_of(model) is reducer and info.dense and info.trace
    tr.reapply(model, "tome(r=4)")
    assert tr.get_info(model).spec == TOME and tr.get_info(model).dense


def test_the_interface_refuses_an_unpatched_model():
    model = make_host("deit")
    assert not tr.is_patched(model) and tr.find_info(model) is None
    for call in (tr.reducer_of, tr.get_info, tr.reapply):
        with pytest.raises(tr.TokenReduceError, match="not patched"):
            call(model)
