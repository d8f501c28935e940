"""bspf: block-based pruning and fusion on chunked attention (a coherent, working reading of BSPF-ViT).

Paper: "Block-based Symmetric Pruning and Fusion for Efficient Vision Transformers", Hsieh et al.,
2025, arXiv 2507.12125 (BSPF-ViT). No official code. As written, the paper's fusion transfers
nothing and its symmetry shortcut is not exact (docs/methods.md, section "BSPF-ViT"), so this module implements one
coherent reading; every choice is listed under "Decisions" and "Deviations".

Attention runs in chunks of c patch tokens (as ``chunked(size=c)``, core.attention.attend): the patch
part of the softmaxed attention A (B, H, N, N) is the C diagonal blocks A_m = A[chunk m, chunk m],
each (c, c), softmaxed over the prefix keys and the chunk's own. The attention hands them over per
chunk (core.attention.ChunkedProbs, (B, H, chunks, c, p + c) per group), so A is never built as an
(N, N) tensor; with one chunk (c >= M) the attention is full and A is (B, H, N, N). At each block in
``locs``, after attention + residual and before the MLP, per chunk m (head mean a_m = mean_h A_m,
(B, c, c)):

    1. entry scores     E_m = K * a_m                  3x3 cross-correlation, zero padding   (B, c, c)
                        K (3, 3) learned, initialised as a local average (1/9 everywhere)
    2. entry keep mask  M_m = [E_m >= the k_e-th largest entry of E_m],  k_e = ceil(entries c^2)
    3. token score      s_i = sum_j (M o E)_ij + sum_j (M o E)_ji     query row + key column    (B, c)
    4. token keep       the k = ceil(keep c) tokens of the chunk with the highest s_i, in order
    5. fusion           every pruned token i goes to d = argmax_{j kept in chunk m} sigma_ij,
                        sigma_ij = max(cos(x_i, x_j), 0) * h_ij,
                        h_ij = 1 - Hamming([M_i,:, M_:,i], [M_j,:, M_:,j]) / 2c   (keep-mask rows+columns)
                        w_i  = size_i * sigma_id * exp(s_i - s_d)                 (0 < exp(.) <= 1)
                        x_d <- (size_d x_d + sum_{i->d} w_i x_i) / (size_d + sum_{i->d} w_i)
                        size_d <- size_d + sum_{i->d} size_i                      (TokenState.merge)
    6. the following blocks attend in chunks of k tokens, so every chunk keeps its own tokens.
With ``fuse=False`` (the prune-only ablation) step 5 is skipped: the same tokens are kept at the
same blocks and the pruned ones are dropped.

x (B, N, C) -> (B, p + sum_m k_m, C). With a partial last chunk of r < c tokens it keeps
ceil(keep r) <= k tokens, which is again the partial last chunk of the next blocks' chunking.

Scoring paths (``path``): 'exact' scores every entry of each A_m. 'mirrored' is the paper's shortcut
for W_q = W_k (models/transforms.py ``tie_qk``): it reads and scores only the upper triangle,
a_m -> U(a_m) = triu(a_m) + triu(a_m, 1)^T, E_m = U(K * U(a_m)) computed at the c(c+1)/2 upper
entries. With a symmetric a_m and a symmetric kernel (K = K^T) both paths are equal. Row-wise
softmax makes A_m asymmetric even when S = Q K^T is symmetric (A_ij / A_ji = Z_j / Z_i, Z the row
sums of exp(S)), and a learned kernel need not stay symmetric: probes/bspf_symmetry.py
measures how far the mirrored decisions are from the exact ones.

Cost: the reduction removes tokens, so every later projection, MLP and attention chunk is really
smaller (measured: bench/macs.py, tokenreduce bench). ``scoring_macs`` counts, per chunk of c
tokens keeping k, with D the width: the kernel 9 c^2 (exact) or 9 c (c + 1) / 2 (mirrored), the
cosine similarities (c - k) k D and the Hamming agreement (c - k) k 2c (one product of +-1 masks).
The attention probabilities are the chunked attention's own (no extra MACs), but a pruning block
leaves the fused SDPA kernel (explicit softmax), which costs time that tokenreduce bench measures.

Decisions (where the paper is silent or inconsistent):
- Scored blocks: only the C diagonal chunk blocks A_m, the only ones chunked attention computes.
  Scoring all C^2 inter-chunk blocks needs the full N x N product Q K^T (the reviewers' objection
  4: O(N^2), what chunking avoids); not implemented.
- Entry scores are computed on the head mean of A_m (one channel, one kernel); the mask keeps the
  entries at or above the k_e-th largest score (ties kept together, so a symmetric score matrix
  gives a symmetric mask).
- Joint query/key decision at the token level: a token's score sums its kept entries as a query
  (row) and as a key (column); the top ``keep`` of each chunk are kept, so chunks stay equal-sized
  and attention stays chunked. Pruning single entries only (sparse attention) would save nothing
  on dense kernels.
- Fusion (the paper's update touches only kept entries of complementary masks, so it moves nothing):
  each pruned token is fused into the retained token of its chunk with the highest similarity
  sigma = cosine x Hamming similarity, weighted by sigma and its size (a size-weighted mean, sizes
  summed and conserved). A pruned token dissimilar to every retained one (sigma = 0) adds its size
  but no content.
- The kernel learns through the fusion: w_i carries exp(s_i - s_d), so the loss reaches K through
  the kept entries of the scores (top-k itself has no gradient).
- The Hamming similarity compares the rows and the columns of the keep mask (the joint view); on
  the mirrored path the mask is symmetric and this is the row comparison of the paper.
- The mirrored path mirrors both the attention it reads and the scores it computes, so it reads
  and scores only upper-triangle entries.
- ceil with a 1e-9 tolerance (so keep=0.7 of 10 is 7) and at least one token per chunk.

Deviations:
- Prefix tokens (cls, dist, registers) attend to and are attended by every token, take no part in
  scoring and are never pruned (as ``chunked``).
- Chunks are contiguous runs in raster order (not 2-D windows), as ``chunked``.
- ``prop_attn`` (default False) optionally adds ToMe's log-size bias; the paper has none.

Options (ablations; the defaults are the reading above):
- ``fuse=False``: prune-only. The same scores, keep masks and token counts, but the pruned tokens are
  dropped instead of fused, so the study can separate what the fusion adds from what the pruning
  costs. Nothing then reaches the kernel (top-k has no gradient; the fusion weights were its only
  path): it stays at its initial value and is not trainable (``requires_grad=False``, so no optimizer
  holds it), the reducer is not ``learned``, sizes are no longer conserved, and the scoring MACs are
  the kernel's only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core import ops
from ..core.attention import ChunkedProbs
from ..core.errors import SpecError, TokenReduceError
from ..core.method import AttnInfo, Host, Reducer, register_method
from ..core.schedule import Schedule, check_keep, check_locs, compile_schedule
from ..core.state import TokenState

# ----------------------------------------------------------------------------- chunks


def kept(keep: float, n: int) -> int:
    """Tokens (or entries) kept of ``n``: ceil(keep * n), tolerant to float error, at least 1."""
    return max(1, math.ceil(keep * n - 1e-9))


def chunk_groups(m: int, size: int) -> list[tuple[int, int, int]]:
    """How ``m`` patch tokens split into chunks of ``size`` (as core.attention.attend splits them):
    (start, chunks, tokens per chunk) for the full chunks, then the partial last one if any."""
    size = min(size, m)
    full, rest = divmod(m, size)
    return [(0, full, size)] + ([(full * size, 1, rest)] if rest else [])


def diagonal_blocks(probs: Tensor | ChunkedProbs, num_prefix: int,
                    groups: Sequence[tuple[int, int, int]]) -> list[Tensor]:
    """The diagonal chunk blocks of attention probabilities, one (B, H, chunks, c, c) per group of
    ``groups`` (:func:`chunk_groups`): read off chunked attention's per-chunk probabilities
    (:class:`ChunkedProbs`, which must be cut into the same chunks), or cut out of full ones (B, H, N, N)."""
    if isinstance(probs, ChunkedProbs):
        if list(probs.groups) != [(num_prefix + start, count, size) for start, count, size in groups]:
            raise TokenReduceError(f"bspf: the attention was computed in chunks {list(probs.groups)}, not in the "
                                   f"chunks {list(groups)} after the {num_prefix} prefix tokens that bspf scores")
        return probs.diagonal()
    out = []
    for start, count, size in groups:
        lo = num_prefix + start
        hi = lo + count * size
        sub = probs[:, :, lo:hi, lo:hi].unflatten(2, (count, size)).unflatten(4, (count, size))  # (B,H,n,c,n,c)
        out.append(sub.diagonal(dim1=2, dim2=4).permute(0, 1, 4, 2, 3))  # (B, H, count, c, c)
    return out


# ----------------------------------------------------------------------------- entry scores and paths


def mirror(t: Tensor) -> Tensor:
    """U(t) = triu(t) + triu(t, 1)^T over the last two dims: the upper triangle, mirrored."""
    return t.triu() + t.triu(1).transpose(-2, -1)


def correlate(a: Tensor, kernel: Tensor, at: Tensor | None = None) -> Tensor:
    """3x3 cross-correlation of a (n, c, c) with ``kernel`` (3, 3), zero padding, at the flat
    positions ``at`` (T,) (all c^2 if None): (n, T), one (1 x 9) @ (9 x T) product per block (9 T MACs)."""
    patches = F.unfold(a[:, None], 3, padding=1)  # (n, 9, c * c)
    if at is not None:
        patches = patches[:, :, at]  # (n, 9, T)
    return (kernel.reshape(1, 1, 9) @ patches)[:, 0]  # (n, T)


def _exact(a: Tensor, kernel: Tensor) -> Tensor:
    return correlate(a, kernel).unflatten(1, a.shape[-2:])  # (n, c, c)


def _mirrored(a: Tensor, kernel: Tensor) -> Tensor:
    n, c, _ = a.shape
    rows, cols = torch.triu_indices(c, c, device=a.device)
    upper = correlate(mirror(a), kernel, rows * c + cols)  # (n, c (c + 1) / 2)
    flat = a.new_zeros(n, c * c).scatter(1, (rows * c + cols).expand(n, -1), upper)
    return flat.scatter(1, (cols * c + rows).expand(n, -1), upper).unflatten(1, (c, c))


@dataclass(frozen=True)
class Path:
    """A scoring path: the entry scores of (n, c, c) attention blocks, and how many entries it scores."""

    scores: Callable[[Tensor, Tensor], Tensor]
    entries: Callable[[int], int]


#: The scoring paths, by name (the ``path`` parameter).
PathName = Literal["exact", "mirrored"]
PATHS: dict[PathName, Path] = {
    "exact": Path(_exact, lambda c: c * c),
    "mirrored": Path(_mirrored, lambda c: c * (c + 1) // 2),
}


def entry_scores(a: Tensor, kernel: Tensor, path: str) -> Tensor:
    """E = the scores of attention blocks a (n, c, c) on ``path`` ('exact' or 'mirrored'), (n, c, c)."""
    return PATHS[path].scores(a, kernel)


def entry_mask(scores: Tensor, entries: float) -> Tensor:
    """M = scores >= the k_e-th largest score of each (c, c) block, k_e = ceil(entries c^2); bool (n, c, c)."""
    k = kept(entries, scores.shape[-1] * scores.shape[-2])
    threshold = scores.flatten(-2).topk(k, dim=-1).values[..., -1:]  # (n, 1)
    return scores >= threshold[..., None]


def token_scores(scores: Tensor, mask: Tensor) -> Tensor:
    """s_i = sum_j (M o E)_ij + sum_j (M o E)_ji: kept scores of token i as a query and as a key, (n, c)."""
    kept_scores = scores * mask
    return kept_scores.sum(-1) + kept_scores.sum(-2)


# ----------------------------------------------------------------------------- decisions and fusion


@dataclass
class ChunkDecision:
    """The decision for one group of equal chunks: ``scores`` E and ``mask`` M (B, n, c, c), token
    scores ``token`` (B, n, c), the kept and pruned token offsets within each chunk, ascending,
    ``keep`` (B, n, k) and ``drop`` (B, n, c - k)."""

    scores: Tensor
    mask: Tensor
    token: Tensor
    keep: Tensor
    drop: Tensor


@dataclass
class Decision:
    """The decisions of one pruning block, one :class:`ChunkDecision` per group of chunks."""

    chunks: list[ChunkDecision]

    def token_keep(self) -> Tensor:
        """(B, M) bool over the M patch tokens entering the block: kept or not."""
        out = []
        for d in self.chunks:
            B, n, c = d.token.shape
            out.append(torch.zeros(B, n, c, dtype=torch.bool, device=d.keep.device).scatter(2, d.keep, True).flatten(1))
        return torch.cat(out, 1)

    def entry_keep(self) -> Tensor:
        """(B, sum over chunks of c^2) bool: every chunk's entry mask, flattened."""
        return torch.cat([d.mask.flatten(1) for d in self.chunks], 1)


