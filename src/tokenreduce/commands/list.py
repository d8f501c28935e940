"""``tokenreduce list``: the registered methods, their parameters and defaults."""

from __future__ import annotations

import argparse
import dataclasses
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("list", help="list the token-reduction methods and their parameters")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..core.method import get_method, list_methods

    for name in list_methods():
        cls = get_method(name)
        params = ", ".join(f"{f.name}={f.default!r}" for f in dataclasses.fields(cls.Config))
        doc = (sys.modules[cls.__module__].__doc__ or "").strip()
        print(f"{name}({params})")
        print(f"    {doc.splitlines()[0] if doc else ''}")
    return 0
