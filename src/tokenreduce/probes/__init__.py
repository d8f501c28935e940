"""Probes: registered experiments, one module per published claim or reviewer's falsifier (probes/base.py),
run alone by ``tokenreduce experiment`` and by the studies that call them. Importing this package registers
them."""

from . import (  # noqa: F401
    bspf_symmetry,
    cropr_diagnostics,
    oracle_at_counts,
    recall_at_kept,
)
from .base import (
    Experiment,
    ProbeRequest,
    RunContext,
    build_experiment,
    get_experiment,
    list_experiments,
    reading,
    register_experiment,
)

__all__ = ["Experiment", "ProbeRequest", "RunContext", "build_experiment", "get_experiment", "list_experiments",
           "reading", "register_experiment"]
