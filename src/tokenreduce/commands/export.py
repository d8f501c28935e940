"""``tokenreduce export``: a model with its method as an ONNX file with static token counts (for one
batch size, or every one with ``--dynamic-batch``), checked against the eager model with
onnxruntime on the same inputs (bench/export.py)."""

from __future__ import annotations

import argparse

from ..bench.settings import EXPORTERS
from ..core.errors import TokenReduceError
from . import checks, vocab


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export", help="export a model and its method to ONNX (static token counts), checked with onnxruntime",
        description="Export a timm ViT (random or pretrained weights, or a trained tokenreduce checkpoint) with "
        "a method applied to ONNX. Every token count is static (the method's schedule), the batch size is "
        "fixed (--batch-size) unless --dynamic-batch. The file is run with onnxruntime on the same random images "
        "as the eager model and the largest difference is reported; above --atol the command fails. "
        "Needs: pip install 'tokenreduce[export]'.",
    )
    vocab.add_model(p, default=None, note=f"default {vocab.DEFAULT_MODEL}; not with --checkpoint")
    vocab.add_checkpoint(p, note="its model, stem, transforms and method, deployed without training-only parts")
    vocab.add_spec(p, note="replaces a checkpoint's own")
    p.add_argument("--onnx", required=True, metavar="PATH", help="the .onnx file to write")
    vocab.add_img_size(p)
    vocab.add_pretrained(p)
    vocab.add_batch_size(p, default=1, note="of the exported graph")
    vocab.renamed(p, "--batch", "--batch-size")
    p.add_argument("--dynamic-batch", action="store_true",
                   help="one file for every batch size (a symbolic batch axis; traced at max(--batch-size, 2) images "
                   "and checked at that batch and at 1)")
    p.add_argument("--exporter", choices=EXPORTERS, default=EXPORTERS[0],
                   help="torch's exporter: dynamo (torch.onnx.export(dynamo=True), every method) or classic "
                   "(dynamo=False, TorchScript tracing; refused for a method it cannot export) (default: %(default)s)")
    p.add_argument("--opset", type=int, metavar="N",
                   help="ONNX opset (default: the exporter's); refused below what the method needs (a merge: 16)")
    p.add_argument("--atol", type=float, default=1e-3,
                   help="largest allowed |onnxruntime - eager| on the check inputs (default: %(default)s)")
    vocab.add_seed(p, of=" of the random check images")
    vocab.add_device(p, note="where the model is traced (onnxruntime checks the file on the CPU)")
    vocab.add_amp(p, note="an autocast export holds the casts in the graph; bf16 is refused (ONNX's Conv takes no "
                  "bfloat16)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..bench.evaluation import log
    from ..bench.export import export_onnx, load_for_export

    if args.batch_size < 1:
        raise TokenReduceError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.amp == "bf16":
        raise TokenReduceError("--amp bf16 cannot be exported: the autocast graph feeds bfloat16 to ONNX operators "
                               "that take none (the patch embedding's Conv), so onnxruntime refuses the file; give "
                               "--amp fp16 (the casts held in the graph) or off")
    from ..models.precision import autocast

    checks.writable_file(args.onnx, "--onnx")
    args.device = checks.device(args.device)
    model, what = load_for_export(model=args.model, checkpoint=args.checkpoint, spec=args.spec,
                                  img_size=args.img_size, pretrained=args.pretrained)
    model.to(args.device)
    log(f"exporting {what} to {args.onnx} ({args.device}, amp {args.amp})")
    with autocast(args.device, args.amp):
        res = export_onnx(model, args.onnx, batch=args.batch_size, seed=args.seed, dynamic_batch=args.dynamic_batch,
                          exporter=args.exporter, opset=args.opset)
    print(f"wrote {res.path} ({res.size_bytes / 1e6:.1f} MB, ONNX opset {res.opset}, {res.exporter} exporter): {what}")
    shape = ("batch", *res.input_shape[1:]) if res.dynamic_batch else tuple(res.input_shape)
    print(f"input ({', '.join(map(str, shape))}); tokens leaving each block (static): "
          f"{' '.join(map(str, res.tokens_per_block))}")
    checked = f"{res.input_shape[0]} and 1" if res.dynamic_batch else f"{res.input_shape[0]}"
    print(f"onnxruntime vs eager on the same {checked} random image(s): max |difference| {res.max_abs_diff:.3g}")
    if not res.max_abs_diff <= args.atol:  # also catches NaN
        raise TokenReduceError(f"the exported model differs from the eager one by {res.max_abs_diff:.3g} > "
                               f"--atol {args.atol:g}; {res.path} was written but does not match")
    return 0
