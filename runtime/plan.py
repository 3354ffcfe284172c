"""Reading and writing components inside an nnsight trace: ``read``/``write`` act on
one ``ComponentAddress`` (a per-head place handed on flat, one head sliced out once
the tensor is seen to hold the heads the address states; a write checked before it
reaches the model); ``Plan`` runs several in forward order in one trace, so no caller
meets nnsight's out-of-order error.

Each is lowered to steps (``causalab_mini.lower``) that ``causalab_mini.plain`` runs,
the one executor of reads and writes: here with the model's internals, on a server
without them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from . import plain
from .engines import Engine, engine_for
from .internals import WriteRefused, check_value
from .locator import ComponentAddress, refuse
from .lower import Target, geometry, lower_step
from .positions import Encoded, check_frame, encode, resolve, stacked, trace_inputs

if TYPE_CHECKING:
    from .generation import Generation


def layout_mismatch(address: ComponentAddress, held: Sequence[int]) -> str | None:
    """Why the tensor the model holds at a per-head ``address`` (shape ``held``, before
    it is handed on flat) does not have the heads and head size the address states
    (None where it does, or where the place is not per head): ``plain.layout_mismatch``
    on the address's geometry."""
    return plain.layout_mismatch(geometry(address), held)


def _positions_due(address: ComponentAddress, index: Any) -> Any:
    """The (batch, n) token index a read or write at ``address`` takes, or None for every
    position; refuses an address with positions and no index (they are resolved on the
    batch, which a plan knows and an address does not)."""
    if not address.position:
        return None
    if index is None:
        raise refuse(
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
    step = lower_step(
        model, address, write=False, value=None, held=False, index=index, target=Target.TRACE
    )
    value = plain.read(model, step, model.internals)
    return value if address.featurizer is None else address.featurizer.read(value)


def check_write(address: ComponentAddress, value: Any, current: Any) -> None:
    """Refuse a write that does not fit: read-only, or shape / dtype / device differ
    (``check_value``, the one check every spelling of a write makes). ``current`` is
    the place's tensor as handed on (all heads)."""
    if not address.writable:
        raise WriteRefused(f"{address.component} is read-only: {address.why_read_only}")
    step = geometry(address)
    where = step["where"]
    if address.head is not None:
        where = f"head {address.head} of {where}"
        current = current[plain.head_slice(step)]
    if address.stream is not None:
        where = f"stream {address.stream} of {where}"
        current = current[plain.stream_slice(step, current, None)]
    check_value(where, value, current)


def write(model: Any, address: ComponentAddress, value: Any, index: Any = None) -> None:
    """Write ``value`` (as ``read`` hands it on) at ``address`` inside a trace, after
    checking that it fits. A head's write replaces that head's slice only; a write at
    positions (``index``, as for ``read``) those tokens only, every other position as
    the model computed it."""
    index = _positions_due(address, index)
    step = lower_step(
        model, address, write=True, value=value, held=False, index=index, target=Target.TRACE
    )
    edit = step.get("edit")
    if edit is not None:  # made of the place's tensor (a featurized write)
        step["value"] = edit(plain.read(model, step, model.internals))
    plain.write(model, step, model.internals)


@dataclass(frozen=True, eq=False)
class Step:
    """One read or write of a plan; ``value`` is what a write puts: a tensor (exactly
    the place's shape) or a mechanism (``causalab_mini.mechanisms``)."""

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

        if isinstance(self.value, torch.Tensor) and isinstance(other.value, torch.Tensor):
            return bool(torch.equal(self.value, other.value))
        return bool(self.value == other.value)  # mechanisms compare as data

    def __hash__(self) -> int:
        return hash((self.address, self.write))


@dataclass(frozen=True)
class Plan:
    """Reads and writes for one trace, kept in forward order (writes before reads at
    the same place), so no caller meets nnsight's out-of-order error. Pure data:
    it pickles and travels."""

    steps: tuple[Step, ...] = ()

    @cached_property
    def positions(self) -> frozenset[Any]:
        """The position specs its steps name (each resolved per row of a run's batch)."""
        return frozenset(s.address.position for s in self.steps if s.address.position)

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
        engine: str | Engine = "nnsight",
        **remote: Any,
    ) -> dict[ComponentAddress, Any]:
        """Run the plan in one trace; return what was read, by address. With ``held``,
        a read returns the whole tensor as the model holds it (a per-head place before
        it is handed on flat), to see the heads it holds.

        Where a step names positions, ``inputs`` is text (a string, a list of strings,
        or ``positions.encode(model, texts)``): it is tokenized once, each step's
        positions are resolved per row of that batch in the content ``frame`` (plain or
        chat), and the trace runs on the batch with ``position_ids`` counted from each
        row's first real token. ``frame="chat"`` always runs the chat prompt (the
        template rendered around each text, generation prompt included), whether or not
        a step names positions; a frame the inputs cannot take is refused.

        ``remote=True`` (or ``backend=...``) runs it on NDIF as plain nnsight module
        accesses (``causalab_mini.remote``): every read comes back, or it raises.

        ``engine="hooks"`` runs it locally with plain torch forward hooks
        (``causalab_mini.hooks``: the same tensors, no trace; it refuses what needs a
        forward's source); nnsight's trace is the default and the only remote engine.
        ``engine`` may also be a ``causalab_mini.engines.Engine``."""
        if set(remote) - {"remote", "backend", "blocking"}:
            raise TypeError(f"Plan.run takes remote=, backend= and blocking=, not {sorted(remote)}")
        runner = engine_for(engine, **remote)
        inputs, indices = _resolved(self, model, inputs, frame)
        # a featurized read returns features (causalab_mini.featurizers)
        return featurized(runner.reads(model, runner.lower(self, model, held, indices), inputs))

    def generate(
        self,
        model: Any,
        inputs: Any,
        *,
        max_new_tokens: int,
        frame: str = "plain",
        **generate_kwargs: Any,
    ) -> Generation:
        """Run the plan at every step of ``model.generate`` on ``inputs`` (text, or
        ``positions.encode(model, texts)``; ``generate_kwargs`` go to generate, e.g.
        ``do_sample=False``); return a ``Generation``: each step's reads, by address,
        and the generated tokens.

        Step 0 runs the prompt: positions resolve per row of the prompt batch in the
        content ``frame``, as in ``run``. Each later step runs one new token per row,
        the token being generated: ``{"index": -1}`` there is that token, and any other
        position is refused before anything runs. A write at ``{"index": -1}`` is made
        at every step (it steers generation); an address without positions reads each
        step's whole tensor. It stops where transformers' generate stops (EOS, a stopping
        criterion; ``min_new_tokens=max_new_tokens`` runs every step). Local nnsight>=0.8
        only (``causalab_mini.generation``)."""
        from .generation import generate

        return generate(
            self, model, inputs, max_new_tokens=max_new_tokens, frame=frame, **generate_kwargs
        )


