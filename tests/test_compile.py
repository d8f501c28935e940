"""torch.compile: every fixed-schedule, training-free method traces as ONE graph (fullgraph=True: no
graph break) and the compiled model matches the eager one.

Which methods: every registered one that declares itself neither ``learned`` nor
``dynamic_schedule`` (core/method.py), at its ``example`` spec on a tiny ViT; no method is named.
The fast test compiles with dynamo's 'eager' backend: the capture is what fullgraph checks and
takes about a second; the slow one (``-m slow``) also generates code with inductor, about 20 to
100 s per method on 2 CPU cores.

At several resolutions (torch.compile's default, automatic dynamic shapes), every graph is static: the
input's size, the grid and the schedule bound to it are constants of the graph (a recompile per
resolution), never symbols that a reducer's per-block arithmetic nests until tracing never ends.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from conftest import make_host, supplied
from timm.models.vision_transformer import VisionTransformer

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


def resolution_host(kind: str) -> tuple[torch.nn.Module, dict[str, bool]]:
    """A tiny host that runs any resolution, and the keywords its forward takes for it."""
    torch.manual_seed(0)
    size = dict(image_size=32, patch_size=4, hidden_size=32, num_hidden_layers=3, num_attention_heads=2)
    if kind == "timm":
        return VisionTransformer(img_size=32, patch_size=4, embed_dim=32, depth=3, num_heads=2, num_classes=10,
                                 dynamic_img_size=True).eval(), {}
    if kind == "vit":
        config = transformers.ViTConfig(**size, intermediate_size=64, num_labels=10)
        return transformers.ViTForImageClassification(config).eval(), {"interpolate_pos_encoding": True}
    return transformers.Dinov2Model(transformers.Dinov2Config(**size)).eval(), {}  # DINOv2 runs any size


def tensor_out(out) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else out[0]


def symbolic_sizes(gm: torch.fx.GraphModule) -> list[str]:
    """Nodes of ``gm`` whose value or size is a symbol no guard has pinned to a number."""
    out = []
    for node in gm.graph.nodes:
        value = node.meta.get("example_value")
        sizes = [value] if isinstance(value, torch.SymInt) else list(getattr(value, "shape", ()))
        for d in sizes:
            if isinstance(d, torch.SymInt) and not d.node.shape_env.replace(d.node.expr).is_number:
                out.append(f"{node.name}: {d.node.expr}")
    return out


def runs_attention(gm: torch.fx.GraphModule) -> bool:
    return any(node.target in (torch.bmm, torch.nn.functional.scaled_dot_product_attention) for node in gm.graph.nodes)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["timm", "vit", "dinov2"])
def test_each_resolution_compiles_the_blocks_to_static_graphs(kind: str):
    """ToMe on a transformers ViT compiled at a second resolution traced for over 20 minutes (the
    grid and the schedule's counts had become symbols, nested per block by the merge sizes). Each size now
    compiles the blocks as the first one did: no graph that runs attention holds a symbolic size (what
    follows the blocks, a norm and a head, may), and the outputs are the eager ones."""
    torch._dynamo.reset()
    model, kw = resolution_host(kind)
    tr.apply(model, "tome(r=2)")
    graphs = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(model, backend=backend)  # dynamic=None: sizes that change become symbols
    for size in (32, 48, 64, 32):
        x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(size))
        with torch.no_grad():
            got = tensor_out(compiled(x, **kw))  # first: the compiled forward binds the new grid
            want = tensor_out(model(x, **kw))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert tr.get_info(model).tokens_per_block == [size * size // 16 + 1 - 2 * (i + 1) for i in range(3)]
    blocks = [gm for gm in graphs if runs_attention(gm)]
    assert 3 <= len(blocks) <= 4  # one per resolution, and one more where 32 comes back after a re-bind
    symbolic = [s for gm in blocks for s in symbolic_sizes(gm)]
    assert not symbolic, f"symbolic sizes in a compiled graph of the blocks: {symbolic[:5]}"
