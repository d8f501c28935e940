"""Runnable experiments and studies: one module per published claim or reviewer's falsifier
(experiments/base.py), and studies, controlled comparisons of arms over a grid (experiments/study.py), one
module each under experiments/studies/.

Importing this package registers the built-in experiments and studies.
"""

# the built-in experiments and studies register themselves on import (one module each)
from . import (  # noqa: F401
    bspf_symmetry,
    cropr_diagnostics,
    oracle_at_counts,
    recall_at_kept,
    studies,
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
    REFERENCE,
    Arm,
    Axis,
    Bed,
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

__all__ = ["REFERENCE", "Arm", "Axis", "Bed", "Bench", "BenchTable", "Col", "Expect", "Experiment", "Measure", "Probe",
           "RunContext", "Smoke", "Study", "Testbed", "build_experiment", "get_experiment", "get_study",
           "list_experiments", "list_studies", "register_experiment", "register_study"]
