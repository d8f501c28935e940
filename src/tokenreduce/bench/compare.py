"""Specs against the unpatched model on one model, in one interleaved run (``tokenreduce bench``).

The rows: the unpatched model, a control (a patched model that reduces nothing; its speed-up is
the patch overhead), each spec and, with ``match_random``, per spec the matched random pruner
(``speed.matched_random``: identical per-block token counts, no scoring cost). Each row gets
analytic MACs and tokens per block (``macs.count_macs``), the ``measure_speed`` results, and for
a spec with a matched pruner

    ratio_vs_random   = median over rounds of img_per_s(spec) / img_per_s(matched random)
    latency_vs_random = median over rounds of latency(matched random) / latency(spec)   (batch 1)

(about 1: the method's scoring costs nothing measurable; below 1: what its scoring costs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from ..adapters import hosts
from ..core.errors import TokenReduceError
from .macs import count_macs
from .speed import Case, matched_random, measure_speed, paired_ratio


def bench_cases(model: nn.Module, specs: Sequence[str], control: str, match_random: bool) -> list[dict[str, Any]]:
    """Rows to measure: unpatched, control, each spec and (optionally) its matched random pruner."""
    rows = [{"label": "unpatched", "kind": "unpatched", "spec": None},
            {"label": f"control {control}", "kind": "control", "spec": control}]
    for spec in specs:
        rows.append({"label": spec, "kind": "method", "spec": spec})
        if match_random:
            rows.append({"label": f"random~{spec}", "kind": "matched", "spec": matched_random(model, spec),
                         "matched_to": spec})
    labels = [r["label"] for r in rows]
    if len(set(labels)) != len(labels):
        raise TokenReduceError("each --spec must be given once")
    return rows


def bench_specs(model: nn.Module, specs: Sequence[str], *, control: str, match_random: bool = False,
                img_size: int | None = None, speed: dict[str, Any] | None = None, seed: int = 0,
                progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The rows (module docstring) for ``specs`` on the unpatched ``model`` (on its device and dtype).

    ``speed``: ``measure_speed`` keywords (batch, warmup, repeats, min_run_s, threads).
    """
    rows = bench_cases(model, specs, control, match_random)
    for row in rows:  # MACs from the compiled schedules; also rejects a bad spec before any timing
        with hosts.patched(model, row["spec"]):
            macs = count_macs(model, img_size)
        row.update(macs=macs.total, gmacs=macs.total / 1e9, tokens_per_block=macs.tokens_per_block)
    results = measure_speed(model, [Case(r["label"], r["spec"]) for r in rows], img_size=img_size, seed=seed,
                            progress=progress, **(speed or {}))
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
