"""The command line's one vocabulary: every flag that more than one subcommand takes is declared here,
once, with one meaning and one help line; a subcommand adds it with ``add_<flag>(parser)`` and
declares its own flags next to it. A test walks every subcommand and fails on a flag of its own that
re-declares a vocabulary flag under another meaning.

The meanings, the same in every command:

- ``--spec SPEC``: a method spec, e.g. ``'tome(r=13)'`` (``tokenreduce list``); inspect too.
- ``--checkpoint PATH``: a tokenreduce checkpoint, the ``.safetensors`` file ``tokenreduce train``
  writes or its training output directory. In bench and eval it is the reference model (timed /
  evaluated unpatched); eval's fine-tuned checkpoints come with ``--finetuned PATH`` (repeatable).
- ``--weights PATH``: a foreign state_dict (``.safetensors``, ``.pth``, ``.pt``) for the ``--model``
  timm model; never a tokenreduce checkpoint.
- ``--model NAME``: a timm model name.
- ``--batch-size N``: the batch of the command's main work (timed throughput, training, the exported
  graph); ``--eval-batch-size N`` where a second batch exists (the task's metric).
- ``--threads N``: torch CPU threads; default torch's own (``torch.get_num_threads()``) everywhere.
- ``--device D``: where the model runs (default: cuda when available, else cpu, resolved when the command
  runs); ``--amp bf16|fp16|off``: autocast of the forward (default off). Every command that runs a model
  takes both; bench's ``--dtype`` converts the weights themselves.
- ``--out DIR``: always a folder (bench writes ``DIR/results.json``); a single results file is
  ``--results PATH``.

Old spellings (``inspect --method``, ``--batch``, ``--eval-batch``, ``bench --reference``, eval's
repeated ``--checkpoint``, a state_dict given to ``--checkpoint``, ``--out FILE.json``, demo's
``--data``) fail with exit status 2 and one line naming the new spelling; none is silently read.

This module stays light (argparse, the standard library and torch-free settings such as
``bench/settings.py``, where the names of torch-backed registries are declared): ``tokenreduce --help``
must not import torch.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from ..bench.settings import AMP_CHOICES, BACKENDS

#: The timm model a command builds when none is given.
DEFAULT_MODEL = "deit_small_patch16_224"
#: File suffixes of foreign weights; a tokenreduce checkpoint is always ``.safetensors`` or a directory.
FOREIGN_WEIGHTS = (".pth", ".pt", ".bin", ".ckpt")
#: What ``--threads`` defaults to, said in every command's help.
THREADS_DEFAULT = "torch's own, torch.get_num_threads(): the physical cores or OMP_NUM_THREADS"

#: Namespace attribute holding the dests of the flags that were typed (:func:`given`).
GIVEN = "given_flags"
#: Attribute set on every action declared here, so that a test can tell vocabulary flags from stray ones.
TAG = "tokenreduce_vocab"


def fail(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    """Exit with status 2 and one line ``<prog>: error: <message>`` (no usage block)."""
    parser.exit(2, f"{parser.prog}: error: {message}\n")


def _tag(action: argparse.Action) -> argparse.Action:
    setattr(action, TAG, True)
    return action


def _add(p: argparse.ArgumentParser | argparse._ArgumentGroup, *flags: str, note: str | None = None,
         help: str, **kw: Any) -> argparse.Action:
    """Add a vocabulary flag: its one help line, plus a command's note on how it uses it."""
    return _tag(p.add_argument(*flags, help=f"{help}; {note}" if note else help, **kw))


# ----------------------------------------------------------------------------- old spellings


class _Renamed(argparse.Action):
    """A hidden old spelling: using it fails, naming the new one."""

    def __init__(self, option_strings: list[str], dest: str, message: str = "", **kw: Any) -> None:
        super().__init__(option_strings, argparse.SUPPRESS, nargs="?", default=argparse.SUPPRESS,
                         help=argparse.SUPPRESS)
        self.message = message

    def __call__(self, parser, namespace, values, option_string=None) -> NoReturn:
        fail(parser, self.message)


