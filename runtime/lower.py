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
from .errors import RemoteRefused
from .internals import WriteRefused, _copied, boundary, child

if TYPE_CHECKING:
    from .locator import ComponentAddress


def _select(select: Any) -> tuple[Any, ...] | None:
    from causalab_mini.address import FirstIfTuple, Index

    if select is None:
        return None
    if isinstance(select, FirstIfTuple):
        return ("first",)
    if isinstance(select, Index):
        return ("index", select.key)
    raise RemoteRefused(f"a select of type {type(select).__name__} cannot be sent as plain code")


def _where(address: Any) -> str:
    where = address.component if address.layer is None else f"{address.component}[{address.layer}]"
    where += f".head[{address.head}]" if address.head is not None else ""
    return where + (f".stream[{address.stream}]" if address.stream is not None else "")


def _heads_merged(address: Any) -> RemoteRefused:
    return RemoteRefused(
        f"{address.component} is held with batch and heads merged, (batch*heads, ...), "
        "which plain remote steps do not view apart: read it in a local trace"
    )


def lower_step(
    model: Any, address: Any, *, write: bool, value: Any, held: bool, index: Any = None
) -> dict[str, Any]:
    """One plan step as plain data: the Envoy, the operations below it, the side, and
    what a read or write does with the tensor there (``index``: the (batch, n) tokens
    of a step at positions, resolved on the client)."""
    from causalab_mini.address import IOType

    internals = model.internals
    step: dict[str, Any] = {
        "write": write,
        "value": value,
        "held": held,
        "where": _where(address),
        "layout": address.layout,
        "head": None,
        "nested": [],
        "take": None,
        "attr": None,
        "select": None,
        "copy": False,
        "scale": None,
        "in_place": False,
        "snapshot": False,
        "index": index,
        "axis": address.sequence_axis,
    }
    if address.stream_layout is not None:
        step["layout"] = f"streams_{address.stream_layout}"
        if address.stream is not None:
            size = address.width
            step["head"] = ("last", address.stream * size, size)
    if address.head is not None:
        if address.layout == "bhsk":
            step["head"] = ("axis1", address.head, None)
        else:
            step["head"] = ("last", address.head * address.head_dim, address.head_dim)
    if write and not address.writable:
        raise WriteRefused(f"{address.component} is read-only: {address.why_read_only}")
    if write and index is not None and not compat.is_08():
        # as plan.write: measured under nnsight 0.7.0, a read saved before came back changed
        raise WriteRefused(
            f"{_where(address)}: a write at positions is certified on nnsight 0.8, and "
            f"nnsight {compat.nnsight_version()} is installed: install nnsight>=0.8, or "
            "write the whole place"
        )
    if address.kind == "boundary":
        place = internals[address.accessor]
        row = place.address_at(address.layer)
        if row.io is IOType.MODULE:
            raise RemoteRefused(
                f"{address.component} is a module, not a tensor: a plan reads tensors"
            )
        if write and row.read_only is not None:
            raise WriteRefused(f"{place.where(address.layer)} is read-only: {row.read_only}")
        if row.merged_heads or address.merged_heads:
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
        envoy = child(internals.row_base(row, address.layer), row.module)
        side = "input" if row.io is IOType.INPUT else "output"
        step.update(
            envoy=None if envoy is model else envoy,
            ops=tuple(row.source),
            # a module with a child named input/output has its boundary at nns_*; an
            # operation has no children
            attr=side if row.source else boundary(side, envoy),
            select=_select(row.select),
            # Place.get/set's contract: a read where the tensor changes in place later
            # (the forward's own add, or an in-place write) is a copy; a write at a
            # snapshot place hands the model a copy of the value
            copy=_copied(row),
            snapshot=bool(row.snapshot),
            scale=internals.scale(row.scale) if row.scale is not None else None,
            in_place=row.write == "in_place",
        )
        return step
    if address.merged_heads:
        raise _heads_merged(address)
    envoy = child(internals.layer_envoy(address.layer), address.module)
    step.update(envoy=envoy, ops=tuple(address.needles), take=tuple(address.take))
    return step


def lower(
    plan: Any, model: Any, held: bool = False, indices: Mapping[Any, Any] | None = None
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
        step = lower_step(model, s.address, write=s.write, value=s.value, held=held, index=index)
        for address in _nested_sources_due(s.address, nested, opened):
            envoy = child(model.internals.layer_envoy(address.layer), address.module)
            step["nested"].append((envoy, address.needles[0]))
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


__all__ = ["lower", "lower_step"]
