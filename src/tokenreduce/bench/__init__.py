"""Benchmarks: analytic MACs (``macs``), same-run throughput and latency (``speed``), specs against
the unpatched model (``compare``, behind ``tokenreduce bench``), the task's metrics of many specs in
one run (``accuracy``), budget specs per target speed-up (``budgets``), the eval/demo pipeline
(``evaluation``), provenance, tables and atomic results files (``report``, ``pareto``). The models
measured come from ``models.make_model``."""

from __future__ import annotations

from ..core.lazy import lazy_exports

#: public name -> the module that defines it, loaded on first use (PEP 562), so that ``bench.settings``
#: (read by the command line's parsers) imports no torch.
_API = {
    **dict.fromkeys(("BlockMacs", "MacsReport", "count_macs", "flop_counter_macs", "input_shape"), ".macs"),
    **dict.fromkeys(("METRICS", "format_table", "provenance", "write_json"), ".report"),
    **dict.fromkeys(("Case", "SpeedResult", "matched_random", "measure_speed"), ".speed"),
}

__all__ = [
    "METRICS", "BlockMacs", "Case", "MacsReport", "SpeedResult", "count_macs", "flop_counter_macs",
    "format_table", "input_shape", "matched_random", "measure_speed", "provenance", "write_json",
]

__getattr__, __dir__ = lazy_exports(__name__, _API, globals())
