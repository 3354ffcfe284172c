"""A plan lowered to a *program*: one tuple of plain steps (nnsight Envoys, operation
names, numbers, tensors) that ``causalab_mini.plain`` runs, on a server or here; and
when, in a trace, the nested ``.source`` of an interior opens.

``Plan`` (``causalab_mini.plan``) keeps addresses and runs them locally; ``remote``
sends what ``lower`` makes of them. Both ask this module which nested sources a step
must open first, so the rule is written once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from . import compat
from .errors import RemoteRefused, WriteRefused
from .geometry import ComponentError
from .tree import boundary, child

if TYPE_CHECKING:
    from causalab_mini.address import Address

# ``internals`` (whose places' steps ``row_step`` makes) and ``locator`` (whose
# ComponentAddress ``lower_step`` lowers) import this module: their types are Any here
Internals = Any
ComponentAddress = Any


def copied(address: Address) -> bool:
    """Whether a read at ``address`` hands out a copy: the tensor there is modified in
    place later in the same forward (``snapshot``), or a write at this place overwrites
    it in place (``write: in_place``), and a value already read must not change."""
    return bool(address.snapshot or address.write == "in_place")


def copied_for_edits(address: Address | None, attr: str) -> bool:
    """Whether a read handed to the user is copied where the row does not copy already:
    a module's input, which the block holds elsewhere too (the residual it adds the
    sublayer to), so that an in-place edit of it is written like the assignment (the
    module handed a new input) and reaches nothing else, and a value read before keeps
    its value. A module's or an operation's output is handed on as the model's tensor:
    an in-place edit of it is the assignment (nothing else holds it yet), and a read
    there sees what the forward does to it in place later (XLM masks its block
    output)."""
    if address is not None and (copied(address) or address.scale is not None):
        return False  # a copy already
    return attr.endswith("input") or attr.endswith("inputs")


def _select(select: Any) -> tuple[Any, ...] | None:
    from causalab_mini.address import FirstIfTuple, Index

    if select is None:
        return None
    if isinstance(select, FirstIfTuple):
        return ("first",)
    if isinstance(select, Index):
        return ("index", select.key)
    raise RemoteRefused(f"a select of type {type(select).__name__} cannot be sent as plain code")


def _blank(where: str) -> dict[str, Any]:
    """A step with every field at its default (what ``causalab_mini.plain`` reads)."""
    return {
        "write": False,
        "value": None,
        "held": False,
        "where": where,
        # the target: an Envoy (None: the model itself), operations under it by needle
        # (``op``: the first one's name where the client resolved it), its side
        "envoy": None,
        "ops": (),
        "op": None,
        "take": None,
        "attr": "output",
        "select": None,
        "io_module": False,
        # how the place means the tensor there
        "unflatten": False,
        "unmerge": None,
        "unmerge_kind": "place",
        "unmerge_heads_are": "the layer's attention has",
        "views": (),
        "copy": False,
        "scale": None,
        # a computed place (heads_through): (the projection's Envoy, heads)
        "heads_through": None,
        "in_place": False,
        "snapshot": False,
        "edit_copy": False,
        # where a write of a first input goes through the call's (args, kwargs): that
        # attribute (nnsight 0.6/0.7, compat.first_input_setter_keeps_keywords)
        "first_input_via": None,
        # how a component hands it on
        "layout": None,
        "per_head": False,
        "heads": (None, None, None, None),
        "head": None,
        "stream": None,
        "index": None,
        "axis": None,
        # names for messages and the client's bookkeeping
        "place": None,
        "layer": None,
        "row": "",
        "module_path": "",
        "component": "",
        "nested": [],
    }


def _views(internals: Internals, row: Address) -> tuple[tuple[Any, ...], ...]:
    """A row's token views as plain data (``plain._token_view``)."""
    views: list[tuple[Any, ...]] = [("seq_first",)] if row.seq_first else []
    if row.leading_positions is not None:
        view = row.leading_positions
        views.append(("lead", tuple(view.axes), internals.count(view.config)))
    if row.trailing_streams is not None:
        trail = row.trailing_streams
        views.append(("trail", tuple(trail.axes), internals.count(trail.config)))
    return tuple(views)


