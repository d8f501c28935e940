"""ONNX export (bench/export.py, ``tokenreduce export``): eager, compiled and onnxruntime outputs
agree, the graph holds the reduced token counts, and what cannot be exported is refused clearly.

Exporting takes 5 to 15 s per model on 2 busy CPU cores, so the default run exports two methods,
one that merges (its sort-based matching) and one that prunes, plus the trained-checkpoint path;
``-m slow`` exports every exportable registered method (chosen by declaration, no name), with a
dynamic batch and with torch's classic exporter too (where the method declares it can).
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_host

pytest.importorskip("onnxruntime", reason="onnxruntime is not installed: pip install 'tokenreduce[export]'")
pytest.importorskip("onnxscript", reason="onnxscript is not installed: pip install 'tokenreduce[export]'")

import tokenreduce as tr  # noqa: E402
from tokenreduce.bench.export import (  # noqa: E402
    check_exportable,
    export_onnx,
    graph_token_counts,
    run_session,
    session,
    translations,
)
from tokenreduce.cli import main  # noqa: E402
from tokenreduce.core import ops  # noqa: E402
from tokenreduce.core.errors import TokenReduceError  # noqa: E402
from tokenreduce.core.method import format_spec  # noqa: E402

FAST = ["tome(r=(8, 0, 8, 0))", "topk(keep=0.5, locs=(1, 2))"]


def exportable_examples() -> list[str]:
    out = []
    for name in tr.list_methods():
        spec = format_spec(name, tr.get_method(name).example)
        reducer = tr.build_reducer(spec)
        if reducer.exportable and not reducer.dynamic_schedule:
            out.append(spec)
    return out


def training_free_examples() -> list[str]:
    return [s for s in exportable_examples() if not tr.build_reducer(s).learned]


def check_batches(model: torch.nn.Module, path, batches=(1, 3)) -> None:
    """The ONNX file at ``path`` matches the eager model on fresh images at every batch size given."""
    sess = session(path)
    for b in batches:
        x = torch.randn(b, 3, 32, 32, generator=torch.Generator().manual_seed(10 + b))
        with torch.no_grad():
            torch.testing.assert_close(run_session(sess, x), model(x), rtol=1e-4, atol=1e-4)


def check_three_ways(spec: str, tmp_path, compile_backend: str) -> None:
    model = tr.apply(make_host("deit"), spec).eval()
    res = export_onnx(model, tmp_path / "m.onnx", batch=2)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))  # export's own check input
    y = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))  # and a fresh one
    sess = session(res.path)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=False, backend=compile_backend)
    with torch.no_grad():
        eager_y, compiled_y = model(y), compiled(y)
    torch.testing.assert_close(run_session(sess, y), eager_y, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(compiled_y, eager_y, rtol=1e-4, atol=1e-4)
    assert res.max_abs_diff is not None and res.max_abs_diff < 1e-4
    with torch.no_grad():
        model(x)
    # the graph runs at the schedule's static token counts: every count of the eager forward is
    # the width of some (B, N, C) value in it, and the unreduced count only where the eager one has it
    counts = tr.get_info(model).tokens_per_block
    assert counts == res.tokens_per_block and set(counts) <= set(res.graph_tokens)
    assert res.graph_tokens == graph_token_counts(res.path, 2, model.embed_dim)
    assert max(res.graph_tokens) == 64 + 1  # nothing larger than the unreduced sequence


@pytest.mark.parametrize("spec", [FAST[0], pytest.param(FAST[1], marks=pytest.mark.slow)])  # the prune: slow tier
def test_eager_compiled_and_onnxruntime_agree(spec: str, tmp_path):
    check_three_ways(spec, tmp_path, "eager")  # dynamo capture; inductor in the slow test
    model = tr.apply(make_host("deit"), spec)
    assert tr.get_info(model).tokens_per_block[-1] < 65  # the method reduced tokens: the count check bites


@pytest.mark.slow
def test_tied_scores_keep_the_lower_positions_in_eager_and_onnxruntime_alike(tmp_path):
    """A confident DynamicViT predictor saturates: many keep log-probabilities are exactly 0.0 in float32, and
    which of them top-k kept was the kernel's choice (onnxruntime and eager kept different tokens)."""
    scores = torch.tensor([[0.0, -1.0, 0.0, 0.0, -2.0, 0.0]])
    assert ops.keep_topk(scores, 2, 1)[0].tolist() == [[0, 1, 3]]  # the prefix, then the two lowest zeros
    keep, drop = ops.keep_topk(scores, 3, 0, with_drop=True)
    assert keep.tolist() == [[0, 2, 3]] and drop.tolist() == [[1, 4, 5]]
    model = tr.apply(make_host("deit"), "dynamicvit(keep=0.5, locs=(1, 2))").eval()
    with torch.no_grad():
        for predictor in tr.reducer_of(model).predictors:
            predictor.out_conv[-2].weight.mul_(1e4)  # the keep / drop logits far apart: log-softmax saturates
    res = export_onnx(model, tmp_path / "m.onnx", batch=2)
    y = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(run_session(session(res.path), y), model(y), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("spec", exportable_examples())
def test_every_exportable_method_agrees(spec: str, tmp_path):
    check_three_ways(spec, tmp_path, "inductor")


@pytest.mark.slow  # fast: test_export_command_dynamic_batch exports the same merge with a dynamic batch
def test_one_file_with_a_dynamic_batch_runs_every_batch_size(tmp_path):
    model = tr.apply(make_host("deit"), FAST[0]).eval()  # the merge; every method: the slow test below
    res = export_onnx(model, tmp_path / "m.onnx", dynamic_batch=True)  # exported once
    check_batches(model, res.path)
    assert res.dynamic_batch and res.max_abs_diff < 1e-4 and res.input_shape == (2, 3, 32, 32)
    with torch.no_grad():
        model(torch.randn(1, 3, 32, 32))
    counts = tr.get_info(model).tokens_per_block
    assert counts == res.tokens_per_block and set(counts) <= set(res.graph_tokens) and counts[-1] < 65


@pytest.mark.slow
@pytest.mark.parametrize("spec", training_free_examples())
def test_every_training_free_method_exports_a_dynamic_batch(spec, tmp_path):
    model = tr.apply(make_host("deit"), spec).eval()
    check_batches(model, export_onnx(model, tmp_path / "m.onnx", dynamic_batch=True).path)


@pytest.mark.slow
@pytest.mark.parametrize("spec", exportable_examples())
def test_the_classic_exporter_is_right_or_refused_by_declaration(spec, tmp_path):
    """What a method declares for the classic exporter holds: at the lowest opset it allows (and
    never above the classic default), the graph matches at two batch sizes, or it is refused."""
    model = tr.apply(make_host("deit"), spec).eval()
    reducer = tr.build_reducer(spec)
    if not reducer.classic_onnx:
        with pytest.raises(TokenReduceError, match="classic ONNX exporter.*dynamo"):
            export_onnx(model, tmp_path / "m.onnx", exporter="classic")
        return
    res = export_onnx(model, tmp_path / "m.onnx", exporter="classic", dynamic_batch=True,
                      opset=max(14, reducer.min_onnx_opset))  # 14: fused attention
    check_batches(model, res.path)


def test_the_classic_exporter_below_a_merges_opset_is_refused(tmp_path):
    """Below opset 16 torch's classic exporter writes ToMe's summing scatter without its reduction
    (of several merged tokens only one survives): refused by export_onnx and by the patched forward
    itself when torch.onnx.export(dynamo=False) traces it; at 16 it is right, at every batch size."""
    model = tr.apply(make_host("deit"), "tome(r=(8, 0, 8, 0))").eval()
    x = torch.randn(1, 3, 32, 32)
    with pytest.raises(TokenReduceError, match="needs ONNX opset >= 16"):  # torch's own entry point
        torch.onnx.export(model, (x,), str(tmp_path / "b.onnx"), dynamo=False, opset_version=15)
    with pytest.raises(TokenReduceError, match=r"tome\(r=\(8, 0, 8, 0\).*needs ONNX opset >= 16.*got opset 14"):
        export_onnx(model, tmp_path / "a.onnx", exporter="classic", opset=14)
    assert not list(tmp_path.iterdir())
    res = export_onnx(model, tmp_path / "c.onnx", exporter="classic", opset=16, dynamic_batch=True)
    assert res.opset == 16 and res.exporter == "classic" and res.max_abs_diff < 1e-4
    check_batches(model, res.path)
    with torch.no_grad():  # a plain torch.jit.trace is no ONNX export: not refused
        torch.testing.assert_close(torch.jit.trace(model, x, check_trace=False)(x), model(x))
    with pytest.raises(TokenReduceError, match="unknown ONNX exporter 'torchscript'; choose one of dynamo, classic"):
        export_onnx(model, tmp_path / "d.onnx", exporter="torchscript")


def test_the_classic_exporter_refuses_what_it_cannot_export_and_names_dynamo(tmp_path):
    spec = next(s for s in exportable_examples() if not tr.build_reducer(s).classic_onnx
                and tr.build_reducer(s).min_onnx_opset)  # a merge the classic exporter cannot translate
    model = tr.apply(make_host("deit"), spec).eval()
    with pytest.raises(TokenReduceError, match=r"classic ONNX exporter.*use the dynamo exporter.*export_onnx"):
        export_onnx(model, tmp_path / "a.onnx", exporter="classic")
    with pytest.raises(TokenReduceError, match=r"classic ONNX exporter.*dynamo=True"):
        torch.onnx.export(model, (torch.randn(1, 3, 32, 32),), str(tmp_path / "b.onnx"), dynamo=False)
    composite = tr.build_reducer(f"{spec} + tome(r=2)")
    assert not composite.classic_onnx and composite.min_onnx_opset == 16


def test_a_stable_sort_exports_with_its_ties_in_order(tmp_path):
    class Sort(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            up = x.sort(dim=1, stable=True).indices
            down = x.sort(dim=1, stable=True, descending=True).indices
            return torch.cat([up, down], 1)

    x = torch.tensor([[2.0, 1.0, 2.0, 1.0, 0.0, 2.0], [1.0, 1.0, 1.0, 0.0, 0.0, 1.0]])  # ties everywhere
    program = torch.onnx.export(Sort().eval(), (x,), dynamo=True, verbose=False,
                                custom_translation_table=translations())
    program.save(str(tmp_path / "sort.onnx"))
    got = run_session(session(tmp_path / "sort.onnx"), x)
    assert torch.equal(got, Sort()(x))


@pytest.mark.parametrize("spec", ["topk(keep=0.5, locs=(1, 2))",
                                  pytest.param("evit(keep=0.5, locs=(1, 2))", marks=pytest.mark.slow),
                                  pytest.param("dynamicvit(keep=0.5, locs=(1, 2))", marks=pytest.mark.slow)])
def test_transformers_onnx_exporter_exports_the_pruners(spec: str):
    """transformers' OnnxExporter failed on evit, topk and dynamicvit (KeyError 'val'): its graph
    pass rewrites a stable sort into a node without the metadata the ONNX translation reads. Exporting, the
    tokens are ranked by topk (ONNX TopK puts equal scores in position order, as the eager stable sort)."""
    exporters = pytest.importorskip("transformers.exporters")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.ViTConfig(image_size=32, patch_size=4, hidden_size=32, num_hidden_layers=3,
                                    num_attention_heads=2, intermediate_size=64, num_labels=10)
    model = tr.apply(transformers.ViTForImageClassification(config).eval(), spec)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    exported = exporters.OnnxExporter().export(model, {"pixel_values": x}, config=exporters.OnnxConfig())
    y = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = model(pixel_values=y).logits
    assert tr.get_info(model).tokens_per_block[-1] < 65  # the method reduced tokens
    torch.testing.assert_close(torch.as_tensor(exported(pixel_values=y)["logits"]), want, rtol=1e-4, atol=1e-4)


def test_what_cannot_be_exported_is_refused_by_name(tmp_path):
    learned = next(n for n in tr.list_methods() if tr.get_method(n).learned)
    model = tr.apply(make_host("deit"), format_spec(learned, tr.get_method(learned).example)).train()
    with pytest.raises(TokenReduceError, match="training mode.*soft policy.*model.eval"):
        export_onnx(model, tmp_path / "x.onnx")
    with pytest.raises(TokenReduceError, match="trace=True"):
        check_exportable(tr.apply(make_host("deit"), "topk(keep=0.5, locs=(1,))", trace=True))

    base = tr.get_method("topk")

    class NotExportable(base):
        exportable = False

    class Dynamic(base):
        dynamic_schedule = True

    cfg = base.Config(keep=0.5, locs=(1,))
    with pytest.raises(TokenReduceError, match="cannot be exported"):
        check_exportable(tr.apply(make_host("deit"), NotExportable(cfg)))
    with pytest.raises(TokenReduceError, match="dynamic schedule"):
        check_exportable(tr.apply(make_host("deit"), Dynamic(cfg)))
    assert not (tmp_path / "x.onnx").exists()


@pytest.mark.slow
def test_export_command_exports_a_trained_checkpoint(tmp_path, capsys):
    from tokenreduce.models import build_model, save_checkpoint

    cfg = {"name": "vit_tiny_patch16_224",
           "kwargs": {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2, "num_classes": 5}}
    learned = next(n for n in tr.list_methods() if tr.get_method(n).learned)
    spec = tr.build_reducer(format_spec(learned, {**tr.get_method(learned).example, "locs": (1,)})).spec()
    torch.manual_seed(3)
    model = tr.apply(build_model(cfg), spec)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))  # weights no fresh model has
    ckpt = tmp_path / "model.safetensors"
    save_checkpoint(ckpt, model, meta={"model": cfg, "spec": spec})
    out = tmp_path / "model.onnx"
    assert main(["export", "--checkpoint", str(ckpt), "--onnx", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed and "max |difference|" in printed
    model.eval()
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(run_session(session(out), x), model(x), rtol=1e-4, atol=1e-4)
    counts = " ".join(map(str, tr.get_info(model).tokens_per_block))
    assert f"(static): {counts}" in printed and counts != "17 17"


@pytest.mark.parametrize(("argv", "match"), [
    (["--checkpoint", "x.safetensors", "--model", "test_vit"], "leave out --model"),
    (["--model", "test_vit", "--batch-size", "0"], "--batch-size must be >= 1"),
    (["--model", "test_vit", "--spec", "nosuch(r=1)"], "unknown method"),
    (["--model", "test_vit", "--spec", "tome(r=1)", "--exporter", "classic", "--opset", "13"],
     "needs ONNX opset >= 16"),
    (["--model", "test_vit", "--spec", "tome(r=2)", "--amp", "bf16"], "--amp bf16 cannot be exported"),
])
def test_export_command_errors_are_one_line(capsys, tmp_path, argv, match):
    assert main(["export", "--onnx", str(tmp_path / "x.onnx"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("tokenreduce export: error: ") and match in err[-1], err
    assert not any("Traceback" in line for line in err)
    assert not list(tmp_path.iterdir())  # nothing written


def test_a_graph_onnxruntime_refuses_is_one_line_and_leaves_no_file(tmp_path, monkeypatch):
    from tokenreduce.bench import export as ex

    model = make_host("deit").eval()
    out = tmp_path / "m.onnx"
    out.write_bytes(b"an earlier export")

    def invalid(model, x, path, dynamic_batch, opset):  # what a bf16-autocast graph is to onnxruntime
        path.write_bytes(b"not an onnx graph")

    monkeypatch.setitem(ex._EXPORT, "dynamo", invalid)
    with pytest.raises(TokenReduceError, match=rf"onnxruntime cannot run the exported graph \(\w+: .*\); nothing was "
                                               rf"written to {out}"):
        export_onnx(model, out)
    assert out.read_bytes() == b"an earlier export" and [p.name for p in tmp_path.iterdir()] == ["m.onnx"]


@pytest.mark.slow
def test_export_command_dynamic_batch(tmp_path, capsys):
    from tokenreduce.models import build_model, save_checkpoint

    cfg = {"name": "vit_tiny_patch16_224",
           "kwargs": {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2, "num_classes": 5}}
    ckpt, out = tmp_path / "model.safetensors", tmp_path / "model.onnx"
    save_checkpoint(ckpt, build_model(cfg), meta={"model": cfg})
    argv = ["export", "--checkpoint", str(ckpt), "--spec", "tome(r=4)", "--onnx", str(out), "--dynamic-batch"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "input (batch, 3, 32, 32)" in printed and "same 2 and 1 random image(s)" in printed
    assert "(static): 13 9" in printed
    sess = session(out)
    for b in (1, 3):
        assert run_session(sess, torch.randn(b, 3, 32, 32)).shape == (b, 5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.json", "model.onnx", "model.safetensors"]


def test_an_exporter_limit_is_a_user_error_a_bug_keeps_its_traceback(tmp_path, monkeypatch):
    from torch.onnx.errors import UnsupportedOperatorError

    from tokenreduce.bench import export as ex

    model = make_host("deit").eval()
    tr.apply(model, "topk(keep=0.5, locs=(1,))")

    def limit(*args):
        raise UnsupportedOperatorError("aten::fancy", 17, "")

    def bug(*args):
        raise KeyError("a bug in the traced code")

    monkeypatch.setitem(ex._EXPORT, "dynamo", limit)
    with pytest.raises(TokenReduceError, match="ONNX export failed"):
        export_onnx(model, tmp_path / "m.onnx")
    monkeypatch.setitem(ex._EXPORT, "dynamo", bug)
    with pytest.raises(KeyError, match="a bug"):
        export_onnx(model, tmp_path / "m.onnx")
