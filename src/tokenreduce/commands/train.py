"""``tokenreduce train``: train a ViT from scratch, or fine-tune a (reduced) model, for a task.

Settings come from, in increasing priority: TrainConfig defaults (with ``--resume``: the settings the
run in ``--out`` was started with), ``--recipe NAME``, the flags given. Multi-process:
``torchrun --nproc_per_node N -m tokenreduce.cli train ...``.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core.errors import DiskFullError, TokenReduceError
from ..core.registry import format_spec, parse_spec
from ..train.config import GROUPS, TrainConfig
from . import checks, vocab

#: The model's size flags (not TrainConfig fields: they fill the ``model`` field's ``kwargs``):
#: flag dest -> (timm create_model kwarg, type, help).
MODEL_FLAGS: dict[str, tuple[str, type, str | None]] = {
    "patch_size": ("patch_size", int, None), "in_chans": ("in_chans", int, "1 (grayscale) or 3"),
    "dim": ("embed_dim", int, "embedding width"), "depth": ("depth", int, None), "heads": ("num_heads", int, None),
    "mlp_ratio": ("mlp_ratio", float, None), "num_classes": ("num_classes", int, "default: the dataset's"),
    "drop_path": ("drop_path_rate", float, "stochastic depth rate"),
}


def _shown(f: dataclasses.Field) -> str:
    """A field's help with its TrainConfig default (if it has one to say)."""
    help, default = f.metadata["help"], f.default
    if default is None or default is False or default == ():
        return help
    return f"{help} (default: {default})" if help else f"default: {default}"


def add_model(g: argparse._ArgumentGroup, f: dataclasses.Field) -> None:
    """The flags the ``model`` field is composed of (:func:`config_from_args`): ``--model`` and the model's size
    and build."""
    vocab.add_model(g, default=None, note="e.g. vit_tiny_patch16_224 (the size flags override it)")
    vocab.add_img_size(g)
    for dest, (_, kind, help) in MODEL_FLAGS.items():
        g.add_argument("--" + dest.replace("_", "-"), type=kind, help=help)
    vocab.add_pretrained(g, default=None)
    g.add_argument("--stem", metavar="SPEC", help="patch embedding: 'patch' (timm's, default) or 'conv' "
                   "(local-coherence conv stem on the same token grid); see tokenreduce list; with --init, a "
                   "fresh stem in place of the checkpoint's, every other weight kept")
    g.add_argument("--transform", action="append", metavar="SPEC",
                   help="model transform applied after building, e.g. 'tie_qk' (shared W_q = W_k); repeatable; "
                   "with --init, applied on top of the checkpoint's model, starting from its weights")


#: TrainConfig fields whose flags are added in their own way: field -> add(group, field). ``model`` is composed
#: of several flags; the rest are the shared vocabulary's (commands/vocab.py), ``data`` bringing ``data_dir`` and
#: ``download`` along. Every other field's flag is generated from its declaration (:func:`add_setting`).
OWN_WAY: dict[str, Callable[[Any, dataclasses.Field], Any] | None] = {
    "model": add_model,
    "spec": lambda g, f: vocab.add_spec(g, note=f.metadata["help"]),
    "data": lambda g, f: vocab.add_data(g, note=f"default {f.default}", download_default=None),
    "data_dir": None, "download": None,
    "batch_size": lambda g, f: vocab.add_batch_size(g, default=None, note=_shown(f)),
    "eval_batch_size": lambda g, f: vocab.add_eval_batch_size(g, default=None),
    "seed": lambda g, f: vocab.add_seed(g, default=None, shown=f"the recipe's, else {f.default}"),
    "out": lambda g, f: vocab.add_out_dir(g, default=None, note=f.metadata["help"]),
    "threads": lambda g, f: vocab.add_threads(g),
    "device": lambda g, f: vocab.add_device(g, default=None),
    "amp": lambda g, f: vocab.add_amp(g, default=None, note="default: the recipe's, else off"),
}


