"""Reading and writing components inside an nnsight trace: ``read``/``write`` act on
one ``ComponentAddress`` (a per-head place handed on flat, one head sliced out once
the tensor is seen to hold the heads the address states; a write checked before it
reaches the model); ``Plan`` runs several in forward order in one trace, so no caller
meets nnsight's out-of-order error."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from causalab_mini.address import replace_part

from . import compat
from .geometry import ComponentError
from .internals import PlaceUnavailable, WriteRefused, check_value, child
from .locator import ComponentAddress, _refuse
from .lower import _nested_sources_due, _prepare_sources
from .ops import OperationNotFound, inner_op
from .positions import Encoded, encode, put, resolve, stacked, take, trace_inputs


def _interior_op(model: Any, address: ComponentAddress) -> Any:
    envoy = child(model.internals.layer_envoy(address.layer), address.module)
    if envoy is None:
        raise _refuse(address.component, f"layer {address.layer} has no module {address.module!r}")
    return getattr(envoy.source, str(address.op))


def _inner_op(model: Any, address: ComponentAddress, outer: Any) -> Any:
    return inner_op(
        outer,
        address.needles[1:],
        row=address.accessor,
        module=f"layers.{address.layer}.{address.module}",
        model_class=model.internals.model_class,
    )


def _whole(model: Any, address: ComponentAddress) -> Any:
    """The full tensor at an address (all heads)."""
    if address.kind == "boundary":
        return model.internals[address.accessor].get(address.layer)
    outer = _interior_op(model, address)
    op = _inner_op(model, address, outer)
    assert address.take is not None
    what, index = address.take
    if what == "arg":
        value = op.inputs[0][index]
    else:
        value = op.output
        # a call may return a tuple or a list (GPT-1's _attn returns [z, ...])
        value = value[index] if isinstance(value, (tuple, list)) else value
    return _unmerged(address, value)


def _unmerged(address: ComponentAddress, value: Any) -> Any:
    """An interior the call holds (batch*heads, ...) viewed as (batch, heads, ...)."""
    if not address.merged_heads:
        return value
    heads = address.heads
    if heads is None or value.shape[0] % heads:
        raise _refuse(
            address.component,
            f"it is held with batch and heads merged, {tuple(value.shape)}, and its first "
            f"axis is no multiple of the {heads} heads stated",
        )
    return value.view(value.shape[0] // heads, heads, *value.shape[1:])


def _stream_layout(address: ComponentAddress) -> Any:
    from causalab_mini.address import Streams

    return Streams(address.stream_layout, "")


def _flat(address: ComponentAddress, native: Any) -> Any:
    """The tensor as handed on: a place held per head (bhsd, bhds, bshd) becomes b s f,
    and a place of several residual streams (batch, seq, n x hidden)."""
    if address.stream_layout is not None:
        return _stream_layout(address).flat(native)
    if address.layout == "bhsd":
        return native.transpose(1, 2).flatten(2)
    if address.layout == "bhds":  # a key transposed for the product
        return native.permute(0, 3, 1, 2).flatten(2)
    if address.layout == "bshd":
        return native.flatten(2)
    return native


def _native(address: ComponentAddress, flat: Any, like: Any) -> Any:
    """Back to how the model holds it (the inverse of ``_flat``), shaped like ``like``."""
    if address.stream_layout is not None:
        return _stream_layout(address).held(flat, like)
    if address.layout == "bhsd":
        b, h, s, d = like.shape
        return flat.reshape(b, s, h, d).transpose(1, 2)
    if address.layout == "bhds":
        b, h, d, s = like.shape
        return flat.reshape(b, s, h, d).permute(0, 2, 3, 1)
    if address.layout == "bshd":
        return flat.reshape(like.shape)
    return flat


def layout_mismatch(address: ComponentAddress, held: Sequence[int]) -> str | None:
    """Why the tensor the model holds at a per-head ``address`` (shape ``held``, before
    it is handed on flat) does not have the heads and head size the address states
    (None where it does, or where the place is not per head). bhsd, bhds and bshd hold the
    head axis and the head size themselves, bsf heads x head size on its last axis,
    bhsk the heads on axis 1."""
    if address.per_head == "none" or address.layout is None:
        return None
    shape = tuple(int(n) for n in held)
    where = address.component if address.layer is None else f"{address.component}[{address.layer}]"
    axes = {"bhsd": (1, 3), "bshd": (2, 3), "bhds": (1, 2), "bhsk": (1, None)}
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


def _stream_slice(address: ComponentAddress, flat: Any) -> tuple[Any, ...]:
    """Stream ``address.stream`` of a tensor handed on flat: its hidden-wide slice."""
    assert address.stream is not None and address.streams is not None
    size = flat.shape[-1] // address.streams
    start = address.stream * size
    return (..., slice(start, start + size))


def _streams_checked(address: ComponentAddress, flat: Any) -> None:
    """Refuse one stream of a tensor whose last axis is not n streams of equal width."""
    assert address.streams is not None
    width = int(flat.shape[-1])
    if width % address.streams or (
        address.width is not None and address.width * address.streams != width
    ):
        raise _refuse(
            address.component,
            f"stream {address.stream} is not sliced out: {width} wide as handed on, which is "
            f"not {address.streams} streams of width {address.width}",
        )


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


def layout_check(address: ComponentAddress) -> Any:
    """For the hooks engine: the check ``read``/``write`` make of the tensor held at a
    per-head or per-stream ``address`` (None where they make none)."""
    if address.head is None and address.stream is None:
        return None

    def check(native: Any) -> None:
        if address.head is not None:
            _checked(address, native)
        if address.stream is not None:
            _streams_checked(address, _flat(address, native))

    return check


def _positions_due(address: ComponentAddress, index: Any) -> Any:
    """The (batch, n) token index a read or write at ``address`` takes, or None for every
    position; refuses an address with positions and no index (they are resolved on the
    batch, which a plan knows and an address does not)."""
    if not address.position:
        return None
    if index is None:
        raise _refuse(
            address.component,
            f"{address} names positions, which are resolved on the batch the trace runs: "
            "run it in a Plan (Plan.of(...).run(model, texts)), or pass index= "
            "(positions.stacked(positions.resolve(model, texts, spec), spec))",
        )
    return index


def read(model: Any, address: ComponentAddress, index: Any = None) -> Any:
    """The tensor at ``address`` (inside a trace), as handed on: per-head places with a
    width are flat (batch, seq, heads x head_dim); one head's slice where ``head`` is set,
    once the tensor is seen to hold the heads the address states. Where the address
    names positions, only those tokens of each row (``index``: (batch, n), from
    ``positions.resolve``), along the component's sequence axis."""
    index = _positions_due(address, index)
    native = _whole(model, address)
    value = _flat(address, native)
    if index is not None:
        assert address.sequence_axis is not None
        value = take(value, index, address.sequence_axis)
    if address.head is not None:
        _checked(address, native)
        value = value[_head_slice(address)]
    if address.stream is not None:
        _streams_checked(address, value)
        value = value[_stream_slice(address, value)]
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
    if address.stream is not None:
        where = f"stream {address.stream} of {where}"
        current = current[_stream_slice(address, current)]
    check_value(where, value, current)


