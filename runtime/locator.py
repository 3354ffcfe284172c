"""``locate``: a component at a layer (and head) of a loaded model, compiled into a
``ComponentAddress`` that is pure data (it pickles, compares, sorts by rank and
prints), or refused with the model's reason. ``component_status`` does it for every
component of the table at once."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields, replace
from typing import Any

from causalab_mini.address import Component, Interior, Operand
from causalab_mini.generated import (
    COMPONENTS,
    INTERIORS,
    OPERANDS,
)

from .family import families_of
from .flow import calls_by_layer, flow_refusal
from .geometry import (
    HEAD_KINDS,
    ComponentError,
    HeadSizeUnknown,
    attn_implementation,
    head_size,
    num_heads,
    num_kv_heads,
    width_of,
)
from .ops import OperationNotFound, op_name
from .positions import Position
from .positions import parse as parse_position
from .tree import child
from .versions import outside_versions


@dataclass(frozen=True, order=True)
class ComponentAddress:
    """Where one component is on one model, as data.

    Two addresses are equal (and hash equal) when they name the same component, layer,
    head, resolved operation and rank on models whose tensor there is the same kind of
    tensor: the number of heads, the head size, the width, the streams and the model's
    families (``family``) take part, so results keyed by address never mix models. The
    family's spelling of the child module (``module``) is resolution detail and takes
    no part in equality or ordering.
    """

    rank: tuple[int, int | float]
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
    # the call holds it (batch*heads, ...): read and written through (batch, heads, ...)
    merged_heads: bool = field(default=False, compare=False)
    head_dim: int | None = None
    heads: int | None = None
    width: int | None = None
    sequence_axis: int | None = field(default=None, compare=False)
    keys_axis: int | None = field(default=None, compare=False)
    writable: bool = field(default=True, compare=False)
    why_read_only: str | None = field(default=None, compare=False)
    # why head_dim is None on a per-head place with a width (its head size is not
    # stated unambiguously): the whole tensor reads, one head is refused
    head_size_unknown: str | None = field(default=None, compare=False)
    # a place that carries several residual streams (hyper-connections, AltUp): one
    # stream (``stream``) or all, handed on flat like heads, (batch, seq, n x hidden)
    stream: int | None = None
    streams: int | None = None
    stream_layout: str | None = field(default=None, compare=False)
    # the tokens of each row a read returns and a write replaces (``positions.parse``
    # of a spec; empty: every position), resolved on the batch a plan runs
    position: tuple[Position, ...] = ()
    # the basis a read returns and a write takes (``causalab_mini.featurizers``), bound
    # to this place's width; None: the place's own coordinates
    featurizer: Any = None
    # the model's families (``model.families``, the class name where it has none): an
    # address on another family names another tensor even where the sizes agree
    family: tuple[str, ...] = ()

    def __hash__(self) -> int:
        # the fields that take part in equality, hashed once per address (a plan's
        # reads are keyed by address on every run); kept out of pickles and copies
        # (``__getstate__``): a string's hash is another in another process
        kept = self.__dict__.get("_hash")
        if kept is None:
            kept = hash(tuple(getattr(self, f.name) for f in _COMPARED))
            object.__setattr__(self, "_hash", kept)
        return int(kept)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_hash", None)
        return state

    def __str__(self) -> str:
        where = self.component if self.layer is None else f"{self.component}[{self.layer}]"
        if self.head is not None:
            where += f".head[{self.head}]"
        if self.stream is not None:
            where += f".stream[{self.stream}]"
        if self.position:
            specs = [p.spec() for p in self.position]
            where += f" at {specs[0] if len(specs) == 1 else specs}"
        if self.featurizer is not None:
            where += f" in {self.featurizer!r}"
        detail = self.module or ("layer" if self.layer is not None else "model")
        if self.op:
            detail += f" op={self.op}"
        return f"{where} @ {detail} rank={self.rank}"


# the fields an address's equality (and hash) compare
_COMPARED = tuple(f for f in fields(ComponentAddress) if f.compare)


def locate(
    model: Any,
    component: str,
    layer: int | None = None,
    head: int | None = None,
    *,
    stream: int | None = None,
    position: Any = None,
    featurizer: Any = None,
) -> ComponentAddress:
    """Compile ``component`` at ``layer`` (and ``head``, or ``stream`` where the place
    carries several residual streams) on ``model`` into an address, or refuse with the
    reason the model gives. ``position`` (a spec ``causalab_mini.positions`` reads:
    ``{"index": -1}``, ``{"span": "fox"}``, ``"all"``, a list) restricts the address to
    those tokens of each row: a read returns (batch, n_positions, ...), a write
    replaces them only. It is resolved on the batch a ``Plan`` runs. ``featurizer`` (a
    ``causalab_mini.featurizers`` one) binds the address to a basis, sized by the
    component table's width here: a read returns features, a write takes them."""
    address = replace(_located(model, component, layer, head, stream), family=_family(model))
    if featurizer is not None:
        bind = getattr(featurizer, "bind", None)
        if not callable(bind):
            raise refuse(
                component,
                f"featurizer={featurizer!r} is no featurizer: give one of "
                "causalab_mini.featurizers (Identity(), Subspace(k), Linear(m), PCA.fit(x, k), "
                "SAE(...), Gate(f))",
            )
        # sized by the component table's width here, or refused with both widths
        address = replace(address, featurizer=bind(address.width, str(address)))
    if position is None:
        return address
    parsed = parse_position(position)
    if address.sequence_axis is None:
        known = component in COMPONENTS
        why = (
            "its tensor has no sequence axis"
            if known
            else "it is a place of your own, whose sequence axis the component table does not state"
        )
        row = model.internals[component].row if component in model.internals else None
        if row is not None and row.before_layers:
            why = (
                "it is a place of the encoder, whose positions count in the encoder's input, "
                "which a plan does not resolve; in a trace, read "
                f"model.{component}[layer, index] with index = positions.stacked("
                "positions.resolve(model, batch, spec, stack='encoder'), spec)"
            )
        raise refuse(
            component,
            f"position {position!r} cannot apply: {why}. Address it without a position "
            "(and select the tokens from what it returns)",
        )
    return replace(address, position=parsed)