@dataclass
class BlockRecord:
    """What a pruning block saw and decided (:meth:`BSPF.recording`): the softmaxed attention of the
    diagonal chunk blocks, one (B, H, chunks, c, c) per group, detached, and the token decision (B, M)."""

    block: int
    attn: list[Tensor]
    keep: Tensor


def _chunk_base(num_prefix: int, start: int, count: int, size: int, device: torch.device) -> Tensor:
    """(1, n, 1): the sequence position of the first token of each of ``count`` chunks of ``size``."""
    return (num_prefix + start + size * torch.arange(count, device=device))[None, :, None]


def kept_positions(num_prefix: int, groups: Sequence[tuple[int, int, int]], decision: Decision) -> Tensor:
    """(B, p + kept) the sequence positions the decision keeps, ascending: the prefix, then every chunk's
    kept tokens in order."""
    ref = decision.chunks[0].keep
    parts = [torch.arange(num_prefix, device=ref.device).expand(ref.shape[0], num_prefix)]
    for (start, count, size), d in zip(groups, decision.chunks, strict=True):
        parts.append((_chunk_base(num_prefix, start, count, size, ref.device) + d.keep).flatten(1))
    return torch.cat(parts, 1)


def fusion_plan(x: Tensor, state: TokenState, groups: Sequence[tuple[int, int, int]],
                 decision: Decision) -> tuple[ops.MergePlan, Tensor]:
    """The merge plan (retained tokens in order, each pruned token into its destination) and the merge
    weights (B, N): size_d for retained tokens, w_i = size_i sigma_id exp(s_i - s_d) for pruned ones."""
    B, N, C = x.shape
    p = state.num_prefix
    sizes = state.sizes(x)  # (B, N)
    srcs, dst_pos, weights = [], [], []
    for (start, count, size), d in zip(groups, decision.chunks, strict=True):
        base = _chunk_base(p, start, count, size, x.device)  # (1, n, 1)
        xg = x[:, p + start:p + start + count * size].unflatten(1, (count, size))  # (B, n, c, C)
        xk, xd = (ops.gather_tokens(xg.flatten(0, 1), t.flatten(0, 1)) for t in (d.keep, d.drop))  # (B n, k|r, C)
        cos = F.normalize(xd, dim=-1) @ F.normalize(xk, dim=-1).transpose(-2, -1)  # (B n, r, k)
        bits = torch.cat([d.mask, d.mask.transpose(-2, -1)], -1).flatten(0, 1).to(x.dtype) * 2 - 1  # (B n, c, 2c)
        bk, bd = (ops.gather_tokens(bits, t.flatten(0, 1)) for t in (d.keep, d.drop))
        agree = (bd @ bk.transpose(-2, -1) / (2 * size) + 1) / 2  # (B n, r, k): 1 - Hamming / 2c
        sigma, j = (cos.clamp_min(0) * agree).max(-1)  # (B n, r)
        dst = d.keep.flatten(0, 1).gather(1, j).view(B, count, -1)  # (B, n, r) offsets in the chunk
        gain = (d.token.gather(2, d.drop) - d.token.gather(2, dst)).exp()  # (B, n, r), s_i <= s_d
        src = (base + d.drop).flatten(1)  # (B, n r) positions
        srcs.append(src)
        dst_pos.append((base + dst).flatten(1))
        weights.append(sizes.gather(1, src) * sigma.view(B, -1) * gain.flatten(1))
    keep, src, to = kept_positions(p, groups, decision), torch.cat(srcs, 1), torch.cat(dst_pos, 1)
    alive = torch.zeros(B, N, dtype=torch.bool, device=x.device).scatter(1, keep, True)
    slot = alive.cumsum(1) - 1  # (B, N) output slot of each retained position
    weight = sizes.scatter(1, src, torch.cat(weights, 1).to(sizes.dtype))
    return ops.MergePlan(keep, src, slot.gather(1, to), to), weight


