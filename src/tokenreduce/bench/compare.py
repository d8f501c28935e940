"""Specs against the unpatched model on one model, in one interleaved run (``tokenreduce bench``).

The rows: the unpatched model, a control (a patched model that reduces nothing; its speed-up is
the patch overhead), each spec and, with ``match_random``, per spec the matched random pruner
(``speed.matched_random``: identical per-block token counts, no scoring cost). Each row gets
analytic MACs and tokens per block (``macs.count_macs``), the ``measure_speed`` results, and for
a spec with a matched pruner

    ratio_vs_random   = median over rounds of img_per_s(spec) / img_per_s(matched random)
    latency_vs_random = median over rounds of latency(matched random) / latency(spec)   (batch 1)

(about 1: the method's scoring costs nothing measurable; below 1: what its scoring costs).
With a ``stem`` (a method that needs another stem, e.g. ImagePiece's conv stem) two more kinds of row:
the unreduced model with that stem (``stem S``) and each spec on it (``spec [stem S]``), counted and timed
on that model against the same plain unpatched model, so a method's figures include its stem.
:func:`bench_document` is the whole run as ``tokenreduce bench`` makes it (its ``results.json``), for
the command and for a study's benches alike (:class:`BenchRequest`, the run a study declares, :func:`run_bench`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from ..adapters import hosts
from ..core.errors import TokenReduceError
from ..models.build import ModelSource, make_model
from ..models.stems import build_stem, canonical_stem
from .backends import get_backend
from .macs import count_macs, input_shape
from .report import format_table, provenance
from .settings import SPEED
from .speed import Case, matched_random, measure_speed, paired_ratio

#: The columns of the bench table, (row key, header) as ``report.format_table`` takes them.
COLUMNS = [
    ("label", "case"), ("gmacs", "GMACs"), ("img_per_s", "img/s"), ("img_per_s_iqr", "iqr"),
    ("latency_ms", "lat ms"), ("latency_ms_iqr", "iqr"), ("speedup", "speedup"),
    ("latency_speedup", "lat speedup"), ("ratio_vs_random", "vs random"), ("latency_vs_random", "lat vs random"),
]
#: the column a run on CUDA adds (bench/speed.py's peak allocated memory at batch B)
MEMORY_COLUMN = ("peak_mem_mib", "peak MiB")


def columns_for(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    """``columns`` (default :data:`COLUMNS`) and, where any row measured it (CUDA), the peak memory."""
    out = list(columns) or list(COLUMNS)
    return out + [MEMORY_COLUMN] if any(r.get("peak_mem_mib") is not None for r in rows) else out


def bench_text(result: dict[str, Any], columns: Sequence[tuple[str, str]] = ()) -> list[str]:
    """A bench document's table (:func:`columns_for` ``columns``) as the ``bench`` command prints it, in a
    markdown code block under the line that says what was timed how."""
    model, settings, prov = result["model"], result["settings"], result["provenance"]
    weights = f"the trained {model['reference']}" if model.get("reference") else "random weights"
    h, w = model["img_size"]
    said = (f"{model['name']} ({h}x{w}, {weights}), batch {settings['batch']} (latency: batch 1), "
            f"{settings['warmup']} warm-up + {settings['repeats']} timed rounds, {prov['threads']} threads, "
            f"{prov['device']} {prov['dtype']}, backend {settings.get('backend', 'eager')}")
    return [said, "", "```", format_table(result["results"], columns_for(result["results"], columns)), "```"]


def speedups_text(row: dict[str, Any] | None, vs_random: bool = False) -> str:
    """A bench row's speed-ups as "batch B / batch 1" to 2 decimals: against the unpatched model, or
    (``vs_random``) its matched random pruner; '' where the row lacks them."""
    b, one = ("ratio_vs_random", "latency_vs_random") if vs_random else ("speedup", "latency_speedup")
    return f"{row[b]:.2f} / {row[one]:.2f}" if row and row.get(b) is not None and row.get(one) is not None else ""


def with_stem(model: nn.Module, stem: str) -> tuple[str, nn.Module]:
    """(the canonical spec of ``stem``, a copy of the unpatched timm ``model`` with that stem in place of its
    patch embedding, freshly initialised; every other weight the same): the stem rows' model."""
    spec = canonical_stem(stem)  # an unknown stem fails naming the valid ones
    return spec, build_stem(spec, copy.deepcopy(model))


def bench_cases(model: nn.Module, specs: Sequence[str], control: str, match_random: bool,
                stem: str | None = None) -> list[dict[str, Any]]:
    """Rows to measure: unpatched, control, each spec and (optionally) its matched random pruner; with
    ``stem``, the model with that stem and each spec on it."""
    rows = [{"label": "unpatched", "kind": "unpatched", "spec": None},
            {"label": f"control {control}", "kind": "control", "spec": control}]
    for spec in specs:
        rows.append({"label": spec, "kind": "method", "spec": spec})
        if match_random:
            rows.append({"label": f"random~{spec}", "kind": "matched", "spec": matched_random(model, spec),
                         "matched_to": spec})
    if stem is not None:
        rows.append({"label": f"stem {stem}", "kind": "stem", "spec": None, "stem": stem})
        rows += [{"label": f"{spec} [stem {stem}]", "kind": "method+stem", "spec": spec, "stem": stem}
                 for spec in specs]
    labels = [r["label"] for r in rows]
    if len(set(labels)) != len(labels):
        raise TokenReduceError("each --spec must be given once")
    return rows


