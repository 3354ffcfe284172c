"""A registry row resolved on a model, as a step of ``causalab_mini.plain`` (the one
executor of reads and writes): what ``model.internals[name][layer]`` reads and writes,
as plain data. ``causalab_mini.internals`` makes each place's steps here, and
``causalab_mini.lower`` starts a component's step from its place's (or from
``blank``), so neither needs the other."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import compat
from .errors import PlaceUnavailable, RemoteRefused
from .tree import boundary

if TYPE_CHECKING:
    from typing import Protocol

    from causalab_mini.address import Address

    from .plain import Step

    class Internals(Protocol):
        """What a place's step is made with: ``causalab_mini.internals.Internals``."""

        model: Any

        def scale(self, attribute: str | float) -> float: ...

        def count(self, attribute: str) -> int: ...


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


def select_of(select: Any) -> tuple[Any, ...] | None:
    from causalab_mini.address import FirstIfTuple, Index

    if select is None:
        return None
    if isinstance(select, FirstIfTuple):
        return ("first",)
    if isinstance(select, Index):
        return ("index", select.key)
    raise RemoteRefused(f"a select of type {type(select).__name__} cannot be sent as plain code")


def blank(where: str) -> Step:
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
        # a computed place (heads_through): the function of the tensor there that
        # gives each head's term (local engines only)
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
        # local engines only: a write's value made of the place's handed tensor (an
        # interchange's patch, a mechanism), and what a read is cut to where it is made
        "edit": None,
        "then": None,
    }


def token_views(internals: Internals, row: Address) -> tuple[tuple[Any, ...], ...]:
    """A row's token views as plain data (``plain._token_view``)."""
    views: list[tuple[Any, ...]] = [("seq_first",)] if row.seq_first else []
    if row.leading_positions is not None:
        view = row.leading_positions
        views.append(("lead", tuple(view.axes), internals.count(view.config)))
    if row.trailing_streams is not None:
        trail = row.trailing_streams
        views.append(("trail", tuple(trail.axes), internals.count(trail.config)))
    return tuple(views)


def row_step(internals: Internals, name: str, row: Address, envoy: Any, layer: int | None) -> Step:
    """Row ``name`` resolved at ``layer`` (``row``; its module's Envoy ``envoy``) as a
    step: what ``model.internals[name][layer]`` reads and writes."""
    from causalab_mini.address import IOType

    from .geometry import num_heads

    where = f"{name}[{layer}]" if row.per_layer else f"{name}()"
    step = blank(where)
    side = "input" if row.io is IOType.INPUT else "output"
    # a module with a child named input/output has its boundary at nns_*; an operation
    # has no children
    attr = side if row.source else boundary(side, envoy)
    step["envoy"] = None if envoy is internals.model else envoy
    step["ops"] = tuple(row.source)
    step["attr"] = attr
    step["select"] = select_of(row.select)
    step["io_module"] = row.io is IOType.MODULE
    step["unflatten"] = bool(row.flat_tokens)
    step["unmerge"] = num_heads(internals.model, layer) if row.merged_heads else None
    step["views"] = token_views(internals, row) if row.views_tokens else ()
    step["copy"] = copied(row)
    step["snapshot"] = bool(row.snapshot)
    step["scale"] = internals.scale(row.scale) if row.scale is not None else None
    step["heads_through"] = heads_through(internals, where, row, envoy, layer)
    step["in_place"] = row.write == "in_place"
    step["edit_copy"] = copied_for_edits(row, attr)
    step["first_input_via"] = first_input_via(row, envoy, side)
    step["place"] = name
    step["layer"] = layer
    step["row"] = name
    step["module_path"] = f"layers.{layer}.{row.module}" if row.per_layer else row.module
    return step


def heads_through(
    internals: Internals, where: str, row: Address, envoy: Any, layer: int | None
) -> Callable[[Any], Any] | None:
    """Where the row is computed head by head through its module's weight
    (``heads_through``), the function that makes each head's term of the tensor there
    (``causalab_mini.heads``). It reads the weight when it runs: a step outlives
    dispatch, which replaces a meta model's weights."""
    if not row.heads_through:
        return None
    from .geometry import num_heads
    from .heads import projection_weight, through_heads

    heads = num_heads(internals.model, layer)

    def terms(value: Any) -> Any:
        weight, why = projection_weight(getattr(envoy, "_module", envoy), where)
        if weight is not None and weight.is_meta:  # (a model's own weights, dispatched)
            why = (
                f"{where} sends each head through the output projection's weight, and "
                "that weight is not in memory while this runs (offloaded: accelerate "
                "puts it in place only inside the module's own forward). Load the model "
                "without offloading, or read attention_premix and apply the weight yourself"
            )
        elif weight is not None:
            value, why = through_heads(value, weight, heads, where)
        if why is not None:
            raise PlaceUnavailable(why)
        return value

    return terms


def first_input_via(row: Address, envoy: Any, side: str) -> str | None:
    """The attribute a write of the row's first input goes through, as the whole call's
    ``(args, kwargs)``, where nnsight's own ``input`` setter would not replace a first
    argument given by keyword (nnsight 0.6/0.7); None where ``input`` is written as it
    is read."""
    if side != "input" or compat.first_input_setter_keeps_keywords():
        return None
    return "inputs" if row.source else boundary("inputs", envoy)


__all__ = [
    "blank",
    "copied",
    "copied_for_edits",
    "first_input_via",
    "heads_through",
    "row_step",
    "select_of",
    "token_views",
]
