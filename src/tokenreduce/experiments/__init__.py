"""Runnable experiments and studies: one module per published claim or reviewer's falsifier
(experiments/base.py), and studies, controlled comparisons of arms over a grid (experiments/study.py).

Importing this package registers the built-in experiments and studies.
"""

# the built-in experiments and studies register themselves on import (one module each)
from . import (  # noqa: F401
    bench_backends,
    bench_deit,
    bench_imagepiece,
    bspf_arms,
    bspf_symmetry,
    cropr_arms,
    cropr_diagnostics,
    eet_arms,
    fmnist_budget,
    hash_baseline,
    imagepiece_controls,
    oracle_at_counts,
    recall_at_kept,
    reference_fmnist,
    scenes_bench,
    scenes_bspf,
    scenes_cropr,
    scenes_eet,
    scenes_imagepiece,
)
from .base import (
    Experiment,
    RunContext,
    build_experiment,
    get_experiment,
    list_experiments,
    register_experiment,
)
from .study import (
    Arm,
    Axis,
    Bench,
    BenchTable,
    Col,
    Expect,
    Measure,
    Probe,
    Smoke,
    Study,
    get_study,
    list_studies,
    register_study,
)
from .testbed import Testbed

__all__ = ["Arm", "Axis", "Bench", "BenchTable", "Col", "Expect", "Experiment", "Measure", "Probe", "RunContext",
           "Smoke", "Study", "Testbed", "build_experiment", "get_experiment", "get_study", "list_experiments",
           "list_studies", "register_experiment", "register_study"]