def write(model: Any, address: ComponentAddress, value: Any, index: Any = None) -> None:
    """Write ``value`` (as ``read`` hands it on) at ``address`` inside a trace, after
    checking that it fits. A head's write replaces that head's slice only; a write at
    positions (``index``, as for ``read``) those tokens only, every other position as
    the model computed it."""
    if not address.writable:
        raise WriteRefused(f"{address.component} is read-only: {address.why_read_only}")
    index = _positions_due(address, index)
    if index is not None and not compat.is_08():
        # measured under nnsight 0.7.0 (drift session): with a batch's own position_ids
        # and a write at positions, a read saved before the write came back changed
        raise WriteRefused(
            f"{address}: a write at positions is certified on nnsight 0.8, and nnsight "
            f"{compat.nnsight_version()} is installed, under which a read saved before such "
            "a write was seen to change: install nnsight>=0.8, or write the whole place "
            "(positions.put on what a read returns)"
        )
    native = _whole(model, address)
    flat = _flat(address, native)
    if address.head is not None:
        _checked(address, native)
    if address.stream is not None:
        _streams_checked(address, flat)
    part = flat
    if index is not None:
        assert address.sequence_axis is not None
        part = take(flat, index, address.sequence_axis)
    check_write(address, value, part)
    if address.head is not None:
        whole = part.clone()
        whole[_head_slice(address)] = value
        value = whole
    if address.stream is not None:
        whole = part.clone()
        whole[_stream_slice(address, part)] = value
        value = whole
    if index is not None:
        assert address.sequence_axis is not None
        value = put(flat, index, address.sequence_axis, value)
    value = _native(address, value, native)
    if native.is_contiguous() and not value.is_contiguous():
        # laid out as the model's own tensor was: a forward may .view() it (GPT-NeoX-
        # Japanese's _attn views the query it is given)
        value = value.contiguous()
    if address.merged_heads:  # back through the view: (batch*heads, ...)
        value = value.reshape(-1, *value.shape[2:])
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
        if isinstance(out, (tuple, list)):
            op.output = replace_part(out, index, value)
        else:
            op.output = value


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
        self,
        model: Any,
        inputs: Any,
        held: bool = False,
        *,
        frame: str = "plain",
        engine: str = "nnsight",
        **remote: Any,
    ) -> dict[ComponentAddress, Any]:
        """Run the plan in one trace; return what was read, by address. With ``held``,
        a read returns the whole tensor as the model holds it (a per-head place before
        it is handed on flat), to see the heads it holds.

        Where a step names positions, ``inputs`` is text (a string, a list of strings,
        or ``positions.encode(model, texts)``): it is tokenized once, each step's
        positions are resolved per row of that batch in the content ``frame`` (plain or
        chat), and the trace runs on the batch with ``position_ids`` counted from each
        row's first real token.

        ``remote=True`` (or ``backend=...``) runs it on NDIF as plain nnsight module
        accesses (``causalab_mini.remote``): every read comes back, or it raises.

        ``engine="hooks"`` runs it locally with plain torch forward hooks
        (``causalab_mini.hooks``: the same tensors, no trace; it refuses what needs a
        forward's source); nnsight's trace is the default and the only remote engine."""
        if set(remote) - {"remote", "backend", "blocking"}:
            raise TypeError(f"Plan.run takes remote=, backend= and blocking=, not {sorted(remote)}")
        from .hooks import check_engine

        check_engine(engine, bool(remote.get("remote") or remote.get("backend") is not None))
        inputs, indices = _resolved(self, model, inputs, frame)
        if engine == "hooks":
            from .hooks import run_plan as run_hooks

            return run_hooks(self, model, inputs, held, indices, layout_check)
        if remote.get("remote") or remote.get("backend") is not None:
            from .remote import run_plan

            return run_plan(self, model, inputs, held=held, indices=indices, **remote)
        saved: list[tuple[ComponentAddress, Any]] = []  # bound before the trace
        sources = _prepare_sources(model, [s.address for s in self.steps])
        try:
            self._trace(model, inputs, sources, saved, held, indices)
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
        indices: dict[Any, Any] | None = None,
    ) -> None:
        indices = indices or {}
        with model.trace(inputs):
            touched: set[Any] = set()
            for step in self.steps:
                for address in _nested_sources_due(step.address, sources, touched):
                    _interior_op(model, address).source  # noqa: B018 - installs the nested source
                index = indices.get(step.address.position)
                if step.write:
                    write(model, step.address, step.value, index)
                elif held:
                    saved.append((step.address, _whole(model, step.address).save()))
                else:
                    saved.append((step.address, read(model, step.address, index).save()))


def _resolved(plan: Plan, model: Any, inputs: Any, frame: str) -> tuple[Any, dict[Any, Any]]:
    """The inputs the trace runs and, per position spec of the plan's steps, its (batch,
    n) token index on that batch (none where no step names positions: the inputs go to
    the trace as given)."""
    specs = {s.address.position for s in plan.steps if s.address.position}
    if not specs:
        return (inputs.inputs if isinstance(inputs, Encoded) else inputs), {}
    encoded = inputs if isinstance(inputs, Encoded) else encode(model, inputs, frame)
    indices = {spec: stacked(resolve(model, encoded, spec), spec) for spec in specs}
    return trace_inputs(model, encoded), indices


__all__ = ["Plan", "Step", "check_write", "layout_mismatch", "read", "write"]
