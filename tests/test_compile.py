"""torch.compile: every fixed-schedule, training-free method traces as ONE graph (fullgraph=True: no
graph break) and the compiled model matches the eager one.

Which methods: every registered one that declares itself neither ``learned`` nor
``dynamic_schedule`` (core/method.py), at its ``example`` spec on a tiny ViT; no method is named.
The fast test compiles with dynamo's 'eager' backend: the capture is what fullgraph checks and
takes about a second; the slow one (``-m slow``) also generates code with inductor, about 20 to
100 s per method on 2 CPU cores.
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_host, supplied

import tokenreduce as tr
from tokenreduce.core.method import format_spec


def fixed_schedule_training_free() -> list[str]:
    out = []
    for name in tr.list_methods():
        cls = tr.get_method(name)
        reducer = tr.build_reducer(format_spec(name, cls.example))
        if not reducer.learned and not reducer.dynamic_schedule:
            out.append(name)
    return out


METHODS = fixed_schedule_training_free()


def compiled_and_eager(name: str, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    torch._dynamo.reset()
    model = tr.apply(make_host("deit"), format_spec(name, tr.get_method(name).example))
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), supplied(model):
        want = model(images)
        got = torch.compile(model, fullgraph=True, dynamic=False, backend=backend)(images)
    return got, want


def test_the_set_is_chosen_by_declaration():
    assert METHODS, "no fixed-schedule training-free method is registered"
    for name in tr.list_methods():
        reducer = tr.build_reducer(format_spec(name, tr.get_method(name).example))
        assert (name in METHODS) == (not reducer.learned and not reducer.dynamic_schedule)


@pytest.mark.parametrize("name", METHODS)
def test_one_graph_and_the_eager_outputs(name: str):
    got, want = compiled_and_eager(name, "eager")  # raises on any graph break (fullgraph=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", METHODS)
def test_inductor_matches_eager(name: str):
    got, want = compiled_and_eager(name, "inductor")
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