def bench_specs(model: nn.Module, specs: Sequence[str], *, control: str, match_random: bool = False,
                speed: dict[str, Any] | None = None, seed: int = 0,
                stem: tuple[str, nn.Module] | None = None,
                progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The rows (module docstring) for ``specs`` on the unpatched ``model`` (on its device and dtype).

    ``speed``: ``measure_speed`` keywords (batch, warmup, repeats, min_run_s, threads); ``stem``: (its spec,
    the unpatched model with it) for the stem rows.
    """
    rows = bench_cases(model, specs, control, match_random, stem[0] if stem else None)

    def host(row: dict[str, Any]) -> nn.Module:
        return stem[1] if stem and "stem" in row else model

    for row in rows:  # MACs from the compiled schedules; also rejects a bad spec before any timing
        with hosts.patched(host(row), row["spec"]):
            macs = count_macs(host(row))
        row.update(macs=macs.total, gmacs=macs.total / 1e9, tokens_per_block=macs.tokens_per_block)
    cases = [Case(r["label"], r["spec"], host(r) if "stem" in r else None) for r in rows]
    results = measure_speed(model, cases, seed=seed, progress=progress, **(speed or {}))
    by_label = {s.label: s for s in results}
    for row in rows:
        row.update({k: v for k, v in by_label[row["label"]].as_dict().items() if k not in ("label", "spec")})
    for row in rows:
        row["ratio_vs_random"] = row["latency_vs_random"] = None
        if row["kind"] == "method" and match_random:
            rnd = next(r for r in rows if r.get("matched_to") == row["spec"])
            # method speed-up / random speed-up, paired per round like the speed-ups themselves
            row["ratio_vs_random"] = paired_ratio(row["img_per_s_runs"], rnd["img_per_s_runs"])
            row["latency_vs_random"] = paired_ratio(rnd["latency_ms_runs"], row["latency_ms_runs"])
    return rows


def bench_document(model: nn.Module, specs: Sequence[str], *, model_info: dict[str, Any], settings: dict[str, Any],
                   control: str, match_random: bool, threads: int, backend: str, device: str, dtype: str,
                   seed: int, argv: Sequence[str] | None = None,
                   stem: tuple[str, nn.Module] | None = None, amp: str = "off", compile_mode: str = "default",
                   progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """``tokenreduce bench``'s results document: :func:`bench_specs` on the unpatched ``model`` (already
    on ``device`` and ``dtype``; every forward autocast to ``amp``, precision.autocast) with ``settings``
    (batch, warmup, repeats, min_run_s), plus provenance, the model (``model_info`` with its input size and
    parameter count) and the settings."""
    from ..models.precision import autocast

    with autocast(device, amp):
        rows = bench_specs(model, specs, control=control, match_random=match_random,
                           speed={**settings, "threads": threads, "backend": backend, "compile_mode": compile_mode},
                           seed=seed, stem=stem,
                           progress=progress)
    h, w = input_shape(model)[1:]
    return {
        "provenance": provenance(argv=argv, threads=threads, dtype=dtype, device=device, amp=amp,
                                 batch_sizes=[settings["batch"], 1], seed=seed, backend=backend,
                                 **({"compile_mode": compile_mode} if backend == "compile" else {}),
                                 **get_backend(backend).versions()),
        "model": {**model_info, "img_size": [h, w], "params": sum(p.numel() for p in model.parameters())},
        "settings": {**settings, "control": control, "match_random": match_random, "backend": backend,
                     **({"compile_mode": compile_mode} if backend == "compile" else {}),
                     **({"stem": stem[0]} if stem else {})},
        "results": rows,
    }


@dataclass(frozen=True)
class BenchRequest:
    """``tokenreduce bench`` as its flags give it, and a bench as a study declares it (study/grid.py): ``specs``
    against the unpatched model of ``source`` (its checkpoint's reducer left out; random weights drawn from the
    seed where it names none) and the ``control`` in one interleaved run; ``speed``: the timing flags (the rest as
    ``settings.SPEED``), backend, compile_mode, dtype, seed; ``reference``: the checkpoint as it was named (a file
    or a trained recipe), which the results name; ``stem``: also timed with this stem in place of the patch
    embedding."""

    source: ModelSource
    specs: tuple[str, ...]
    control: str
    match_random: bool
    speed: dict[str, Any]
    argv: tuple[str, ...]
    reference: str | None = None
    stem: str | None = None


def run_bench(req: BenchRequest, *, threads: int, device: str, amp: str = "off",
              progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """``req``'s results document (:func:`bench_document`) on ``threads`` threads and ``device``."""
    import torch

    speed = {"backend": "eager", "compile_mode": "default", "dtype": "float32", "seed": 0, **SPEED, **req.speed}
    backend, compile_mode = speed.pop("backend"), speed.pop("compile_mode")
    dtype, seed = speed.pop("dtype"), speed.pop("seed")
    torch.manual_seed(seed)
    source, built = req.source, make_model(req.source)
    built.model.to(device, getattr(torch, dtype))
    config = built.config or {}
    info = {"name": config.get("name", source.hf_config), "kwargs": config.get("kwargs", {}),
            "pretrained": source.pretrained or bool((source.config or {}).get("pretrained")),
            "reference": req.reference, **({"weights": str(source.weights)} if source.weights else {})}
    return bench_document(built.model, req.specs, model_info=info, settings=speed, control=req.control,
                          match_random=req.match_random, threads=threads, backend=backend, device=device, dtype=dtype,
                          seed=seed, argv=list(req.argv), stem=with_stem(built.model, req.stem) if req.stem else None,
                          amp=amp, compile_mode=compile_mode, progress=progress)
