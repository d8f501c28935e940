"""Patch a Hugging Face transformers vision encoder in place, reversibly, to run a token reducer.

Supported (the layout of transformers >= 5): ``ViTModel``, ``ViTForImageClassification``,
``DeiTModel``, ``DeiTForImageClassification``, ``DeiTForImageClassificationWithTeacher`` (class and
distillation tokens), ``Dinov2Model``, ``Dinov2ForImageClassification``, ``Dinov2WithRegistersModel``
and ``...ForImageClassification`` (register tokens), ``CLIPVisionModel`` and the vision tower of
``CLIPModel``, ``CLIPVisionModelWithProjection``, ``CLIPForImageClassification``, and, with no class token,
``SiglipVisionModel`` and the vision tower of ``SiglipModel`` and ``SiglipForImageClassification``
(the attention-pooling head, ``head``, pools the reduced tokens as they are), and their SigLIP 2
counterparts (``Siglip2VisionModel``, ...: patchified ``pixel_values`` (B, N, C * p * p) with
``spatial_shapes`` and ``pixel_attention_mask``; a batch whose images share one grid and carry no
padding, the padding of mixed sizes being an attention mask; :func:`feed` patchifies images as its
processor does, for whatever feeds images to a model). Prefix tokens (class,
distillation, registers) come first and are never reduced.

The patch is per instance: the *base* model's ``forward`` (the ``ViTModel`` inside a
``ViTForImageClassification``, the ``CLIPVisionModel`` inside a ``CLIPModel``) becomes an instance
attribute (``remove`` deletes it, so the class's own forward is back), and every wrapper keeps its
own forward and heads. The patched forward calls the host's own sub-modules by name: the
embeddings (and CLIP's ``pre_layrnorm``); per layer the pre-attention norm (``layernorm_before``,
``norm1``, ``layer_norm1``), the attention's ``q_proj``, ``k_proj``, ``v_proj`` and output
projection (``o_proj``, ``out_proj``) with its own scaling, the branch after it (``dropout``;
DINOv2's ``layer_scale1`` and ``drop_path``), the second norm and the ``mlp`` (DINOv2's
``layer_scale2``); then the final norm and pooling (``layernorm`` and ``pooler``; CLIP's
``post_layernorm`` on the class token). Each layer is a :class:`BlockView` run by the block loop
every host shares (adapters/common.py): attention is ``core.attention.attend``, PyTorch's fused
SDPA (the kernel transformers' ``sdpa`` implementation calls) wherever nothing needs the
probabilities, explicit (``eager``) only in the blocks where the method asks for them.

Behaving like transformers' own forward:

- hooks: each layer is entered through its own ``__call__`` (``apply`` installs a forward on each
  layer, :func:`tokenreduce.adapters.common.block_forward`, that runs the reduced layer inside a
  patched forward and the class's own forward when the layer is called on its own; ``remove``
  deletes it). A forward pre-hook on a layer sees ``(hidden_states,)``, the tokens entering it
  (B, N_in, C), a forward hook its output, a tensor (B, N_out, C) as transformers 5 layers return,
  after the layer's reduction; hooks with ``with_kwargs=True`` see the keyword ``tokenreduce`` (the
  forward's block loop) instead of the attention mask. They fire once per forward, checkpointed or
  not (outside the checkpoint, as transformers places it). Hooks on the layer's norms, ``mlp``, the
  attention's ``q_proj``, ``k_proj``, ``v_proj`` and output projection fire as they are called (again
  in a recomputation); a hook on the attention module itself (``attention``, ``self_attn``) does not;
- gradient checkpointing: after ``gradient_checkpointing_enable(gradient_checkpointing_kwargs=...)``
  (v5: ``activation_checkpointing_enable``) every layer, reducing or not, runs through the layer's
  own ``_gradient_checkpointing_func`` (torch's checkpoint with the user's kwargs, reentrant or not),
  once per layer, in training with gradients as transformers does; the reducer's work runs inside it
  and is replayed exactly by the recomputation (:func:`tokenreduce.adapters.common.checkpointed`);
- any resolution: the input's patch grid decides the schedule (``Patch.at_grid``), so
  ``interpolate_pos_encoding=True`` (ViT, DeiT, CLIP) and DINOv2 at any size run as unpatched; without
  it a size other than the config's is refused by transformers' own embeddings, as unpatched;
- ``return_dict``: the keyword, else ``config.return_dict``, as transformers reads it (a tuple when
  False; transformers' classification wrappers fail on ``config.return_dict = False`` in their own
  forward, patched or not: pass ``return_dict=False`` to the call instead);
- ``save_pretrained`` writes the model's state_dict, a learned reducer's ``tokenreduce.*`` tensors
  included; ``from_pretrained`` gives back the *unpatched* model (it knows nothing of tokenreduce, and
  reports those keys as unexpected): call ``tokenreduce.apply(model, spec)`` again (then, for a learned
  reducer, ``model.load_state_dict(saved, strict=False)`` to put its tensors back).

Not available on a patched model, each refused by name: attention masks, ``output_attentions`` and
``output_hidden_states`` (the token count changes between layers; ``tokenreduce.get_info`` says
what each layer kept), ``torch.jit.script`` (TorchScript would compile the class's unreduced
forward) and a classic ONNX export (``torch.onnx.export(dynamo=False)``) of a method that declares
it cannot take one. torch.fx symbolic tracing fails in transformers' own code (its vision models do
not fx-trace, unpatched either; fx traces the class's forward of the model it is given), so it never
yields a graph; where it reaches the patched forward, that refuses it by name. A patched model
pickles: pickle, ``torch.save(model)`` and deepcopy give it back patched. Nothing here imports
transformers until a transformers model is given.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
from torch import Tensor, nn

from ..core.errors import TokenReduceError, UnsupportedModelError
from ..core.method import Host, Reducer
from .common import (
    ATTR,
    AttentionView,
    BlockView,
    Feed,
    HostParts,
    Patch,
    PoolCost,
    RefuseScript,
    attach,
    detach,
    enter_blocks,
    guard_forward,
    heads_view,
    hold_static,
    leave_blocks,
    run_blocks,
    split_heads,
)
from .common import get_patch as get_patch

DESCRIPTION = "transformers ViT, DeiT, DINOv2, CLIP and SigLIP vision models"
#: The base model's instance attributes ``apply`` sets and ``remove`` deletes.
_PATCHED_ATTRS = ("forward", "__prepare_scriptable__")
INSTALL_HINT = "pip install 'tokenreduce[hf]'"


def require_transformers() -> ModuleType:
    """The transformers package, or a TokenReduceError naming the extra that installs it."""
    try:
        import transformers
    except ImportError:
        raise TokenReduceError(f"this needs transformers, an optional dependency: {INSTALL_HINT}") from None
    return transformers


# ----- views of the layers -------------------------------------------------------------------------


class HFAttention(AttentionView):
    """A transformers attention with separate q, k, v projections (ViT, DeiT, DINOv2: ``o_proj``,
    ``scaling``, ``attention_dropout``; CLIP: ``out_proj``, ``scale``, ``dropout``)."""

    def __init__(self, attn: nn.Module, out: str, scale: str, dropout: str) -> None:
        self.m, self.head_dim, self.scale = attn, attn.head_dim, getattr(attn, scale)
        self.inputs, self.output = (attn.q_proj, attn.k_proj, attn.v_proj), getattr(attn, out)
        self.num_heads = attn.q_proj.out_features // attn.head_dim
        self._dropout = float(getattr(attn, dropout))

    def qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = (split_heads(proj(x), self.head_dim) for proj in self.inputs)  # (B, H, N, d) each
        return q, k, v

    def out(self, o: Tensor, x: Tensor) -> Tensor:
        return self.output(heads_view(o))

    def dropout_p(self) -> float:
        return self._dropout if self.m.training else 0.0


class HFLayerView(BlockView):
    """What every transformers layer view shares: the layer is ``module``, and its checkpointing is
    transformers' own (a ``GradientCheckpointingLayer``): ``gradient_checkpointing_enable`` sets the
    layer's ``gradient_checkpointing`` flag and its ``_gradient_checkpointing_func``, torch's checkpoint
    with the user's ``gradient_checkpointing_kwargs``, which the layer uses in training with gradients."""

    def __init__(self, layer: nn.Module) -> None:
        self.m, self.module, self.mlp = layer, layer, layer.mlp

    def checkpointing(self) -> Callable[..., Any] | None:
        layer = self.m
        if getattr(layer, "gradient_checkpointing", False) and layer.training and torch.is_grad_enabled():
            return layer._gradient_checkpointing_func
        return None


