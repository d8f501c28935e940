"""Run records: the one reader of a study's run JSONs, and the paths they hold.

A run record (``<results>/runs/<id>.json``) is the only home of a number, so :func:`read_record` checks it whole
for the runner, ``tokenreduce study --summarize`` and ``tokenreduce report`` alike: of this study, bed, run, test bed,
kind and grid point; the metrics the tables and claims read finite; every value with a declared range
(bench/report.py ``RANGES``) in it; per-item results reproducing their metric. A record that fails is refused with a
:class:`RecordError` naming the file and the field; nothing is dropped or counted silently.

A record holds no machine paths: one under an anchor (the study's checkpoints, the cache, the shipped references)
is written from its token, ``{checkpoints}/<id>/...`` (:func:`relative`), and resolved where the study is now
(:func:`resolve`), so a copied study folder reads its own checkpoints; older records' paths are read as they are.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..bench.report import finite_number, metric_range
from ..core.errors import TokenReduceError
from ..tasks.items import decode, metric_of
from .declare import Study
from .plan import KINDS, Layout, plan

_AGAIN = "restore the record, or delete it to run that run again"

#: How far (in points) a metric may lie from 100 x the mean of its per-item results. Metrics are stored
#: unrounded but summed in float32, and the items are stored as float32 (or bits): in the committed records the
#: two differ by at most 3e-6 points. 1e-3 is far above that, yet below the weight of one item (100 / n points)
#: for any test set under 100 000 items and below the 0.01 the tables print: items of another run, or a metric
#: edited by hand, are refused.
ITEM_TOLERANCE = 1e-3


class RecordError(TokenReduceError):
    """A run record that cannot be read or does not describe the run its path says."""


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number (a record is written without NaN or infinities)")


def _load(path: Path) -> Any:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise RecordError(f"cannot read the run record {path}: {getattr(e, 'strerror', None) or e}") from None
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        what = "empty" if not text.strip() else f"{e.msg} at line {e.lineno} column {e.colno}"
        raise RecordError(f"{path} is not a valid run record (truncated, conflicted or hand-edited JSON: {what}); "
                          "restore it, or delete it to run that run again") from None
    except ValueError as e:
        raise RecordError(f"{path} is not a valid run record: {e}") from None


def read_record(path: str | os.PathLike, study: Study | None = None, *, units: dict[str, Any] | None = None
                ) -> dict[str, Any]:
    """The run record at ``path``, checked (module docstring) against ``study`` when given (else only that it
    is a JSON object); a :class:`RecordError` naming the file and the field otherwise. ``units``: the study's
    plan by run id, when the caller has it."""
    path = Path(path)
    doc = _load(path)
    if not isinstance(doc, dict):
        raise RecordError(f"{path} is not a run record: a JSON object was expected, it holds a {type(doc).__name__}")
    if study is None:
        return doc
    run = path.stem
    want = {"study": study.name, "bed": study.bed_name, "id": f"{study.key}/{run}", "run": run,
            "testbed": study.bed.describe()}
    for field, value in want.items():
        if doc.get(field) != value:
            raise RecordError(f"{path}: field {field!r} is {doc.get(field)!r}, not {value!r}: a record of another "
                              f"study, test bed or run (copied here?); delete it to run {run} of {study.key} again")
    kind = doc.get("kind")
    if kind not in KINDS:
        raise RecordError(f"{path}: field 'kind' is {kind!r}; valid kinds: {', '.join(KINDS)}")
    units = units if units is not None else {u.id: u for u in plan(study)}
    if run not in units:
        raise RecordError(f"{path}: {run!r} is not a run of study {study.key}{' (smoke)' if study.is_smoke else ''}; "
                          f"its runs: {', '.join(units)}")
    if units[run].kind != kind:
        raise RecordError(f"{path}: field 'kind' is {kind!r}, but {run} is a {units[run].kind} run of {study.key}")
    _check_coordinates(path, doc, units[run], {a.name: a.implicit for a in study.axes() if a.implicit is not None})
    if kind in ("train", "evaluate"):  # the arm tables and claims read their metrics
        metrics = doc.get("metrics")
        if not isinstance(metrics, dict):
            raise RecordError(f"{path}: field 'metrics' must be an object of the run's metrics, it is "
                              f"{'missing' if metrics is None else type(metrics).__name__}")
        claimed = [e.metric for e in study.expect if doc.get("arm") in (e.arm, e.baseline)]
        for name in dict.fromkeys([c.metric for c in study.columns] + [e.metric for e in study.expect]):
            if name in metrics and not finite_number(metrics[name]):
                raise RecordError(f"{path}: field 'metrics.{name}' is {metrics[name]!r}, not a finite number; {_AGAIN}")
            if name in claimed and name not in metrics:
                raise RecordError(f"{path}: field 'metrics.{name}' is missing; a claim of {study.key} reads it from "
                                  f"arm {doc.get('arm')!r}; {_AGAIN}")
        _check_ranges(path, "metrics", metrics)
        _check_items(path, metrics)
    elif not isinstance(doc.get("result"), dict):
        raise RecordError(f"{path}: field 'result' must be an object (the {kind}'s result), it is "
                          f"{type(doc.get('result')).__name__ if 'result' in doc else 'missing'}")
    else:
        rows = doc["result"].get("results")
        for i, row in enumerate(rows if isinstance(rows, list) else []):
            if isinstance(row, dict):
                _check_ranges(path, f"result.results[{i}]", row)
    return doc


def _check_coordinates(path: Path, doc: dict[str, Any], unit: Any, implicit: dict[str, Any]) -> None:
    """A run of the grid holds the grid point its id names (a record copied to another run's name with its
    ``id`` and ``run`` edited still says where it was made). ``implicit``: axis -> the value its id leaves out,
    which a record made before the axis existed does not name."""
    if unit.point is None:
        return
    want = unit.point.values
    point = doc.get("point")
    named = {**{k: v for k, v in implicit.items() if k in want}, **point} if isinstance(point, dict) else None
    if named != want:
        raise RecordError(f"{path}: field 'point' is {doc.get('point')!r}, not {want!r}: the record of another run "
                          f"(copied to this name?); {_AGAIN}")
    config = doc.get("config")
    if "seed" in want and isinstance(config, dict) and config.get("seed", want["seed"]) != want["seed"]:
        raise RecordError(f"{path}: field 'config.seed' is {config.get('seed')!r}, but {unit.id} is the run of seed "
                          f"{want['seed']}: the record of another run (copied to this name?); {_AGAIN}")
    if unit.evaluates and unit.needs and doc.get("evaluates") != unit.evaluates:
        raise RecordError(f"{path}: field 'evaluates' is {doc.get('evaluates')!r}, not {unit.evaluates!r}: the record "
                          f"of another run (copied to this name?); {_AGAIN}")


def _check_ranges(path: Path, field: str, values: dict[str, Any]) -> None:
    """Every value in ``values`` whose name has a declared range (bench/report.py ``RANGES``) lies in it."""
    for name, v in values.items():
        r = metric_range(name)
        if r is None or not (isinstance(v, list) or (isinstance(v, (int, float)) and not isinstance(v, bool))):
            continue
        if not r.holds(v):
            raise RecordError(f"{path}: field '{field}.{name}' is {v!r}, not {r.text()}; {_AGAIN}")


def _check_items(path: Path, metrics: dict[str, Any]) -> None:
    """Each per-item entry decodes and reproduces the metric it decomposes (within :data:`ITEM_TOLERANCE`)."""
    items = metrics.get("items")
    if items is None:
        return
    if not isinstance(items, dict):
        raise RecordError(f"{path}: field 'metrics.items' must be an object (metric -> its per-item results), it "
                          f"is {type(items).__name__}; {_AGAIN}")
    for name, entry in items.items():
        field = f"metrics.items.{name}"
        try:
            got = metric_of(decode(entry))
        except TokenReduceError as e:
            raise RecordError(f"{path}: field {field!r}: {e}; {_AGAIN}") from None
        claimed = metrics.get(name)
        if not finite_number(claimed):
            raise RecordError(f"{path}: field {field!r} decomposes metrics.{name}, which is {claimed!r}, not a "
                              f"finite number; {_AGAIN}")
        if got is None or abs(got - claimed) > ITEM_TOLERANCE:
            mean = "no item has a value" if got is None else f"100 x their mean is {got:.4f}"
            raise RecordError(f"{path}: field {field!r} does not reproduce metrics.{name} {claimed:.4f} ({mean}, "
                              f"tolerance {ITEM_TOLERANCE:g}): per-item results edited or of another run; {_AGAIN}")


def load_runs(layout: Layout, study: Study | None = None) -> dict[str, dict[str, Any]]:
    """Run id -> the checked record (:func:`read_record`) of every run JSON in ``layout`` (none: {})."""
    folder = layout.results / "runs"
    if not folder.is_dir():
        return {}
    units = {u.id: u for u in plan(study)} if study is not None else None
    return {p.stem: read_record(p, study, units=units) for p in sorted(folder.glob("*.json"))
            if not p.name.startswith(".")}


# ----------------------------------------------------------------------------- paths


def anchors(layout: Layout) -> dict[str, Path]:
    """Token -> the folder it stands for in a record's paths, most specific first."""
    from ..data.build import cache_dir
    from ..models.references import SHIPPED_DIR

    return {"{references}": SHIPPED_DIR, "{checkpoints}": Path(layout.checkpoints), "{study}": Path(layout.results),
            "{cache}": cache_dir()}


