"""Results files and tables: provenance, a plain-text table, atomic JSON.

Every results file records how it was made (command, git revision, versions, machine, dtype,
batch sizes, seed), so that any figure we print can be reproduced. :func:`provenance` is the one
builder of that record, used by every writer (train's metrics and run JSON, eval, demo, bench,
experiment); :func:`read_provenance` reads it back from any results file, older shapes included, and
:func:`revision_gap` says whether it names a clean commit.
"""

from __future__ import annotations

import fnmatch
import io
import json
import math
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import timm
import torch

import tokenreduce

from ..core.errors import TokenReduceError
from ..models.checkpoint import atomic_write

#: The fixed metric names used in results files.
METRICS = ("img_per_s", "latency_ms", "macs", "tokens_per_block", "speedup")


@dataclass(frozen=True)
class Range:
    """The values a metric may take: a number in [``low``, ``high``] (above ``low`` when ``above``), an
    integer when ``integer``; a list (tokens per block) when each of its entries is."""

    low: float
    high: float = math.inf
    above: bool = False
    integer: bool = False

    def text(self) -> str:
        what = "an integer" if self.integer else "a number"
        if self.high == math.inf:
            return f"{what} {'>' if self.above else '>='} {self.low:g}"
        return f"{what} in [{self.low:g}, {self.high:g}]"

    def holds(self, value: Any) -> bool:
        if isinstance(value, list):
            return all(self.holds(v) for v in value)
        if not finite_number(value):
            return False
        if self.integer and not float(value).is_integer():
            return False
        return (value > self.low if self.above else value >= self.low) and value <= self.high


PERCENT, POSITIVE, COUNT = Range(0, 100), Range(0, above=True), Range(0, integer=True)
#: The range of each metric results files and run records hold (fnmatch patterns, the first match decides;
#: a name none matches, such as a loss term, is checked only for being a finite number where it is read).
#: A training's wall time is rounded to 0.1 s, so a few-step smoke on a fast machine records 0.0.
RANGES = (
    ("*_drop", Range(-100, 100)), ("top1", PERCENT), ("map", PERCENT), ("map_*", PERCENT), ("p@*_*", PERCENT),
    ("miou*", PERCENT), ("pixel_acc", PERCENT), ("train_*acc", PERCENT),
    ("img_per_s", POSITIVE), ("latency_ms", POSITIVE), ("macs", POSITIVE), ("gmacs", POSITIVE),
    ("speedup", POSITIVE), ("*_speedup", POSITIVE), ("train_time_s", Range(0)), ("loss", Range(0)),
    ("tokens_per_block", COUNT), ("n", COUNT), ("n_*", COUNT), ("epochs", COUNT), ("steps", COUNT),
    ("bits", COUNT), ("batch_size", COUNT), ("batch", COUNT), ("world_size", COUNT),
    ("spearman", Range(-1, 1)), ("overlap", Range(0, 1)),
)


def finite_number(v: Any) -> bool:
    """Whether ``v`` is a finite int or float (a bool is not a number here)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def metric_range(name: str) -> Range | None:
    """The declared :data:`RANGES` entry of the metric ``name``; None for a name without one."""
    return next((r for pattern, r in RANGES if fnmatch.fnmatchcase(name, pattern)), None)


def git_revision() -> str | None:
    """``<commit>`` (with ``-dirty`` for uncommitted changes) of the checkout this package runs from."""
    here = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


#: The keys every provenance record holds (a writer adds its own settings beside them). The revision is
#: under ``git`` (as most committed results have it); files written before it was settled say ``git_revision``.
PROVENANCE_KEYS = ("command", "git", "tokenreduce", "torch", "timm", "python", "platform", "cpu", "cpu_count", "device",
                   "gpu", "threads", "dtype", "batch_sizes", "seed")


def provenance(
    *, argv: Sequence[str] | None = None, threads: int | None = None, dtype: str = "float32",
    device: str = "cpu", batch_sizes: Sequence[int] = (), seed: int | None = None, **extra: Any,
) -> dict[str, Any]:
    """What a results file needs to be reproduced (:data:`PROVENANCE_KEYS`): command, revision,
    versions, machine, settings (on CUDA: the GPUs, CUDA, cuDNN and driver versions and TF32,
    precision.device_info; None on the CPU); ``extra``: the writer's own settings."""
    from ..models.precision import device_info

    info = {
        "command": command_text(argv if argv is not None else sys.argv),
        "git": git_revision(),
        "tokenreduce": tokenreduce.__version__,
        "torch": torch.__version__,
        "timm": timm.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "device": device,
        "gpu": torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else None,
        **device_info(device),
        "threads": threads if threads is not None else torch.get_num_threads(),
        "dtype": dtype,
        "batch_sizes": list(batch_sizes),
        "seed": seed,
    }
    info.update(extra)
    return info


def command_text(argv: Sequence[str]) -> str:
    """``argv`` as one line, the program named ``tokenreduce`` however it was started (the entry point's or
    ``python -m tokenreduce.cli``'s path is a machine's path, not part of the command)."""
    argv = list(argv)
    if argv and (Path(argv[0]).name == "tokenreduce" or Path(argv[0]).as_posix().endswith(("tokenreduce/cli.py",
                                                                                              "tokenreduce/__main__.py"))):
        argv[0] = "tokenreduce"
    return " ".join(argv)