class ViTLayerView(HFLayerView):
    """ViTLayer, DeiTLayer: layernorm_before, attention, dropout; layernorm_after, mlp, dropout."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__(layer)
        self.attn = HFAttention(layer.attention, "o_proj", "scaling", "attention_dropout")

    def norm1(self, x: Tensor) -> Tensor:
        return self.m.layernorm_before(x)

    def attn_branch(self, a: Tensor) -> Tensor:
        return self.m.dropout(a)

    def mlp_branch(self, x: Tensor) -> Tensor:
        return self.m.dropout(self.m.mlp(self.m.layernorm_after(x)))


class Dinov2LayerView(HFLayerView):
    """Dinov2Layer: norm1, attention, layer_scale1, drop_path; norm2, mlp, layer_scale2, drop_path."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__(layer)
        self.attn = HFAttention(layer.attention, "o_proj", "scaling", "attention_dropout")

    def norm1(self, x: Tensor) -> Tensor:
        return self.m.norm1(x)

    def attn_branch(self, a: Tensor) -> Tensor:
        return self.m.drop_path(self.m.layer_scale1(a))

    def mlp_branch(self, x: Tensor) -> Tensor:
        return self.m.drop_path(self.m.layer_scale2(self.m.mlp(self.m.norm2(x))))


