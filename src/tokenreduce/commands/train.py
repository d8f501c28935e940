"""``tokenreduce train``: train a ViT from scratch, or fine-tune a (reduced) model, for a task.

Settings come from, in increasing priority: TrainConfig defaults (with ``--resume``: the settings the
run in ``--out`` was started with), ``--recipe NAME``, the flags given. Multi-process:
``torchrun --nproc_per_node N -m tokenreduce.cli train ...``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from . import vocab

#: CLI flag -> timm create_model kwarg.
MODEL_FLAGS = {"img_size": "img_size", "patch_size": "patch_size", "in_chans": "in_chans", "dim": "embed_dim",
               "depth": "depth", "heads": "num_heads", "mlp_ratio": "mlp_ratio", "num_classes": "num_classes",
               "drop_path": "drop_path_rate"}
#: Flags that set a TrainConfig field of the same name in their own way (the rest map one to one):
#: --model names the timm model of the ``model`` dict, --distill is comma-separated, --recipe loads one.
COMPOSED = ("model", "distill", "recipe")
#: Flags that are not TrainConfig fields: the model's size (MODEL_FLAGS) and build (``model`` dict
#: entries), --bits (a task parameter), --results (a file this command writes after the run).
NOT_FIELDS = (*MODEL_FLAGS, "pretrained", "stem", "transform", "bits", "results")
#: TrainConfig fields without a flag, and why (every other field has one; a test checks both ways).
NO_FLAG: dict[str, str] = {}


#: ``--optimizer`` choices: the names in ``tokenreduce.train.optim.OPTIMIZERS`` (a test keeps them equal;
#: this module stays light so that ``tokenreduce train --help`` does not import torch).
OPTIMIZERS = ("adamw", "sgd")
#: Flags of train's own (the rest is the shared vocabulary, commands/vocab.py).
OWN_FLAGS = (
    "--recipe", "--patch-size", "--in-chans", "--dim", "--depth", "--heads", "--mlp-ratio", "--num-classes",
    "--drop-path", "--stem", "--transform", "--init", "--task", "--bits", "--teacher", "--distill", "--distill-weight",
    "--distill-tau",
    "--augment", "--subset", "--eval-subset", "--epochs", "--optimizer", "--lr", "--min-lr", "--momentum",
    "--weight-decay", "--warmup-epochs", "--label-smoothing", "--grad-clip", "--amp", "--resume", "--force",
    "--ckpt-every", "--eval-every", "--deterministic", "--workers", "--quiet",
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train", help="train a ViT from scratch or fine-tune a reduced model",
        description="Train a timm ViT (from scratch, or from --init CKPT) for a --task (default classify) with an "
        "optional reducer --spec, optional distillation from --teacher CKPT. Checkpoints (safetensors + JSON) go to "
        "--out; --resume continues an interrupted run exactly. Multi-process: "
        "torchrun --nproc_per_node N -m tokenreduce.cli train ...",
        epilog="Tasks (with their metrics) and recipes: tokenreduce list. "
        "Example: tokenreduce train --recipe fmnist-vit",
    )
    g = p.add_argument_group("model")
    g.add_argument("--recipe", help="named recipe (model + optimiser + schedule; tokenreduce list); flags override it")
    vocab.add_model(g, default=None, note="e.g. vit_tiny_patch16_224 (the size flags override it)")
    vocab.add_img_size(g)
    g.add_argument("--patch-size", type=int)
    g.add_argument("--in-chans", type=int, help="1 (grayscale) or 3")
    g.add_argument("--dim", type=int, help="embedding width")
    g.add_argument("--depth", type=int)
    g.add_argument("--heads", type=int)
    g.add_argument("--mlp-ratio", type=float)
    g.add_argument("--num-classes", type=int, help="default: the dataset's")
    g.add_argument("--drop-path", type=float, help="stochastic depth rate")
    vocab.add_pretrained(g, default=None)
    g.add_argument("--stem", metavar="SPEC", help="patch embedding: 'patch' (timm's, default) or 'conv' "
                   "(local-coherence conv stem on the same token grid); see tokenreduce list; with --init, a "
                   "fresh stem in place of the checkpoint's, every other weight kept")
    g.add_argument("--transform", action="append", metavar="SPEC",
                   help="model transform applied after building, e.g. 'tie_qk' (shared W_q = W_k); repeatable; "
                   "with --init, applied on top of the checkpoint's model, starting from its weights")
    vocab.add_spec(g, note="the reducer to fine-tune with")
    g.add_argument("--init", metavar="CKPT", help="start from this tokenreduce checkpoint's model and weights")
    g.add_argument("--task", metavar="SPEC",
                   help="what to train for, a task spec, e.g. 'hash(bits=32)' (default classify; tokenreduce list)")
    g.add_argument("--bits", type=int, metavar="N", help="code length of a hashing task: sets bits=N in the task spec "
                   "(from --task or the recipe)")
    g.add_argument("--teacher", metavar="CKPT", help="distil from this frozen tokenreduce checkpoint")
    g.add_argument("--distill", help="what to distil: logits, tokens or logits,tokens (default with a teacher: logits)")
    g.add_argument("--distill-weight", type=float)
    g.add_argument("--distill-tau", type=float, help="softmax temperature of logit distillation (default 1)")
    d = p.add_argument_group("data")
    vocab.add_data(d, note="default fashion_mnist", download_default=None)
    d.add_argument("--augment", help="none, crop_flip, crop_flip_erase or rrc_flip (default: the dataset's)")
    d.add_argument("--subset", type=int, metavar="N", help="train (and evaluate) on a fixed N-image subset")
    d.add_argument("--eval-subset", type=int, metavar="N")
    o = p.add_argument_group("optimisation")
    o.add_argument("--epochs", type=int)
    vocab.add_batch_size(o, default=None, note="global, split across processes (default 128)")
    vocab.add_eval_batch_size(o, default=None)
    o.add_argument("--optimizer", choices=OPTIMIZERS, help="default adamw")
    o.add_argument("--lr", type=float, help="peak learning rate (a task's parameter groups may scale it)")
    o.add_argument("--min-lr", type=float)
    o.add_argument("--momentum", type=float, help="SGD momentum (default 0.9)")
    o.add_argument("--weight-decay", type=float)
    o.add_argument("--warmup-epochs", type=float)
    o.add_argument("--label-smoothing", type=float)
    o.add_argument("--grad-clip", type=float)
    o.add_argument("--amp", choices=("bf16",), help="bf16 autocast")
    r = p.add_argument_group("run")
    vocab.add_out_dir(r, default=None, note="where the checkpoints go (default for a recipe: "
                      "$TOKENREDUCE_CACHE/<recipe>)")
    r.add_argument("--resume", action="store_true", default=None,
                   help="continue the run in --out with its own settings (flags that contradict them are refused; "
                   "runtime ones such as --threads, --device, --workers may change)")
    r.add_argument("--force", action="store_true", default=None, help="overwrite a run in --out")
    r.add_argument("--ckpt-every", type=int, metavar="STEPS")
    r.add_argument("--eval-every", type=int, metavar="EPOCHS")
    vocab.add_seed(r, default=None, shown="the recipe's, else 0")
    r.add_argument("--deterministic", action="store_true", default=None)
    vocab.add_threads(r)
    vocab.add_device(r, default=None)
    r.add_argument("--workers", dest="num_workers", type=int, help="data loader workers (default 0)")
    r.add_argument("--quiet", action="store_true", default=None, help="no progress output")
    vocab.add_results(r)
    p.set_defaults(func=run)
    _OPTIONS.update({a.dest: a.option_strings[-1] for a in p._actions if a.option_strings and a.dest != "help"})


#: argparse dest -> option string, to write down the command that made a result.
_OPTIONS: dict[str, str] = {}


def command_line(args: argparse.Namespace) -> str:
    """The ``tokenreduce train`` command equivalent to ``args`` (the flags that were given)."""
    parts = ["tokenreduce", "train"]
    for dest, opt in _OPTIONS.items():
        value = getattr(args, dest, None)
        if value is None or value is False:
            continue
        for v in value if isinstance(value, list) else [value]:  # a repeatable flag (--transform) once per value
            parts += [opt] if v is True else [opt, shlex.quote(str(v))]
    return " ".join(parts)


def config_from_args(args: argparse.Namespace):
    """The TrainConfig the flags ask for (recipe, then flags)."""
    from ..core.errors import TokenReduceError
    from ..train.config import field_names
    from ..train.loop import TrainConfig
    from ..train.recipes import default_out, get_recipe

    fields: dict[str, Any] = {**(_started_with(args) if args.resume else {}),
                              **(get_recipe(args.recipe) if args.recipe else {})}
    model = dict(fields.get("model") or {})
    kwargs = dict(model.get("kwargs") or {})
    if args.model:
        model["name"] = args.model
    kwargs.update({kw: getattr(args, flag) for flag, kw in MODEL_FLAGS.items() if getattr(args, flag) is not None})
    if args.pretrained:
        model["pretrained"] = True
    if args.stem:
        model["stem"] = args.stem
    if args.transform:
        model["transforms"] = list(args.transform)
    init = args.init or fields.get("init")
    if init and (args.stem or args.transform) and set(model) <= {"stem", "transforms"} and not kwargs:
        # --init CKPT --stem S --transform T: the checkpoint's own model with a fresh stem S and T on top
        # (models.build.changes_on_top)
        from ..models import read_meta

        base = read_meta(init)["model"]
        model = {**base, **({"stem": args.stem} if args.stem else {}),
                 "transforms": [*base.get("transforms", []), *(args.transform or [])]}
        kwargs = dict(base.get("kwargs") or {})
    if model or kwargs:
        if "name" not in model:
            raise TokenReduceError("model size flags need --model NAME (a timm ViT) or --recipe")
        fields["model"] = {**model, "kwargs": kwargs}
    fields.update({k: getattr(args, k) for k in field_names()
                   if k not in COMPOSED and getattr(args, k, None) is not None})
    if args.distill:
        fields["distill"] = tuple(s.strip() for s in args.distill.split(",") if s.strip())
    if args.bits is not None:
        fields["task"] = with_bits(fields.get("task") or "classify", args.bits)
    if not fields.get("out"):
        if not args.recipe:
            raise TokenReduceError("give --out DIR (where checkpoints go) or --recipe NAME")
        fields["out"] = str(default_out(args.recipe))
    return TrainConfig.from_dict(fields)


def _started_with(args: argparse.Namespace) -> dict[str, Any]:
    """The settings (runtime fields left out) of the run ``--resume`` continues, so that the flags given
    add to them: ``tokenreduce train --out DIR --resume`` alone continues the run in DIR."""
    from ..train.loop import RUNTIME_FIELDS, saved_config
    from ..train.recipes import default_out

    out = args.out or (default_out(args.recipe) if args.recipe else None)
    saved = saved_config(out) if out else None
    if saved is None:
        return {}
    return {k: v for k, v in saved.to_dict().items() if k not in RUNTIME_FIELDS}


def with_bits(task: str, bits: int) -> str:
    """The task spec ``task`` with its ``bits`` parameter set to ``bits`` (``--bits``); a clear error
    for a task that has no such parameter."""
    import dataclasses

    from ..core.errors import TokenReduceError
    from ..core.registry import format_spec, parse_spec
    from ..tasks import get_task, list_tasks

    def has_bits(t: str) -> bool:
        return any(f.name == "bits" for f in dataclasses.fields(get_task(t).Config))

    name, params = parse_spec(task)
    if not has_bits(name):
        having = [t for t in list_tasks() if has_bits(t)]
        raise TokenReduceError(f"--bits sets the code length of a hashing task, but task {name!r} has no bits "
                               f"parameter; tasks with one: {', '.join(having)}")
    return format_spec(name, {**params, "bits": bits})


def run(args: argparse.Namespace) -> int:
    from ..train.loop import train
    from . import checks

    cfg = config_from_args(args)
    if args.results:
        checks.writable_file(args.results, "--results")
    try:
        metrics = train(cfg)
    except KeyboardInterrupt as e:
        print(f"tokenreduce train: {interrupted(e, cfg)}; continue with: {resume_command(args, cfg)}",
              file=sys.stderr)
        return 130
    if "checkpoint" not in metrics:  # not the main process
        return 0
    extra = " (reused; --force retrains)" if metrics.get("reused") else ""
    metric = metrics.get("metric", "top1")  # runs made before tasks have no 'metric'
    shown = [f"{k} {metrics[k]:.4g}" for k in dict.fromkeys((metric, "loss"))
             if isinstance(metrics.get(k), (int, float))]
    print("  ".join([*shown, f"checkpoint {metrics['checkpoint']}{extra}"]))
    if args.results:
        write_results(Path(args.results), command_line(args), cfg, metrics)
    return 0


def interrupted(e: KeyboardInterrupt, cfg) -> str:
    """What a Ctrl-C left behind: the checkpoint the loop saved at the step it stopped, or the last one."""
    from ..train.loop import TrainingInterrupted

    if isinstance(e, TrainingInterrupted) and e.checkpoint is not None:
        return f"interrupted after step {e.step}, saved in {e.checkpoint}"
    last = Path(cfg.out) / "last.safetensors"
    if last.is_file():
        from ..models import read_meta

        return f"interrupted; the last checkpoint is {last} (step {read_meta(last).get('step')})"
    return "interrupted before the first checkpoint"


def resume_command(args: argparse.Namespace, cfg) -> str:
    """The command that continues this run: the one given, with --resume and the output directory, no --force."""
    return command_line(argparse.Namespace(**{**vars(args), "resume": True, "force": None, "out": cfg.out}))


def write_results(path: Path, command: str, cfg, metrics: dict[str, Any]) -> None:
    """Results JSON: the command that made it, the config, the metrics and the environment."""
    from ..bench.report import write_json

    prov = {**metrics.get("provenance", {}), "command": command}
    write_json(path, {"command": command, "config": cfg.to_dict(), "metrics": metrics, "provenance": prov})
