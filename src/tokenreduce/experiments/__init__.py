"""Runnable experiments: one module per published claim or reviewer's falsifier (experiments/base.py).

Importing this package registers the built-in experiments.
"""

# the built-in experiments register themselves on import (one line each)
from . import bspf_symmetry, cropr_diagnostics, recall_at_kept  # noqa: F401
from .base import (
    Experiment,
    RunContext,
    build_experiment,
    get_experiment,
    list_experiments,
    register_experiment,
)

__all__ = ["Experiment", "RunContext", "build_experiment", "get_experiment", "list_experiments",
           "register_experiment"]