def renamed(p: argparse.ArgumentParser, old: str, new: str, why: str = "") -> None:
    """Refuse the old flag ``old`` with a line naming ``new`` (``why``: what changed, if more than the name)."""
    message = f"{old} is now {new}" + (f" ({why})" if why else "")
    _tag(p.add_argument(old, action=_Renamed, message=message))


# ----------------------------------------------------------------------------- checks at parse time


class _OutDir(argparse.Action):
    """``--out DIR``: a folder; a ``.json`` path is the old bench ``--out FILE.json`` and is refused."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if Path(values).suffix == ".json":
            fail(parser, f"--out is a folder (the command writes DIR/results.json), got the file name {values}; "
                 "give a folder, e.g. --out runs/bench")
        setattr(namespace, self.dest, values)


class _Given(argparse.Action):
    """Store the value and note that the flag was typed (:func:`given`), so that a default and the same
    value typed are told apart."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        namespace.__dict__.setdefault(GIVEN, set()).add(self.dest)


def given(args: argparse.Namespace, dest: str) -> bool:
    """Whether the flag storing ``dest`` was typed on the command line (flags declared with ``_Given``)."""
    return dest in getattr(args, GIVEN, ())


class _Checkpoint(argparse.Action):
    """``--checkpoint PATH``: given once; a foreign weights file is refused, naming ``--weights``."""

    def __init__(self, option_strings: list[str], dest: str, again: str = "", **kw: Any) -> None:
        super().__init__(option_strings, dest, **kw)
        self.again = again

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if getattr(namespace, self.dest, None) not in (None, self.default):
            fail(parser, f"--checkpoint is given once{'; ' + self.again if self.again else ''}")
        if Path(values).suffix in FOREIGN_WEIGHTS:
            weights = any("--weights" in a.option_strings for a in parser._actions)
            fail(parser, f"--checkpoint is a tokenreduce checkpoint (a .safetensors file or a training directory), "
                 f"got {values}" + ("; a timm state_dict goes to --weights PATH" if weights else ""))
        setattr(namespace, self.dest, values)


# ----------------------------------------------------------------------------- the flags


def add_spec(p: argparse.ArgumentParser | argparse._ArgumentGroup, *, repeat: bool = False,
             note: str | None = None) -> argparse.Action:
    """``--spec SPEC``: a method spec; ``repeat``: a list, one per ``--spec``."""
    kw: dict[str, Any] = {"action": "append", "default": []} if repeat else {}
    return _add(p, "--spec", metavar="SPEC", note=note, **kw,
                help="method spec, e.g. 'tome(r=13)' or 'evit(keep=0.7, locs=(3, 6, 9))' (tokenreduce list)"
                + ("; repeat for several" if repeat else ""))


def add_checkpoint(p: argparse.ArgumentParser | argparse._ArgumentGroup, *, required: bool = False,
                   note: str | None = None, again: str = "") -> argparse.Action:
    """``--checkpoint PATH``: a tokenreduce checkpoint (``again``: what to do instead of repeating it)."""
    return _add(p, "--checkpoint", action=_Checkpoint, again=again, required=required, metavar="PATH", note=note,
                help="a tokenreduce checkpoint: the .safetensors file tokenreduce train writes, or its training "
                "output directory")


def add_finetuned(p: argparse.ArgumentParser) -> argparse.Action:
    """``--finetuned PATH``: fine-tuned tokenreduce checkpoints next to the reference ``--checkpoint``."""
    return _add(p, "--finetuned", action="append", default=[], metavar="PATH",
                help="a fine-tuned tokenreduce checkpoint (file or training directory) evaluated with the spec it "
                "carries; repeatable (checkpoints of one spec make one row, mean and std over them); the reference's "
                "model, or it with another stem (timed and counted with that stem)")


