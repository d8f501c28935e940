"""diffrate: DiffRate's deployed prune-then-merge at a searched per-block schedule.

Paper: "DiffRate: Differentiable Compression Rate for Efficient Vision Transformers", Chen et al.,
ICCV 2023, arXiv 2305.17997.
Checked against: github.com/OpenGVLab/DiffRate (DiffRate/patch/deit.py: the eval branch of
DiffRateBlock.forward and DiffRateAttention; DiffRate/merge.py: get_merge_func; DiffRate/ddp.py: what a
kept number counts; main.py: --load_compression_rate; compression_rate.json: the searched schedules),
output for output in float64 (tests/test_diffrate_official.py). The repository has no licence file and
builds on ToMe's (CC-BY-NC): reimplemented, none of its code is used.

The search (a differentiable rate per block) is training; what it yields, and what this method runs, is
the deployed path: two kept numbers per block. In every block, after attention + residual and before the
MLP, with N tokens entering (p prefix, n = N - p patches), P_b and M_b the patches kept after pruning and
after merging at block b (the published numbers less the class token), n1 = min(n, P_b), n2 = min(n1, M_b):
    attention   softmax(Q K^T / sqrt(d) + log m)     m (B, N): each token's attention mass (below)
    a_i = (1/H) sum_h A_h[CLS -> i]                  (B, n) post-softmax CLS row, head mean, patches only
    rank the patches by a_i, highest first
    prune       drop ranks n1 .. n-1                 (B, p + n1, C)
    merge       kept = ranks 0 .. n2-1, src = ranks n2 .. n1-1 (the least attended survivors)
                u = x / ||x||_2 over channels        x the block's tokens after attention + residual
                                                     (not the keys), detached
                each src token s goes to j(s) = argmax_{k in kept} u_s . u_k   (prefix tokens excluded)
                x_k <- (x_k + sum_{s -> k} x_s) / (1 + #{s -> k})      plain mean, not size-weighted
                m_k <- m_k + sum_{s -> k} m_s * (u_s . u_j(s))         mass weighted by the similarity
    output      (B, p + n2, C); m of the output tokens drives the next blocks' attention bias
``score`` ranks by another score than a_i (core/scores.py; the default on a model without a class token
is the representation shift of the attention branch).
m starts at 1 (log m = 0). The official code calls m the token size; here the TokenState's ``size`` keeps
counting patches (what ``get_info`` reports and the merge invariants hold) and m is its ``mass``, which
every reduction carries and proportional attention reads (DiffRate is proportional: ``proportional``).

The schedule, as the official code reads compression_rate.json: ``prune_kept_num`` and
``merge_kept_num`` are, per block, the tokens kept (class token included, 197 = everything) after
pruning and after merging; they are cumulative counts, not removals, and need not be monotone (the
published DeiT-T 1.0 and MAE-L/H lists rise again): a block slices to P_b and merges down to M_b only
where M_b < P_b, so the tokens that leave a block are min(entering, P_b, M_b), the official FLOPs count.
Block 0 is never reduced (its numbers are 197). ``diffrate(schedule='deit_s-2.9')`` takes a published
schedule, named ``<model>-<GMACs>`` (``SCHEDULES``; model deit_t, deit_s, deit_b, mae_b, mae_l, mae_h);
``diffrate(prune=(...), merge=(...))`` takes explicit patch counts, one per block (prefix tokens not
counted: the published numbers less 1); one of the two alone means no pruning / no merging there.
``diffrate()`` is ``deit_s-2.9``: 197 -> 194 -> 176 -> ... -> 64 -> 56 -> 3 tokens, 2.91 G MACs on DeiT-S.
A published schedule runs on a model of its shape (depth and patch count; DeiT-T/S/B and MAE-B: 12
blocks and 196 patches, so the 12-block 196-patch scene reference takes them unchanged) and is refused
on any other, naming the schedules that fit: a searched schedule is not rescaled.
Scoring MACs: the CLS row (N D) and, where tokens merge, the cosines (n1 - n2) x n2 x D. Budget family:
the published schedules of the host's shape; ``schedule_origin`` names the model each was searched for (a
table of picks says it beside the row: none of them was searched for the model it runs on here).

Deviations:
- kept tokens stay in spatial order (the official code sorts every block's tokens by CLS attention and
  keeps that order); the blocks are permutation-equivariant over patches, so with a class-token head the
  logits agree up to float rounding, and argmax ties (measure zero) may break differently.
- every prefix token is protected (never pruned, never a merge destination; the official code knows one
  class token) and the CLS row is the first prefix token's.
- the attention mass is clamped at the smallest positive float: a merge whose best similarity is
  negative can drive it to 0 or below, where the official code's log gives -inf or NaN.
- the mass is the TokenState's ``mass`` beside its patch-count ``size`` (the project's invariant). A
  later stage of ``'A + B'`` that merges sums the masses of what it merges (the official code has no
  such stage).
- on a host with average pooling the official MAE head weights the pooled tokens by the mass; here the
  host's own head runs unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..core import ops
from ..core.errors import SpecError
from ..core.method import AttnInfo, Host, format_spec, register_method
from ..core.schedule import Schedule, compile_schedule
from ..core.scores import Score, ScoredPruner
from ..core.state import TokenState

#: compression_rate.json of the official code (github.com/OpenGVLab/DiffRate): ``<model>-<GMACs>`` ->
#: (prune_kept_num, merge_kept_num), tokens kept after pruning / merging in each block, class token included.
#: Models: deit_t / deit_s / deit_b (ViT-T/S/B-DeiT), mae_b / mae_l / mae_h (ViT-B/L/H-MAE).
SCHEDULES: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "deit_t-0.6": ((197, 196, 180, 157, 130, 107, 86, 73, 63, 51, 40, 3),
                   (197, 187, 167, 139, 114, 90, 76, 66, 57, 45, 37, 3)),
    "deit_t-0.7": ((197, 196, 194, 180, 150, 123, 98, 82, 68, 60, 52, 3),
                   (197, 196, 192, 158, 133, 103, 88, 72, 64, 58, 49, 3)),
    "deit_t-0.8": ((197, 197, 196, 186, 166, 147, 117, 103, 92, 80, 74, 3),
                   (197, 196, 190, 172, 154, 125, 107, 96, 84, 78, 70, 3)),
    "deit_t-0.9": ((197, 197, 196, 190, 182, 166, 141, 125, 113, 105, 99, 3),
                   (197, 196, 194, 188, 172, 147, 129, 115, 107, 103, 96, 3)),
    "deit_t-1.0": ((197, 197, 196, 194, 188, 184, 178, 164, 156, 137, 129, 21),
                   (197, 197, 196, 190, 186, 154, 148, 156, 145, 135, 125, 21)),
    "deit_s-2.3": ((197, 192, 168, 143, 121, 105, 92, 74, 62, 45, 33, 3),
                   (197, 180, 156, 127, 109, 98, 80, 66, 52, 37, 31, 3)),
    "deit_s-2.5": ((197, 192, 174, 156, 131, 115, 111, 99, 76, 50, 39, 3),
                   (197, 186, 160, 133, 119, 107, 96, 82, 66, 43, 37, 3)),
    "deit_s-2.7": ((197, 196, 182, 160, 141, 127, 115, 105, 88, 66, 49, 3),
                   (197, 188, 170, 147, 131, 119, 109, 96, 76, 54, 45, 3)),
    "deit_s-2.9": ((197, 196, 190, 168, 150, 139, 129, 117, 99, 78, 58, 3),
                   (197, 194, 176, 156, 141, 133, 121, 107, 88, 64, 56, 3)),
    "deit_s-3.1": ((197, 197, 194, 180, 160, 147, 137, 129, 115, 92, 76, 3),
                   (197, 196, 186, 164, 150, 141, 133, 121, 103, 78, 68, 3)),
    "deit_b-8.7": ((197, 192, 172, 156, 131, 107, 90, 72, 56, 33, 17, 3),
                   (197, 178, 162, 141, 115, 96, 78, 60, 47, 21, 13, 3)),
    "deit_b-10.0": ((197, 194, 182, 168, 148, 129, 113, 101, 82, 49, 25, 3),
                    (197, 186, 174, 156, 137, 117, 105, 90, 66, 31, 19, 3)),
    "deit_b-10.4": ((197, 196, 188, 174, 156, 141, 121, 103, 90, 58, 25, 3),
                    (197, 190, 184, 164, 145, 131, 107, 94, 74, 31, 21, 3)),
    "deit_b-11.5": ((197, 197, 197, 188, 170, 154, 139, 123, 107, 72, 43, 3),
                    (197, 197, 192, 178, 158, 145, 127, 111, 94, 50, 35, 3)),
    "deit_b-12.5": ((197, 197, 196, 192, 184, 170, 154, 139, 129, 94, 58, 3),
                    (197, 196, 194, 190, 176, 160, 145, 131, 115, 68, 47, 3)),
    "mae_b-8.7": ((197, 192, 166, 143, 119, 103, 86, 72, 54, 43, 37, 23),
                  (197, 176, 150, 127, 107, 92, 76, 58, 47, 41, 23, 23)),
    "mae_b-10.0": ((197, 194, 173, 154, 135, 120, 108, 92, 76, 64, 52, 40),
                   (197, 181, 160, 141, 122, 116, 95, 80, 67, 60, 40, 40)),
    "mae_b-10.4": ((197, 195, 179, 159, 140, 122, 105, 100, 89, 71, 56, 45),
                   (197, 187, 166, 145, 125, 109, 102, 97, 75, 64, 45, 45)),
    "mae_b-11.5": ((197, 196, 182, 172, 162, 147, 131, 109, 101, 94, 70, 49),
                   (197, 192, 178, 164, 150, 133, 115, 101, 96, 82, 49, 49)),
    "mae_l-31.0": ((197, 195, 188, 179, 168, 157, 146, 143, 131, 121, 111, 102, 93, 85, 76, 70, 61, 53, 47, 35, 31,
                    26, 21, 14),
                   (197, 191, 184, 172, 161, 151, 145, 135, 125, 117, 106, 96, 89, 80, 72, 64, 54, 50, 40, 27, 27,
                    23, 14, 14)),
    "mae_l-34.7": ((197, 195, 192, 189, 181, 170, 161, 160, 149, 140, 128, 118, 109, 95, 91, 82, 73, 68, 58, 54, 43,
                    38, 29, 18),
                   (197, 193, 190, 185, 173, 164, 159, 154, 142, 137, 121, 111, 103, 97, 82, 76, 67, 61, 58, 48, 35,
                    32, 18, 18)),
    "mae_l-38.5": ((197, 197, 195, 190, 187, 183, 179, 171, 164, 159, 151, 143, 137, 114, 106, 89, 88, 85, 76, 57,
                    47, 53, 32, 24),
                   (197, 196, 193, 189, 183, 180, 175, 167, 161, 158, 152, 134, 120, 110, 97, 91, 87, 83, 65, 47, 54,
                    34, 24, 24)),
    "mae_l-42.3": ((197, 197, 197, 195, 194, 193, 191, 187, 182, 180, 173, 149, 142, 134, 125, 121, 111, 106, 91, 87,
                    77, 39, 38, 32),
                   (197, 197, 196, 194, 193, 192, 187, 183, 181, 173, 154, 146, 137, 127, 123, 114, 105, 98, 87, 75,
                    43, 45, 32, 32)),
    "mae_l-46.1": ((197, 197, 197, 196, 194, 192, 191, 188, 185, 181, 170, 157, 154, 146, 143, 139, 128, 125, 111,
                    100, 92, 83, 69, 60),
                   (197, 197, 196, 195, 193, 191, 189, 187, 183, 176, 162, 155, 148, 145, 139, 133, 127, 118, 104,
                    95, 86, 71, 60, 60)),
    "mae_h-83.7": ((257, 255, 246, 227, 200, 178, 168, 159, 155, 145, 140, 139, 128, 119, 114, 109, 107, 100, 101,
                    102, 117, 104, 103, 97, 97, 102, 95, 90, 82, 83, 74, 56),
                   (257, 252, 240, 212, 186, 172, 160, 163, 148, 142, 138, 132, 118, 114, 111, 108, 103, 102, 105,
                    106, 109, 105, 108, 99, 96, 96, 95, 86, 79, 77, 56, 56)),
    "mae_h-93.2": ((257, 257, 257, 257, 248, 250, 240, 239, 229, 209, 160, 159, 149, 111, 109, 106, 104, 106, 101,
                    104, 85, 96, 88, 93, 94, 88, 88, 91, 81, 78, 76, 75),
                   (257, 257, 257, 249, 242, 241, 239, 229, 209, 203, 159, 150, 124, 107, 107, 101, 100, 101, 104,
                    89, 101, 88, 89, 88, 91, 86, 86, 83, 78, 78, 75, 75)),
    "mae_h-103.4": ((257, 256, 255, 251, 245, 235, 204, 197, 194, 189, 185, 177, 169, 160, 152, 144, 146, 139, 139,
                     136, 135, 133, 131, 128, 126, 126, 124, 121, 114, 96, 82, 53),
                    (257, 256, 253, 247, 238, 211, 201, 195, 193, 185, 179, 171, 162, 154, 150, 145, 141, 138, 137,
                     135, 134, 133, 130, 127, 125, 125, 122, 114, 101, 90, 53, 53)),
    "mae_h-124.5": ((257, 256, 252, 248, 238, 237, 220, 214, 198, 186, 189, 191, 191, 185, 188, 186, 186, 183, 183,
                     182, 182, 183, 183, 181, 186, 182, 182, 180, 178, 180, 161, 136),
                    (257, 254, 251, 244, 238, 223, 221, 203, 194, 192, 191, 190, 188, 184, 188, 185, 184, 183, 185,
                     183, 183, 185, 183, 183, 185, 183, 179, 167, 177, 133, 136, 136)),
}
#: the models named in ``SCHEDULES`` (the part before the dash), as the official repository names them
MODELS = {"deit_t": "DeiT-T", "deit_s": "DeiT-S", "deit_b": "DeiT-B", "mae_b": "ViT-B (MAE)", "mae_l": "ViT-L (MAE)",
          "mae_h": "ViT-H (MAE)"}
#: the default schedule (``diffrate()``): DeiT-S at 2.9 G MACs, 79.54 top-1 off the shelf (the official README)
DEFAULT = "deit_s-2.9"


def published(name: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The published schedule ``name`` as patch counts (the official numbers less the class token):
    (kept after pruning, kept after merging), one per block. SpecError naming the schedules if unknown."""
    if name not in SCHEDULES:
        raise SpecError(f"diffrate: unknown schedule {name!r}; the published ones are {', '.join(SCHEDULES)}")
    prune, merge = SCHEDULES[name]
    return tuple(c - 1 for c in prune), tuple(c - 1 for c in merge)