def _family(model: Any) -> tuple[str, ...]:
    """What an address records of the model it was located on: its families, or its
    class name where it matched none."""
    families = tuple(getattr(model, "families", ()) or ())
    if families:
        return families
    inner = getattr(model, "_model", model)
    return (type(inner).__name__,)


def _located(
    model: Any, component: str, layer: int | None, head: int | None, stream: int | None
) -> ComponentAddress:
    internals = model.internals
    spec = COMPONENTS.get(component)
    if stream is not None and (spec is None or spec.kind != "boundary"):
        raise ComponentError(
            f"component {component!r} carries one stream: give no stream (places of several "
            "residual streams are boundary components, such as block_input)"
        )
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
        return _interior(model, spec, interior_of(model, spec.target), layer, head)
    return _boundary(model, spec, layer, head, stream)


def interior_of(model: Any, name: str) -> Interior:
    """The interior ``name`` on ``model``: the default (interiors.yaml), or where a
    family of the model computes attention in its own forward, that family's (the
    last matching family that says, as with rows)."""
    found = INTERIORS[name]
    for family in families_of(model):
        found = family.interiors.get(name, found)
    return found


def operands_of(model: Any) -> dict[str, Operand]:
    """The attention operands the interior checks read on ``model``: the defaults
    (the shared attention function's), each replaced where a family says."""
    out = dict(OPERANDS)
    for family in families_of(model):
        out.update(family.operands)
    return out


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
    return int(layer % n)


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
            raise refuse(spec.name, f"one head cannot be sliced out: {exc}") from None
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


def refuse(component: str, reason: str) -> ComponentError:
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


