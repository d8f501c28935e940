"""Reference checkpoints shipped inside the package, so a fresh clone evaluates without training.

A shipped reference ``NAME`` is three files in ``tokenreduce/references/``:

- ``NAME.safetensors``: the checkpoint itself (weights + metadata, as ``tokenreduce train`` writes it);
- ``NAME.json``: its human-readable sidecar (the checkpoint's metadata);
- ``NAME.reference.json``: where it came from: the SHA-256 of the safetensors file, the recipe and
  the exact command that trained it, its metrics, the training time and the machine.

:func:`shipped` checks the file against the recorded SHA-256 before handing it out: a damaged or
replaced file is a CheckpointError, never a silently different reference. :func:`ship` writes the
three files from a finished training run (what the maintainers run once after training).
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
from pathlib import Path
from typing import Any

import timm
import torch

from .checkpoint import CheckpointError, atomic_write, read_meta, resolve, sidecar_path

#: Where shipped references live (package data).
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "references"


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def provenance_path(name: str, root: Path = SHIPPED_DIR) -> Path:
    return root / f"{name}.reference.json"


def list_shipped(root: Path = SHIPPED_DIR) -> list[str]:
    return sorted(p.name[: -len(".reference.json")] for p in root.glob("*.reference.json"))


def shipped_provenance(name: str, root: Path = SHIPPED_DIR) -> dict[str, Any] | None:
    """The provenance record of shipped reference ``name``, or None when none is shipped."""
    path = provenance_path(name, root)
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def shipped(name: str, root: Path = SHIPPED_DIR) -> Path | None:
    """The shipped checkpoint of ``name`` after its SHA-256 check, or None when none is shipped."""
    record = shipped_provenance(name, root)
    if record is None:
        return None
    path = root / record["file"]
    if not path.is_file():
        raise CheckpointError(f"shipped reference {name!r}: {path} is missing (reinstall the package)")
    digest = file_sha256(path)
    if digest != record["sha256"]:
        raise CheckpointError(f"shipped reference {name!r}: {path} has SHA-256 {digest}, its record says "
                              f"{record['sha256']} (the file is damaged or was replaced; reinstall the package)")
    return path


def ship(run: str | Path, name: str, *, command: str, root: Path = SHIPPED_DIR,
         extra: dict[str, Any] | None = None) -> Path:
    """Copy the finished training run ``run`` (a directory or its model.safetensors) into ``root`` as
    reference ``name`` with its provenance record; returns the record's path."""
    src = resolve(run)
    meta = read_meta(src)
    metrics_file = src.parent / "metrics.json"
    metrics = json.loads(metrics_file.read_text()) if metrics_file.is_file() else meta.get("metrics", {})
    root.mkdir(parents=True, exist_ok=True)
    dst = root / f"{name}.safetensors"
    shutil.copyfile(src, dst)
    if sidecar_path(src).is_file():
        shutil.copyfile(sidecar_path(src), sidecar_path(dst))
    record = {
        "name": name, "file": dst.name, "sha256": file_sha256(dst), "bytes": dst.stat().st_size,
        "recipe": meta.get("config", {}).get("recipe") or meta.get("recipe"), "command": command,
        "metrics": metrics, "model": meta.get("model"), "data": meta.get("data"), "classes": meta.get("classes"),
        "trained_with": {"torch": torch.__version__, "timm": timm.__version__, "python": platform.python_version(),
                         "machine": platform.machine(), "processor": platform.processor() or None},
        **(extra or {}),
    }
    return atomic_write(provenance_path(name, root), (json.dumps(record, indent=2, sort_keys=True) + "\n").encode())


__all__ = ["SHIPPED_DIR", "file_sha256", "list_shipped", "ship", "shipped", "shipped_provenance"]
