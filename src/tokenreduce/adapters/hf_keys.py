"""The state_dict key map between timm's VisionTransformer and transformers' ViT and DeiT, both ways.

With it the same weights run on either host (the cross-host equivalence tests hold the logits
equal, unpatched and under every training-free method). One row per tensor, ``{i}`` the block:

    timm (VisionTransformer[Distilled])   transformers, under B = 'vit' (ViT) or 'deit' (DeiT)
    cls_token                              B.embeddings.cls_token
    dist_token                             B.embeddings.distillation_token          (DeiT)
    pos_embed                              B.embeddings.position_embeddings
    patch_embed.proj.{weight,bias}         B.embeddings.patch_embeddings.projection.{weight,bias}
    blocks.{i}.norm1.*                     B.layers.{i}.layernorm_before.*
    blocks.{i}.attn.qkv.{weight,bias}      B.layers.{i}.attention.{q,k,v}_proj.{weight,bias}
                                           (the fused (3A, D) qkv split in three along dim 0: q, k, v)
    blocks.{i}.attn.proj.*                 B.layers.{i}.attention.o_proj.*
    blocks.{i}.norm2.*                     B.layers.{i}.layernorm_after.*
    blocks.{i}.mlp.fc1.*, mlp.fc2.*        B.layers.{i}.mlp.fc1.*, mlp.fc2.*
    norm.*                                 B.layernorm.*
    head.*                                 classifier.* (ViT), cls_classifier.* (DeiT)
    head_dist.*                            distillation_classifier.*                (DeiT)

The configs must match too: a timm ViT uses LayerNorm eps 1e-6 (transformers' ViTConfig defaults to
1e-12: set ``layer_norm_eps=1e-6``) and exact GELU (``hidden_act='gelu'``, the default), with
``qkv_bias=True`` and ``intermediate_size = mlp_ratio * hidden_size``. Models with parts the other
host lacks (timm's register tokens, LayerScale, qk-norm, avg pooling) have no row: a key without
one is refused, naming it.
"""

from __future__ import annotations

import re

import torch
from torch import Tensor

from ..core.errors import TokenReduceError

#: timm module (or parameter) -> transformers one, under the base prefix B (module docstring)
_EMBED = {"cls_token": "embeddings.cls_token", "dist_token": "embeddings.distillation_token",
          "pos_embed": "embeddings.position_embeddings", "patch_embed.proj": "embeddings.patch_embeddings.projection",
          "norm": "layernorm"}
_BLOCK = {"norm1": "layernorm_before", "attn.proj": "attention.o_proj", "norm2": "layernorm_after",
          "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}
_HEADS = {"vit": {"head": "classifier"}, "deit": {"head": "cls_classifier", "head_dist": "distillation_classifier"}}
_QKV = ("q_proj", "k_proj", "v_proj")


def _table(base: str, depth: int) -> list[tuple[str, str]]:
    """(timm name, transformers name) pairs, longest timm name first (so 'norm1' wins over 'norm')."""
    rows = [(t, f"{base}.{h}") for t, h in _EMBED.items()] + list(_HEADS[base].items())
    rows += [(f"blocks.{i}.{t}", f"{base}.layers.{i}.{h}") for i in range(depth) for t, h in _BLOCK.items()]
    return sorted(rows, key=lambda r: -len(r[0]))


def _rename(key: str, rows: list[tuple[str, str]], direction: str) -> str:
    for src, dst in rows if direction == "to_hf" else [(h, t) for t, h in rows]:
        if key == src or key.startswith(src + "."):
            return dst + key[len(src):]
    raise TokenReduceError(f"no {direction.replace('_', ' ')} key map row for {key!r}: this model has a part the "
                           "other host lacks (register tokens, LayerScale, qk-norm, a pooling head)")


def _depth(keys: list[str], pattern: str) -> int:
    return 1 + max((int(m.group(1)) for k in keys if (m := re.match(pattern, k))), default=-1)


def timm_to_hf(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """A timm VisionTransformer's state_dict under transformers' ViTForImageClassification keys, or
    DeiTForImageClassificationWithTeacher's when it has a distillation token (module docstring)."""
    base = "deit" if "dist_token" in state_dict else "vit"
    rows = _table(base, _depth(list(state_dict), r"blocks\.(\d+)\."))
    out = {}
    for key, value in state_dict.items():
        m = re.fullmatch(r"blocks\.(\d+)\.attn\.qkv\.(weight|bias)", key)
        if m:
            for name, part in zip(_QKV, value.chunk(3, dim=0), strict=True):
                out[f"{base}.layers.{m.group(1)}.attention.{name}.{m.group(2)}"] = part.clone()
        else:
            out[_rename(key, rows, "to_hf")] = value
    return out


def hf_to_timm(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """A transformers ViTForImageClassification's (or DeiTForImageClassificationWithTeacher's)
    state_dict under timm VisionTransformer(Distilled) keys (module docstring)."""
    base = "deit" if any(k.startswith("deit.") for k in state_dict) else "vit"
    rows = _table(base, _depth(list(state_dict), rf"{base}\.layers\.(\d+)\."))
    out, qkv = {}, {}
    for key, value in state_dict.items():
        m = re.fullmatch(rf"{base}\.layers\.(\d+)\.attention\.([qkv]_proj)\.(weight|bias)", key)
        if m:
            qkv.setdefault((m.group(1), m.group(3)), {})[m.group(2)] = value
        else:
            out[_rename(key, rows, "to_timm")] = value
    for (i, kind), parts in qkv.items():
        out[f"blocks.{i}.attn.qkv.{kind}"] = torch.cat([parts[name] for name in _QKV], 0)
    return out
