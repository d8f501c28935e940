"""``tokenreduce list``: what spec strings can name - methods, tasks, stems and model transforms -
with their parameters and defaults, and the training recipes."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("list", help="list the token-reduction methods, tasks, stems, model transforms and recipes")
    p.set_defaults(func=run)


def _summary(obj: object) -> str:
    """The first line of the docstring of ``obj``'s module."""
    doc = (sys.modules[obj.__module__].__doc__ or "").strip()
    return doc.splitlines()[0] if doc else ""


def _section(title: str, names: list[str], describe: Callable[[str], tuple[str, str]]) -> None:
    print(title)
    for name in names:
        spec, doc = describe(name)
        print(f"  {spec}")
        if doc:
            print(f"      {doc}")


def run(args: argparse.Namespace) -> int:
    from ..core.method import format_spec, get_method, list_methods
    from ..models import list_stems, list_transforms
    from ..models.stems import canonical_stem
    from ..models.transforms import canonical_transform
    from ..tasks import get_task, list_tasks
    from ..train.recipes import RECIPES

    def method(name: str) -> tuple[str, str]:
        cls = get_method(name)
        defaults = {f.name: f.default for f in dataclasses.fields(cls.Config)}
        return format_spec(name, defaults), _summary(cls)

    def task(name: str) -> tuple[str, str]:
        cls = get_task(name)
        fields = dataclasses.fields(cls.Config) if dataclasses.is_dataclass(cls.Config) else ()
        return format_spec(name, {f.name: f.default for f in fields}), f"metric {cls.metric}; {_summary(cls)}"

    _section("methods (--spec):", list_methods(), method)
    _section("tasks (tokenreduce train --task):", list_tasks(), task)
    _section("stems (tokenreduce train --stem):", list_stems(), lambda n: (canonical_stem(n), ""))
    _section("model transforms (tokenreduce train --transform):", list_transforms(),
             lambda n: (canonical_transform(n), ""))
    _section("recipes (tokenreduce train --recipe):", list(RECIPES), lambda n: (n, RECIPES[n]["description"]))
    return 0
