"""Progress output of a training run (rank 0 only)."""

from __future__ import annotations

import sys
import time
from typing import Any

from tqdm import tqdm


class Progress:
    """tqdm bar on rank 0 when stderr is a terminal; otherwise (a log file) a line with the
    numbers given to :meth:`step` and the ETA every ``every`` steps, plus the epoch lines;
    nothing when quiet."""

    def __init__(self, total: int, initial: int, enabled: bool, quiet: bool, every: int = 50) -> None:
        self.quiet = quiet or not enabled
        self.bar = None
        self.total, self.done, self.every = total, initial, every
        self.start, self.start_step = time.monotonic(), initial
        if enabled and not quiet and sys.stderr.isatty():
            self.bar = tqdm(total=total, initial=initial, dynamic_ncols=True, unit="step", leave=True)

    def step(self, **post: Any) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(post, refresh=False)
        elif not self.quiet and self.done % self.every == 0:
            rate = (time.monotonic() - self.start) / max(1, self.done - self.start_step)
            eta = rate * (self.total - self.done)
            stats = " ".join(f"{k} {v}" for k, v in post.items())
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
