"""The geometry of a loaded model's attention, as the tensors have it: head counts
(query heads, the key/value heads the attention function receives), head sizes (the
q/k and value heads apart, as multi-head latent attention holds them) and the width
each component's last axis has. Read off the layer's attention module where it
states them, else the layer's config; a size stated ambiguously is refused
(``HeadSizeUnknown``) rather than guessed."""

from __future__ import annotations

from typing import Any

from .errors import CausalabError
from .tree import child, layer_config


class ComponentError(CausalabError, LookupError):
    """A component that cannot be compiled for this model, with the reason."""


def _config(model: Any, layer: int | None = None) -> Any:
    """The text config, or layer ``layer``'s own where the config varies by layer."""
    return layer_config(model.text_config, layer)


def _attention_module(model: Any, layer: int | None) -> Any | None:
    """The torch module of layer ``layer``'s attention (None where it has none)."""
    if layer is None:
        return None
    place = model.internals["attentions"]
    if place.unavailable_on(layer) is not None:
        return None
    row = place.address_at(layer)
    base = model.internals.row_base(row, layer)
    envoy = None if base is None else child(base, row.module)
    return None if envoy is None else envoy._module


def _measured(module: Any, *keys: str) -> int | None:
    """The first of ``keys`` the module holds as a positive int (None if none)."""
    for key in keys:
        value = getattr(module, key, None) if module is not None else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


# Head geometry is read off the layer's attention module where it says (a layer may
# differ from the config: MiMo-V2-Flash doubles the key/value heads of its
# sliding-window layers), else from the layer's config.


def num_heads(model: Any, layer: int | None = None) -> int:
    value = _measured(_attention_module(model, layer), "num_heads", "num_attention_heads")
    if value is not None:
        return value
    config = _config(model, layer)
    for key in ("num_attention_heads", "n_head", "num_heads", "n_heads"):
        value = getattr(config, key, None)
        if isinstance(value, int):
            return value
    raise ComponentError(f"{model.internals.model_class}'s config names no attention head count")


def num_kv_heads(model: Any, layer: int | None = None) -> int:
    """The key/value heads of the keys the attention function receives. It repeats
    them by the module's num_key_value_groups to meet the query heads, so where the
    module states that, heads / groups is their count, whatever else it states
    (JetMoE tiles its 2 key/value heads to top_k x 2 before the call, and says
    num_key_value_groups = 1)."""
    module = _attention_module(model, layer)
    groups = _measured(module, "num_key_value_groups")
    if groups is not None and num_heads(model, layer) % groups == 0:
        return num_heads(model, layer) // groups
    value = _measured(module, "num_key_value_heads", "num_kv_heads")
    if value is not None:
        return value
    config = _config(model, layer)
    for key in ("num_key_value_heads", "num_kv_heads", "n_head_kv"):
        value = getattr(config, key, None)
        if isinstance(value, int):
            return value
    if getattr(config, "multi_query", False):
        return 1
    return num_heads(model, layer)


class HeadSizeUnknown(ComponentError):
    """A head size that neither the attention module nor the config states
    unambiguously for the tensor at hand (the reason says what each states)."""


# The head size a per-head tensor has: queries and keys have the q/k head size, the
# heads' mixed values (attention_z, attention_premix) the value head size. Most
# models have one head_dim; multi-head latent attention (DeepSeek-V2/V3, MiniCPM3,
# GLM-4-MoE-Lite, ...) holds them apart as qk_head_dim (nope + rope) and v_head_dim,
# and its config's head_dim is the rope part only, which is neither.
HEAD_KINDS = {
    "q_width": "qk",
    "kv_width": "qk",
    "z_width": "v",
    "value_width": "v",
    # each head's term of the output projection: a head is as wide as the model
    "heads_hidden": "hidden",
}
_OWN_KEYS = {"qk": ("qk_head_dim",), "v": ("v_head_dim",)}
_GENERIC_KEYS = ("head_dim", "head_size")
_KIND_NAMES = {"qk": "q/k", "v": "value"}