#: Older spellings of provenance keys in stored results -> the key they mean now.
_OLD_KEYS = {"git_revision": "git", "machine": "platform"}


def read_provenance(doc: dict[str, Any]) -> dict[str, Any]:
    """The provenance of a stored results document, in today's keys, whatever shape wrote it:
    ``doc['provenance']``; an older training run JSON's ``doc['run']``; or the versions an older
    training run spread into its metrics. ``git_revision`` reads as ``git``. Missing keys are absent."""
    found = doc.get("provenance") or doc.get("run") or (doc.get("metrics") or {}).get("provenance")
    if not found:
        metrics = doc.get("metrics") or doc
        found = {k: metrics[k] for k in ("git", "git_revision", "torch", "timm", "python", "machine", "cpu_count",
                                         "threads") if k in metrics}
    out = dict(found)
    for old, new in _OLD_KEYS.items():
        if old in out:
            out.setdefault(new, out.pop(old))
    if "command" not in out and isinstance(doc.get("command"), str):
        out["command"] = doc["command"]
    return out


def revision_gap(doc: dict[str, Any]) -> str:
    """What keeps a results document from naming the committed code that made it: "dirty" (a git revision
    ending ``-dirty``: made from uncommitted changes), "none" (no revision recorded: its ``provenance`` and its
    metrics' provenance name none), or "" (a clean commit)."""
    prov = doc.get("provenance") or {}
    inner = doc.get("metrics", {}).get("provenance", {}) if isinstance(doc.get("metrics"), dict) else {}
    revs = [str(r) for r in (prov.get("git_revision", prov.get("git")), inner.get("git")) if r]
    return "dirty" if any(r.endswith("-dirty") for r in revs) else "" if revs else "none"


#: A table column: (row key, header) or (row key, header, format): a ``str.format`` pattern such as
#: ``"{:.2f}"`` or a callable value -> text. Without a format, floats print with 3 decimals (1
#: from 10 up) and lists as their items joined by spaces.
Column = tuple[str, str] | tuple[str, str, str | Callable[[Any], str]]


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[Column]) -> str:
    """A plain-text table of ``rows``, one line per row; a missing value prints as '-'.

    Columns whose values are all numbers (or missing) are right-aligned, the others left-aligned.
    """
    def cell(v: Any, fmt: str | Callable[[Any], str] | None) -> str:
        if v is None or v == "":
            return "-"
        if fmt is not None:
            return fmt(v) if callable(fmt) else fmt.format(v)
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
        if isinstance(v, (list, tuple)):
            return " ".join(map(str, v))
        return str(v)

    cols = [(c[0], c[1], c[2] if len(c) > 2 else None) for c in columns]
    cells = [[cell(r.get(k), f) for k, _, f in cols] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (_, h, _) in enumerate(cols)]
    numeric = [all(_is_number(r.get(k)) for r in rows) for k, _, _ in cols]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True))

    out = [line([h for _, h, _ in cols]), line(["-" * w for w in widths])]
    out += [line(c) for c in cells]
    return "\n".join(s.rstrip() for s in out)


def _is_number(v: Any) -> bool:
    return v is None or v == "" or (isinstance(v, (int, float)) and not isinstance(v, bool))


def write_text(path: str | os.PathLike, text: str | bytes) -> Path:
    """Write ``text`` to ``path`` atomically (``models.checkpoint.atomic_write``: a temporary file in
    the same folder, then os.replace), so a reader never sees half a file and an interrupted run
    leaves the old one intact. Creates the folder. Returns the path."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, text.encode() if isinstance(text, str) else text)
    except OSError as e:
        reason = "a file is in the way" if isinstance(e, (FileExistsError, NotADirectoryError)) else e.strerror or e
        raise TokenReduceError(f"cannot write {path} ({reason}); choose another --out") from None
    return path


def write_figure(fig: Any, path: str | os.PathLike, dpi: int = 120, metadata: dict | None = None) -> Path:
    """Write the matplotlib figure ``fig`` as a PNG atomically (:func:`write_text`) and close it; ``metadata``:
    the PNG's text chunks (matplotlib's ``savefig``; ``{"Software": None}`` writes none)."""
    import matplotlib.pyplot as plt

    png = io.BytesIO()
    try:
        fig.savefig(png, format="png", dpi=dpi, metadata=metadata)
    finally:
        plt.close(fig)
    return write_text(path, png.getvalue())


def no_nan(v: Any) -> Any:
    """``v`` with every non-finite float (NaN, +-inf; in nested dicts, lists and tuples) replaced by None:
    JSON has no NaN or infinity, and a value that is not a number (a speed with no valid round) is
    missing, not a number to compute with."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: no_nan(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [no_nan(x) for x in v]
    return v


def write_json(path: str | os.PathLike, data: Any) -> Path:
    """Write ``data`` as indented, strict JSON (NaN and infinities written as null), atomically
    (:func:`write_text`)."""
    return write_text(path, json.dumps(no_nan(data), indent=2, allow_nan=False) + "\n")