def _streams(
    model: Any, spec: Component, address: Any, stream: int | None, width: int | None
) -> dict[str, Any]:
    """The stream fields of a boundary address: how many streams the place carries, how
    the model holds them, the one selected, and the width as handed on (all streams
    concatenated, or one stream's)."""
    if address.streams is None:
        if stream is not None:
            raise ComponentError(
                f"component {spec.name!r} carries one residual stream on this model: give no stream"
            )
        return {"width": width}
    count = getattr(model.text_config, address.streams.count, None)
    if not isinstance(count, int) or count < 1:
        raise refuse(
            spec.name,
            f"its row carries several streams counted by config attribute "
            f"{address.streams.count!r}, which this model's config does not give",
        )
    if stream is not None and (
        isinstance(stream, bool) or not isinstance(stream, int) or not 0 <= stream < count
    ):
        raise IndexError(
            f"stream {stream!r} is out of range for {spec.name}: this model carries {count} "
            f"residual streams (0..{count - 1})"
        )
    return {
        "stream": stream,
        "streams": count,
        "stream_layout": address.streams.layout,
        "width": width if stream is not None or width is None else width * count,
    }


def _boundary(
    model: Any, spec: Component, layer: int | None, head: int | None, stream: int | None = None
) -> ComponentAddress:
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
        raise refuse(spec.name, reason)
    heads, hd, unknown = _check_head(model, spec, head, at)
    address = place.address_at(at)
    op = None
    if address.source:
        envoy = child(internals.row_base(address, at), address.module)
        try:
            op = op_name(
                envoy,
                address.source[0],
                row=spec.target,
                module=address.module,
                model_class=internals.model_class,
            )
        except OperationNotFound as exc:
            raise refuse(spec.name, str(exc)) from None
    width = _widths(model, spec, at, head, heads, hd)
    policy = _policy(spec, heads, hd, width, unknown)
    policy.update(_streams(model, spec, address, stream, width))
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
        **policy,
    )


def _interior_refusal(model: Any, spec: Component, interior: Interior, at: int) -> str | None:
    """Why interior ``interior`` of component ``spec`` is not on layer ``at`` (its
    attention row missing there, a family without interiors, needles outside their
    versions, an attention implementation that has no such call), or None."""
    reason = model.internals[interior.within].unavailable_on(at)
    if reason is not None:
        return str(reason)
    for family in families_of(model):
        if family.interiors_unavailable is not None:
            return str(family.interiors_unavailable).replace("{place}", spec.name)
    if interior.unavailable is not None:  # this interior alone (a family's row)
        return str(interior.unavailable).replace("{place}", spec.name)
    outside = outside_versions(interior.versions)
    if outside is not None:
        package, rng, installed = outside
        return (
            f"its needles hold for {package} {rng}, and {package} {installed} is installed: "
            "update registry/interiors.yaml for this version"
        )
    implementation = attn_implementation(model)
    if interior.eager_only and implementation != "eager":
        return (
            f"exists only under 'eager' attention, and this model runs {implementation!r}: load "
            'it with attn_implementation="eager" (or enable_attention_probs=True; '
            "`registry model --eager`)"
        )
    return None


def _interior_op(model: Any, spec: Component, interior: Interior, at: int) -> tuple[str, str]:
    """(the module whose forward holds the interior, relative to the layer; the name
    of the operation its first needle names there), or refused."""
    internals = model.internals
    within_row = internals[interior.within].address_at(at)
    if interior.module is not None:  # a family's own forward, relative to the layer
        module = interior.module
        base = internals.layer_envoy(at)
    else:  # the attention row's module, relative to the row's base (its layer_list)
        module = within_row.module
        base = internals.row_base(within_row, at)
    envoy = None if base is None else child(base, module)
    if envoy is None:
        raise refuse(
            spec.name,
            f"its attention's forward is in {module!r}, which layer {at} does not have",
        )
    try:
        op = op_name(
            envoy,
            interior.needles[0],
            row=spec.name,
            module=f"layers.{at}.{module}",
            model_class=internals.model_class,
        )
    except OperationNotFound as exc:
        if interior.missing is not None and "has no operation" in str(exc):
            # the interior says what a forward without its call lacks (no rotary)
            reason = interior.missing.replace("{place}", spec.name)
            raise refuse(spec.name, f"{reason} ({str(exc).splitlines()[0]})") from None
        raise refuse(spec.name, str(exc)) from None
    if interior.reaches is not None and interior.arg is not None:
        _check_reaches(model, spec, interior, envoy, at)
    return module, op


