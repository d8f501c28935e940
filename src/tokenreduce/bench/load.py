"""The machine's load around a timing run: a timing that shares its cores with other work reads slow for
the methods it happens to overlap, and its ratios against the unpatched model are no longer paired.

The output lock (train/lock.py) keeps the runs of one study or bench output apart; other work on the
machine it cannot stop, so a timing records the 1-minute load average (``os.getloadavg``) before and after
it, ``{"before": x, "after": y}`` in its record's provenance (``load_1min``), and says in one line when
either exceeds the threads it timed with (its own threads account for up to that many). None where the
system has no load average (Windows).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

#: The provenance key of a timing's load record (records written before it exist without it).
KEY = "load_1min"


def load_average() -> float | None:
    """The 1-minute load average (runnable processes, averaged), or None where there is none."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


@contextmanager
def watched(threads: int, log: Callable[[str], None]) -> Iterator[dict[str, float | None]]:
    """Around a timing with ``threads`` threads: yields ``{"before": x}``, which holds ``"after"`` too once the
    block ends; logs one ``warning:`` line when either exceeds ``threads`` (other work shared the cores)."""
    load = {"before": load_average()}
    yield load
    load["after"] = load_average()
    seen = [v for v in load.values() if v is not None]
    if seen and max(seen) > threads:
        log(f"warning: the machine was loaded during this timing (1-minute load average {load['before']} before, "
            f"{load['after']} after, above the {threads} thread{'s' if threads != 1 else ''} it used): other work "
            "shared its cores, so its speeds may read low; time again on an idle machine")
