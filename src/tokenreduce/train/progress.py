"""Progress output of a training run (rank 0 only)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from tqdm import tqdm


class Progress:
    """tqdm bar on rank 0 when stderr is a terminal; otherwise (a log file) a line with the
    numbers :meth:`step` is given and the ETA every ``every`` steps, plus the epoch lines;
    nothing when quiet.

    The numbers are read every ``refresh`` steps only (:meth:`due`, the same steps on every rank,
    shown or not): reading them waits for the device, which the steps in between do not."""

    def __init__(self, total: int, initial: int, enabled: bool, quiet: bool, every: int = 50,
                 refresh: int = 10) -> None:
        if every % refresh:
            raise ValueError(f"every ({every}) must be a multiple of refresh ({refresh})")
        self.quiet = quiet or not enabled
        self.bar = None
        self.total, self.done, self.every, self.refresh = total, initial, every, refresh
        self.start, self.start_step = time.monotonic(), initial
        if enabled and not quiet and sys.stderr.isatty():
            self.bar = tqdm(total=total, initial=initial, dynamic_ncols=True, unit="step", leave=True)

    def due(self) -> bool:
        """Whether the coming :meth:`step` reads its numbers (on every rank alike)."""
        return (self.done + 1) % self.refresh == 0

    def step(self, post: Callable[[], dict[str, Any]]) -> None:
        """One step done; ``post()`` (the numbers to show) is called only when due and shown."""
        due = self.due()
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
            if due:
                self.bar.set_postfix(post(), refresh=False)
        elif not self.quiet and self.done % self.every == 0:
            rate = (time.monotonic() - self.start) / max(1, self.done - self.start_step)
            eta = rate * (self.total - self.done)
            stats = " ".join(f"{k} {v}" for k, v in post().items())
            self.write(f"step {self.done}/{self.total} {stats} | {rate:.2f} s/step, ETA {eta / 60:.1f} min")

    def write(self, line: str) -> None:
        if self.quiet:
            return
        if self.bar is not None:
            self.bar.write(line)
        else:
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