def row_step(
    internals: Internals, name: str, row: Address, envoy: Any, layer: int | None
) -> dict[str, Any]:
    """Row ``name`` resolved at ``layer`` (``row``; its module's Envoy ``envoy``) as a
    step: what ``model.internals[name][layer]`` reads and writes."""
    from causalab_mini.address import IOType

    from .geometry import num_heads

    where = f"{name}[{layer}]" if row.per_layer else f"{name}()"
    step = _blank(where)
    side = "input" if row.io is IOType.INPUT else "output"
    # a module with a child named input/output has its boundary at nns_*; an operation
    # has no children
    attr = side if row.source else boundary(side, envoy)
    step.update(
        envoy=None if envoy is internals.model else envoy,
        ops=tuple(row.source),
        attr=attr,
        select=_select(row.select),
        io_module=row.io is IOType.MODULE,
        unflatten=bool(row.flat_tokens),
        unmerge=num_heads(internals.model, layer) if row.merged_heads else None,
        views=_views(internals, row) if row.views_tokens else (),
        copy=copied(row),
        snapshot=bool(row.snapshot),
        scale=internals.scale(row.scale) if row.scale is not None else None,
        heads_through=_heads_through(internals, name, row, envoy, layer),
        in_place=row.write == "in_place",
        edit_copy=copied_for_edits(row, attr),
        first_input_via=_first_input_via(row, envoy, side),
        place=name,
        layer=layer,
        row=name,
        module_path=f"layers.{layer}.{row.module}" if row.per_layer else row.module,
    )
    return step


def _heads_through(
    internals: Internals, name: str, row: Address, envoy: Any, layer: int | None
) -> tuple[Any, int] | None:
    """Where the row is computed head by head through its module's weight
    (``heads_through``): (the module's Envoy, whose weight is read when the place is:
    a step outlives dispatch, which replaces the meta weights; the layer's attention
    heads)."""
    if not row.heads_through:
        return None
    from .geometry import num_heads

    return envoy, num_heads(internals.model, layer)


def _first_input_via(row: Address, envoy: Any, side: str) -> str | None:
    """The attribute a write of the row's first input goes through, as the whole call's
    ``(args, kwargs)``, where nnsight's own ``input`` setter would not replace a first
    argument given by keyword (nnsight 0.6/0.7); None where ``input`` is written as it
    is read."""
    if side != "input" or compat.first_input_setter_keeps_keywords():
        return None
    return "inputs" if row.source else boundary("inputs", envoy)


def _where(address: Any) -> str:
    return address.component if address.layer is None else f"{address.component}[{address.layer}]"


def _boundary_step(
    model: Any, address: ComponentAddress, *, write: bool, remote: bool
) -> dict[str, Any]:
    """The step of the row a boundary component reads (a copy of the place's own)."""
    place = model.internals[address.accessor]
    step = dict(place.step(address.layer))
    row = place.address_at(address.layer)
    if step["io_module"]:
        message = f"{address.component} is a module, not a tensor: a plan reads tensors"
        raise RemoteRefused(message) if remote else ComponentError(message)
    if write and row.read_only is not None:
        raise WriteRefused(f"{place.where(address.layer)} is read-only: {row.read_only}")
    if not remote:
        return step
    if row.heads_through:
        raise RemoteRefused(
            f"{address.component} is computed from the output projection's weight, which a "
            "plan sent as plain code does not carry: read attention_premix remotely and "
            "compute the heads' terms from the weight locally"
        )
    if row.merged_heads:
        raise _heads_merged(address)
    if row.flat_tokens:
        raise RemoteRefused(
            f"{address.component} is held flat, (batch*seq, ...), and is viewed back with "
            "the batch and sequence of the layer's input, which only the local forward "
            "records: read it in a local trace"
        )
    if row.views_tokens:
        raise RemoteRefused(
            f"{address.component}'s row leaves positions out of the tensor there "
            "(leading_positions or trailing_streams), which a plan sent as plain code "
            "does not do: read it in a trace of the model (remote=True sends the model's "
            "own places) or locally"
        )
    return step


def _interior_step(model: Any, address: ComponentAddress, *, remote: bool) -> dict[str, Any]:
    """The step of an interior component: an operation (by needles) inside a layer's
    module, an argument or a part of what it returns."""
    if remote and address.merged_heads:
        raise _heads_merged(address)
    assert address.layer is not None
    envoy = child(model.internals.layer_envoy(address.layer), address.module)
    if envoy is None:
        raise ComponentError(
            f"component {address.component!r}: layer {address.layer} has no module "
            f"{address.module!r}"
        )
    step = _blank(_where(address))
    step.update(
        envoy=envoy,
        ops=tuple(address.needles),
        op=address.op,
        take=tuple(address.take) if address.take is not None else None,
        unmerge=address.heads if address.merged_heads else None,
        unmerge_kind="component",
        unmerge_heads_are="stated",
        row=address.accessor,
        module_path=f"layers.{address.layer}.{address.module}",
    )
    return step


def _heads_merged(address: Any) -> RemoteRefused:
    return RemoteRefused(
        f"{address.component} is held with batch and heads merged, (batch*heads, ...), "
        "which plain remote steps do not view apart: read it in a local trace"
    )