# ----------------------------------------------------------------------------- the method


def _kernel_values(kernel: str | Sequence[float]) -> list[float]:
    if kernel == "average":
        return [1.0 / 9] * 9
    if isinstance(kernel, str) or not isinstance(kernel, Sequence) or len(kernel) != 9 or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in kernel):
        raise SpecError(f"bspf: kernel={kernel!r} is invalid; give 'average' (1/9 everywhere) or 9 numbers, "
                        "the 3x3 initial kernel row by row")
    return [float(v) for v in kernel]


@dataclass(frozen=True)
class BSPFConfig:
    """``size``: patch tokens per chunk; ``keep``: fraction of each chunk's tokens kept at every block of
    ``locs``; ``entries``: fraction of each attention block's entries kept by the mask; ``path``:
    'exact' or 'mirrored'; ``kernel``: the initial 3x3 kernel ('average' or 9 numbers, row by row);
    ``prop_attn``: add log(size) to the attention logits; ``fuse``: fuse the pruned tokens into the kept
    ones (False: drop them, the prune-only ablation)."""

    size: int = 49
    keep: float = 0.5
    locs: Sequence[int] = (3, 6, 9)
    entries: float = 0.5
    path: PathName = "exact"
    kernel: Literal["average"] | Sequence[float] = "average"
    prop_attn: bool = False
    fuse: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise SpecError(f"bspf: size={self.size!r} is invalid; size is the number of patch tokens per chunk, "
                            "a positive int")
        check_keep(self.keep, "bspf")
        if not isinstance(self.entries, (int, float)) or not 0.0 < self.entries <= 1.0:
            raise SpecError(f"bspf: entries={self.entries!r} is outside (0, 1]; it is the fraction of each "
                            "attention block's entries the mask keeps")
        if self.path not in PATHS:
            raise SpecError(f"bspf: unknown path {self.path!r}; valid: {', '.join(map(repr, PATHS))}")
        _kernel_values(self.kernel)


