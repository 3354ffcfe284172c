"""Components: the names research code uses, compiled to addresses that are pure data.

``locate(model, component, layer)`` asks ``model.internals`` for the row, whether the
place exists on this layer and its rank, and returns a ``ComponentAddress`` that
pickles, compares, sorts by rank and prints. ``read``/``write`` act on one address
inside an nnsight trace; ``Plan`` runs several in forward order in one trace.

Four components are interiors: tensors inside the attention module's forward that
never cross a module boundary, reached through nnsight's ``.source``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from causalab_mini.address import Component, Interior
from causalab_mini.generated import COMPONENTS, FAMILY_INTERIORS_UNAVAILABLE, INTERIORS

from . import compat
from .internals import (
    PlaceUnavailable,
    WriteRefused,
    _installed,
    check_value,
    child,
    layer_config,
)
from .ops import OperationNotFound, find_op, op_name


class ComponentError(LookupError):
    """A component that cannot be compiled for this model, with the reason."""


@dataclass(frozen=True, order=True)
class ComponentAddress:
    """Where one component is on one model, as data.

    Two addresses are equal when they name the same component, layer, head, resolved
    operation and rank; the family's spelling of the child module (``module``) is
    resolution detail and takes no part in equality or ordering.
    """

    rank: tuple[int, int]
    component: str
    layer: int | None
    head: int | None = None
    op: str | None = None
    kind: str = field(default="boundary", compare=False)
    accessor: str = field(default="", compare=False)
    module: str = field(default="", compare=False)
    io: str = field(default="output", compare=False)
    needles: tuple[str, ...] = field(default=(), compare=False)
    take: tuple[str, int] | None = field(default=None, compare=False)
    per_head: str = field(default="none", compare=False)
    layout: str | None = field(default=None, compare=False)
    head_dim: int | None = field(default=None, compare=False)
    heads: int | None = field(default=None, compare=False)
    width: int | None = field(default=None, compare=False)
    sequence_axis: int | None = field(default=None, compare=False)
    keys_axis: int | None = field(default=None, compare=False)
    writable: bool = field(default=True, compare=False)
    why_read_only: str | None = field(default=None, compare=False)
    # why head_dim is None on a per-head place with a width (its head size is not
    # stated unambiguously): the whole tensor reads, one head is refused
    head_size_unknown: str | None = field(default=None, compare=False)

    def __str__(self) -> str:
        where = self.component if self.layer is None else f"{self.component}[{self.layer}]"
        if self.head is not None:
            where += f".head[{self.head}]"
        detail = self.module or ("layer" if self.layer is not None else "model")
        if self.op:
            detail += f" op={self.op}"
        return f"{where} @ {detail} rank={self.rank}"


# ---------------------------------------------------------------------- widths


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
    envoy = child(model.internals.layer_envoy(layer), place.address_at(layer).module)
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
HEAD_KINDS = {"q_width": "qk", "kv_width": "qk", "z_width": "v"}
_OWN_KEYS = {"qk": ("qk_head_dim",), "v": ("v_head_dim",)}
_GENERIC_KEYS = ("head_dim", "head_size")
_KIND_NAMES = {"qk": "q/k", "v": "value"}


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
    from head_dim is stated."""
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
        generic = _measured(source, *_GENERIC_KEYS)
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
        return int(model.hidden_size)
    if name == "vocab_size":
        head = model.lm_head._module
        out = getattr(head, "out_features", None)
        return int(out) if isinstance(out, int) else int(model.vocab_size)
    if name in ("q_width", "z_width"):
        return num_heads(model, layer) * head_size(model, layer, HEAD_KINDS[name])
    if name == "kv_width":
        return num_kv_heads(model, layer) * head_size(model, layer, "qk")
    if name == "intermediate_size":
        place = model.internals["mlps_neurons"]
        at = 0 if layer is None else layer
        if place.unavailable_on(at) is None:
            module = child(model.internals.layer_envoy(at), place.address_at(at).module)
            measured = _in_features(module._module) if module is not None else None
            if measured is not None:
                return measured
        value = getattr(_config(model, layer), "intermediate_size", None)
        return int(value) if isinstance(value, int) else None
    raise ComponentError(f"unknown width attribute {name!r}")


# ---------------------------------------------------------------------- locate


def attn_implementation(model: Any) -> str:
    return str(getattr(model._model.config, "_attn_implementation", None) or "eager")


