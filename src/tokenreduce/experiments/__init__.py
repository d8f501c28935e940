"""Runnable experiments: one module per published claim or reviewer's falsifier (experiments/base.py).

Importing this package registers the built-in experiments.
"""

from .base import (
    Experiment,
    RunContext,
    build_experiment,
    get_experiment,
    list_experiments,
    register_experiment,
)

# the built-in experiments register themselves on import (one line each)

__all__ = ["Experiment", "RunContext", "build_experiment", "get_experiment", "list_experiments",
           "register_experiment"]
