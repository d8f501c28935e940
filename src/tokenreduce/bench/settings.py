"""The benchmark's settings, declared once and read by everyone (the commands, eval and demo, the speed
and budget code, the studies). No torch: the command line reads them to build its parsers.
"""

from __future__ import annotations

#: A timing run: ``batch`` for throughput (latency is at batch 1), ``warmup`` untimed and ``repeats`` timed
#: rounds, each timed measurement repeating the forward until it lasts about ``min_run_s`` seconds.
SPEED = {"batch": 32, "warmup": 2, "repeats": 10, "min_run_s": 0.05}
#: ``--quick``: smoke settings, seconds long, the numbers rough.
QUICK = {"batch": 4, "warmup": 1, "repeats": 3, "min_run_s": 0.0}
#: The paired rounds that calibrate the budget rule 'measured' (bench/budgets.py): fewer than the final
#: measurement's, enough that the median of a spec's per-round ratios survives two rounds that other work slowed.
BUDGET_ROUNDS = {"warmup": 1, "repeats": 5}
#: A pick for a target speed-up is on target when its speed-up lies within this many x of the target
#: (bench/budgets.py): half the gap between adjacent targets (1.5x, 2x, 2.5x), so a pick on target is nearer
#: its own target than any other and the rows of two targets never overlap.
BAND = 0.25
#: ``--amp``: the forward's precision (models/precision.py maps each to its autocast dtype, a test holds the two
#: equal), the one spelling of these choices for the command line, TrainConfig and every runner.
AMP_CHOICES = ("bf16", "fp16", "off")
#: How a timed case runs (``--backend``; bench/backends.py holds one class per name), in this order.
BACKENDS = ("eager", "compile", "onnxruntime")
#: torch.compile's modes for the 'compile' backend (``--compile-mode``): reduce-overhead adds CUDA graphs (one
#: replay per forward: the launch-bound batch-1 latency's answer on a GPU), max-autotune searches kernels too.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
#: The ONNX exporters (``--exporter``; bench/export.py holds one function per name), the default first.
EXPORTERS = ("dynamo", "classic")