def featurized(values: dict[Any, Any]) -> dict[Any, Any]:
    """A plan's reads with each featurized address's tensor in its features
    (``causalab_mini.featurizers``; a ragged read, a list of tensors, each)."""
    if all(a.featurizer is None for a in values):  # (no key hashed again)
        return values
    out = {}
    for a, v in values.items():
        f = a.featurizer
        out[a] = v if f is None else [f.read(t) for t in v] if isinstance(v, list) else f.read(v)
    return out


def _resolved(plan: Plan, model: Any, inputs: Any, frame: str) -> tuple[Any, dict[Any, Any]]:
    """The inputs the trace runs and, per position spec of the plan's steps, its (batch,
    n) token index on that batch (none where no step names positions). A frame other
    than plain is always the batch the trace runs (the chat prompt, whether or not a
    step names positions); a frame the inputs cannot take is refused, never replaced by
    another (``check_frame``)."""
    from . import seq2seq

    check_frame(inputs, frame)
    specs = plan.positions
    if isinstance(inputs, Encoded) and not specs:
        return inputs.inputs, {}
    if not specs and frame == "plain" and not seq2seq.is_encoder_decoder(model):
        return inputs, {}
    if not specs and isinstance(inputs, Mapping):
        seq2seq.check_ids(model, inputs)  # an encoder-decoder's ids need the decoder's
        return inputs, {}
    encoded = inputs if isinstance(inputs, Encoded) else encode(model, inputs, frame)
    indices = {spec: stacked(resolve(model, encoded, spec), spec) for spec in specs}
    return trace_inputs(model, encoded), indices


__all__ = ["Plan", "Step", "check_write", "featurized", "layout_mismatch", "read", "write"]
