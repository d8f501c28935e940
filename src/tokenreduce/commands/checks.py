"""Checks the subcommands run on their flags before any work starts, so that a bad value fails in a
second with one line rather than with a traceback, or after a whole evaluation has run."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..core.errors import TokenReduceError


def threads(n: int | None, flag: str = "--threads") -> None:
    """``n`` CPU threads: None (torch's default) or >= 1."""
    if n is not None and n < 1:
        raise TokenReduceError(f"{flag} must be >= 1, got {n}")


def resolve_threads(n: int | None, flag: str = "--threads") -> int:
    """``n`` checked, or torch's own default (``torch.get_num_threads()``) for None: what ``--threads``
    defaults to in every command."""
    threads(n, flag)
    if n is not None:
        return n
    import torch

    return torch.get_num_threads()


def device(name: str | None, here: bool = True) -> str | None:
    """``name`` if torch knows it and this machine has it (models.precision.resolve_device), else a TokenReduceError;
    None (``--device``'s default): cuda when torch sees one, else cpu. On CUDA, TF32 is enabled for float32
    matmuls (models.precision.prepare_device). ``here=False``, for a command that runs nothing here (``study
    --list``, ``--summarize``): the name is checked, not the machine, and None stays None."""
    from ..models.precision import prepare_device, resolve_device

    if not here:
        if name is not None:
            resolve_device(name, here=False)
        return name
    return prepare_device(name)


def writable_dir(path: str | os.PathLike, flag: str = "--out") -> Path:
    """The output directory ``path``, created now, after proving a file can be written there."""
    path = Path(path)
    _probe(path, f"{flag} {path}")
    return path


def writable_file(path: str | os.PathLike, flag: str = "--out") -> Path:
    """The output file ``path`` (written later, atomically, in its folder): its folder must take files and
    ``path`` must not be a directory."""
    path = Path(path)
    if path.is_dir():
        raise TokenReduceError(f"{flag} {path} is a directory; give a file name")
    _probe(path.parent, f"{flag} {path}: its folder {path.parent}")
    return path


def _probe(folder: Path, what: str) -> None:
    """Create ``folder`` and a temporary file in it (removed at once); a TokenReduceError naming ``what``
    if either fails."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        reason = "a file is in the way" if isinstance(e, (FileExistsError, NotADirectoryError)) else e.strerror or e
        raise TokenReduceError(f"{what} cannot be written ({reason})") from None