@register_method("bspf")
class BSPF(Reducer):
    """Chunked attention; at ``locs`` each chunk keeps its best-scored tokens and fuses the others in.

    x (B, N, C) -> (B, p + sum_m ceil(keep c_m), C) at each block of ``locs`` (see the module docstring).
    """

    Config = BSPFConfig
    needs = frozenset({"probs"})
    learned = True
    min_onnx_opset = 16  # fusion sums the pruned tokens into the kept ones (scatter_add_)
    conserves_patches = True  # every pruned token is fused into a retained one, sizes summed
    classic_onnx = False  # chunked attention splits a traced size with divmod; a stable sort
    zero = {"size": 1_000_000, "keep": 1.0, "locs": (1,)}  # one chunk (full attention), nothing pruned
    example = {"size": 24, "keep": 0.5, "locs": (1, 2)}  # 64 patches: chunks 24, 24, 16 -> 12, 12, 8 -> 6, 6, 4

    def __init__(self, cfg: BSPFConfig) -> None:
        super().__init__(cfg)
        # without fusion nothing reaches the kernel (module docstring, "Options"): not trainable, not learned
        self.kernel = nn.Parameter(torch.tensor(_kernel_values(cfg.kernel)).view(3, 3), requires_grad=cfg.fuse)
        self.learned = cfg.fuse
        self._chunks: tuple[int, ...] = ()
        self._records: list[BlockRecord] | None = None
        self.proportional = bool(cfg.prop_attn)
        self.conserves_patches = cfg.fuse  # every pruned token is fused into a retained one, sizes summed

    def bind(self, host: Host) -> Schedule:
        c = self.cfg
        locs = check_locs(c.locs, host.depth, self.name)
        chunks, counts, m, size = [], [], host.num_patches, c.size
        for block in range(host.depth):
            chunks.append(size)  # the chunk size of the tokens entering the block
            if block in locs:
                size_now = min(size, m)
                m = sum(count * kept(c.keep, s) for _, count, s in chunk_groups(m, size))
                size = kept(c.keep, size_now)
                counts.append(m)
        self._chunks = tuple(chunks)
        return compile_schedule(host.num_patches, host.depth, self.name, where=self.where, counts=counts, locs=locs)

    def attention_chunk(self, block: int) -> int | None:
        return self._chunks[block]

    def scoring_macs(self, block: int, tokens_in: int, count: int, host: Host) -> int:
        """Plus, per chunk of c tokens keeping k: the kernel at the scored entries (9 c^2 exact, 9 c (c+1)/2
        mirrored) and, with fusion, the cosine similarities (c - k) k D and the Hamming agreement (c - k) k 2c."""
        path = PATHS[self.cfg.path]
        macs = 0
        for _, n, c in chunk_groups(tokens_in - host.num_prefix, self._chunks[block]):
            k = kept(self.cfg.keep, c)
            macs += n * 9 * path.entries(c)
            if self.cfg.fuse:
                macs += n * (c - k) * k * (host.dim + 2 * c)
        return super().scoring_macs(block, tokens_in, count, host) + macs

    def decide(self, attn: Sequence[Tensor], path: str | None = None) -> Decision:
        """The decisions on the diagonal chunk blocks ``attn`` (one (B, H, chunks, c, c) per group, as
        :func:`diagonal_blocks` cuts them) on ``path`` (default: the configured one)."""
        path = path or self.cfg.path
        if path not in PATHS:
            raise SpecError(f"bspf: unknown path {path!r}; valid: {', '.join(map(repr, PATHS))}")
        out = []
        for a in attn:
            B, _, n, c, _ = a.shape
            mean = a.mean(1).flatten(0, 1)  # (B n, c, c) head mean
            scores = entry_scores(mean, self.kernel.to(mean.dtype), path)
            mask = entry_mask(scores, self.cfg.entries)
            token = token_scores(scores, mask).view(B, n, c)
            order = token.argsort(dim=-1, descending=True, stable=True)
            k = kept(self.cfg.keep, c)
            out.append(ChunkDecision(scores.view(B, n, c, c), mask.view(B, n, c, c), token,
                                     order[..., :k].sort(-1).values, order[..., k:].sort(-1).values))
        return Decision(out)

    @contextmanager
    def recording(self) -> Iterator[list[BlockRecord]]:
        """Record what every pruning block saw and decided while the context is open (for experiments)."""
        self._records = records = []
        try:
            yield records
        finally:
            self._records = None

    def reduce(self, x: Tensor, state: TokenState, info: AttnInfo, count: int) -> Tensor:
        groups = chunk_groups(x.shape[1] - state.num_prefix, self._chunks[state.block])
        attn = diagonal_blocks(info.probs, state.num_prefix, groups)
        decision = self.decide(attn)
        if self._records is not None:
            self._records.append(BlockRecord(state.block, [a.detach() for a in attn], decision.token_keep()))
        if not self.cfg.fuse:  # the prune-only ablation: the same kept tokens, the others dropped
            return state.gather(x, kept_positions(state.num_prefix, groups, decision))
        plan, weight = fusion_plan(x, state, groups, decision)
        return state.merge(x, plan, weight)