class CLIPLayerView(HFLayerView):
    """CLIPEncoderLayer, SiglipEncoderLayer: layer_norm1, self_attn; layer_norm2, mlp."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__(layer)
        self.attn = HFAttention(layer.self_attn, "out_proj", "scale", "dropout")

    def norm1(self, x: Tensor) -> Tensor:
        return self.m.layer_norm1(x)

    def attn_branch(self, a: Tensor) -> Tensor:
        return a

    def mlp_branch(self, x: Tensor) -> Tensor:
        return self.m.mlp(self.m.layer_norm2(x))


# ----- the families: where each base model keeps its parts -----------------------------------------


class Family:
    """One family of base models: its layers (a dotted path, the layer classes and their view),
    its embedding step, its stem and how it finishes (final norm, pooling)."""

    layers_path: str
    layer_classes: tuple[str, ...]
    view: type[BlockView]
    #: sub-modules every layer must have (the transformers >= 5 layout the views call)
    layer_parts: tuple[str, ...]

    def __init__(self, *layer_classes: str) -> None:
        self.layer_classes = layer_classes

    def layers(self, base: nn.Module) -> nn.ModuleList:
        return functools.reduce(getattr, self.layers_path.split("."), base)

    def embed(self, base: nn.Module, pixel_values: Tensor, kwargs: dict[str, Any]) -> Tensor:
        """Images -> the tokens entering the first layer, (B, p + N, C), by the host's embeddings."""
        raise NotImplementedError

    def finish(self, base: nn.Module, x: Tensor) -> Any:
        """The last layer's tokens -> the base model's output (BaseModelOutputWithPooling)."""
        raise NotImplementedError

    def stem(self, base: nn.Module) -> tuple[nn.Module, nn.Module]:
        """(the module turning images into patch tokens, its projection)."""
        pe = base.embeddings.patch_embeddings
        return pe, pe.projection

    def grid(self, base: nn.Module, pixel_values: Any, kwargs: dict[str, Any], bound: tuple[int, int]
             ) -> tuple[int, int]:
        """The patch grid (gh, gw) of this forward's input (checked: :func:`_grid`); ``bound``: the grid the
        reducer is bound to (the last input's)."""
        return _grid(base, pixel_values)

    def feed(self, base: nn.Module, images: Tensor) -> Feed:
        """Images (B, C, H, W) as the forward takes them: ``pixel_values`` themselves."""
        return Feed((images,))

    def config_grid(self, cfg: Any) -> tuple[int, int]:
        """The patch grid of the config's own image size."""
        size, patch = _grid_of(cfg.image_size), _grid_of(cfg.patch_size)
        return size[0] // patch[0], size[1] // patch[1]

    def heads(self, base: nn.Module) -> tuple[nn.Module, ...]:
        """The base model's own modules after the layers that count (its pooler)."""
        pooler = getattr(base, "pooler", None)
        return (pooler,) if isinstance(pooler, nn.Module) else ()

    def pool(self, base: nn.Module) -> PoolCost | None:
        """An attention-pooling head over every final token (SigLIP's), or None."""
        return None