def locate(
    model: Any, component: str, layer: int | None = None, head: int | None = None
) -> ComponentAddress:
    """Compile ``component`` at ``layer`` (and ``head``) on ``model`` into an address,
    or refuse with the reason the model gives."""
    internals = model.internals
    spec = COMPONENTS.get(component)
    if spec is None:
        if component in internals:
            return _user_row(model, component, layer, head)
        close = difflib.get_close_matches(component, [*COMPONENTS, *internals], n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ComponentError(
            f"{component!r} is neither a component nor a place of this model.{hint} Components: "
            f"{', '.join(COMPONENTS)}; a place of your own is added with "
            f"RenameConfig(addresses={{{component!r}: Address(...)}})"
        )
    if spec.kind == "interior":
        return _interior(model, spec, INTERIORS[spec.target], layer, head)
    return _boundary(model, spec, layer, head)


def _check_layer(model: Any, component: str, per_layer: bool, layer: int | None) -> int | None:
    if not per_layer:
        if layer is not None:
            raise ComponentError(f"component {component!r} is whole-model: give no layer")
        return None
    if layer is None:
        raise ComponentError(f"component {component!r} is per layer: say which layer")
    n = model.internals.num_layers
    if isinstance(layer, bool) or not isinstance(layer, int) or not -n <= layer < n:
        raise IndexError(f"layer {layer!r} is out of range: this model has layers 0..{n - 1}")
    return layer % n


def _check_head(
    model: Any, spec: Component, head: int | None, layer: int | None
) -> tuple[int | None, int | None, str | None]:
    """(head count, head size, why the head size is unknown) at ``layer`` for a
    per-head component; refuses a head where none is, and one head where its size
    is not stated unambiguously. The head size is that of the tensor the component
    reads (q/k or value heads; see head_size); None for a place held per head with
    no width (scores, probabilities: head h is index h of axis 1)."""
    if spec.per_head == "none":
        if head is not None:
            raise ComponentError(f"component {spec.name!r} is not per head: give no head")
        return None, None, None
    count = num_heads(model, layer) if spec.per_head == "q" else num_kv_heads(model, layer)
    if head is not None and (
        isinstance(head, bool) or not isinstance(head, int) or not 0 <= head < count
    ):
        kind = "query" if spec.per_head == "q" else "key/value"
        raise IndexError(
            f"head {head!r} is out of range for {spec.name}: this model has {count} {kind} heads "
            f"(0..{count - 1})"
        )
    if spec.width is None:
        return count, None, None
    if spec.width not in HEAD_KINDS:
        raise ComponentError(
            f"component {spec.name!r} is per head with width {spec.width!r}, which is no "
            f"heads x head size ({', '.join(HEAD_KINDS)}): registry/components.yaml is what "
            "to fix"
        )
    try:
        return count, head_size(model, layer, HEAD_KINDS[spec.width]), None
    except HeadSizeUnknown as exc:
        if head is not None:
            raise _refuse(spec.name, f"one head cannot be sliced out: {exc}") from None
        return count, None, str(exc)


def _widths(
    model: Any,
    spec: Component,
    layer: int | None,
    head: int | None,
    heads: int | None,
    hd: int | None,
) -> int | None:
    """The width of the component's last axis as handed on: heads x head size for a
    per-head place (one head's size with ``head``), else measured from the model."""
    if spec.width in HEAD_KINDS:
        if hd is None or heads is None:
            return None
        return hd if head is not None else heads * hd
    return width_of(model, spec.width, layer)


def _refuse(component: str, reason: str) -> ComponentError:
    return ComponentError(f"component {component!r}: {reason}")


def _policy(
    spec: Component, heads: int | None, hd: int | None, width: int | None, unknown: str | None
) -> dict[str, Any]:
    """The component table's policy fields, with the widths measured on the model."""
    return {
        "head_size_unknown": unknown,
        "per_head": spec.per_head,
        "layout": spec.layout,
        "head_dim": hd,
        "heads": heads,
        "width": width,
        "sequence_axis": spec.sequence_axis,
        "keys_axis": spec.keys_axis,
        "writable": spec.writable,
        "why_read_only": spec.why_read_only,
    }


def _boundary(model: Any, spec: Component, layer: int | None, head: int | None) -> ComponentAddress:
    internals = model.internals
    place = internals[spec.target]
    if place.per_layer != spec.per_layer:
        raise ComponentError(
            f"component {spec.name!r} is {'per layer' if spec.per_layer else 'whole-model'} in the "
            f"component table but its row {spec.target!r} is "
            f"{'per layer' if place.per_layer else 'whole-model'}: the component table "
            "(registry/components.yaml) is what to fix"
        )
    at = _check_layer(model, spec.name, spec.per_layer, layer)
    reason = place.unavailable_on(at) if place.per_layer else place.unavailable_on()
    if reason is not None:
        raise _refuse(spec.name, reason)
    heads, hd, unknown = _check_head(model, spec, head, at)
    address = place.address_at(at)
    op = None
    if address.source:
        base = internals.layer_envoy(at) if address.per_layer else model
        envoy = child(base, address.module)
        try:
            op = op_name(
                envoy,
                address.source[0],
                row=spec.target,
                module=address.module,
                model_class=internals.model_class,
            )
        except OperationNotFound as exc:
            raise _refuse(spec.name, str(exc)) from None
    width = _widths(model, spec, at, head, heads, hd)
    return ComponentAddress(
        rank=internals.rank(spec.target, at),
        component=spec.name,
        layer=at,
        head=head,
        op=op,
        kind="boundary",
        accessor=spec.target,
        module=address.module,
        io=address.io.value,
        needles=address.source,
        **_policy(spec, heads, hd, width, unknown),
    )


def _interior(
    model: Any, spec: Component, interior: Interior, layer: int | None, head: int | None
) -> ComponentAddress:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    internals = model.internals
    at = _check_layer(model, spec.name, True, layer)
    assert at is not None
    within = internals[interior.within]
    reason = within.unavailable_on(at)
    if reason is not None:
        raise _refuse(spec.name, reason)
    for family in model.families:
        if family in FAMILY_INTERIORS_UNAVAILABLE:
            raise _refuse(
                spec.name, FAMILY_INTERIORS_UNAVAILABLE[family].replace("{place}", spec.name)
            )
    for package, rng in interior.versions:
        installed = _installed(package)
        if installed is not None and Version(installed) not in SpecifierSet(rng):
            raise _refuse(
                spec.name,
                (
                    f"its needles hold for {package} {rng}, and {package} {installed} is installed: "
                    "update registry/interiors.yaml for this version"
                ),
            )
    implementation = attn_implementation(model)
    if interior.eager_only and implementation != "eager":
        raise _refuse(
            spec.name,
            (
                f"exists only under 'eager' attention, and this model runs {implementation!r}: load "
                'it with attn_implementation="eager" (or enable_attention_probs=True; '
                "`registry model --eager`)"
            ),
        )
    module = within.address_at(at).module
    envoy = child(internals.layer_envoy(at), module)
    try:
        op = op_name(
            envoy,
            interior.needles[0],
            row=spec.name,
            module=f"layers.{at}.{module}",
            model_class=internals.model_class,
        )
    except OperationNotFound as exc:
        raise _refuse(spec.name, str(exc)) from None
    heads, hd, unknown = _check_head(model, spec, head, at)
    take = ("arg", interior.arg) if interior.arg is not None else ("return", interior.returns)
    assert take[1] is not None
    width = _widths(model, spec, at, head, heads, hd)
    return ComponentAddress(
        rank=(at, interior.order),
        component=spec.name,
        layer=at,
        head=head,
        op=op,
        kind="interior",
        accessor=interior.name,
        module=module,
        io="inside",
        needles=interior.needles,
        take=(take[0], int(take[1])),
        **_policy(spec, heads, hd, width, unknown),
    )


def _user_row(model: Any, name: str, layer: int | None, head: int | None) -> ComponentAddress:
    """A place the user added: addressable, with no width, not per head, a boundary."""
    internals = model.internals
    place = internals[name]
    if head is not None:
        raise ComponentError(
            f"{name!r} is a place of your own, which is not per head: give no head"
        )
    at = _check_layer(model, name, place.per_layer, layer)
    reason = place.unavailable_on(at) if place.per_layer else place.unavailable_on()
    if reason is not None:
        raise _refuse(name, reason)
    address = place.address_at(at)
    return ComponentAddress(
        rank=internals.rank(name, at),
        component=name,
        layer=at,
        kind="boundary",
        accessor=name,
        module=address.module,
        io=address.io.value,
        needles=address.source,
    )


# ---------------------------------------------------------------------- in a trace


def _interior_op(model: Any, address: ComponentAddress) -> Any:
    envoy = child(model.internals.layer_envoy(address.layer), address.module)
    return getattr(envoy.source, str(address.op))


def _inner_op(model: Any, address: ComponentAddress, outer: Any) -> Any:
    op = outer
    for needle in address.needles[1:]:
        op = find_op(
            op.source,
            needle,
            row=address.accessor,
            module=f"layers.{address.layer}.{address.module}.{address.op}",
            model_class=model.internals.model_class,
        )
    return op


def _whole(model: Any, address: ComponentAddress) -> Any:
    """The full tensor at an address (all heads)."""
    if address.kind == "boundary":
        return model.internals[address.accessor].get(address.layer)
    outer = _interior_op(model, address)
    op = _inner_op(model, address, outer)
    assert address.take is not None
    what, index = address.take
    if what == "arg":
        return op.inputs[0][index]
    value = op.output
    return value[index] if isinstance(value, tuple) else value


def _flat(address: ComponentAddress, native: Any) -> Any:
    """The tensor as handed on: a place held per head (bhsd, bshd) becomes b s f."""
    if address.layout == "bhsd":
        return native.transpose(1, 2).flatten(2)
    if address.layout == "bshd":
        return native.flatten(2)
    return native


def _native(address: ComponentAddress, flat: Any, like: Any) -> Any:
    """Back to how the model holds it (the inverse of ``_flat``), shaped like ``like``."""
    if address.layout == "bhsd":
        b, h, s, d = like.shape
        return flat.reshape(b, s, h, d).transpose(1, 2)
    if address.layout == "bshd":
        return flat.reshape(like.shape)
    return flat


def layout_mismatch(address: ComponentAddress, held: Sequence[int]) -> str | None:
    """Why the tensor the model holds at a per-head ``address`` (shape ``held``, before
    it is handed on flat) does not have the heads and head size the address states
    (None where it does, or where the place is not per head). bhsd and bshd hold the
    head axis and the head size themselves, bsf heads x head size on its last axis,
    bhsk the heads on axis 1."""
    if address.per_head == "none" or address.layout is None:
        return None
    shape = tuple(int(n) for n in held)
    where = address.component if address.layer is None else f"{address.component}[{address.layer}]"
    axes = {"bhsd": (1, 3), "bshd": (2, 3), "bhsk": (1, None)}
    if address.layout in axes:
        if len(shape) != 4:
            return f"{where} is held as {shape}, which has not the 4 axes of {address.layout}"
        h_axis, d_axis = axes[address.layout]
        heads = shape[h_axis]
        if heads != address.heads:
            return (
                f"{where} holds {heads} heads on axis {h_axis} of {shape}, and the address "
                f"states {address.heads}"
            )
        if d_axis is None or address.head_dim is None:
            return None
        size = shape[d_axis]
        if size != address.head_dim:
            return (
                f"{where} holds heads of size {size} ({address.layout} {shape}), and the "
                f"address states a head size of {address.head_dim}"
            )
        flat = heads * size
    else:  # bsf: the heads and their size concatenated on the last axis
        if address.head_dim is None or address.heads is None:
            return None
        flat = shape[-1]
        if flat != address.heads * address.head_dim:
            return (
                f"{where} is {flat} wide on its last axis, and the address states "
                f"{address.heads} heads x {address.head_dim} = {address.heads * address.head_dim}"
            )
    if address.head is None and address.width is not None and address.width != flat:
        return f"{where} is {flat} wide as handed on, and the address states width {address.width}"
    return None


def _head_slice(address: ComponentAddress) -> tuple[Any, ...]:
    assert address.head is not None
    if address.layout == "bhsk":
        return (slice(None), address.head)
    assert address.head_dim is not None
    start = address.head * address.head_dim
    return (..., slice(start, start + address.head_dim))


def _checked(address: ComponentAddress, native: Any) -> None:
    """Refuse one head of a tensor whose heads are not what the address states: a
    slice by a wrong head size would be a plausible, wrong tensor."""
    reason = layout_mismatch(address, native.shape)
    if reason is not None:
        raise _refuse(address.component, f"head {address.head} is not sliced out: {reason}")


def read(model: Any, address: ComponentAddress) -> Any:
    """The tensor at ``address`` (inside a trace), as handed on: per-head places with a
    width are flat (batch, seq, heads x head_dim); one head's slice where ``head`` is set,
    once the tensor is seen to hold the heads the address states."""
    native = _whole(model, address)
    value = _flat(address, native)
    if address.head is not None:
        _checked(address, native)
        value = value[_head_slice(address)]
    return value


def check_write(address: ComponentAddress, value: Any, current: Any) -> None:
    """Refuse a write that does not fit: read-only, or shape / dtype / device differ
    (``check_value``, the one check every spelling of a write makes). ``current`` is
    the place's tensor as handed on (all heads)."""
    if not address.writable:
        raise WriteRefused(f"{address.component} is read-only: {address.why_read_only}")
    where = address.component if address.layer is None else f"{address.component}[{address.layer}]"
    if address.head is not None:
        where = f"head {address.head} of {where}"
        current = current[_head_slice(address)]
    check_value(where, value, current)


def write(model: Any, address: ComponentAddress, value: Any) -> None:
    """Write ``value`` (as ``read`` hands it on) at ``address`` inside a trace, after
    checking that it fits. A head's write replaces that head's slice only."""
    if not address.writable:
        raise WriteRefused(f"{address.component} is read-only: {address.why_read_only}")
    native = _whole(model, address)
    flat = _flat(address, native)
    if address.head is not None:
        _checked(address, native)
    check_write(address, value, flat)
    if address.head is not None:
        whole = flat.clone()
        whole[_head_slice(address)] = value
        value = whole
    value = _native(address, value, native)
    if address.kind == "boundary":
        model.internals[address.accessor].set(address.layer, value)
        return
    outer = _interior_op(model, address)
    op = _inner_op(model, address, outer)
    assert address.take is not None
    what, index = address.take
    if what == "arg":
        args, kwargs = op.inputs
        op.inputs = ((*args[:index], value, *args[index + 1 :]), kwargs)
    else:
        out = op.output
        if isinstance(out, tuple):
            op.output = (*out[:index], value, *out[index + 1 :])
        else:
            op.output = value


# ---------------------------------------------------------------------- plans


@dataclass(frozen=True, eq=False)
class Step:
    """One read or write of a plan; ``value`` is the tensor a write puts."""

    address: ComponentAddress
    write: bool = False
    value: Any = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Step):
            return NotImplemented
        if (self.address, self.write) != (other.address, other.write):
            return False
        if self.value is None or other.value is None:
            return self.value is other.value
        import torch

        return bool(torch.equal(self.value, other.value))

    def __hash__(self) -> int:
        return hash((self.address, self.write))


