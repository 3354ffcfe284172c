"""A plan lowered to a *program*: one tuple of plain steps (nnsight Envoys, operation
names, numbers, tensors) that ``causalab_mini.plain`` runs, on a server or here; and
when, in a trace, the nested ``.source`` of an interior opens.

``Plan`` (``causalab_mini.plan``) keeps addresses and runs them locally; ``remote``
sends what ``lower`` makes of them. Both ask this module which nested sources a step
must open first, so the rule is written once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any, NamedTuple

from . import compat
from .errors import HooksRefused, RemoteRefused, WriteRefused
from .geometry import ComponentError
from .locator import ComponentAddress
from .steps import blank
from .tree import child

if TYPE_CHECKING:
    from .plain import Step


class Target(Enum):
    """What a lowered program runs on, which decides what it may ask of a step.

    ``TRACE``: an nnsight trace here, with the model's internals (every place: flat
    tokens viewed back, heads merged with the batch, positions the forward adds).
    ``REMOTE``: plain nnsight module accesses on a server, which has no internals.
    ``HOOKS``: the same plain steps run by torch hooks here. The last two refuse what
    only the internals can view, each with its own error and remedy."""

    TRACE = "trace"
    REMOTE = "remote"
    HOOKS = "hooks"

    @property
    def plain_only(self) -> bool:
        return self is not Target.TRACE

    def refused(self, reason: str) -> Exception:
        """The refusal of a step this target cannot run, with what does run it."""
        if self is Target.HOOKS:
            return HooksRefused(
                f"engine='hooks' runs plain steps and refuses this one: {reason}; use "
                "engine='nnsight' (the default), which runs it"
            )
        return RemoteRefused(f"{reason}: read it in a local trace")


class Program(NamedTuple):
    """A lowered plan: its steps in order, and the addresses of its reads in the order
    the program returns them."""

    steps: tuple[Step, ...]
    reads: tuple[ComponentAddress, ...]


def _where(address: Any) -> str:
    return address.component if address.layer is None else f"{address.component}[{address.layer}]"


def _boundary_step(model: Any, address: ComponentAddress, *, write: bool, target: Target) -> Step:
    """The step of the row a boundary component reads (a copy of the place's own)."""
    place = model.internals[address.accessor]
    step: Step = {**place.step(address.layer)}  # type: ignore[typeddict-item]
    row = place.address_at(address.layer)
    if step["io_module"]:
        message = f"{address.component} is a module, not a tensor: a plan reads tensors"
        raise target.refused(message) if target.plain_only else ComponentError(message)
    if write and row.read_only is not None:
        raise WriteRefused(f"{place.where(address.layer)} is read-only: {row.read_only}")
    if not target.plain_only:
        return step
    if row.heads_through and target is Target.REMOTE:
        raise target.refused(
            f"{address.component} is computed from the output projection's weight, which "
            "a plan sent as plain code does not carry (read attention_premix remotely and "
            "the weight locally)"
        )
    if row.merged_heads:
        raise _heads_merged(address, target)
    if row.flat_tokens:
        raise target.refused(
            f"{address.component} is held flat, (batch*seq, ...), and is viewed back with "
            "the batch and sequence of the layer's input, which only the local forward "
            "records"
        )
    if row.views_tokens:
        raise target.refused(
            f"{address.component}'s row leaves positions out of the tensor there "
            "(leading_positions or trailing_streams), which plain steps do not do"
        )
    return step


def _interior_step(model: Any, address: ComponentAddress, *, target: Target) -> Step:
    """The step of an interior component: an operation (by needles) inside a layer's
    module, an argument or a part of what it returns."""
    if target.plain_only and address.merged_heads:
        raise _heads_merged(address, target)
    assert address.layer is not None
    envoy = child(model.internals.layer_envoy(address.layer), address.module)
    if envoy is None:
        raise ComponentError(
            f"component {address.component!r}: layer {address.layer} has no module "
            f"{address.module!r}"
        )
    step = blank(_where(address))
    step["envoy"] = envoy
    step["ops"] = tuple(address.needles)
    step["op"] = address.op
    take = address.take
    step["take"] = (str(take[0]), int(take[1])) if take is not None else None
    step["unmerge"] = address.heads if address.merged_heads else None
    step["unmerge_kind"] = "component"
    step["unmerge_heads_are"] = "stated"
    step["row"] = address.accessor
    step["module_path"] = f"layers.{address.layer}.{address.module}"
    return step


def _heads_merged(address: ComponentAddress, target: Target) -> Exception:
    return target.refused(
        f"{address.component} is held with batch and heads merged, (batch*heads, ...), "
        "which plain steps do not view apart"
    )


def component_fields(address: ComponentAddress, step: Step) -> Step:
    """``step`` with how a component hands on the tensor at its place: its name, its
    layout (several streams: ``streams_<layout>``), its heads' geometry and the head,
    the stream and the sequence axis it takes."""
    step["where"] = _where(address)
    step["component"] = address.component
    step["layout"] = (
        f"streams_{address.stream_layout}" if address.stream_layout is not None else address.layout
    )
    step["per_head"] = address.per_head != "none"
    step["heads"] = (address.layout, address.heads, address.head_dim, address.width)
    step["head"] = address.head
    step["stream"] = (
        None if address.stream is None else (address.stream, address.streams or 0, address.width)
    )
    step["axis"] = address.sequence_axis
    return step


def geometry(address: ComponentAddress) -> Step:
    """A step that holds only how ``address`` hands its tensor on (to check or slice a
    tensor already read: ``plain.layout_mismatch``, ``plain.head_slice``)."""
    return component_fields(address, blank(_where(address)))


def _placed_step(model: Any, address: ComponentAddress, write: bool, target: Target) -> Step:
    """A fresh copy of the step at ``address`` for ``target`` (refused as the target
    refuses it), before what a plan adds (value, positions, nested sources). Made once
    per model (``Internals.lowered_steps``): rows, module tree and Envoys outlive traces
    and dispatch, as ``Place.step``'s cache relies on, so a plan run again lowers
    without resolving anything."""
    cache: dict[tuple[Any, bool, Target], Step] = model.internals.lowered_steps
    key = (address, write, target)
    hit = cache.get(key)
    if hit is None:
        if address.kind == "boundary":
            hit = _boundary_step(model, address, write=write, target=target)
        else:
            hit = _interior_step(model, address, target=target)
        cache[key] = component_fields(address, hit)
    step = hit.copy()
    step["nested"] = []
    return step


def lower_step(
    model: Any,
    address: ComponentAddress,
    *,
    write: bool,
    value: Any,
    held: bool,
    index: Any = None,
    target: Target,
) -> Step:
    """One read or write of a component as a step: the target (an Envoy and the
    operations below it), the side, how its place means the tensor there, and how the
    component hands it on (``index``: the (batch, n) tokens of a step at positions,
    resolved on the client). A plain-only ``target`` refuses what only the client's
    internals can view (a flat or head-merged tensor, positions the forward adds)."""
    if write and not address.writable:
        raise WriteRefused(f"{address.component} is read-only: {address.why_read_only}")
    step = _placed_step(model, address, write, target)
    if write and address.featurizer is not None:
        # features (or a mechanism on them) at a featurized address: made of the place's
        # tensor where the step runs, with the featurizer's own code (never sent)
        if target is Target.REMOTE:
            raise RemoteRefused(
                f"{address}: a featurized write runs the featurizer's code, which a plan "
                "sent as plain steps does not carry: run it locally, or write the tensor "
                "featurizer.write(x, features) makes"
            )
        step["edit"], value = address.featurizer.lowered_write(model, address, value), None
    elif write and hasattr(value, "lowered_at"):  # a mechanism: its plain edit, checked
        value = value.lowered_at(model, address)
    step["write"] = write
    step["value"] = value
    step["held"] = held
    step["index"] = index
    step["nested"] = []
    return step


def lower(
    plan: Any,
    model: Any,
    held: bool = False,
    indices: Mapping[Any, Any] | None = None,
    *,
    target: Target,
    edits: Sequence[Any] | None = None,
) -> Program:
    """The plan's steps as plain data, in its order, and the addresses of its reads
    in the order the program returns them. Where an interior opens a nested
    ``.source``, the step ``Plan.run`` opens it at opens it (the first step at its outer
    operation on nnsight 0.6/0.7, the first step inside it on 0.8: ``_nested_sources_due``;
    the server runs the client's nnsight, which ``check_versions`` holds it to).

    ``edits`` (one per step, local targets only): a step's ``edit`` (a write's value
    made of the place's handed tensor) or ``then`` (applied to a read where it is made),
    as ``(edit, then)`` pairs."""
    if edits is not None and target is Target.REMOTE and any(e != (None, None) for e in edits):
        raise RemoteRefused(
            "a step whose value is computed where it runs (an interchange's patch) is not "
            "sent as plain data: run it locally"
        )
    steps = []
    reads = []
    opened: set[Any] = set()
    nested: dict[tuple[Any, str], list[Any]] = {}
    for s in plan.steps:
        if len(s.address.needles) > 1:
            nested.setdefault((s.address.layer, s.address.module), []).append(s.address)
    for i, s in enumerate(plan.steps):
        index = (indices or {}).get(s.address.position) if s.address.position else None
        step = lower_step(
            model, s.address, write=s.write, value=s.value, held=held, index=index, target=target
        )
        if edits is not None:
            step["edit"], step["then"] = edits[i]
        for address in _nested_sources_due(s.address, nested, opened):
            assert address.layer is not None
            envoy = child(model.internals.layer_envoy(address.layer), address.module)
            step["nested"].append((envoy, address.needles[0], address.op))
        steps.append(step)
        if not s.write:
            reads.append(s.address)
    return Program(tuple(steps), tuple(reads))


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


def prepare_sources(
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
    "Program",
    "Target",
    "component_fields",
    "geometry",
    "lower",
    "lower_step",
    "prepare_sources",
]