def add_model(p: argparse.ArgumentParser | argparse._ArgumentGroup, *, default: str | None = DEFAULT_MODEL,
              note: str | None = None) -> argparse.Action:
    """``--model NAME``: a timm model name."""
    shown = f" (default: {default})" if default else ""
    return _add(p, "--model", action=_Given, default=default, metavar="NAME", note=note,
                help=f"timm model name{shown}")


def add_model_source(p: argparse.ArgumentParser) -> None:
    """The flags that build a model without a checkpoint: ``--model``, ``--hf-config``, ``--img-size``,
    ``--pretrained``, ``--weights``."""
    add_model(p)
    _add(p, "--hf-config", metavar="PATH|NAME",
         help="a transformers model instead of --model: a folder holding config.json (as save_pretrained writes "
         "it; --pretrained loads its weights) or a built-in config (vit-tiny, deit-tiny, dinov2-tiny, clip-tiny, "
         "siglip2-tiny, vit-small); a SigLIP 2 tower is fed its images patchified as its processor does it; "
         "needs the hf extra")
    add_img_size(p)
    add_pretrained(p)
    add_weights(p)


def add_img_size(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> argparse.Action:
    return _add(p, "--img-size", type=int, metavar="N",
                help="input resolution, a multiple of the patch size (default: the model's)")


def add_pretrained(p: argparse.ArgumentParser | argparse._ArgumentGroup, *,
                   default: bool | None = False) -> argparse.Action:
    return _add(p, "--pretrained", action="store_true", default=default,
                help="timm's pretrained weights (needs the Hugging Face hub; HF_HUB_OFFLINE=1 fails fast offline)")


def add_weights(p: argparse.ArgumentParser) -> argparse.Action:
    """``--weights PATH``: a foreign state_dict for the timm model (never a tokenreduce checkpoint)."""
    return _add(p, "--weights", metavar="PATH",
                help="a local state_dict (.safetensors, .pth, .pt) to load into the --model timm model; a "
                "tokenreduce checkpoint goes to --checkpoint")


def add_batch_size(p: argparse.ArgumentParser | argparse._ArgumentGroup, *, default: int | None,
                   note: str) -> argparse.Action:
    """``--batch-size N``: the batch of the command's main work, ``note`` says which."""
    shown = f" (default: {default})" if default is not None else ""
    return _add(p, "--batch-size", type=int, default=default, metavar="N", help=f"batch size: {note}{shown}")


def add_eval_batch_size(p: argparse.ArgumentParser | argparse._ArgumentGroup, *,
                        default: int | None) -> argparse.Action:
    shown = f" (default: {default})" if default is not None else ""
    return _add(p, "--eval-batch-size", type=int, default=default, metavar="N",
                help=f"batch size for the task's metric{shown}")


def add_threads(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> argparse.Action:
    """``--threads N``: one default everywhere, torch's own (None until the command runs)."""
    return _add(p, "--threads", type=int, metavar="N", help=f"torch CPU threads (default: {THREADS_DEFAULT})")


def add_out_dir(p: argparse.ArgumentParser | argparse._ArgumentGroup, *, default: str | None,
                note: str | None = None) -> argparse.Action:
    """``--out DIR``: always a folder."""
    shown = f" (default: {default})" if default else ""
    return _add(p, "--out", action=_OutDir, default=default, metavar="DIR", note=note,
                help=f"output folder{shown}")


def add_results(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> argparse.Action:
    return _add(p, "--results", metavar="PATH", help="also write a results JSON file here (metrics, command, versions)")


def add_data(p: argparse.ArgumentParser | argparse._ArgumentGroup, *, note: str | None = None,
             download: bool = True, download_default: bool | None = False) -> None:
    """``--data``, ``--data-dir`` and (``download``) ``--download``: the dataset to read."""
    _add(p, "--data", metavar="NAME_OR_DIR", note=note,
         help="dataset: fashion_mnist, a directory of Fashion-MNIST idx files, or an image folder "
         "ROOT/{train,val}/<class>/<image>")
    _add(p, "--data-dir", metavar="DIR", help="where a named dataset's files are")
    if download:
        _add(p, "--download", action="store_true", default=download_default,
             help="fetch a missing named dataset (network)")


def add_seed(p: argparse.ArgumentParser | argparse._ArgumentGroup, *, default: int | None = 0, of: str = "",
             shown: str | None = None) -> argparse.Action:
    """``--seed N``: the run's random seed (``of``: what it draws; ``shown``: the default in words)."""
    shown = shown or str(default)
    return _add(p, "--seed", type=int, default=default, metavar="N", help=f"random seed{of} (default: {shown})")


def add_seeds(p: argparse.ArgumentParser, *, default: str | None, note: str | None = None) -> argparse.Action:
    shown = f" (default: {default})" if default else ""
    return _add(p, "--seeds", default=default, metavar="A,B", note=note,
                help=f"seeds of the stochastic methods, each run once per seed{shown}")


def add_device(p: argparse.ArgumentParser | argparse._ArgumentGroup, *, default: str | None = None,
               note: str | None = None) -> argparse.Action:
    """``--device``: where the model runs; None (the default) is resolved when the command runs
    (precision.prepare_device: cuda when torch sees one, else cpu; TF32 on for float32 matmuls on CUDA)."""
    shown = default or "cuda if available, else cpu"
    return _add(p, "--device", default=default, note=note,
                help=f"cpu, cuda[:i] or mps (default: {shown}; on CUDA float32 matmuls use TF32)")


def add_amp(p: argparse.ArgumentParser | argparse._ArgumentGroup, *, default: str | None = "off",
            note: str | None = None) -> argparse.Action:
    """``--amp``: autocast the model's forward to bf16 or fp16 (training: fp16 with a GradScaler)."""
    shown = f" (default: {default})" if default else ""
    return _add(p, "--amp", default=default, choices=AMP_CHOICES, note=note,
                help=f"autocast the forward to bfloat16 or float16, weights kept in float32; training in fp16 "
                f"scales the loss (GradScaler){shown}")


def add_backend(p: argparse.ArgumentParser) -> argparse.Action:
    """``--backend``: how every timed case runs (bench/backends.py)."""
    return _add(p, "--backend", default="eager", choices=BACKENDS,
                help="how every timed case runs: eagerly, torch.compile'd (compiled before timing), or exported "
                "to ONNX and run by onnxruntime on the CPU in float32 (default: %(default)s)")


def add_timing(p: argparse.ArgumentParser, defaults: dict[str, int]) -> None:
    """``--warmup`` and ``--repeats``: the rounds of a timing run (``defaults``' values shown)."""
    _add(p, "--warmup", type=int, metavar="N", help=f"untimed rounds (default: {defaults['warmup']})")
    _add(p, "--repeats", type=int, metavar="N", help=f"timed rounds (default: {defaults['repeats']})")


def add_quick(p: argparse.ArgumentParser, note: str) -> argparse.Action:
    return _add(p, "--quick", action="store_true", help=f"smoke settings, seconds long, numbers are rough: {note}")


def add_budgets(p: argparse.ArgumentParser, note: str) -> argparse.Action:
    return _add(p, "--budgets", metavar="X,Y", help=f"target speed-ups, e.g. 1.5,2: one spec per training-free "
                f"method and target; {note}")


#: Every ``add_*`` above, for the tests and for readers: the whole vocabulary.
ADDERS: tuple[Callable[..., Any], ...] = (
    add_spec, add_checkpoint, add_finetuned, add_model, add_model_source, add_img_size, add_pretrained, add_weights,
    add_batch_size, add_eval_batch_size, add_threads, add_out_dir, add_results, add_data, add_seed, add_seeds,
    add_device, add_amp, add_backend, add_timing, add_quick, add_budgets,
)