def _output(**fields: Tensor | None) -> Any:
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    return BaseModelOutputWithPooling(**fields)


class ViTFamily(Family):
    """ViTModel, DeiTModel: embeddings, layers, layernorm, optional pooler (a Linear on the class token)."""

    layers_path, view = "layers", ViTLayerView
    layer_parts = ("layernorm_before", "attention.q_proj", "attention.o_proj", "dropout", "layernorm_after", "mlp")

    def embed(self, base: nn.Module, pixel_values: Tensor, kwargs: dict[str, Any]) -> Tensor:
        pixel_values = pixel_values.to(base.embeddings.patch_embeddings.projection.weight.dtype)
        return base.embeddings(pixel_values, bool_masked_pos=kwargs.pop("bool_masked_pos", None),
                               interpolate_pos_encoding=kwargs.pop("interpolate_pos_encoding", None))

    def finish(self, base: nn.Module, x: Tensor) -> Any:
        seq = base.layernorm(x)
        return _output(last_hidden_state=seq, pooler_output=base.pooler(seq) if base.pooler is not None else None)


class Dinov2Family(Family):
    """Dinov2Model, Dinov2WithRegistersModel: embeddings, encoder.layer, layernorm; pooled = class token."""

    layers_path, view = "encoder.layer", Dinov2LayerView
    layer_parts = ("norm1", "attention.q_proj", "attention.o_proj", "layer_scale1", "drop_path", "norm2", "mlp",
                   "layer_scale2")

    def embed(self, base: nn.Module, pixel_values: Tensor, kwargs: dict[str, Any]) -> Tensor:
        return base.embeddings(pixel_values, bool_masked_pos=kwargs.pop("bool_masked_pos", None))

    def finish(self, base: nn.Module, x: Tensor) -> Any:
        seq = base.layernorm(x)
        return _output(last_hidden_state=seq, pooler_output=seq[:, 0, :])


class CLIPFamily(Family):
    """CLIPVisionModel: embeddings, pre_layrnorm, encoder.layers; pooled = post_layernorm(class token),
    the last hidden state left unnormalised (as CLIP returns it)."""

    layers_path, view = "encoder.layers", CLIPLayerView
    layer_parts = ("layer_norm1", "self_attn.q_proj", "self_attn.out_proj", "layer_norm2", "mlp")

    def embed(self, base: nn.Module, pixel_values: Tensor, kwargs: dict[str, Any]) -> Tensor:
        x = base.embeddings(pixel_values, interpolate_pos_encoding=bool(kwargs.pop("interpolate_pos_encoding", False)))
        return self.pre_norm(base, x)

    def pre_norm(self, base: nn.Module, x: Tensor) -> Tensor:
        """CLIP's norm on the embeddings, before the first layer."""
        return base.pre_layrnorm(x)

    def finish(self, base: nn.Module, x: Tensor) -> Any:
        return _output(last_hidden_state=x, pooler_output=base.post_layernorm(x[:, 0, :]))

    def stem(self, base: nn.Module) -> tuple[nn.Module, nn.Module]:
        conv = base.embeddings.patch_embedding
        return conv, conv


