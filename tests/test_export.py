"""ONNX export (bench/export.py, ``tokenreduce export``): eager, compiled and onnxruntime outputs
agree, the graph holds the reduced token counts, and what cannot be exported is refused clearly.

Exporting takes 5 to 15 s per model on 2 busy CPU cores, so the default run exports two methods,
one that merges (its sort-based matching) and one that prunes, plus the trained-checkpoint path;
``-m slow`` exports every exportable registered method (chosen by declaration, no name).
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


@pytest.mark.parametrize("spec", FAST)
def test_eager_compiled_and_onnxruntime_agree(spec: str, tmp_path):
    check_three_ways(spec, tmp_path, "eager")  # dynamo capture; inductor in the slow test
    model = tr.apply(make_host("deit"), spec)
    assert tr.get_info(model).tokens_per_block[-1] < 65  # the method reduced tokens: the count check bites


@pytest.mark.slow
@pytest.mark.parametrize("spec", exportable_examples())
def test_every_exportable_method_agrees(spec: str, tmp_path):
    check_three_ways(spec, tmp_path, "inductor")


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
    (["--model", "test_vit", "--batch", "0"], "--batch must be >= 1"),
    (["--model", "test_vit", "--spec", "nosuch(r=1)"], "unknown method"),
])
def test_export_command_errors_are_one_line(capsys, tmp_path, argv, match):
    assert main(["export", "--onnx", str(tmp_path / "x.onnx"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("tokenreduce export: error: ") and match in err[-1], err
    assert not any("Traceback" in line for line in err)
