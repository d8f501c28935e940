"""Stems: what turns the image into patch tokens, addressed by spec strings (``patch``, ``conv``).

A stem replaces ``model.patch_embed.proj`` only: timm's PatchEmbed keeps its padding checks,
flatten and norm, so the token grid (``patch_embed.grid_size``), the position embedding and
everything after them are unchanged. The replacement maps (B, C_in, H, W) -> (B, D, H/p, W/p)
like the patchify convolution it replaces and exposes ``in_channels`` / ``out_channels``.

- ``patch``: timm's PatchEmbed as it is (one p x p convolution with stride p).

:func:`build_stem` installs a stem with fresh weights; on a trained checkpoint that is a stem swap
(``--init CKPT --stem conv``): the rest of the network keeps its weights and the new stem is trained
by the fine-tune.
- ``conv(norm='bn')``: :class:`ConvStem`, ImagePiece's local-coherence stem.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from torch import Tensor, nn

from ..core.errors import SpecError, UnsupportedModelError
from ..core.registry import NoParams, Registry

StemFn = Callable[[nn.Module, object], None]
_STEMS: Registry[StemFn] = Registry("stem")

#: Patch sizes the conv stem reaches: 1 to 4 stride-2 convolutions among its four 3x3 ones.
CONV_PATCH_SIZES = (2, 4, 8, 16)
#: Normalisation after each 3x3 convolution of the conv stem.
Norm = Literal["bn", "none"]
_NORMS: dict[Norm, Callable[[int], nn.Module]] = {"bn": nn.BatchNorm2d, "none": lambda c: nn.Identity()}


def register_stem(name: str, config: type = NoParams) -> Callable[[StemFn], StemFn]:
    """Decorator: ``fn(model, cfg)`` installs stem ``name`` (Config ``config``) into a timm ViT."""
    return _STEMS.register(name, config)


def list_stems() -> list[str]:
    """Names of the registered stems."""
    return _STEMS.names()


def canonical_stem(spec: str) -> str:
    """The canonical spec of a stem (every parameter spelled out); SpecError if unknown."""
    return _STEMS.canonical(spec)


def build_stem(spec: str, model: nn.Module) -> nn.Module:
    """Install the stem ``spec`` into ``model`` (in place, fresh weights); returns ``model``."""
    pe = getattr(model, "patch_embed", None)
    if pe is None or not hasattr(pe, "proj"):
        raise UnsupportedModelError(f"stems replace patch_embed.proj; {type(model).__name__} has none")
    _, fn, cfg = _STEMS.resolve(spec)
    fn(model, cfg)
    return model


@register_stem("patch")
def _patch(model: nn.Module, cfg: NoParams) -> None:
    """timm's patch embedding: the model's own ``patch_embed.proj`` is left as timm built it; in place of
    this module's conv stem (a stem swap on a checkpoint) a fresh p x p, stride-p convolution of the same
    widths."""
    pe = model.patch_embed
    if isinstance(pe.proj, ConvStem):
        size = tuple(int(s) for s in pe.patch_size)
        old = pe.proj
        ref = next(old.parameters())
        pe.proj = nn.Conv2d(old.in_channels, old.out_channels, size, stride=size).to(device=ref.device, dtype=ref.dtype)


def _check_norm(norm: str) -> None:
    if norm not in _NORMS:
        raise SpecError(f"conv stem: unknown norm {norm!r}; valid: {', '.join(map(repr, _NORMS))}")


class ConvStem(nn.Module):
    """ImagePiece's local-coherence stem: four 3x3 convolutions (BN + ReLU) and a 1x1 to D.

    ImagePiece (Yoa et al., "ImagePiece: Content-aware Re-tokenization for Efficient Image
    Recognition", arXiv 2412.16491, AAAI 2025) replaces the 16x16 patchify convolution with
    "four 3x3 convolutions and one 1x1 convolution" so that neighbouring tokens see overlapping
    pixels (local coherence). Strides, channels and normalisation are not published; we follow
    the template of Xiao et al. 2021, "Early Convolutions Help Transformers See Better"
    (arXiv 2106.14881):

        x (B, C_in, H, W)
        -> [3x3 conv, stride s_i, padding 1 -> BN -> ReLU] for i = 1..4, widths D/8, D/4, D/2, D
        -> 1x1 conv D -> D (with bias)                     -> (B, D, H/p, W/p)

    with s_i = 2 for the first log2(p) convolutions and 1 for the rest, so that the product of
    the strides is the patch size p: p = 16 gives four stride-2 convolutions (Xiao et al.'s
    stem), p = 4 two stride-2 then two stride-1 ones (downsampling first keeps the full-resolution
    layers cheap), p = 2 and 8 one and three. Hence p must be one of 2, 4, 8, 16 (square).
    The 3x3 convolutions have no bias when followed by BN. ``norm='none'`` drops the BN (the
    ReLU stays). Initialisation: PyTorch's defaults (BN weight 1, bias 0). Unlike Xiao et al. we
    do not remove a transformer block to match the cost of the stem; its MACs are measured
    (bench/macs.py) and reported with the rest.
    """

    def __init__(self, in_channels: int, out_channels: int, patch_size: int, norm: str = "bn") -> None:
        super().__init__()
        if patch_size not in CONV_PATCH_SIZES:
            raise SpecError(f"the conv stem reaches patch sizes {', '.join(map(str, CONV_PATCH_SIZES))} (square, "
                            f"a power of two made of stride-2 3x3 convolutions), not {patch_size}")
        if out_channels % 8:
            raise SpecError(f"the conv stem's widths are D/8, D/4, D/2, D: the embedding width D={out_channels} "
                            "must be divisible by 8")
        _check_norm(norm)
        self.in_channels, self.out_channels, self.patch_size, self.norm = in_channels, out_channels, patch_size, norm
        n2 = int(math.log2(patch_size))
        self.strides = (2,) * n2 + (1,) * (4 - n2)
        widths = [out_channels // 8, out_channels // 4, out_channels // 2, out_channels]
        layers: list[nn.Module] = []
        c = in_channels
        for s, w in zip(self.strides, widths, strict=True):
            layers += [nn.Conv2d(c, w, 3, stride=s, padding=1, bias=norm == "none"), _NORMS[norm](w), nn.ReLU()]
            c = w
        layers.append(nn.Conv2d(c, out_channels, 1))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)  # (B, C_in, H, W) -> (B, D, H/p, W/p)

    def extra_repr(self) -> str:
        return f"in_channels={self.in_channels}, out_channels={self.out_channels}, patch_size={self.patch_size}, " \
               f"strides={self.strides}, norm={self.norm!r}"


@dataclass(frozen=True)
class ConvConfig:
    """``norm``: normalisation after each 3x3 convolution, 'bn' (BatchNorm, Xiao et al.) or 'none'."""

    norm: Norm = "bn"

    def __post_init__(self) -> None:
        _check_norm(self.norm)


@register_stem("conv", ConvConfig)
def _conv(model: nn.Module, cfg: ConvConfig) -> None:
    pe = model.patch_embed
    proj = pe.proj
    ph, pw = (int(s) for s in pe.patch_size)
    if ph != pw:
        raise SpecError(f"the conv stem needs square patches, this model has {ph}x{pw}; supported patch sizes: "
                        f"{', '.join(map(str, CONV_PATCH_SIZES))}")
    in_channels = getattr(proj, "in_channels", None)
    out_channels = getattr(proj, "out_channels", None)
    if in_channels is None or out_channels is None:
        raise UnsupportedModelError(f"patch_embed.proj ({type(proj).__name__}) has no in_channels/out_channels")
    stem = ConvStem(in_channels, out_channels, ph, cfg.norm)
    ref = next(proj.parameters(), None)
    if ref is not None:
        stem = stem.to(device=ref.device, dtype=ref.dtype)
    pe.proj = stem