class SiglipFamily(CLIPFamily):
    """SiglipVisionModel: embeddings (patches only, no class token), encoder.layers; post_layernorm on
    every token, then the attention-pooling head (``head``, when ``config.vision_use_head``) over the
    tokens as the reduction left them: one probe query attending to them with the host's own weights, no
    size bias (``get_info(model).sizes`` has the sizes for a caller that wants to weight them)."""

    def pre_norm(self, base: nn.Module, x: Tensor) -> Tensor:
        return x  # none

    def finish(self, base: nn.Module, x: Tensor) -> Any:
        seq = base.post_layernorm(x)
        return _output(last_hidden_state=seq, pooler_output=base.head(seq) if base.use_head else None)

    def heads(self, base: nn.Module) -> tuple[nn.Module, ...]:
        return ()  # its attention-pooling head is counted over the tokens it pools (pool)

    def pool(self, base: nn.Module) -> PoolCost | None:
        if not base.use_head:
            return None
        head, dim = base.head, base.config.hidden_size
        mlp = sum(m.in_features * m.out_features for m in head.modules() if isinstance(m, nn.Linear))
        # nn.MultiheadAttention's in-projection is a parameter, not a Linear: q for the probe, k and v per token
        return PoolCost(per_token=2 * dim * dim, fixed=dim * dim + mlp, width=dim, probes=1)


class Siglip2Family(SiglipFamily):
    """Siglip2VisionModel: SiglipFamily's layout, on patchified pixel_values (B, N, C * p * p) embedded by
    a Linear with position embeddings resized to ``spatial_shapes`` (B, 2); the config's grid is the
    square of ``num_patches``. Images of other grids in one batch, or padding (``pixel_attention_mask``
    with zeros), are refused: they need an attention mask.

    The input's grid is in the values of ``spatial_shapes``, which a compiled graph sees only as a tensor
    (reading them is a graph break): under torch.compile the grid is the one the reducer is bound to
    (the config's, or that of the last eager forward) when it holds the input's N patches, else the
    square one of N; a grid it cannot tell is refused naming the way out (one eager forward at that grid
    first). The values are then checked inside the graph, as the forward runs (``torch._assert_async``:
    a RuntimeError carrying the same message)."""

    def grid(self, base: nn.Module, pixel_values: Any, kwargs: dict[str, Any], bound: tuple[int, int]
             ) -> tuple[int, int]:
        shapes, mask = kwargs.get("spatial_shapes"), kwargs.get("pixel_attention_mask")
        if not isinstance(pixel_values, Tensor) or pixel_values.dim() != 3 or not isinstance(shapes, Tensor):
            raise TokenReduceError("SigLIP 2 takes patchified pixel_values (B, N, C * p * p) with spatial_shapes "
                                   "(B, 2), as its image processor makes them (tokenreduce.adapters.hosts.feed "
                                   "makes them from images)")
        if torch.compiler.is_compiling():
            return _traced_grid(pixel_values.shape[1], shapes, mask, bound)
        if (shapes != shapes[:1]).any() or (mask is not None and not bool(mask.all())):
            raise TokenReduceError(_ONE_GRID)
        gh, gw = (int(v) for v in shapes[0])
        if gh * gw != pixel_values.shape[1]:
            raise TokenReduceError(f"spatial_shapes say {gh}x{gw} patches; pixel_values hold {pixel_values.shape[1]}")
        return gh, gw

    def feed(self, base: nn.Module, images: Tensor) -> Feed:
        """Images (B, C, H, W) patchified as transformers' Siglip2ImageProcessor does it
        (``convert_image_to_patches``: row-major patches, each p x p x C values, channels last), one
        grid for the batch and no padding: ``pixel_values`` (B, gh * gw, C * p * p), ``spatial_shapes``
        (B, 2) and ``pixel_attention_mask`` (B, gh * gw) of ones. H and W are multiples of p (the
        processor resizes to them; here they are checked)."""
        p, chans = int(base.config.patch_size), int(base.config.num_channels)
        if images.dim() != 4 or images.shape[1] != chans or images.shape[2] % p or images.shape[3] % p:
            raise TokenReduceError(f"SigLIP 2 patchifies images (B, {chans}, H, W) with H and W multiples of its "
                                   f"patch size {p}; got {tuple(images.shape)}")
        b, _, h, w = images.shape
        gh, gw = h // p, w // p
        patches = images.reshape(b, chans, gh, p, gw, p).permute(0, 2, 4, 3, 5, 1).reshape(b, gh * gw, p * p * chans)
        shapes = torch.tensor([[gh, gw]] * b, device=images.device)
        mask = torch.ones(b, gh * gw, dtype=torch.int32, device=images.device)
        return Feed((), {"pixel_values": patches, "spatial_shapes": shapes, "pixel_attention_mask": mask})

    def config_grid(self, cfg: Any) -> tuple[int, int]:
        side = int(cfg.num_patches ** 0.5)
        return side, side

    def embed(self, base: nn.Module, pixel_values: Tensor, kwargs: dict[str, Any]) -> Tensor:
        kwargs.pop("pixel_attention_mask", None)  # all ones (checked by grid)
        return base.embeddings(pixel_values, kwargs.pop("spatial_shapes"))

    def finish(self, base: nn.Module, x: Tensor) -> Any:
        seq = base.post_layernorm(x)
        # the head's own call with no padding: a mask of ones over the tokens left
        pooled = base.head(seq, x.new_ones(x.shape[:2], dtype=torch.long)) if base.use_head else None
        return _output(last_hidden_state=seq, pooler_output=pooled)