@dataclass(frozen=True)
class Plan:
    """Reads and writes for one trace, kept in forward order (writes before reads at
    the same place), so no caller meets nnsight's out-of-order error. Pure data:
    it pickles and travels."""

    steps: tuple[Step, ...] = ()

    @staticmethod
    def of(
        reads: Iterable[ComponentAddress] = (), writes: Iterable[tuple[ComponentAddress, Any]] = ()
    ) -> Plan:
        steps = [Step(a) for a in reads] + [Step(a, True, v) for a, v in writes]
        return Plan(tuple(sorted(steps, key=lambda s: (s.address.rank, not s.write))))

    def run(
        self, model: Any, inputs: Any, held: bool = False, **remote: Any
    ) -> dict[ComponentAddress, Any]:
        """Run the plan in one trace; return what was read, by address. With ``held``,
        a read returns the whole tensor as the model holds it (a per-head place before
        it is handed on flat), to see the heads it holds.

        ``remote=True`` (or ``backend=...``) runs it on NDIF as plain nnsight module
        accesses (``causalab_mini.remote``): every read comes back, or it raises."""
        if set(remote) - {"remote", "backend", "blocking"}:
            raise TypeError(f"Plan.run takes remote=, backend= and blocking=, not {sorted(remote)}")
        if remote.get("remote") or remote.get("backend") is not None:
            from .remote import run_plan

            return run_plan(self, model, inputs, held=held, **remote)
        saved: list[tuple[ComponentAddress, Any]] = []  # bound before the trace
        sources = _prepare_sources(model, [s.address for s in self.steps])
        try:
            self._trace(model, inputs, sources, saved, held)
        except (OperationNotFound, PlaceUnavailable, WriteRefused, ComponentError) as exc:
            # nnsight wraps what a trace body raises in its own traceback text; hand the
            # caller our message as it was written
            original = getattr(exc, "original", None)
            if isinstance(original, Exception) and original is not exc:
                raise original from None
            raise
        return {address: getattr(t, "value", t) for address, t in saved}

    def _trace(
        self,
        model: Any,
        inputs: Any,
        sources: dict[tuple[int | None, str], list[ComponentAddress]],
        saved: list[tuple[ComponentAddress, Any]],
        held: bool = False,
    ) -> None:
        with model.trace(inputs):
            touched: set[Any] = set()
            for step in self.steps:
                for address in _nested_sources_due(step.address, sources, touched):
                    _interior_op(model, address).source  # noqa: B018 - installs the nested source
                if step.write:
                    write(model, step.address, step.value)
                elif held:
                    saved.append((step.address, _whole(model, step.address).save()))
                else:
                    saved.append((step.address, read(model, step.address).save()))


