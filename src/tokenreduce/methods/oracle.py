"""oracle: keep the tokens a supplied per-image priority ranks first (the best pruner at given counts).

No paper: the yardstick a review of EET (arXiv 2504.16691) asks for. "How far is CTP from the best
possible pruner at equal counts?" needs a pruner that, at CTP's token counts and blocks, keeps the
object's tokens first. Where the object is comes from the data (object masks), never from the model,
so the method holds no knowledge of any data set: the caller supplies, per forward, a priority for
every original patch of every image, and the method keeps the highest.

    from tokenreduce.methods.oracle import oracle_priority, oracle_spec, patch_fractions
    tokenreduce.apply(model, oracle_spec(tokenreduce.get_info(ctp_model).schedule))  # CTP's counts
    with oracle_priority(model, patch_fractions(masks, grid)):  # (B, N) object fraction per patch
        logits = model(images)

At each block of the schedule, of the M non-prefix tokens present (each the original patch j_m it
stems from, ``TokenState.index``):
    priority  P (B, N) of the original patches, read at j_m      (B, M)
    keep      the ``count`` tokens of highest P, in spatial order; the prefix tokens always stay
    ties      ``ties='index'``: the lower original patch index first (deterministic, reads nothing
              from the attention, keeps the fused kernel); ``ties='cls_attn'``: the higher head-mean
              class-token attention first (then the lower position), so that beyond the object the
              oracle keeps what the model attends to
Dropped tokens are discarded (as CTP's). With object fractions as the priority the oracle keeps every
patch holding object pixels before any background patch, most-covered first.

The priority is supplied with :func:`oracle_priority` (a context manager; it sets a non-persistent
buffer of the reducer, so the reducer is the patched model's ``tokenreduce`` submodule, never in a
checkpoint), shape (B, N) for the B images of the forward, or (N,) / (1, N) for one priority shared by
every image. A forward without one refuses (TokenReduceError naming what is missing): there is no
fallback. :func:`patch_fractions` turns pixel masks into per-patch fractions for a patch grid.

Options: ``counts`` / ``keep`` with ``locs`` (core.schedule, as ``topk``), ``where`` (default
'block', CTP's placement: after the whole block), ``ties``.

Deviations: none (no reference implementation). Not exportable (the priority comes from outside the
model at every forward) and no budget family (it is a yardstick, not a method to deploy).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core import ops
from ..core.errors import SpecError, TokenReduceError
from ..core.method import AttnInfo, Host, Reducer, format_spec, register_method
from ..core.schedule import Schedule, Where, compile_schedule
from ..core.state import TokenState

Ties = Literal["index", "cls_attn"]
TIES: tuple[str, ...] = get_args(Ties)
#: the seed of the priority the contract tests supply (:meth:`Oracle.example_inputs`)
EXAMPLE_SEED = 0


@dataclass(frozen=True)
class OracleConfig:
    """``counts`` or ``keep`` with ``locs``: the schedule (core.schedule); ``where``: 'block' (after the
    MLP, CTP's) or 'attn'; ``ties``: 'index' or 'cls_attn' (module docstring)."""

    keep: float | None = None
    counts: Sequence[int] | None = None
    locs: Sequence[int] | None = None
    where: Where = "block"
    ties: Ties = "index"

    def __post_init__(self) -> None:
        if self.ties not in TIES:
            raise SpecError(f"oracle: ties={self.ties!r} is invalid; choose from {', '.join(map(repr, TIES))}")


@register_method("oracle")
class Oracle(Reducer):
    """Keep the tokens of highest supplied priority: x (B, N, C) -> (B, p + count, C) (module docstring)."""

    Config = OracleConfig
    exportable = False  # the priority comes from outside the model at every forward
    classic_onnx = False  # a stable sort
    zero = {"keep": 1.0, "locs": (0,)}
    example = {"counts": (32, 16), "locs": (1, 2)}

    def __init__(self, cfg: OracleConfig) -> None:
        super().__init__(cfg)
        if cfg.ties == "cls_attn":  # a declaration of this instance, as a composite's
            self.needs = frozenset({"cls_attn"})
            self.needs_class_token = True
        self.num_patches = 0
        # the priority of the forward in progress, (B | 1, N); empty outside oracle_priority
        self.register_buffer("priority", torch.empty(0), persistent=False)

    @classmethod
    def budget_family(cls, host: Host) -> list[str]:
        return []  # a yardstick, not a method to deploy at a budget

    def bind(self, host: Host) -> Schedule:
        c = self.cfg
        if c.keep is None and c.counts is None:  # checked here, not in the config: its defaults must parse
            raise SpecError("oracle: give the schedule, counts=(...) or keep=..., with locs=(...) (e.g. a method's: "
                            "methods.oracle.oracle_spec(get_info(model).schedule))")
        self.num_patches = host.num_patches
        keep = None if c.counts is not None else c.keep
        return compile_schedule(host.num_patches, host.depth, self.name, where=self.where, keep=keep,
                                counts=c.counts, locs=c.locs)

    @contextmanager
    def example_inputs(self) -> Iterator[None]:
        """What a forward of this reducer needs from outside the model, for tests: a fixed random
        priority per patch (seed ``EXAMPLE_SEED``), shared by every image, so that any input runs."""
        gen = torch.Generator().manual_seed(EXAMPLE_SEED)
        with oracle_priority(self, torch.rand(self.num_patches, generator=gen)):
            yield

    def _priority_for(self, x: Tensor) -> Tensor:
        prio = self.priority
        if prio.numel() == 0:
            raise TokenReduceError(
                "oracle: no token priority was supplied for this forward; run the model inside "
                "`with tokenreduce.methods.oracle.oracle_priority(model, priority):`, priority (B, N) over the N "
                "patches of each image (e.g. patch_fractions(object_masks, grid))")
        if prio.shape[0] not in (1, x.shape[0]):
            raise TokenReduceError(f"oracle: the priority holds {prio.shape[0]} images but the forward has "
                                   f"{x.shape[0]}; supply (B, N) for this batch, or (N,) for every image")
        return prio.to(x.device).expand(x.shape[0], -1)  # (B, N)

    def class_token_substitute(self) -> str | None:
        return "ties='index'"

    def reduce(self, x: Tensor, state: TokenState, info: AttnInfo, count: int) -> Tensor:
        p = state.num_prefix
        prio = self._priority_for(x)  # (B, N0 - p)
        patch = state.index[:, p:] - p  # (B, M) the original patch each token stems from
        # the tie order first (a stable sort keeps it), then by priority
        if self.cfg.ties == "cls_attn":
            order = info.cls_attn.mean(dim=1)[:, p:].argsort(dim=1, descending=True, stable=True)  # (B, M)
        else:
            order = patch.argsort(dim=1, stable=True)  # (B, M) the lower patch index first
        ranked = prio.gather(1, patch.gather(1, order)).argsort(dim=1, descending=True, stable=True)
        kept = order.gather(1, ranked[:, :count]).sort(dim=1).values + p  # (B, count) positions, in order
        prefix = ops.positions(0, p, 1, x.device).expand(x.shape[0], p)
        return state.gather(x, torch.cat([prefix, kept], dim=1))  # (B, p + count, C)


def _oracles(target: nn.Module) -> list[Oracle]:
    found = [m for m in target.modules() if isinstance(m, Oracle)]
    if not found:
        raise TokenReduceError("oracle_priority: this model runs no oracle; apply a spec with an oracle stage first, "
                               "e.g. tokenreduce.apply(model, 'oracle(counts=(98, 49, 12), locs=(3, 7, 9))')")
    return found


@contextmanager
def oracle_priority(model: nn.Module, priority: Tensor) -> Iterator[None]:
    """``with oracle_priority(model, priority): model(images)``: the oracle in the patched ``model`` (or an
    oracle reducer itself) keeps, in the forwards inside the context, the tokens of highest ``priority``
    (B, N) over the N patches of each of the B images, or (N,) for every image; e.g.
    :func:`patch_fractions` of the images' object masks. The previous priority (none, outside) comes
    back after it. Raises TokenReduceError if the model runs no oracle or the shape does not fit its grid."""
    found = _oracles(model)
    prio = torch.as_tensor(priority)
    if prio.dim() == 1:
        prio = prio[None]
    n = found[0].num_patches
    if prio.dim() != 2 or prio.shape[1] != n or prio.shape[0] < 1:
        raise TokenReduceError(f"oracle_priority: the priority must be (B, {n}) or ({n},), one value per patch of "
                               f"the model's grid; got shape {tuple(torch.as_tensor(priority).shape)}")
    if not prio.is_floating_point():
        prio = prio.float()
    if not bool(torch.isfinite(prio).all()):
        raise TokenReduceError("oracle_priority: the priority holds NaN or infinite values; give finite numbers")
    before = [o.priority for o in found]
    for o in found:
        o.priority = prio.detach()
    try:
        yield
    finally:
        for o, old in zip(found, before, strict=True):
            o.priority = old


def patch_fractions(masks: Tensor, grid: int | tuple[int, int] | None = None, *,
                    patch_size: int | tuple[int, int] | None = None) -> Tensor:
    """The fraction of object pixels in each patch: masks (B, H, W) (bool, or float in [0, 1]) ->
    (B, gh * gw) float, row-major, the patch order of the model's tokens.

    Give either the model's patch ``grid`` (gh, gw) (``get_info(model).host.grid``), for a mask at any
    resolution (adaptive average pooling: the mask of a 56 x 56 scene for a 14 x 14 grid), or the
    ``patch_size`` in mask pixels, for a mask at the input's resolution (H and W must divide by it).
    """
    if (grid is None) == (patch_size is None):
        raise TokenReduceError("patch_fractions: give exactly one of grid=(gh, gw) and patch_size=")
    m = torch.as_tensor(masks)
    if m.dim() != 3:
        raise TokenReduceError(f"patch_fractions: masks must be (B, H, W), got shape {tuple(m.shape)}")
    if patch_size is not None:
        ph, pw = (patch_size, patch_size) if isinstance(patch_size, int) else tuple(patch_size)
        if ph < 1 or pw < 1 or m.shape[1] % ph or m.shape[2] % pw:
            raise TokenReduceError(f"patch_fractions: masks of {m.shape[1]}x{m.shape[2]} do not split into patches "
                                   f"of {ph}x{pw}; give the model's grid= instead")
        grid = (m.shape[1] // ph, m.shape[2] // pw)
    gh, gw = (grid, grid) if isinstance(grid, int) else tuple(grid)
    return F.adaptive_avg_pool2d(m.float()[:, None], (gh, gw)).flatten(1)  # (B, gh * gw)


def oracle_spec(schedule: Schedule, ties: str = "index") -> str:
    """The oracle at exactly ``schedule``'s counts, blocks and placement (a pruning method's, e.g. CTP's:
    ``get_info(model).schedule``)."""
    counts = tuple(schedule.counts[b] for b in schedule.locs)
    grows = any(b > a for a, b in zip((schedule.num_patches, *counts), counts, strict=False))
    if schedule.where not in ("attn", "block") or grows:
        raise TokenReduceError("oracle_spec: the schedule acts at both points of a block or brings tokens back; "
                               "an oracle prunes at one point and never restores (give the pruning stage's schedule)")
    return format_spec(Oracle.name, {"counts": counts, "locs": tuple(schedule.locs), "where": schedule.where,
                                  "ties": ties})


__all__ = ["TIES", "Oracle", "OracleConfig", "oracle_priority", "oracle_spec", "patch_fractions"]