def schedule_shape(name: str) -> tuple[int, int]:
    """(depth, patches) of the model the published schedule ``name`` was searched for."""
    prune, _ = SCHEDULES[name]
    return len(prune), prune[0] - 1


def kept_counts(prune: Sequence[int], merge: Sequence[int], num_patches: int) -> tuple[int, ...]:
    """Patch tokens leaving each block: min(entering, prune[b], merge[b]), as the official code runs a schedule."""
    out, n = [], num_patches
    for p, m in zip(prune, merge, strict=True):
        n = min(n, p, m)
        out.append(n)
    return tuple(out)


@dataclass(frozen=True)
class DiffRateConfig:
    #: a published schedule (``SCHEDULES``); None with no counts: ``DEFAULT``
    schedule: str | None = None
    #: patch tokens kept after pruning in each block (prefix tokens not counted); None: no pruning
    prune: Sequence[int] | None = None
    #: patch tokens kept after merging in each block; None: no merging
    merge: Sequence[int] | None = None
    #: the token score in place of the CLS row (core/scores.py); None: 'cls' with a class token, else the shift
    score: Score | None = None


@register_method("diffrate")
class DiffRate(ScoredPruner):
    """Prune by CLS attention, then merge the least attended survivors into their most similar kept token:
    x (B, N, C) -> (B, p + count, C)."""

    Config = DiffRateConfig
    zero = {"prune": (64, 64, 64, 64)}  # the tiny test hosts: 4 blocks, 64 patches
    # prune then merge (block 0), a merge number above the pruned count (block 1: no merge), both (2, 3)
    example = {"prune": (60, 50, 40, 30), "merge": (52, 52, 36, 20)}
    min_onnx_opset = 16  # the merge sums tokens (scatter_add_)
    proportional = True  # log m on the attention logits, always (the official code has no switch)

    def __init__(self, cfg: DiffRateConfig) -> None:
        super().__init__(cfg)
        if cfg.schedule is not None and (cfg.prune is not None or cfg.merge is not None):
            raise SpecError("diffrate: give a published schedule or prune/merge counts, not both")
        if cfg.schedule is not None:
            published(cfg.schedule)  # an unknown name fails here, naming the published ones
        self._prune: tuple[int, ...] = ()  # per block, set by bind

    @classmethod
    def budget_family(cls, host: Host) -> list[str]:
        """The published schedules searched for a model of the host's shape, mildest first by the official
        FLOPs count (4 N C^2 + 2 N^2 C per attention, 8 N C^2 per MLP: DeiT's MLP ratio 4, which the host does not
        state; bench/budgets.py re-sorts by counted MACs); none for any other shape."""
        fits = [n for n in SCHEDULES if schedule_shape(n) == (host.depth, host.num_patches)]

        def cost(name: str) -> int:
            n, c, total = host.num_patches + 1, host.dim, 0
            for k in kept_counts(*published(name), host.num_patches):
                total += 4 * n * c * c + 2 * n * n * c + 8 * (k + 1) * c * c
                n = k + 1
            return total

        return [format_spec(cls.name, {"schedule": n}) for n in sorted(fits, key=cost, reverse=True)]

    def schedule_origin(self) -> str | None:
        """A published schedule's model and MACs, e.g. 'DiffRate schedule searched for ViT-B (MAE) at 8.7
        GMACs'; None for explicit counts."""
        c = self.cfg
        if c.prune is not None or c.merge is not None:
            return None
        model, gmacs = (c.schedule or DEFAULT).split("-")
        return f"DiffRate schedule searched for {MODELS[model]} at {gmacs} GMACs"

    def bind(self, host: Host) -> Schedule:
        self.bind_score(host)
        prune, merge = self._counts(host)
        self._prune = prune
        counts = kept_counts(prune, merge, host.num_patches)
        entering = (host.num_patches, *counts[:-1])
        locs = [b for b, (c, e) in enumerate(zip(counts, entering, strict=True)) if c != e]
        return compile_schedule(host.num_patches, host.depth, self.name, where=self.where,
                                counts=[counts[b] for b in locs], locs=locs)

    def _counts(self, host: Host) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(prune, merge) patch counts per block for ``host``, checked."""
        c, n = self.cfg, host.num_patches
        if c.prune is None and c.merge is None:
            name = c.schedule or DEFAULT
            if schedule_shape(name) != (host.depth, n):
                fits = ", ".join(s for s in SCHEDULES if schedule_shape(s) == (host.depth, n)) or "none"
                depth, patches = schedule_shape(name)
                default = " (the default)" if c.schedule is None else ""
                raise SpecError(
                    f"diffrate: schedule {name!r}{default} was searched for {depth} blocks of {patches} patches; "
                    f"this model has {host.depth} blocks of {n}. Published schedules for it: {fits}; all: "
                    f"{', '.join(SCHEDULES)}; or give prune=/merge= patch counts, one per block")
            return published(name)
        given = {k: tuple(v) for k, v in (("prune", c.prune), ("merge", c.merge)) if v is not None}
        for key, values in given.items():
            if len(values) != host.depth:
                raise SpecError(f"diffrate: {key} has {len(values)} entries; give one per block ({host.depth})")
            bad = [v for v in values if not 1 <= v <= n]
            if bad:
                hint = (" (counts exclude the class token; the published lists include it: subtract 1)"
                        if n + 1 in bad else "")
                raise SpecError(f"diffrate: {key}={values} has {bad[0]}; each count of patch tokens kept lies in "
                                f"[1, {n}]{hint}")
        untouched = (n,) * host.depth  # nothing pruned / merged
        return given.get("prune", untouched), given.get("merge", untouched)

    def scoring_macs(self, block: int, tokens_in: int, count: int, host: Host) -> int:
        """Plus the matching: cosines of the r merged tokens against the ``count`` kept patches over the
        width, one (r x D) @ (D x count) product, D = host.dim (the tokens, not the keys)."""
        r = self._survivors(block, tokens_in - host.num_prefix, count) - count
        return super().scoring_macs(block, tokens_in, count, host) + r * count * host.dim

    def _survivors(self, block: int, entering: int, count: int) -> int:
        """Patches left after the prune at ``block``: min(entering, P_b), at least ``count`` (a composite's
        count for the tokens reaching it may exceed what pruning alone would leave)."""
        return max(count, min(entering, self._prune[block]))

    def compose_step(self, block: int, entering: int, aside: int, alone: Schedule) -> tuple[int, int]:
        """The default count for the tokens reaching it; only the pruned ones are kept aside."""
        count, _ = super().compose_step(block, entering, aside, alone)
        return count, aside + entering - self._survivors(block, entering, count)

    def reduce(self, x: Tensor, state: TokenState, info: AttnInfo, count: int) -> Tensor:
        p, B = state.num_prefix, x.shape[0]
        survivors = self._survivors(state.block, x.shape[1] - p, count)
        r = survivors - count  # merged
        scores = self.scores_of(info)[:, :, p:].mean(dim=1)  # (B, n) post-softmax CLS row of the patches
        order = scores.argsort(dim=1, descending=True) + p  # (B, n) positions, most attended first
        kept = order[:, :count].sort(dim=1).values  # (B, count) ascending: spatial order
        keep = torch.cat([ops.positions(0, p, 1, x.device).expand(B, p), kept], 1)  # (B, p + count), prefix first
        if r == 0:
            return state.gather(x, keep)  # the mass goes with the kept tokens
        src = order[:, count:survivors]  # (B, r) the least attended survivors
        metric = x.detach()
        a = ops.gather_tokens(metric, src)  # (B, r, C)
        b = ops.gather_tokens(metric, kept)  # (B, count, C)
        a = a / a.norm(dim=-1, keepdim=True)
        b = b / b.norm(dim=-1, keepdim=True)
        best, slot = torch.bmm(a, b.transpose(1, 2)).max(dim=-1)  # (B, r): cosine and index into kept
        plan = ops.MergePlan(keep, src, slot + p, kept.gather(1, slot))
        mass = state.masses(x)  # (B, N)
        merged = ops.gather_tokens(mass, keep).scatter_add_(1, slot + p, ops.gather_tokens(mass, src) * best)
        merged = merged.clamp_min(torch.finfo(merged.dtype).tiny)
        return state.merge(x, plan, weight=x.new_ones(x.shape[:2]), mass=merged)  # plain mean; sizes summed