def add_setting(g: argparse._ArgumentGroup, f: dataclasses.Field, hint: Any) -> None:
    """The flag of TrainConfig field ``f`` (declared type ``hint``), from its metadata. Its default is None (unset:
    the recipe's or TrainConfig's value stands); a bool is a switch, a tuple a comma-separated list."""
    meta = dict(f.metadata)
    kw: dict[str, Any] = {k: meta[k] for k in ("metavar", "choices") if k in meta}
    if hint is bool:
        kw.update(action="store_true")
    elif typing.get_origin(hint) is not tuple:  # a tuple is read as given, split at commas in config_from_args
        kw.update(type=next(t for t in (*typing.get_args(hint), hint) if t in (int, float, str)))
    g.add_argument(meta.get("flag", "--" + f.name.replace("_", "-")), dest=f.name, default=None, help=_shown(f),
                   **kw)


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
    groups = {name: p.add_argument_group(name) for name in GROUPS}
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        group = groups[f.metadata["group"]]
        if f.name not in OWN_WAY:
            add_setting(group, f, hints[f.name])
        elif OWN_WAY[f.name] is not None:
            OWN_WAY[f.name](group, f)
    groups["model"].add_argument("--bits", type=int, metavar="N", help="code length of a hashing task: sets bits=N in "
                                 "the task spec (from --task or the recipe)")
    vocab.add_results(groups["run"])
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


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig the flags ask for (recipe, then flags)."""
    from ..train.recipes import default_out, get_recipe

    fields: dict[str, Any] = {**(_started_with(args) if args.resume else {}),
                              **(get_recipe(args.recipe) if args.recipe else {})}
    model = dict(fields.get("model") or {})
    kwargs = dict(model.get("kwargs") or {})
    if args.model:
        model["name"] = args.model
    sizes = {"img_size": args.img_size, **{kw: getattr(args, dest) for dest, (kw, _, _) in MODEL_FLAGS.items()}}
    kwargs.update({kw: value for kw, value in sizes.items() if value is not None})
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
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        value = getattr(args, f.name, None)
        if f.name in ("model", "recipe") or value is None:  # model: composed above; recipe: read first
            continue
        if typing.get_origin(hints[f.name]) is tuple:  # a comma-separated list
            value = tuple(v.strip() for v in value.split(",") if v.strip())
        fields[f.name] = value
    if args.bits is not None:
        fields["task"] = with_bits(fields.get("task") or "classify", args.bits)
    if not fields.get("out"):
        if not args.recipe:
            raise TokenReduceError("give --out DIR (where checkpoints go) or --recipe NAME")
        fields["out"] = str(default_out(args.recipe))
    return TrainConfig.from_dict(fields)


def _started_with(args: argparse.Namespace) -> dict[str, Any]:
    """The settings of the run ``--resume`` continues (of the runtime fields only its pace, ``RESUME_KEEPS``), so
    that the flags given add to them: ``tokenreduce train --out DIR --resume`` alone continues the run in DIR."""
    from ..train.config import RESUME_KEEPS, RUNTIME_FIELDS
    from ..train.loop import saved_config
    from ..train.recipes import default_out

    out = args.out or (default_out(args.recipe) if args.recipe else None)
    if out is None:
        raise TokenReduceError("--resume needs --out DIR (the run to continue) or --recipe NAME (its default --out)")
    saved = saved_config(out)
    if saved is None:
        what = "does not exist" if not Path(out).exists() else "holds no run (no last.safetensors or model.safetensors)"
        raise TokenReduceError(f"--resume: {out} {what}, so there is nothing to resume; check --out, or drop "
                               "--resume to start a new run there")
    return {k: v for k, v in saved.to_dict().items() if k not in RUNTIME_FIELDS or k in RESUME_KEEPS}


def with_bits(task: str, bits: int) -> str:
    """The task spec ``task`` with its ``bits`` parameter set to ``bits`` (``--bits``); a clear error
    for a task that has no such parameter."""
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

    if args.force and args.resume:
        raise TokenReduceError("--force starts the run in --out over and --resume continues it; give one of them")
    cfg = config_from_args(args)
    if args.results:
        checks.writable_file(args.results, "--results")
    try:
        metrics = train(cfg)
    except KeyboardInterrupt as e:
        print(f"tokenreduce train: {interrupted(e, cfg)}; continue with: {resume_command(args, cfg)}",
              file=sys.stderr)
        return 130
    except DiskFullError as e:
        if cfg.out is None or not (Path(cfg.out) / "last.safetensors").is_file():
            raise
        raise DiskFullError(f"{e}, or continue from the last checkpoint with: {resume_command(args, cfg)}") from None
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


def interrupted(e: KeyboardInterrupt, cfg: TrainConfig) -> str:
    """What a Ctrl-C left behind: the checkpoint the loop saved at the step it stopped, or the last one."""
    from ..train.loop import TrainingInterrupted

    if isinstance(e, TrainingInterrupted) and e.checkpoint is not None:
        return f"interrupted after step {e.step}, saved in {e.checkpoint}"
    last = Path(cfg.out) / "last.safetensors"
    if last.is_file():
        from ..models import read_meta

        return f"interrupted; the last checkpoint is {last} (step {read_meta(last).get('step')})"
    return "interrupted before the first checkpoint"


def resume_command(args: argparse.Namespace, cfg: TrainConfig) -> str:
    """The command that continues this run: the one given, with --resume and the output directory, no --force."""
    return command_line(argparse.Namespace(**{**vars(args), "resume": True, "force": None, "out": cfg.out}))


def write_results(path: Path, command: str, cfg: TrainConfig, metrics: dict[str, Any]) -> None:
    """Results JSON: the command that made it, the config, the metrics and the environment."""
    from ..bench.report import write_json

    prov = {**metrics.get("provenance", {}), "command": command}
    write_json(path, {"command": command, "config": cfg.to_dict(), "metrics": metrics, "provenance": prov})