def _calls_by_layer(model: Any, interior: Interior, function: str) -> set[int] | None:
    """The layers whose attention calls ``function`` on one plain forward of a short
    text (``flow.calls_by_layer``), measured once per model; None where that forward
    cannot run on text alone (an encoder-decoder, a model that needs other inputs)."""
    internals = model.internals
    cache: dict[str, set[int] | None] = internals.__dict__.setdefault("_calls_by_layer", {})
    if function in cache:
        return cache[function]
    if not getattr(model, "dispatched", True):
        model.dispatch()  # hooks on a meta module never fire
    attentions: dict[int, Any] = {}
    for layer in range(internals.num_layers):
        if internals[interior.within].unavailable_on(layer) is not None:
            continue
        row = internals[interior.within].address_at(layer)
        base = internals.row_base(row, layer)
        envoy = None if base is None else child(base, row.module)
        if envoy is not None:
            attentions[layer] = envoy._module
    made: set[int] | None
    try:
        import torch

        tokens = model.tokenizer("The quick brown fox jumps over", return_tensors="pt")
        device = next(model._model.parameters()).device
        inputs = {"input_ids": tokens["input_ids"].to(device)}
        inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
        import sys

        namespace = sys.modules[type(next(iter(attentions.values()))).__module__]
        made = calls_by_layer(model._model, attentions, getattr(namespace, function), inputs)
    except Exception:
        made = None
    cache[function] = made
    return made


def _check_reaches(model: Any, spec: Component, interior: Interior, envoy: Any, at: int) -> None:
    """Refuse an interior whose call's result must reach another interior's call
    (``reaches``: the pre-rotary query and attention_query) where the forward's source
    says it does not on layer ``at`` (``flow.flow_refusal``): a call on a branch this
    layer skips or that only the run decides, a call that does not hand the argument
    back, or an assignment between the two calls."""
    assert interior.reaches is not None and interior.arg is not None
    later = interior_of(model, interior.reaches)
    if later.arg is None:
        return
    function = interior.needles[0].split("(")[0].split(".")[-1]

    def ran() -> bool | None:
        made = _calls_by_layer(model, interior, function)
        return None if made is None else at in made

    found = flow_refusal(
        envoy._module, interior.needles[0], interior.arg, later.needles[0], later.arg, at, ran
    )
    if found is None:
        return
    family = model.internals.model_class
    scope = f"on layer {at} of {family}" if found.per_layer else f"on {family}"
    raise refuse(
        spec.name,
        f"{spec.name} is refused {scope}: {found.reason}; read {later.name} (after the "
        "rotary) instead",
    )


def _interior(
    model: Any, spec: Component, interior: Interior, layer: int | None, head: int | None
) -> ComponentAddress:
    at = _check_layer(model, spec.name, True, layer)
    assert at is not None
    reason = _interior_refusal(model, spec, interior, at)
    if reason is not None:
        raise refuse(spec.name, reason)
    module, op = _interior_op(model, spec, interior, at)
    heads, hd, unknown = _check_head(model, spec, head, at)
    take = ("arg", interior.arg) if interior.arg is not None else ("return", interior.returns)
    assert take[1] is not None
    width = _widths(model, spec, at, head, heads, hd)
    policy = _policy(spec, heads, hd, width, unknown)
    if interior.layout is not None:  # the family holds it otherwise (heads merged)
        policy["layout"] = interior.layout
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
        merged_heads=interior.merged_heads,
        **policy,
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
        raise refuse(name, reason)
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


__all__ = ["ComponentAddress", "component_status", "interior_of", "locate", "operands_of", "refuse"]
