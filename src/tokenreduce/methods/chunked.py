"""chunked: chunked (block-local) attention at every block, no token reduction.

Paper: "Block-based Symmetric Pruning and Fusion for Efficient Vision Transformers", Hsieh et al.,
2025, arXiv 2507.12125 (BSPF-ViT), which runs its pruning on chunk attention. No official code.
This is the honest baseline for BSPF: the reviewers note that chunk attention alone reaches most of
the paper's gain (docs/methods.md, section "BSPF-ViT"), so it is a method of its own, with the chunk size a parameter.

The M patch tokens are cut into contiguous chunks of ``size`` tokens in their current order (the
last chunk may be shorter); with q, k, v (B, H, N, d) and p prefix tokens:
    patch query i in chunk c:  o_i = softmax_{j in prefix + c}(q_i . k_j / sqrt(d)) v
    prefix query i:            o_i = softmax_{j in all N}(q_i . k_j / sqrt(d)) v
computed chunk by chunk (core.attention.attend), so attention costs
2 * A * (p N + sum_c |c| (p + |c|)) MACs instead of 2 * A * N^2 (core.attention.attention_macs).
size=49 on DeiT-S (196 patches): 4 chunks of 49, attention pairs 197^2 -> 197 + 4 * 49 * 50.
A size >= the patch count is one chunk: full attention.

Deviations:
- Prefix tokens (cls, dist, registers) attend to every token and every token attends to them; the
  paper does not say how the class token takes part in the chunks.
- Chunks are contiguous runs of tokens in raster order (3.5 grid rows for 49 tokens on 14 x 14),
  not 2-D windows; the paper does not say which.
- No fine-tuning schedule is implied: applied to a pretrained model without fine-tuning it changes
  the computation (tokens no longer see other chunks), so accuracy needs fine-tuning to recover.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from ..core.errors import SpecError
from ..core.method import AttnInfo, Host, Reducer, register_method
from ..core.schedule import Schedule, compile_schedule
from ..core.state import TokenState


@dataclass(frozen=True)
class ChunkedConfig:
    size: int = 49


@register_method("chunked")
class Chunked(Reducer):
    """Attention within chunks of ``size`` patch tokens at every block; x (B, N, C) keeps every token."""

    Config = ChunkedConfig
    classic_onnx = False  # chunked attention splits a traced size with divmod
    conserves_patches = True  # nothing is dropped: every token keeps size 1
    zero = {"size": 1_000_000}  # one chunk holds every patch of any host: full attention
    example = {"size": 24}  # 64 patches: chunks of 24, 24 and 16 (a partial last chunk)

    def bind(self, host: Host) -> Schedule:
        size = self.cfg.size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise SpecError(
                f"{self.name}: size={size!r} is invalid; size is the number of patch tokens per "
                f"chunk, a positive int (>= {host.num_patches} means full attention on this model)"
            )
        # no block reduces: every count is the patch count
        return compile_schedule(host.num_patches, host.depth, self.name, where=self.where, counts=(), locs=())

    def attention_chunk(self, block: int) -> int | None:
        return self.cfg.size

    def reduce(self, x: Tensor, state: TokenState, info: AttnInfo, count: int) -> Tensor:
        """Never called (the schedule has no active block): chunked attention keeps every token."""
        return x