def relative(doc: dict[str, Any], layout: Layout) -> dict[str, Any]:
    """``doc`` (a record) with every path under an anchor (:func:`anchors`) written from its token: a string
    that is such a path (absolute or relative), and an absolute one inside a longer string (a command line)."""
    found = [(token, os.path.abspath(folder), re.compile(re.escape(os.path.abspath(folder)) + r"(?=[/\s'\"]|$)"))
             for token, folder in anchors(layout).items()]

    def one(v: str) -> str:
        if "/" not in v or v.startswith("{"):
            return v
        whole = os.path.abspath(v) if not any(c.isspace() for c in v) else ""
        for token, folder, _ in found:
            if (whole + "/").startswith(folder + "/"):
                return token + whole[len(folder):]
        for token, _, pattern in found:
            v = pattern.sub(token, v)
        return v

    return {k: v if k == "testbed" else _strings(v, one) for k, v in doc.items()}  # the bed's is compared as it is


def resolve(path: str, layout: Layout) -> str:
    """The path a record's ``path`` names here: its token replaced by the folder it stands for (the study's
    checkpoints as they are now); an older record's absolute or relative path unchanged."""
    for token, folder in anchors(layout).items():
        if path == token or path.startswith(token + "/"):
            return str(Path(folder) / path[len(token) + 1:])
    return path


def resolved(doc: Any, layout: Layout) -> Any:
    """``doc`` (a record, or a part of one) with every path written from a token (:func:`relative`) resolved
    here (:func:`resolve`): what a run that reads another run's record hands on."""
    return _strings(doc, lambda s: resolve(s, layout) if s.startswith("{") else s)


def _strings(doc: Any, change: Callable[[str], str]) -> Any:
    """``doc`` (nested dicts and lists) with ``change`` applied to each string in it."""
    if isinstance(doc, dict):
        return {k: _strings(v, change) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_strings(v, change) for v in doc]
    return change(doc) if isinstance(doc, str) else doc
