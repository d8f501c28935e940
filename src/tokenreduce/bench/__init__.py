"""Benchmarks: analytic MACs (``macs``), same-run throughput and latency (``speed``), provenance and
results files (``report``)."""

from .macs import BlockMacs, MacsReport, count_macs, flop_counter_macs, input_shape, register_scoring_cost
from .report import METRICS, format_table, provenance, write_json
from .speed import Case, SpeedResult, matched_random, measure_speed

__all__ = [
    "METRICS", "BlockMacs", "Case", "MacsReport", "SpeedResult", "count_macs", "flop_counter_macs",
    "format_table", "input_shape", "matched_random", "measure_speed", "provenance", "register_scoring_cost",
    "write_json",
]
