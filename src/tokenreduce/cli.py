"""The ``tokenreduce`` command line. Each subcommand lives in ``tokenreduce.commands.<name>`` and
exposes ``register(subparsers)``, which adds its parser and sets ``func(args) -> int``.

Methods are addressed only by spec strings like ``'evit(keep=0.7, locs=(3, 6, 9))'``. Every flag two
commands share is declared once, with one meaning, in ``tokenreduce.commands.vocab``. Building the parser
imports no torch (command modules import it inside ``run``), so ``--help`` answers at once.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from .core.errors import TokenReduceError

#: Subcommand modules under tokenreduce.commands, in the order --help lists them.
COMMANDS = ("list", "inspect", "bench", "export", "train", "eval", "experiment", "study", "report", "visualize", "demo")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tokenreduce",
        description="Token reduction for timm Vision Transformers: apply a method by spec string, "
        "measure speed, MACs and accuracy.",
        epilog="Specs: name(key=value, ...), e.g. 'tome(r=13)', 'evit(keep=0.7, locs=(3, 6, 9))', 'ctp()'. "
        "Run 'tokenreduce list' for the methods and their parameters.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"tokenreduce.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    args.argv = ["tokenreduce", *argv]  # the command as typed, for results' provenance
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    # Only the user-error family becomes a one-line message: anything else is a bug of ours and keeps
    # its traceback, so that it is reported rather than taken for bad input.
    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # inside the try: a reader gone since the last write is met here, not at exit
        return status
    except TokenReduceError as e:
        print(f"tokenreduce {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"tokenreduce {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _closed_stdout()


#: Exit status when the reader of stdout went away (``... | head -1``): 128 + SIGPIPE, what the shell reports for
#: a program that SIGPIPE ended, as 130 is 128 + SIGINT.
BROKEN_PIPE = 141


def _closed_stdout() -> int:
    """Quietly end a command whose stdout reader closed the pipe: Python's documented idiom (the signal module's
    note on SIGPIPE) points stdout at devnull so that the flush at exit raises no second BrokenPipeError."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # a stdout without a file descriptor (captured): nothing is flushed to a pipe
        pass
    finally:
        os.close(devnull)
    return BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
