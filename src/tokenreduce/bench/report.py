"""Results files and tables: provenance, a plain-text table, atomic JSON.

Every results file records how it was made (command, git revision, versions, machine, dtype,
batch sizes, seed), so that any figure we print can be reproduced.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: The fixed metric names used in results files.
METRICS = ("img_per_s", "latency_ms", "macs", "tokens_per_block", "speedup")


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


def provenance(
    *, argv: Sequence[str] | None = None, threads: int | None = None, dtype: str = "float32",
    device: str = "cpu", batch_sizes: Sequence[int] = (), seed: int | None = None, **extra: Any,
) -> dict[str, Any]:
    """What a results file needs to be reproduced: command, revision, versions, machine, settings."""
    import timm
    import torch

    import tokenreduce

    info = {
        "command": " ".join(argv if argv is not None else sys.argv),
        "git_revision": git_revision(),
        "tokenreduce": tokenreduce.__version__,
        "torch": torch.__version__,
        "timm": timm.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "device": device,
        "gpu": torch.cuda.get_device_name() if device.startswith("cuda") else None,
        "threads": threads if threads is not None else torch.get_num_threads(),
        "dtype": dtype,
        "batch_sizes": list(batch_sizes),
        "seed": seed,
    }
    info.update(extra)
    return info


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    """A plain-text table: ``columns`` lists (key, header); a missing value prints as '-'.

    Floats print with 3 significant decimals at most; numbers are right-aligned.
    """
    def cell(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
        return str(v)

    cells = [[cell(r.get(k)) for k, _ in columns] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (_, h) in enumerate(columns)]
    numeric = [all(_is_number(r.get(k)) for r in rows) for k, _ in columns]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True))

    out = [line([h for _, h in columns]), line(["-" * w for w in widths])]
    out += [line(c) for c in cells]
    return "\n".join(s.rstrip() for s in out)


def _is_number(v: Any) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def write_json(path: str | os.PathLike, data: Any) -> Path:
    """Write ``data`` as JSON atomically: a temporary file in the same folder, then os.replace,
    so a reader never sees half a file and an interrupted run leaves the old one intact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