_ONE_GRID = ("token reduction on SigLIP 2 takes a batch of images with one patch grid and no padding "
             "(pixel_attention_mask all ones); batch images of one size together")


def _traced_grid(n: int, shapes: Tensor, mask: Tensor | None, bound: tuple[int, int]) -> tuple[int, int]:
    """Siglip2Family.grid under torch.compile: the grid from the static N (the class docstring), the values
    of ``spatial_shapes`` and ``pixel_attention_mask`` checked in the graph."""
    side = int(round(n ** 0.5))
    grid = bound if bound[0] * bound[1] == n else (side, side)
    if grid[0] * grid[1] != n:
        raise TokenReduceError(f"a compiled SigLIP 2 forward cannot read its patch grid from spatial_shapes (a graph "
                               f"sees their shape, not their values), and {n} patches are no square and not the "
                               f"{bound[0]}x{bound[1]} grid the reducer is bound to: run the patched model once "
                               "eagerly on an input of this grid before compiling it")
    ok = (shapes == shapes.new_tensor(grid)).all()
    if mask is not None:
        ok = ok & mask.bool().all()
    torch._assert_async(ok, f"{_ONE_GRID}; this compiled forward was traced for {grid[0]}x{grid[1]} patches")
    return grid


#: base model class -> its family
FAMILIES: dict[str, Family] = {
    "ViTModel": ViTFamily("ViTLayer"),
    "DeiTModel": ViTFamily("DeiTLayer"),
    "Dinov2Model": Dinov2Family("Dinov2Layer"),
    "Dinov2WithRegistersModel": Dinov2Family("Dinov2WithRegistersLayer"),
    "CLIPVisionModel": CLIPFamily("CLIPEncoderLayer"),
    "SiglipVisionModel": SiglipFamily("SiglipEncoderLayer"),
    "Siglip2VisionModel": Siglip2Family("Siglip2EncoderLayer"),
}
#: wrapper class -> (attribute holding its base model, its heads: the modules after the base that count)
WRAPPERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "ViTForImageClassification": ("vit", ("classifier",)),
    "DeiTForImageClassification": ("deit", ("classifier",)),
    "DeiTForImageClassificationWithTeacher": ("deit", ("cls_classifier", "distillation_classifier")),
    "Dinov2ForImageClassification": ("dinov2", ("classifier",)),
    "Dinov2WithRegistersForImageClassification": ("dinov2_with_registers", ("classifier",)),
    "CLIPModel": ("vision_model", ("visual_projection",)),
    "CLIPVisionModelWithProjection": ("vision_model", ("visual_projection",)),
    "CLIPForImageClassification": ("vision_model", ("classifier",)),
    "SiglipModel": ("vision_model", ()),
    "SiglipForImageClassification": ("vision_model", ("classifier",)),
    "Siglip2Model": ("vision_model", ()),
    "Siglip2ForImageClassification": ("vision_model", ("classifier",)),
}


def _hf_names(model: nn.Module) -> list[str]:
    """Names of the transformers classes ``model`` is an instance of, most derived first."""
    return [c.__name__ for c in type(model).__mro__ if c.__module__.startswith("transformers.")]