def _nested_sources_due(
    address: ComponentAddress,
    sources: dict[tuple[int | None, str], list[ComponentAddress]],
    opened: set[Any],
) -> list[ComponentAddress]:
    """The interiors whose outer operation's nested ``.source`` must be opened before
    the step at ``address`` runs (each once; ``opened`` remembers).

    Opening a nested source waits for the operation to hand over the function it
    calls. nnsight 0.6/0.7 hand it over before the operation's inputs, so every
    nested source of a module opens before the first step at that module; nnsight 0.8
    hands it over after the inputs (``run_op``: input, skip, fn, output), so it opens
    just before the first step inside it, after the steps that read or write the
    operation's arguments (which rank before it)."""
    if not compat.callee_after_inputs():
        key = (address.layer, address.module)
        if key not in sources or key in opened:
            return []
        opened.add(key)
        return sources[key]
    if len(address.needles) < 2:
        return []
    op = (address.layer, address.module, address.op)
    if op in opened:
        return []
    opened.add(op)
    return [address]


def _prepare_sources(
    model: Any, addresses: Sequence[ComponentAddress]
) -> dict[tuple[int | None, str], list[ComponentAddress]]:
    """Touch every module's ``.source`` before the trace (nnsight needs it first), and
    list, per (layer, module), the interiors that open a nested source (when in the
    trace: ``_nested_sources_due``)."""
    nested: dict[tuple[int | None, str], list[ComponentAddress]] = {}
    for address in addresses:
        if address.kind == "interior" or address.needles:
            base = model.layers[address.layer] if address.layer is not None else model
            envoy = child(base, address.module)
            if envoy is not None:
                envoy.source  # noqa: B018
        if len(address.needles) > 1:
            nested.setdefault((address.layer, address.module), []).append(address)
    return nested


