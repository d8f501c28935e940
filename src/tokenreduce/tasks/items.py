"""Per-item results of an evaluation: what a metric is the mean of, one value per test item, in the
data's order, stored in a run record so that its intervals can include test-item sampling.

An evaluation asked for them (``Task.evaluate(..., items=True)``) returns ``metrics["items"]``: metric
name -> :func:`encode`\\ d values, e.g. ``{"top1": <1/0 per image>, "map_asym": <AP per query>}``; the
metric is 100 x the mean of its items. Encoded compactly (a record stays readable JSON, one line per
metric): booleans as packed bits, reals as float32, both base64.

    encode(values)      (n,) bool or float tensor / array -> {"dtype", "n", "data"}
    decode(entry)       -> (n,) float64 array (booleans as 0.0 / 1.0), each in [0, 1] or NaN (no value)
    metric_of(values)   the metric they decompose: 100 x the mean of the items that have a value
    record_items(doc, metric)       a run record's stored values of ``metric``, decoded (None: it holds none)
    item_pair(arm, base, metric)    two records' values of one metric, item for item
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import torch

from ..core.errors import TokenReduceError


def encode(values: torch.Tensor | np.ndarray) -> dict[str, Any]:
    """One metric's per-item values (n,): booleans (correct or not) or reals (an AP per query)."""
    a = values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else np.asarray(values)
    a = a.reshape(-1)
    if a.dtype == np.bool_:
        return {"dtype": "bool", "n": int(a.size), "data": base64.b64encode(np.packbits(a).tobytes()).decode()}
    return {"dtype": "float32", "n": int(a.size),
            "data": base64.b64encode(a.astype("<f4").tobytes()).decode()}


def decode(entry: dict[str, Any]) -> np.ndarray:
    """The (n,) values :func:`encode` stored, as float64."""
    try:
        raw, n, dtype = base64.b64decode(entry["data"]), int(entry["n"]), entry["dtype"]
    except (KeyError, TypeError, ValueError) as e:
        raise TokenReduceError(f"per-item results: not an encoded entry ({e})") from e
    if dtype == "bool":
        out = np.unpackbits(np.frombuffer(raw, dtype=np.uint8))[:n].astype(np.float64)
    elif dtype == "float32":
        if len(raw) % 4:
            raise TokenReduceError(f"per-item results: {len(raw)} bytes of float32 values (not a multiple of 4)")
        out = np.frombuffer(raw, dtype="<f4").astype(np.float64)
    else:
        raise TokenReduceError(f"per-item results: unknown dtype {dtype!r}; choose from bool, float32")
    if out.size != n:
        raise TokenReduceError(f"per-item results: {out.size} values stored, {n} declared")
    bad = out[(out < 0) | (out > 1)]
    if bad.size:
        raise TokenReduceError(f"per-item results: {bad.size} values outside [0, 1] (e.g. {bad[0]:g}); an item is "
                               "correct (1) or not (0), or a fraction such as a query's AP")
    return out


def metric_of(values: np.ndarray) -> float | None:
    """100 x the mean of ``values`` (decoded) over the items that have one (a NaN is an item without a value,
    e.g. a query with no relevant item); None when none has."""
    defined = values[~np.isnan(values)]
    return 100.0 * float(defined.mean()) if defined.size else None


def record_items(doc: dict[str, Any], metric: str) -> np.ndarray | None:
    """The per-item values of ``metric`` a run record stores (``doc["metrics"]["items"]``), decoded; None
    where it stores none."""
    metrics = doc.get("metrics")
    entry = metrics.get("items", {}).get(metric) if isinstance(metrics, dict) else None
    return decode(entry) if isinstance(entry, dict) else None


def item_pair(arm: dict[str, Any], base: dict[str, Any], metric: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The per-item ``metric`` values of two records of one seed, item for item; None where either holds none.
    Two records over different numbers of test items are an error (they cannot pair), naming both."""
    a, b = record_items(arm, metric), record_items(base, metric)
    if a is None or b is None:
        return None
    if len(a) != len(b):
        raise TokenReduceError(f"{arm.get('id')} and {base.get('id')}: {metric} over {len(a)} and {len(b)} test "
                               f"items; a paired contrast needs the same items in both records")
    return a, b
