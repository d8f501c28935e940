"""Tasks: what a model is trained for (losses, owned heads, parameter groups) and how it is scored.

Addressed by spec strings like methods: ``build_task('classify')``, ``build_task('hash(bits=32)')``.
"""

from . import classify, eet, hash, segment  # noqa: F401  (registers the built-in tasks)
from .base import (
    Task,
    TaskContext,
    TaskOutput,
    build_task,
    dataset_labels,
    get_task,
    list_tasks,
    register_task,
)

__all__ = ["Task", "TaskContext", "TaskOutput", "build_task", "dataset_labels", "get_task", "list_tasks",
           "register_task"]
