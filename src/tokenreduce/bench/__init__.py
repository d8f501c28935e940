"""Benchmarks: analytic MACs (``macs``), same-run throughput and latency (``speed``), specs against
the unpatched model (``compare``, behind ``tokenreduce bench``), the task's metrics of many specs in
one run (``accuracy``), budget specs per target speed-up (``budgets``), the eval/demo pipeline
(``evaluation``), provenance, tables and atomic results files (``report``, ``pareto``). The models
measured come from ``models.make_model``."""

from .macs import BlockMacs, MacsReport, count_macs, flop_counter_macs, input_shape
from .report import METRICS, format_table, provenance, write_json
from .speed import Case, SpeedResult, matched_random, measure_speed

__all__ = [
    "METRICS", "BlockMacs", "Case", "MacsReport", "SpeedResult", "count_macs", "flop_counter_macs",
    "format_table", "input_shape", "matched_random", "measure_speed", "provenance", "write_json",
]