def _generic_keys(model: Any) -> tuple[str, ...]:
    """The generic head-size keys, with the one the model's families state first
    (``rename: head_size_config_key``: CPM-Ant's dim_head, Reformer's
    attention_head_size)."""
    containers = getattr(getattr(model, "resolution", None), "containers", None)
    own = getattr(containers, "head_size_config_key", None)
    return (own, *_GENERIC_KEYS) if isinstance(own, str) else _GENERIC_KEYS


def _stated(source: Any, kind: str) -> int | None:
    """The head size ``source`` (an attention module or a config) states for ``kind``
    under its own name (a q/k size also as qk_nope_head_dim + qk_rope_head_dim)."""
    value = _measured(source, *_OWN_KEYS[kind])
    if value is None and kind == "qk":
        nope = _measured(source, "qk_nope_head_dim")
        rope = _measured(source, "qk_rope_head_dim")
        if nope is not None and rope is not None:
            value = nope + rope
    return value


def head_size(model: Any, layer: int | None, kind: str) -> int:
    """The head size of layer ``layer``'s ``kind`` tensors ("qk": queries and keys,
    "v": the heads' mixed values), read off the layer's attention module, else the
    layer's config (the module computes the tensor; a config may describe other
    layers too): a size stated for that kind (qk_head_dim or qk_nope_head_dim +
    qk_rope_head_dim, v_head_dim) first, then the one generic head_dim. Raises
    HeadSizeUnknown where what they state leaves it open: a generic head_dim that
    another source contradicts, or a value head size where only a q/k size apart
    from head_dim is stated. A head's term of the output projection ("hidden") is
    as wide as the model."""
    if kind == "hidden":
        width = width_of(model, "hidden_size", layer)
        assert width is not None
        return width
    sources = [
        (where, source)
        for where, source in (
            ("the attention module", _attention_module(model, layer)),
            ("the config", _config(model, layer)),
        )
        if source is not None
    ]
    for where, source in sources:
        own = _stated(source, kind)
        if own is not None:
            return own
        generic = _measured(source, *_generic_keys(model))
        if generic is None:
            continue
        for other, stated in sources:
            size = _stated(stated, kind)
            if size is not None and size != generic:
                raise HeadSizeUnknown(
                    f"the {_KIND_NAMES[kind]} head size of layer {layer} is open: {where} "
                    f"gives head_dim {generic} and {other} a {_KIND_NAMES[kind]} head size of "
                    f"{size}"
                )
            qk = _stated(stated, "qk") if kind == "v" else None
            if qk is not None and qk != generic:
                # transformers' head_dim is the q/k head size; a model whose values
                # differ says so with v_head_dim
                raise HeadSizeUnknown(
                    f"the value head size of layer {layer} is not stated: {where} gives "
                    f"head_dim {generic} and {other} a q/k head size of {qk}, and neither a "
                    "v_head_dim, so which width each head of the mixed values has is open"
                )
        return generic
    heads = num_heads(model, layer)
    hidden = int(model.hidden_size)
    if hidden % heads:
        raise HeadSizeUnknown(
            f"neither the attention module of layer {layer} nor the config states a head "
            f"size, and hidden_size {hidden} is not a multiple of its {heads} heads"
        )
    if kind == "v" and any(_stated(s, "qk") not in (None, hidden // heads) for _, s in sources):
        raise HeadSizeUnknown(
            f"the value head size of layer {layer} is not stated: a q/k head size apart "
            f"from hidden_size / heads ({hidden // heads}) is, and no v_head_dim"
        )
    return hidden // heads


def head_dim(model: Any, layer: int | None = None) -> int:
    """The q/k head size of layer ``layer`` (see head_size)."""
    return head_size(model, layer, "qk")


def _in_features(module: Any) -> int | None:
    for key in ("in_features", "nx"):
        value = getattr(module, key, None)
        if isinstance(value, int):
            return value
    return None


def width_of(model: Any, name: str | None, layer: int | None) -> int | None:
    """The width a component's last axis has, measured from the model."""
    if name is None:
        return None
    if name == "hidden_size":
        if model.hidden_size is not None:
            return int(model.hidden_size)
        # a config that keeps its widths per stack (BLT): nnterp finds none at the top;
        # the unembedding reads the stream, so its input width is the stream's
        measured = _in_features(model.lm_head._module)
        if measured is None:
            raise ComponentError("the model states no hidden size, and lm_head has no in_features")
        return measured
    if name == "vocab_size":
        head = model.lm_head._module
        out = getattr(head, "out_features", None)
        return int(out) if isinstance(out, int) else int(model.vocab_size)
    if name in ("q_width", "z_width"):
        return num_heads(model, layer) * head_size(model, layer, HEAD_KINDS[name])
    if name == "kv_width":
        return num_kv_heads(model, layer) * head_size(model, layer, "qk")
    if name == "value_width":
        return num_kv_heads(model, layer) * head_size(model, layer, "v")
    if name == "heads_hidden":
        return num_heads(model, layer) * head_size(model, layer, "hidden")
    if name == "intermediate_size":
        place = model.internals["mlps_neurons"]
        at = 0 if layer is None else layer
        if place.unavailable_on(at) is None:
            row = place.address_at(at)
            base = model.internals.row_base(row, at)
            module = None if base is None else child(base, row.module)
            measured = _in_features(module._module) if module is not None else None
            if measured is not None:
                return measured
        value = getattr(_config(model, layer), "intermediate_size", None)
        return int(value) if isinstance(value, int) else None
    if name in ("num_experts", "experts_per_token"):
        return _router_width(model, name, layer)
    raise ComponentError(f"unknown width attribute {name!r}")


# where a router states how many experts it scores and how many it chooses, then the
# config's spellings of the same (registry/tiny.yaml's aliases)
_ROUTER_KEYS = {
    # the classes the router scores: its experts, and Zaya's skip expert beside them
    "num_experts": ("num_router_classes", "num_experts", "n_routed_experts", "num_local_experts"),
    "experts_per_token": ("top_k", "num_experts_per_tok", "topk", "moe_topk", "moe_k"),
}
_CONFIG_KEYS = {
    "num_experts": ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"),
    "experts_per_token": ("num_experts_per_tok", "moe_topk", "moe_k", "top_k_experts"),
}


def _router_width(model: Any, name: str, layer: int | None) -> int | None:
    """A mixture's routed experts (``num_experts``) or the experts each token is sent
    to (``experts_per_token``), measured on the layer's router (the module the
    routers_logits row reads): its own attribute, else the block's that holds it, else
    the experts module's beside it, else (for the experts) its weight's rows, else the
    config's."""
    at = 0 if layer is None else layer
    place = model.internals["routers_logits"]
    if place.unavailable_on(at) is None:
        row = place.address_at(at)
        base = model.internals.row_base(row, at)
        envoy = None if base is None else child(base, row.module)
        module = None if envoy is None else envoy._module
        # the router, then the block holding it, then the experts beside it (DBRX keeps
        # top_k on its block and the count on its experts)
        parent = row.module.rpartition(".")[0]
        block = child(base, parent) if base is not None and parent else None
        experts = child(base, f"{parent}.experts") if base is not None and parent else None
        for holder in (module, *(e._module for e in (block, experts) if e is not None)):
            for key in _ROUTER_KEYS[name]:
                value = getattr(holder, key, None)
                if isinstance(value, int):
                    return value
        weight = getattr(module, "weight", None)
        if name == "num_experts" and weight is not None and weight.dim() == 2:
            return int(weight.shape[0])
    config = _config(model, layer)
    for key in _CONFIG_KEYS[name]:
        value = getattr(config, key, None)
        if isinstance(value, int):
            return value
    return None


def attn_implementation(model: Any) -> str:
    return str(getattr(model._model.config, "_attn_implementation", None) or "eager")


__all__ = [
    "HEAD_KINDS",
    "ComponentError",
    "HeadSizeUnknown",
    "attn_implementation",
    "head_dim",
    "head_size",
    "num_heads",
    "num_kv_heads",
    "width_of",
]