def accepts(model: nn.Module) -> bool:
    """Whether ``model`` comes from transformers (by its classes' module names: no import)."""
    return bool(_hf_names(model))


def _resolve(model: nn.Module) -> tuple[nn.Module, Family, tuple[nn.Module, ...]]:
    """(base model, its family, the heads after it) of a supported transformers model."""
    for name in _hf_names(model):
        if name in WRAPPERS:
            attr, heads = WRAPPERS[name]
            base = getattr(model, attr)
            family = next((FAMILIES[n] for n in _hf_names(base) if n in FAMILIES), None)
            if family is not None:
                return base, family, family.heads(base) + tuple(getattr(model, h) for h in heads)
        if name in FAMILIES:
            return model, FAMILIES[name], FAMILIES[name].heads(model)
    raise UnsupportedModelError(
        f"tokenreduce does not patch transformers' {type(model).__name__}; supported: "
        f"{', '.join(sorted([*FAMILIES, *WRAPPERS]))}"
    )


def _grid_of(value: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    return (int(value), int(value)) if isinstance(value, int) else (int(value[0]), int(value[1]))


def _prefix(base: nn.Module) -> tuple[tuple[str, int], ...]:
    """(kind, count) of the prefix tokens in sequence order: class, distillation, registers."""
    emb = base.embeddings
    registers = getattr(emb, "register_tokens", None)
    kinds = (("cls", int(hasattr(emb, "cls_token") or hasattr(emb, "class_embedding"))),
             ("dist", int(getattr(emb, "distillation_token", None) is not None)),
             ("registers", 0 if registers is None else int(registers.shape[1])))
    return tuple((kind, n) for kind, n in kinds if n)


def check_host(model: nn.Module) -> Host:
    """Raise UnsupportedModelError unless ``model`` is a transformers vision encoder this adapter drives."""
    base, family, _ = _resolve(model)
    if not _has(base, family.layers_path):
        raise _layout_error(base, family.layers_path)
    layers = family.layers(base)
    for i, layer in enumerate(layers):
        missing = [p for p in family.layer_parts if not _has(layer, p)]
        if missing:
            raise _layout_error(base, f"{missing[0]} in layer {i}")
        if type(layer).__name__ not in family.layer_classes:
            raise UnsupportedModelError(
                f"layer {i} is a {type(layer).__name__}; supported: {', '.join(family.layer_classes)}"
            )
    cfg = base.config
    grid = family.config_grid(cfg)
    prefix = dict(_prefix(base))
    return Host(
        depth=len(layers), dim=cfg.hidden_size, num_heads=cfg.num_attention_heads,
        num_prefix=sum(prefix.values()), num_patches=grid[0] * grid[1], grid=grid,
        has_class_token="cls" in prefix, family="transformers",
    )


def _layout_error(base: nn.Module, missing: str) -> UnsupportedModelError:
    """The refusal of a base model whose layout is not the one the views call (another transformers version)."""
    version = getattr(require_transformers(), "__version__", "?")
    return UnsupportedModelError(f"{type(base).__name__} has no {missing}: transformers {version} lays it out "
                                 "differently from the layout tokenreduce drives; use transformers >= 5")


def _has(module: nn.Module, path: str) -> bool:
    try:
        functools.reduce(getattr, path.split("."), module)
    except AttributeError:
        return False
    return True


def apply(model: nn.Module, spec: str | Reducer, *, trace: bool = False, dense: bool = False) -> nn.Module:
    """Patch ``model`` in place to run ``spec``; returns the model (``tokenreduce.apply``).

    ``dense=True``: the base model's ``last_hidden_state`` holds one token per original position,
    (B, p + N0, C) in the original order (``TokenState.unmerge``), for dense tasks.
    """
    host = check_host(model)
    base, family, _ = _resolve(model)
    if "forward" in vars(base) and not hasattr(model, ATTR):
        raise TokenReduceError(f"the {type(base).__name__} in this model is already patched through another "
                               "module; call tokenreduce.remove on that one first")
    patch = attach(model, spec, host, trace=trace, dense=dense, undo=remove)
    # instance attributes (per model), picklable: a partial of a module-level function, a plain object
    base.forward = functools.partial(_forward, base, family, patch)
    base.__prepare_scriptable__ = RefuseScript(patch.reducer.spec())
    enter_blocks(family.layers(base))
    return model


def remove(model: nn.Module) -> nn.Module:
    """Undo ``apply``: the model is again exactly transformers'. Raises if it was not patched."""
    if not hasattr(model, ATTR):
        raise TokenReduceError("this model is not patched by tokenreduce; nothing to remove")
    base, family, _ = _resolve(model)
    detach(model)
    for name in _PATCHED_ATTRS:  # the class's own methods again
        base.__dict__.pop(name, None)
    leave_blocks(family.layers(base))
    return model


def parts(model: nn.Module) -> HostParts:
    """The model's sub-modules under host-neutral names (bench/macs.py, inspect)."""
    check_host(model)
    base, family, heads = _resolve(model)
    stem, proj = family.stem(base)
    return HostParts(
        stem=stem, stem_proj=proj, in_chans=int(base.config.num_channels), img_size=_img_size(base, family),
        blocks=tuple(family.view(layer) for layer in family.layers(base)), heads=heads, prefix=_prefix(base),
        pool=family.pool(base),
    )


def feed(model: nn.Module, images: Tensor) -> Feed:
    """Images (B, C, H, W) as ``model``'s forward takes them (its family's ``feed``: SigLIP 2 patchifies them)."""
    base, family, _ = _resolve(model)
    return family.feed(base, images)


def _img_size(base: nn.Module, family: Family) -> tuple[int, int]:
    """The config's image size (H, W); SigLIP 2's, which has none, is its grid of patches."""
    cfg = base.config
    if hasattr(cfg, "image_size"):
        return _grid_of(cfg.image_size)
    (gh, gw), (ph, pw) = family.config_grid(cfg), _grid_of(cfg.patch_size)
    return gh * ph, gw * pw


def _grid(base: nn.Module, x: Tensor) -> tuple[int, int]:
    """The patch grid (gh, gw) of pixel_values x (B, C, H, W). Whether the model takes that size is the
    embeddings' decision, as unpatched: ViT, DeiT and CLIP with ``interpolate_pos_encoding=True``,
    DINOv2 always; otherwise transformers raises its own error."""
    if not isinstance(x, Tensor) or x.dim() != 4:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise TokenReduceError(f"expected pixel_values (B, C, H, W), got {shape}")
    chans = base.config.num_channels
    if x.shape[1] != chans:
        raise TokenReduceError(f"model expects {chans} input channels, got {x.shape[1]}")
    ph, pw = _grid_of(base.config.patch_size)
    hold_static(x.shape[2], x.shape[3])  # the grid is a constant of a compiled graph (common.hold_static)
    return x.shape[2] // ph, x.shape[3] // pw


def _forward(base: nn.Module, family: Family, patch: Patch, pixel_values: Tensor | None = None, **kwargs: Any) -> Any:
    """The base model's forward with the reducer: embeddings, the shared block loop, final norm and pooling."""
    guard_forward(patch, pixel_values)  # first: under torch.fx every argument is a proxy
    if kwargs.pop("attention_mask", None) is not None:
        raise TokenReduceError("attention masks are not supported with token reduction")
    for flag in ("output_attentions", "output_hidden_states"):
        if kwargs.pop(flag, None) or getattr(base.config, flag, False):
            raise TokenReduceError(
                f"{flag} is not available on a model patched by tokenreduce (the token count changes between "
                "layers); tokenreduce.get_info(model) says what each layer kept, or remove the patch first"
            )
    # as transformers' own forward reads it: the keyword, else the config
    return_dict = kwargs.pop("return_dict", getattr(base.config, "return_dict", True))
    grid = family.grid(base, pixel_values, kwargs, patch.host.grid)
    x = family.embed(base, pixel_values, kwargs)  # (B, p + N0, C), N0 = gh * gw
    x, _ = run_blocks([family.view(layer) for layer in family.layers(base)], x, patch, grid)
    out = family.finish(base, x)
    return out.to_tuple() if return_dict is False else out
