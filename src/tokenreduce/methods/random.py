"""random: drop tokens at random, the practical speed limit of any pruning schedule.

No paper; the honest floor every method is compared against (docs/methods.md, section "Random and top-k"). A random
pruner at the same per-block token counts as a method has the same shapes and no scoring cost.

The kept set is a fixed function of (seed, block): drawn once at ``bind`` and shared by every image
and every call, so outputs are reproducible and batch-invariant and the forward pays only a
gather. Change ``seed`` to measure the spread over random patterns.

Deviations: none (no reference implementation).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..core.method import AttnInfo, Host, Reducer, format_spec, register_method
from ..core.schedule import Schedule, Where, compile_schedule
from ..core.state import TokenState


@dataclass(frozen=True)
class RandomConfig:
    keep: float | None = None
    r: int | Sequence[int] | None = None
    counts: Sequence[int] | None = None
    locs: Sequence[int] | None = None
    where: Where = "attn"
    seed: int = 0


@register_method("random")
class RandomPrune(Reducer):
    """Keep a seeded random subset of ``count`` non-prefix tokens: x (B, N, C) -> (B, p + count, C)."""

    Config = RandomConfig
    zero = {"keep": 1.0, "locs": (0,)}
    example = {"keep": 0.5, "locs": (1, 2)}

    def bind(self, host: Host) -> Schedule:
        c = self.cfg
        sched = compile_schedule(
            host.num_patches, host.depth, self.name, where=self.where, keep=c.keep, r=c.r,
            counts=c.counts, locs=c.locs,
        )
        gen = torch.Generator().manual_seed(int(c.seed))
        # the whole index per block, prefix included, built once: the baseline pays for its token
        # counts and nothing else. Built (and moved, _moved) outside inference mode: a cached inference
        # tensor would make a later training forward fail ("Inference tensors cannot be saved for backward")
        self._keep: dict[int, Tensor] = {}
        with torch.inference_mode(False):
            prefix = torch.arange(host.num_prefix)
            prev = host.num_patches
            for block in sched.locs:
                count = sched.counts[block]
                kept = torch.rand(prev, generator=gen).topk(count).indices.sort().values
                self._keep[block] = torch.cat([prefix, kept + host.num_prefix])  # (p + count,)
                prev = count
        return sched

    @classmethod
    def replay_spec(cls, schedule: Schedule, seed: int = 0) -> str | None:
        """``random(counts=..., locs=..., where=..., seed=...)`` with exactly ``schedule``'s counts;
        None for a schedule whose count grows again (a pruner cannot bring tokens back) or that acts
        at both points of a block (a composite's, core/compose.py: one pruner acts at one point)."""
        if schedule.where not in ("attn", "block"):
            return None
        if any(b > a for a, b in zip((schedule.num_patches, *schedule.counts), schedule.counts, strict=False)):
            return None
        counts = tuple(schedule.counts[i] for i in schedule.locs)
        return format_spec(cls.name, {"counts": counts, "locs": tuple(schedule.locs), "where": schedule.where,
                                      "seed": seed})

    def reduce(self, x: Tensor, state: TokenState, info: AttnInfo, count: int) -> Tensor:
        idx = self._keep[state.block]
        if idx.device != x.device:
            idx = self._keep[state.block] = _moved(idx, x.device)
        return state.gather(x, idx.expand(x.shape[0], -1))  # (B, p + count, C)


def _moved(idx: Tensor, device: torch.device) -> Tensor:
    """A copy of ``idx`` on ``device`` that is a normal tensor even when made inside ``torch.inference_mode``
    (as ops.shape_cached does): the cached index serves later training forwards too, whose gather saves it."""
    with torch.inference_mode(False):
        return idx.to(device, copy=True)