def component_status(
    model: Any, layer: int | None = None
) -> dict[str, tuple[ComponentAddress | None, str | None]]:
    """Every component of the table: its address (at ``layer``, or at the first layer
    for a per-layer component when ``layer`` is None) or the reason it is refused.
    With ``layer=None`` a per-layer component is ok only if it is on every layer."""
    out: dict[str, tuple[ComponentAddress | None, str | None]] = {}
    n = model.internals.num_layers
    for name, spec in COMPONENTS.items():
        if not spec.per_layer:
            layers: list[int | None] = [None]
        elif layer is not None:
            layers = [layer]
        else:
            layers = list(range(n))
        found: dict[int | None, ComponentAddress] = {}
        refused: dict[int | None, str] = {}
        for at in layers:
            try:
                found[at] = locate(model, name, at)
            except ComponentError as exc:
                refused[at] = str(exc)
        if not refused:
            out[name] = (found[layers[0]], None)
        elif not found or len(layers) == 1:
            out[name] = (None, refused[next(iter(refused))])
        else:
            out[name] = (
                None,
                (
                    f"component {name!r} is available on layers {sorted(k for k in found if k is not None)} "
                    f"only; on layers {sorted(k for k in refused if k is not None)}: "
                    f"{refused[next(iter(refused))].split(': ', 1)[-1]}"
                ),
            )
    return out


__all__ = [
    "ComponentAddress",
    "ComponentError",
    "HeadSizeUnknown",
    "PlaceUnavailable",
    "Plan",
    "Step",
    "WriteRefused",
    "component_status",
    "head_size",
    "layout_mismatch",
    "locate",
    "read",
    "write",
]