def _positions_refused(address: ComponentAddress) -> WriteRefused:
    # measured under nnsight 0.7.0 (drift session): with a batch's own position_ids and
    # a write at positions, a read saved before the write came back changed
    return WriteRefused(
        f"{address}: a write at positions is certified on nnsight 0.8, and nnsight "
        f"{compat.nnsight_version()} is installed, under which a read saved before such "
        "a write was seen to change: install nnsight>=0.8, or write the whole place "
        "(positions.put on what a read returns)"
    )


def component_fields(address: ComponentAddress) -> dict[str, Any]:
    """How a component hands on the tensor at its place, as step fields: its name, its
    layout (several streams: ``streams_<layout>``), its heads' geometry and the head,
    the stream and the sequence axis it takes."""
    return {
        "where": _where(address),
        "component": address.component,
        "layout": f"streams_{address.stream_layout}"
        if address.stream_layout is not None
        else address.layout,
        "per_head": address.per_head != "none",
        "heads": (address.layout, address.heads, address.head_dim, address.width),
        "head": address.head,
        "stream": None
        if address.stream is None
        else (address.stream, address.streams, address.width),
        "axis": address.sequence_axis,
    }


def lower_step(
    model: Any,
    address: ComponentAddress,
    *,
    write: bool,
    value: Any,
    held: bool,
    index: Any = None,
    remote: bool = True,
) -> dict[str, Any]:
    """One read or write of a component as a step: the target (an Envoy and the
    operations below it), the side, how its place means the tensor there, and how the
    component hands it on (``index``: the (batch, n) tokens of a step at positions,
    resolved on the client). ``remote`` refuses what only the client can view (a flat
    or head-merged tensor, positions the forward adds)."""
    if write and not address.writable:
        raise WriteRefused(f"{address.component} is read-only: {address.why_read_only}")
    if write and index is not None and not compat.is_08():
        raise _positions_refused(address)
    if address.kind == "boundary":
        step = _boundary_step(model, address, write=write, remote=remote)
    else:
        step = _interior_step(model, address, remote=remote)
    step.update(component_fields(address), write=write, value=value, held=held, index=index)
    step["nested"] = []
    return step


def lower(
    plan: Any,
    model: Any,
    held: bool = False,
    indices: Mapping[Any, Any] | None = None,
    *,
    remote: bool = True,
) -> tuple[tuple[dict[str, Any], ...], list[Any]]:
    """The plan's steps as plain data, in its order, and the addresses of its reads
    in the order the program returns them. Where an interior opens a nested
    ``.source``, the step ``Plan.run`` opens it at opens it (the first step at its outer
    operation on nnsight 0.6/0.7, the first step inside it on 0.8: ``_nested_sources_due``;
    the server runs the client's nnsight, which ``check_versions`` holds it to)."""
    steps = []
    reads = []
    opened: set[Any] = set()
    nested: dict[tuple[Any, str], list[Any]] = {}
    for s in plan.steps:
        if len(s.address.needles) > 1:
            nested.setdefault((s.address.layer, s.address.module), []).append(s.address)
    for s in plan.steps:
        index = (indices or {}).get(s.address.position) if s.address.position else None
        step = lower_step(
            model, s.address, write=s.write, value=s.value, held=held, index=index, remote=remote
        )
        for address in _nested_sources_due(s.address, nested, opened):
            envoy = child(model.internals.layer_envoy(address.layer), address.module)
            step["nested"].append((envoy, address.needles[0], address.op))
        steps.append(step)
        if not s.write:
            reads.append(s.address)
    return tuple(steps), reads


def _nested_sources_due(
    address: ComponentAddress,
    sources: dict[tuple[int | None, str], list[ComponentAddress]],
    opened: set[Any],
) -> list[ComponentAddress]:
    """The interiors whose outer operation's nested ``.source`` must be opened before
    the step at ``address`` runs (each once; ``opened`` remembers).

    Opening a nested source waits for the operation to hand over the function it
    calls. nnsight 0.6/0.7 hand it over before the operation's inputs, so a nested
    source opens before the first step at its operation (its arguments, or inside
    it), after the steps at the module's earlier operations (GPT-1's split_heads
    before its _attn); nnsight 0.8 hands it over after the inputs (``run_op``: input,
    skip, fn, output), so it opens just before the first step inside it, after the
    steps that read or write the operation's arguments (which rank before it)."""
    if not compat.callee_after_inputs():
        due = [
            a
            for a in sources.get((address.layer, address.module), [])
            if a.op == address.op and (a.layer, a.module, a.op) not in opened
        ]
        for a in due:
            opened.add((a.layer, a.module, a.op))
        return due[:1]
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


__all__ = [
    "component_fields",
    "copied",
    "copied_for_edits",
    "lower",
    "lower_step",
    "row_step",
]
