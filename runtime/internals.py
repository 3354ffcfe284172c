"""``model.internals``: the Address rows of one loaded model, resolved and traced.

Everything a row means comes from ``causalab_mini.generated``; this module only
walks the module tree (to resolve structural places and layer kinds, never running
the model) and reads or writes the resolved place inside an nnsight trace.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from causalab_mini.address import Address, IOType, StructuralEntry
from causalab_mini.generated import LAYER_KINDS, STRUCTURAL_ADDRESSES

from . import compat, plain
from .compat import several_invokes
from .errors import PlaceUnavailable, RenameError, WriteRefused, check_value
from .family import families_of
from .ops import find_op, inner_op
from .steps import row_step
from .tree import (
    boundary,
    child,
    child_names,
    has_attr,
    layer_config,
    shared_on,
    shared_reason,
)
from .versions import outside_versions

if TYPE_CHECKING:
    from .plain import Step


def _place_name(step: Step) -> str:
    """The place a step of a row reads (every step the internals serve has one)."""
    name = step["place"]
    if name is None:
        raise PlaceUnavailable(f"{step['where']}: a step of no place reached the internals")
    return name


# What every refusal says where the registry has not been told a model's block
# structure (here, and places.yaml's structure_unknown reason): unfinished work, not a
# fact of the model, so the sweep does not count such a model as certified.
NO_STRUCTURE_RULE = "no rule in registry/block_structures.yaml"


def _edits() -> Any:
    """``causalab_mini.edits`` (it imports torch: imported when a trace first hands a
    read, then kept, so a read pays no import statement)."""
    global _EDITS
    if _EDITS is None:
        from . import edits

        _EDITS = edits
    return _EDITS


_EDITS: Any = None


def _as_it_is(step: Step) -> bool:
    """Whether ``step`` reads a module's input or output (or its first element) as
    the model holds it: no operation inside, no view, scale or computed term."""
    return bool(
        step["envoy"] is not None
        and not step["ops"]
        and step["take"] is None
        and step["select"] in (None, ("first",))
        and not step["unflatten"]
        and step["unmerge"] is None
        and not step["views"]
        and step["scale"] is None
        and step["heads_through"] is None
    )


# ``Place.get``: no quick read made yet for the layer; a quick read's answer where it
# leaves the read to the general path (outside a trace body, in a backward)
_UNMADE: Any = object()
_ASIDE: Any = object()


class LayerTokens:
    """A forward pre-hook on one layer's module: the batch and sequence of the input
    the layer was last called with (every axis of its first tensor argument but the
    last). A place whose tensor the block flattens to (tokens, ...) is viewed back
    with them (``flat_tokens``). Plain data, so a model with it pickles."""

    def __init__(self) -> None:
        self.shape: tuple[int, ...] | None = None

    def __call__(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        first = args[0] if args else next(iter(kwargs.values()), None)
        shape = getattr(first, "shape", None)
        self.shape = (
            tuple(int(n) for n in shape[:-1]) if shape is not None and len(shape) >= 2 else None
        )


class Place:
    """One row of ``model.internals``: read with ``[layer]`` (or ``()`` for a
    whole-model place), write with ``[layer] = tensor``."""

    def __init__(self, internals: Internals, name: str, row: Address) -> None:
        self._internals = internals
        self.name = name
        self.row = row
        # layer as given (an int or None) -> the row there as a step (``step``)
        self._steps: dict[int | None, Step] = {}
        # layer as given -> the read made in one function (``Internals.quick_read``),
        # or None where the row's read is not that plain
        self._quick: dict[int | None, Callable[[], Any] | None] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_quick"] = {}  # (functions of this process, as Internals' hands)
        return state

    # ------------------------------------------------------------ description

    @property
    def per_layer(self) -> bool:
        return bool(self.row.per_layer)

    @property
    def address(self) -> Address:
        """The row, with ``{name}`` resolved on the first layer where it resolves."""
        if not self.row.is_structural:
            return self.row
        for layer in range(self._internals.num_layers):
            resolved, _ = self._internals.resolve_row(self.name, self.row, layer)
            if resolved is not None:
                return resolved
        return self.row

    def address_at(self, layer: int | None = None) -> Address:
        """The resolved row at ``layer``; raises PlaceUnavailable with the reason."""
        layer = self._internals.layer_of(self, layer)
        reason = self._internals.reason_at(self.name, self.row, layer)
        if reason is not None:
            raise PlaceUnavailable(self._internals.refusal_text(self.name, layer, reason))
        resolved, _ = self._internals.resolve_row(self.name, self.row, layer)
        assert resolved is not None
        return resolved

    def unavailable_on(self, layer: int | None = None) -> str | None:
        """None if the place exists on ``layer`` (or the whole model), else why not."""
        if layer is None and self.per_layer:
            return self._internals.status()[self.name]
        layer = self._internals.layer_of(self, layer)
        return self._internals.reason_at(self.name, self.row, layer)

    def __repr__(self) -> str:
        scope = "per layer" if self.per_layer else "whole model"
        return f"<{self.name}: {self.address.describe()}, {scope}>"

    # ------------------------------------------------------------ trace access

    def _module_target(self, layer: int | None) -> tuple[Address, Any]:
        """The resolved row at ``layer`` and the Envoy of its module (cached: the
        rows, the module tree and its Envoys outlive traces and dispatch)."""
        internals = self._internals
        key = (self.name, -1 if layer is None else layer)
        hit = internals.module_targets.get(key)
        if hit is not None:
            return hit
        address = self.address_at(layer)
        if address.flat_tokens:
            internals.watch_tokens()  # a layer module swapped since construction
        base = internals.row_base(address, layer)
        envoy = None if base is None else child(base, address.module)
        if envoy is None:  # the tree changed since status was decided
            raise PlaceUnavailable(
                internals.refusal_text(
                    self.name, layer, f"module {address.module!r} is not in the model"
                )
            )
        internals.module_targets[key] = (address, envoy)
        return address, envoy

    def step(self, layer: int | None = None) -> Step:
        """The row at ``layer`` as a step of ``causalab_mini.plain`` (the one executor
        of reads and writes): resolved once per layer, then cached (the rows, the
        module tree and its Envoys outlive traces and dispatch). Raises
        PlaceUnavailable with the reason where the place is not there."""
        cacheable = layer is None or type(layer) is int  # never a bool: it hashes as 0 or 1
        if cacheable:
            hit = self._steps.get(layer)
            if hit is not None:
                return hit
        at = self._internals.layer_of(self, layer)
        address, envoy = self._module_target(at)
        step = row_step(self._internals, self.name, address, envoy, at)
        if cacheable:
            self._steps[layer] = step
        return step

    def get(self, layer: int | None = None) -> Any:
        """The tensor here (inside a trace), whose in-place edits (``x[:, 2] += v``,
        ``x.zero_()``) are this place's write (``edits.editable``): a copy where the row
        copies and at a module's input (``copied_for_edits``), where a value read and
        saved keeps what it was when read; a module place's Envoy."""
        cacheable, quick = layer is None or type(layer) is int, None
        if cacheable:
            quick = self._quick.get(layer, _UNMADE)
            if quick is not None and quick is not _UNMADE:
                got = quick()
                if got is not _ASIDE:
                    return got
        step = self.step(layer)
        if step["io_module"]:
            return self._module_target(step["layer"])[1]
        got = plain.whole_value(self._internals.model, step, self._internals, edit=True)
        if cacheable and quick is _UNMADE:  # (a read made: the row there is resolved)
            self._quick[layer] = self._internals.quick_read(self, step)
        return got

    def read(self, layer: int | None = None) -> Any:
        """The tensor here as ``get`` reads it, as a plain tensor (a copy where the
        row copies), for the library's own reads that never edit it."""
        step = self.step(layer)
        if step["io_module"]:
            return self._module_target(step["layer"])[1]
        return plain.whole_value(self._internals.model, step, self._internals)

    def where(self, layer: int | None) -> str:
        """``layers_mid[1]`` or ``logits()``: the place as a write names it."""
        return f"{self.name}[{layer}]" if self.per_layer else f"{self.name}()"

    def refuses_writes(self) -> str | None:
        """Why no write is taken here, whatever the value (None where writes are)."""
        if self.row.io is IOType.MODULE:
            return (
                "it is a module, not a tensor; write its input or output place "
                f"(e.g. {self.name}_input or {self.name}_output) instead"
            )
        read_only: str | None = self.row.read_only
        return read_only

    def set(self, layer: int | None, value: Any) -> None:
        """Write ``value`` here: a tensor of exactly the place's shape, dtype and device
        (``check_value``); refused at a read-only place. Where the row writes in place,
        the tensor the block carries on is overwritten, and a value read before keeps
        what it was (reads there are copies)."""
        step = self.step(layer)
        refused = self.refuses_writes() if step["io_module"] else self.address_at(layer).read_only
        if refused is not None:
            raise WriteRefused(f"{step['where']} is read-only: {refused}")
        if type(value).__name__ == "EditableRead":  # written as the tensor it holds
            from .edits import plain as unwrapped

            value = unwrapped(value)
        if hasattr(value, "applied"):  # a mechanism (causalab_mini.mechanisms): of the tensor here
            model = self._internals.model
            value = value.applied(step["where"], plain.whole_value(model, step, self._internals))
        plain.put(self._internals.model, step, value, self._internals)

    def __getitem__(self, key: Any) -> Any:
        """``place[layer]``: the tensor there; ``place[layer, index]``: only the tokens
        ``index`` names ((batch, n) token indices per row, from
        ``positions.stacked(positions.resolve(model, inputs, spec), spec)``), along the
        place's sequence axis."""
        layer, index = self._key(key)
        return self.get(layer) if index is None else self.get_at(layer, index)

    def __setitem__(self, key: Any, value: Any) -> None:
        """``place[layer] = v`` writes the place; ``place[layer, index] = v`` only the
        tokens ``index`` names, every other position as the model computed it."""
        layer, index = self._key(key)
        if index is None:
            self.set(layer, value)
        else:
            self.set_at(layer, index, value)

    def __call__(self, layer: int | None = None, index: Any = None) -> Any:
        return self.get(layer) if index is None else self.get_at(layer, index)

    def save(self) -> Any:
        """``model.<place>.save()``: a whole-model place's tensor, saved (what
        ``model.<place>().save()`` gives, as ``model.logits.save()`` does); refused on a
        place per layer, which names no tensor until a layer is given. Without this
        nnsight's ``save`` of any object would hand back the place itself."""
        if self.per_layer:
            raise PlaceUnavailable(
                f"model.{self.name}.save(): {self.name} is a place per layer, which names no "
                f"tensor until a layer is given: write model.{self.name}[layer].save()"
            )
        return self.get(None).save()

    def _key(self, key: Any) -> tuple[Any, Any]:
        if not isinstance(key, tuple):
            return key, None
        if len(key) != 2:
            raise TypeError(
                f"{self.name}[...] takes a layer, or a layer and a (batch, n) token index: "
                f"{self.name}[layer, index], not {len(key)} items"
            )
        layer, index = key
        shape = tuple(getattr(index, "shape", ()))
        dtype = str(getattr(index, "dtype", ""))
        if len(shape) != 2 or "int" not in dtype:
            raise TypeError(
                f"{self.name}[{layer!r}, index]: the index is the (batch, n) integer tensor "
                "of each row's token positions, not "
                f"{type(index).__name__} {shape or ''}: make it with "
                "positions.stacked(positions.resolve(model, inputs, spec), spec)"
            )
        return layer, index

    def sequence_axis(self) -> int:
        """The axis of this place's tensor (as a read hands it out) that runs over the
        input's tokens: the component table's, on the tensor as the row holds it (a
        per-head layout, several streams). Refused where no component states one."""
        from causalab_mini.generated import COMPONENTS

        row = self.address
        if row.streams is not None:
            return 2 if row.streams.layout == "nbsh" else 1
        if row.before_layers and row.per_layer and row.io in (IOType.INPUT, IOType.OUTPUT):
            # a stream of the stack run wholly before the layers (an encoder-decoder's
            # encoder): (batch, seq, hidden), its positions counted in the encoder's
            # input (positions.resolve(..., stack="encoder"))
            return 1
        for spec in COMPONENTS.values():
            if spec.kind == "boundary" and spec.target == self.name:
                if spec.sequence_axis is None:
                    break
                held = {"bhsd": 2, "bhsk": 2, "bhds": 3}
                return int(held.get(str(spec.layout), spec.sequence_axis))
        raise PlaceUnavailable(
            self._internals.refusal_text(
                self.name,
                None,
                "no component states which axis of this place runs over the tokens, so "
                "positions do not apply here: read the whole place and take positions "
                "yourself (positions.take(value, index, axis))",
            )
        )

    def get_at(self, layer: int | None, index: Any) -> Any:
        """The tokens ``index`` names of the place (inside a trace); an in-place edit
        of the result is a write of those tokens (``set_at``)."""
        axis = self.sequence_axis()
        step = self.step(layer)
        model = self._internals.model
        value = plain.take_positions(plain.whole_value(model, step, self._internals), index, axis)
        from .edits import editable

        at = step["layer"]
        target = plain.target_of(model, step, self._internals)
        return editable(
            value,
            f"{self.where(at)} at positions",
            lambda edited: self.set_at(at, index, edited),
            compat.location(target, step["attr"]),
            False,
        )

    def set_at(self, layer: int | None, index: Any, value: Any) -> None:
        """Write ``value`` at the tokens ``index`` names, shaped as ``get_at`` reads
        them; every other position keeps what the model computed. Checked like every
        write (shape, dtype, device; read-only)."""
        axis = self.sequence_axis()
        step = self.step(layer)
        refused = self.refuses_writes() if step["io_module"] else self.address_at(layer).read_only
        if refused is not None:
            raise WriteRefused(f"{step['where']} is read-only: {refused}")
        if type(value).__name__ == "EditableRead":
            from .edits import plain as unwrapped

            value = unwrapped(value)
        model = self._internals.model
        current = plain.whole_value(model, step, self._internals)
        part = plain.take_positions(current, index, axis)
        check_value(f"{step['where']} at positions", value, part)
        plain.put(model, step, plain.put_positions(current, index, axis, value), self._internals)


# how far before the layers a before_layers row ranks (more layers than any model has)
_BEFORE_LAYERS = 1 << 20


# where a computed place's gradient is (each head's term of the output projection is
# made from its input and weight: no tensor the forward runs through)
COMPUTED_GRADIENT = (
    "the place is computed from the output projection's input and weight (each head's "
    "term), not a tensor the forward runs through, so autograd has no gradient for it; "
    "every head's term has the gradient of the projection's output (their sum plus the "
    "bias): read attentions_output (where nothing follows the projection) and take its "
    "x.grad, or attentions_premix's for the heads' inputs"
)


class Internals(Mapping[str, Place]):
    """The rows of one model by name, in forward order."""

    def __init__(self, model: Any, rows: Mapping[str, Address]) -> None:
        self.model = model
        self.num_layers: int = len(model.layers)
        self.model_class: str = type(model._model).__name__
        self._places = {name: Place(self, name, row) for name, row in rows.items()}
        self._order = sorted(self._places, key=lambda n: self.rank(n, 0))
        # row -> the model attribute it is read and written as, where that is not its
        # name (``spelled``: model.token_embeddings)
        self.spellings: dict[str, str] = {
            name: row.spelled for name, row in rows.items() if row.spelled is not None
        }
        self._resolved: dict[tuple[str, int], tuple[Address | None, str | None]] = {}
        self._kinds: dict[tuple[str, int], bool] = {}
        self.module_targets: dict[tuple[str, int], tuple[Address, Any]] = {}
        # (component address, write, lowering target) -> its step, as
        # ``causalab_mini.lower`` makes it before a plan adds values and positions
        self.lowered_steps: dict[tuple[Any, bool, Any], Step] = {}
        self._layer_envoys: list[Any] | None = None
        # per running trace body (nnsight's mediator), the furthest place it reached
        # (its rank, its name) in the generation step it is at (nnsight's iteration)
        self._furthest: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()
        # the trace body that read last and its record there (``reached``)
        self._body: tuple[weakref.ref[Any], list[Any]] | None = None
        # per layer, the batch and sequence of its input, where a row is flat_tokens:
        # the hook, the module it is on, the handle that removes it
        self._tokens: dict[int, tuple[LayerTokens, Any, Any]] = {}
        # what the engines make once per model and keep (lowered programs, the hooks
        # engine's prepared steps and batches): held here, not in a module-level cache,
        # so they go with the model (they refer to it); never pickled
        self.engine_cache: dict[str, dict[Any, Any]] = {}
        # per (place, layer): its rank and how it is named (``passed``, every read)
        self._ranked: dict[tuple[str, int | None], tuple[tuple[int, int | float], str]] = {}
        # per (Envoy id, attribute): the Envoy and nnsight's location of it
        self._locations: dict[tuple[int, str], tuple[Any, str | None]] = {}
        # per (place, layer as given): the place, its name as a write spells it, and
        # its write as an edit of a read calls it (``handed``)
        self._hands: dict[tuple[str, int | None], tuple[Place, str, Callable[[Any], None]]] = {}
        # a hook on every layer costs each layer's call torch's slower path: only where
        # a flat place is there to view back (a dense model's router rows are not)
        if any(
            row.flat_tokens
            and row.per_layer
            and any(self.reason_at(name, row, i) is None for i in range(self.num_layers))
            for name, row in rows.items()
        ):
            self.watch_tokens()

    def __getstate__(self) -> dict[str, Any]:
        # a remote request pickles the model with its internals: the running traces'
        # furthest places are this process's (weak references to its trace bodies)
        state = dict(self.__dict__)
        state["_furthest"] = None
        state["_body"] = None
        state["_locations"] = {}  # (keyed by this process's object ids)
        state["engine_cache"] = {}
        state["_hands"] = {}  # (functions of this process)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._furthest = weakref.WeakKeyDictionary()
        self._body = None
        self._locations = {}
        self.engine_cache = {}
        self._hands = {}

    def watch_tokens(self) -> None:
        """Hook every layer's module to remember its input's batch and sequence (for
        the flat_tokens rows); a module swapped since (dispatch) is hooked again."""
        for layer in range(self.num_layers):
            module = getattr(self.layer_envoy(layer), "_module", None)
            held = self._tokens.get(layer)
            if module is None or (held is not None and held[1] is module):
                continue
            hook = LayerTokens()
            handle = module.register_forward_pre_hook(hook, with_kwargs=True)
            self._tokens[layer] = (hook, module, handle)

    def tokens_aside(self, restore: list[Callable[[], None]]) -> None:
        """Take the layers' token-shape hooks off until ``restore`` runs, for a
        forward no flat place is read or written in: a hook on a module sends every
        call of it down torch's slower path (about 11 µs a layer on a CPU). Only where
        it is the layer's one pre-hook (so it is put back where it was); where the
        layer has others (nnsight 0.6/0.7's own, a user's) that path is taken anyway."""
        held = [
            (layer, entry)
            for layer, entry in self._tokens.items()
            if len(getattr(entry[1], "_forward_pre_hooks", ())) == 1
        ]
        if not held:
            return
        for _, (_, _, handle) in held:
            handle.remove()

        def put_back() -> None:
            for layer, (hook, module, _) in held:
                handle = module.register_forward_pre_hook(hook, with_kwargs=True, prepend=True)
                self._tokens[layer] = (hook, module, handle)

        restore.append(put_back)

    def layers_swapped(self) -> None:
        """The model's modules were replaced (nnsight's dispatch loads the real ones
        in place of the meta ones): the layer Envoys are fetched again and, where a
        row is flat_tokens, the new layer modules hooked."""
        self._layer_envoys = None
        self._locations.clear()
        for place in self._places.values():
            place._quick.clear()
        if self._tokens:
            self.watch_tokens()
        self.install_sources()

    def install_sources(self) -> None:
        """Open the ``.source`` of every module a row reads an operation of, on every
        layer where the row is available, before any trace: nnsight instruments a
        module's forward when its ``.source`` is first opened, and one opened inside a
        trace while that module's forward already runs (XLNet's rel_attn, after a read
        of its dropout) is not the forward that runs, so the first trace after a load
        would miss the operation. Opened once per module; cheap where it is open."""
        for name in self._order:
            place = self._places[name]
            if not place.row.source:
                continue
            layers: list[int | None] = list(range(self.num_layers)) if place.per_layer else [None]
            for layer in layers:
                if place.unavailable_on(layer) is not None:
                    continue
                try:
                    _, envoy = place._module_target(layer)
                    # instruments the module's forward (and on 0.7 keeps its calls
                    # wrapped: an operation read after its argument is then served)
                    compat.keep_operations_wrapped(envoy.source)
                except Exception:
                    continue  # the read says why, with the row, where it is asked for

    def unflatten(self, name: str, layer: int | None, flat: Any) -> Any:
        """``flat`` (tokens, ...) at a flat_tokens row of ``layer``, viewed as (batch,
        seq, ...) with the batch and sequence of the layer's input in this forward; a
        tensor that already leads with them (a layer that does not flatten) as it is."""
        held = self._tokens.get(layer) if layer is not None else None
        shape = held[0].shape if held is not None else None
        dims = tuple(getattr(flat, "shape", ()))
        if several_invokes(self.model):
            # nnsight narrows a (batch, ...) tensor to an invoke's rows; a flat one it
            # hands every invoke whole, and does not take an invoke's write of it
            raise PlaceUnavailable(
                self.refusal_text(
                    name,
                    layer,
                    "the block holds it flat, (batch*seq, ...), and this trace batches "
                    "several invokes, whose rows nnsight cannot tell apart in a flat "
                    "tensor: read or write it in a trace of one invoke (put the prompts "
                    "in one input, a list)",
                )
            )
        if shape is not None and len(shape) > 2 and dims:
            if dims[:2] == shape[:2] or shape[0] * shape[1] == dims[0]:
                # a layer fed several residual streams, (batch, seq, streams, hidden),
                # whose MLP reads one stream's tokens (DeepSeek-V4, HY-V4): its batch
                # and sequence are the input's first two axes
                shape = shape[:2]
        if shape is not None and len(dims) > len(shape) and dims[: len(shape)] == shape:
            return flat  # this layer holds it unflattened (a dense layer beside MoE ones)
        tokens = int(dims[0]) if dims else -1
        if shape is None or len(shape) != 2 or shape[0] * shape[1] != tokens:
            raise PlaceUnavailable(
                self.refusal_text(
                    name,
                    layer,
                    f"the block holds it flat, {tuple(getattr(flat, 'shape', ()))}, and the "
                    f"layer's input in this forward has batch and sequence {shape}, which do "
                    "not multiply to its tokens: it is viewed back only where they do (one "
                    "invoke per trace, the batch the layer was given)",
                )
            )
        return flat.view(*shape, *flat.shape[1:])

    def row_base(self, row: Address, layer: int | None) -> Any | None:
        """The Envoy a row's module path is relative to: the model for a whole-model
        row, ``layers[layer]``, or the entry at ``layer`` of the row's ``layer_list``
        (None where the list or that entry is missing)."""
        if not row.per_layer or layer is None:
            return self.model
        if row.layer_list is None:
            return self.layer_envoy(layer)
        entries = child(self.model, row.layer_list)
        if entries is None:
            return None
        try:
            return entries[layer]
        except (IndexError, TypeError):
            return None

    def layer_envoy(self, layer: int) -> Any:
        """The Envoy of layer ``layer`` (``model.layers[i]`` rebuilds the list of the
        ModuleList's children on every index; the Envoys themselves never change)."""
        if self._layer_envoys is None:
            layers = self.model.layers
            self._layer_envoys = [layers[i] for i in range(self.num_layers)]
        return self._layer_envoys[layer]

    # ------------------------------------------------------------ executor

    # what ``causalab_mini.plain`` asks the client's internals while it runs a step
    # here (on a server it has none of this: its own errors, operations by needle)
    write_error = WriteRefused

    def operation(self, step: Step, envoy: Any) -> Any:
        """The operation a step's needles name under ``envoy``, found as the row names
        it (the first by its name where the component resolved it), with the
        operations listed where one is not found."""
        name, needles = step["op"], step["ops"]
        module, row = step["module_path"], step["row"]
        if name is not None:
            op = getattr(envoy.source, name)
        else:
            op = find_op(
                envoy.source, needles[0], row=row, module=module, model_class=self.model_class
            )
        return inner_op(op, needles[1:], row=row, module=module, model_class=self.model_class)

    def fetch(self, step: Step, target: Any) -> Any:
        """``target``'s boundary in the running trace; nnsight's out-of-order error
        said in places (which place was asked for, which later one the trace passed)."""
        place = self._places[_place_name(step)]
        if compat.backward_running():
            raise self.asked_in_backward(place, step["layer"])
        try:
            value = getattr(target, step["attr"])
        except Exception as exc:
            error = self.fetch_failed(exc, place, step)
            if error is exc:
                raise
            raise error from None
        self.passed(place, step["layer"])
        return compat.invoke_rows(value)

    def fetch_failed(self, exc: Exception, place: Place, step: Step) -> Exception:
        """What a read of ``place`` raises where nnsight raised ``exc`` reading it:
        nnsight's out-of-order error said in places (``out_of_order``), anything else
        as it is."""
        from .edits import PlaceOutOfOrder, edit_runner

        if isinstance(exc, PlaceOutOfOrder) or not self._out_of_order(exc, place, step):
            return exc
        runner = edit_runner()
        if getattr(runner, "iteration", 0) not in (0, None):
            return exc  # a tracer.iter loop that outran the run: nnsight's own end
        return self.out_of_order(place, step["layer"], runner)

    def _furthest_of(self, runner: Any) -> list[Any] | None:
        """The furthest place ``runner`` (a trace body) has read: its rank, its name and
        the generation step it was read at; None where it has read none (or is none)."""
        if runner is None:
            return None
        try:
            return self._furthest.get(runner)
        except TypeError:  # (a body that takes no weak reference)
            return None

    def _out_of_order(self, exc: Exception, place: Place, step: Step) -> bool:
        """Whether ``exc``, raised where a read of ``place`` waited for its value, says
        the model had run past it: nnsight's OutOfOrderError; on 0.6/0.7 also their
        missed value at the forward's end where the trace body had read a later place
        (those releases wait for a passed location until the forward is over)."""
        error = compat.out_of_order_error()
        if error is not None and isinstance(exc, error):
            return True
        missed = compat.missed_value_error()
        if missed is None or not isinstance(exc, missed):
            return False
        from .edits import edit_runner

        best = self._furthest_of(edit_runner())
        at = self.layer_of(place, step["layer"])
        return best is not None and best[0] > self.rank(place.name, at)

    def asked_in_backward(self, place: Place, layer: int | None) -> Exception:
        """A place asked for inside nnsight's ``with loss.backward():``, where the forward
        is over and only gradients of tensors read before are served."""
        from .errors import GradientRefused

        at = place.where(self.layer_of(place, layer))
        return GradientRefused(
            f"{at} was asked for inside `with loss.backward():`, where the forward is over "
            f"and only gradients of tensors read before it are served: read x = "
            f"model.{at} before the backward and write x.grad inside it (or "
            "x.retain_grad() before a plain loss.backward(), then x.grad)"
        )

    def flat_view(self, step: Step, flat: Any) -> Any:
        return self.unflatten(_place_name(step), step["layer"], flat)

    def refusal(self, kind: str, step: Step, reason: str) -> Exception:
        """A step's refusal as the client raises it: a place's view that does not hold
        (PlaceUnavailable, with the model and family), or a component's heads or
        streams (ComponentError)."""
        if kind == "place":
            return PlaceUnavailable(self.refusal_text(_place_name(step), step["layer"], reason))
        from .geometry import ComponentError

        return ComponentError(f"component {step['component']!r}: {reason}")

    def handed(self, step: Step, value: Any, target: Any, raw: Any) -> Any:
        """A read as handed to the user in a trace body: its in-place edits are the
        place's write (``causalab_mini.edits``), and its ``.grad`` is the place's
        gradient (that of ``raw``, the model's tensor it was made of; the ``Gradient``
        made when first asked, of the tensor's version now)."""
        edits = _edits()
        name, layer = _place_name(step), step["layer"]
        hand = self._hands.get((name, layer))
        if hand is None:
            place = self._places[name]
            hand = self._hands[(name, layer)] = (
                place,
                place.where(layer),
                lambda edited: place.set(layer, edited),
            )
        place, where, write = hand
        location = self._location(target, step["attr"])
        gradient: Any = None
        if hasattr(raw, "requires_grad"):  # a tensor (on autograd's graph or not, yet)
            gradient = self._gradient(place, step, value, raw)
        return edits.editable(
            value,
            where,
            write,
            location,
            step["edit_copy"],
            # where nnsight counts no visits of the location (0.6/0.7; 0.8 where it
            # names none)
            None if location is not None and compat.is_08() else self._ran_past(place, layer),
            gradient,
        )

    def _gradient(self, place: Place, step: Step, value: Any, raw: Any) -> Callable[[], Any]:
        """What makes the ``Gradient`` of a read of ``raw`` at ``step`` when first asked:
        what it depends on in the running trace taken now (the tensor's version, whether
        the trace's invokes are cut off the graph)."""
        narrowed = compat.invokes_narrowed_off_the_graph(self.model)
        return partial(self._made_gradient, place, step, value, raw, narrowed, int(raw._version))

    def _made_gradient(
        self, place: Place, step: Step, value: Any, raw: Any, narrowed: bool, version: int
    ) -> Any:
        edits = _edits()
        where = place.where(step["layer"])
        if step["heads_through"] is not None:
            return edits.NoGradient(where, raw, COMPUTED_GRADIENT)
        return edits.Gradient(
            where,
            raw,
            lambda grad: plain.meant_gradient(step, grad, self),
            # a module's input written in place: a write there changes the tensor
            # every later consumer takes, so the tensor's gradient is the place's
            None
            if step["attr"] == "output" or step["in_place"]
            else self._isolate(place, step, value),
            narrowed,
            version,
        )

    def quick_read(self, place: Place, step: Step) -> Callable[[], Any] | None:
        """The read of ``place`` at ``step`` in one function where the step reads a
        module's input or output (or its first element) as it is, on nnsight 0.8 (which
        names the location it waits at): what ``plain.whole_value(..., edit=True)``
        hands out, without the general path's dispatch; None elsewhere. It answers
        ``_ASIDE`` where the general path must read (no trace body, a backward)."""
        if not compat.is_08() or not _as_it_is(step):
            return None
        envoy, attr, layer = step["envoy"], step["attr"], step["layer"]
        location = self._location(envoy, attr)
        if location is None:
            return None
        edits = _edits()
        tensor, made_edit, gradient_of = edits.torch.Tensor, edits.Edit, self._made_gradient
        running, in_backward = compat.body_reader(), compat.backward_running
        rank, reached = self.ranked(place, layer)
        where, first = place.where(layer), step["select"] is not None
        copy, edit_copy = step["copy"], step["edit_copy"]

        def write(edited: Any) -> None:
            place.set(layer, edited)

        def edit(
            read: Any, root: Any, value: Any, raw: Any, version: int, reader: Any, visits: int
        ) -> Any:
            if root is None:  # the read is the copy itself: its plain tensor
                root = edits.plain(read)
            value = root if value is None else value
            gradient = partial(gradient_of, place, step, value, raw, False, version)
            return made_edit(where, write, root, location, None, gradient, reader, visits)

        def read() -> Any:
            runner = running()
            if runner is None or in_backward():
                return _ASIDE
            try:
                whole = getattr(envoy, attr)
            except Exception as exc:
                error = self.fetch_failed(exc, place, step)
                if error is exc:
                    raise
                raise error from None
            reader = self.reached(runner, rank, reached, compat.body_step(runner))
            raw = whole[0] if first and isinstance(whole, (tuple, list)) else whole
            if type(raw) is not tensor:  # (anything else as the general path hands it)
                return plain.held_value(step, envoy, raw, self, edit=True)
            # the Edit made when first asked, of what the read depends on now: the
            # tensor's version, the location's visits
            version, visits = raw._version, edits.visits_of(runner, location)
            if not (copy or edit_copy):
                return edits.hand_out(raw, (edit, raw, raw, raw, version, reader, visits))
            value = raw.clone() if copy else raw
            kept = value if edit_copy else None  # (the place's value, where not the read)
            own = value.clone() if edit_copy else value
            return edits.hand_out(own, (edit, None, kept, raw, version, reader, visits), True)

        return read

    def _location(self, target: Any, attr: str) -> str | None:
        """``compat.location`` of ``target``'s ``attr``, kept per Envoy (a location is
        its path and the attribute's key)."""
        key = (id(target), attr)
        kept = self._locations.get(key)
        if kept is not None and kept[0] is target:
            return kept[1]
        location = compat.location(target, attr)
        self._locations[key] = (target, location)
        return location

    def _isolate(self, place: Place, step: Step, value: Any) -> Any:
        """At a module's input: a function that hands the module a view of its own of
        the place's value (a write of the place) and returns it, so that its gradient
        is the place's alone (the tensor may feed other modules too)."""
        layer = step["layer"]

        def isolate() -> Any:
            own = value.view_as(value)
            place.set(layer, own)
            return own

        return isolate

    def _ran_past(self, place: Place, layer: int | None) -> Any:
        """Whether the running trace body has read a place later in the forward than
        ``place`` at ``layer`` since now (by rank, as ``passed`` records it): where
        nnsight does not count a location's visits (0.6/0.7), how an in-place edit of a
        read made after that is refused, as 0.8's count refuses it."""
        from .edits import edit_runner

        runner = edit_runner()
        rank = self.rank(place.name, self.layer_of(place, layer))
        step = compat.body_step(runner)
        # weak: a read saved past its trace does not keep the trace body alive
        reader = weakref.ref(runner) if runner is not None else None

        def ran_past() -> bool:
            runner = reader() if reader is not None else None
            best = self._furthest_of(runner)
            if best is None:
                return False
            # a later generation step, or a later place in this one
            return bool(best[2] != step or compat.body_step(runner) != step or best[0] > rank)

        return ran_past

    # ------------------------------------------------------------ mapping

    def __getitem__(self, name: str) -> Place:
        try:
            return self._places[name]
        except KeyError:
            raise KeyError(self._unknown(name)) from None

    def _unknown(self, name: str) -> str:
        """Why ``name`` is not a place here, naming the place a component of that name
        reads and the closest place names."""
        import difflib

        from causalab_mini.generated import COMPONENTS

        spec = COMPONENTS.get(name) if isinstance(name, str) else None
        if spec is not None and spec.kind == "boundary" and spec.target in self._places:
            return (
                f"{name!r} is a component name, not a place: the place it reads is "
                f"{spec.target!r}; write model.internals[{spec.target!r}] (or "
                f"locate(model, {name!r}, layer) for the component)"
            )
        if spec is not None:
            return (
                f"{name!r} is a component inside the attention's forward, not a place of "
                f"model.internals; address it with locate(model, {name!r}, layer)"
            )
        close = difflib.get_close_matches(str(name), self._places, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else "."
        return (
            f"{name!r} is not a place of this model{hint} Add your own with "
            f"RenameConfig(addresses={{{name!r}: Address(...)}})"
        )

    def __iter__(self) -> Iterator[str]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._places)

    def __repr__(self) -> str:
        return f"<internals of {self.model_class}: {', '.join(self._order)}>"

    # ------------------------------------------------------------ ranks

    def rank(self, name: str, layer: int | None = None) -> tuple[int, int | float]:
        """(layer, order) for a per-layer place; (-1, order) for a whole-model place
        before the layers (negative order) and (num_layers, order) after them; a row of
        a stack that runs before the layers (``before_layers``: an encoder) ranks
        (layer - 2**20, order), before all of them."""
        row = self[name].row
        # a whole order as an int (rank=(1, 60)); a row between two (34.5) keeps its place
        order = int(row.order) if float(row.order).is_integer() else row.order
        if row.per_layer:
            if layer is None:
                raise ValueError(f"{name} is per layer: say which layer")
            at = self.layer_of(self[name], layer)
            assert at is not None  # a per-layer place's layer
            if row.before_layers:  # another stack, run before the layers (an encoder)
                return (at - _BEFORE_LAYERS, order)
            return (at, order)
        return (-1 if row.order < 0 else self.num_layers, order)

    # ------------------------------------------------------------ order

    def passed(self, place: Place, layer: int | None) -> None:
        """Remember the furthest place (by rank) the running trace body has reached,
        to say which one an out-of-order read came after."""
        runner = compat.running_body()
        if runner is None:
            return
        rank, where = self.ranked(place, layer)
        self.reached(runner, rank, where, compat.body_step(runner))

    def ranked(self, place: Place, layer: int | None) -> tuple[tuple[int, int | float], str]:
        """``place`` at ``layer`` (as given)'s rank and its name there (kept)."""
        ranked = self._ranked.get((place.name, layer))
        if ranked is None:
            at = self.layer_of(place, layer)
            ranked = (self.rank(place.name, at), place.where(at))
            if layer is None or type(layer) is int:  # (never a bool: it hashes as 0 or 1)
                self._ranked[(place.name, layer)] = ranked
        return ranked

    def reached(
        self, runner: Any, rank: tuple[int, int | float], where: str, step: Any
    ) -> weakref.ref[Any] | None:
        """The trace body ``runner`` has read the place ``where`` of ``rank`` in the
        generation step ``step`` (``compat.body_step``): kept as its furthest where it
        is. The record of the body read last is kept at hand (``_body``), checked by
        identity; its weak reference to the body is returned (None for a body that
        takes none)."""
        kept = self._body
        if kept is None or kept[0]() is not runner:
            best = self._furthest_of(runner)
            if best is None:
                best = [rank, where, step]
            try:
                self._furthest[runner] = best
                kept = self._body = (weakref.ref(runner), best)
            except TypeError:  # (a body that takes no weak reference: nothing kept)
                return None
        best = kept[1]
        if best[2] != step or rank > best[0]:
            best[0], best[1], best[2] = rank, where, step
        return kept[0]

    def out_of_order(self, place: Place, layer: int | None, runner: Any) -> Exception:
        """nnsight's OutOfOrderError for ``place`` at ``layer``, said in places."""
        from .edits import PlaceOutOfOrder

        at = self.layer_of(place, layer)
        asked, rank = place.where(at), self.rank(place.name, at)
        families = ", ".join(self.model.families) or "no family file"
        best = self._furthest_of(runner)
        fix = (
            "read (and write) places in forward order, the order of "
            "model.internals.rank(name, layer), or put the reads and writes in a Plan "
            "(causalab_mini.Plan), which runs them in that order"
        )
        if best is not None and best[0] > rank:
            later, later_rank = best[1], best[0]
            return PlaceOutOfOrder(
                f"{asked} (rank {rank}) was asked for after {later} (rank {later_rank}) on "
                f"{self.model_class} (family {families}): {later} comes later in the forward, "
                f"so the model had already run past {asked} when it was asked for. Fix: {fix}"
            )
        since = f" (the furthest place read before it: {best[1]}, rank {best[0]})" if best else ""
        return PlaceOutOfOrder(
            f"{asked} (rank {rank}) was asked for and the model ran past it{since} on "
            f"{self.model_class} (family {families}): something read after it in this trace "
            "comes earlier in the forward (a place, a component or an Envoy read by hand), "
            f"or the forward does not reach it. Fix: {fix}"
        )

    # ------------------------------------------------------------ status

    @property
    def places(self) -> Mapping[str, Place]:
        """Every place by name (a read-only view, in the rows' order)."""
        return MappingProxyType(self._places)

    def status(self, layer: int | None = None) -> dict[str, str | None]:
        """For every row, None if available and otherwise the reason; decided from the
        rows and the module tree, without running the model.

        ``layer=None`` answers for the whole model: a per-layer place is available if
        it is on every layer; where layers differ the reason says which.
        """
        out: dict[str, str | None] = {}
        for name in self._order:
            place = self._places[name]
            if not place.per_layer:
                out[name] = self.reason_at(name, place.row, None)
            elif layer is not None:
                out[name] = self.reason_at(name, place.row, self.layer_of(place, layer))
            else:
                reasons = {i: self.reason_at(name, place.row, i) for i in range(self.num_layers)}
                missing = [i for i, r in reasons.items() if r is not None]
                if not missing:
                    out[name] = None
                elif len(missing) == self.num_layers and len({reasons[i] for i in missing}) == 1:
                    out[name] = reasons[missing[0]]
                else:
                    present = [i for i in range(self.num_layers) if i not in missing]
                    first = reasons[missing[0]]
                    out[name] = f"available on layers {present} only; on layers {missing}: {first}"
        return out

    # ------------------------------------------------------------ internals

    def layer_of(self, place: Place, layer: int | None) -> int | None:
        if not place.per_layer:
            return None
        if layer is None:
            raise ValueError(f"{place.name} is per layer: write {place.name}[layer]")
        if not isinstance(layer, int) or isinstance(layer, bool):
            raise TypeError(f"a layer is an int, not {type(layer).__name__}")
        n = self.num_layers
        if not -n <= layer < n:
            raise IndexError(f"layer {layer} is out of range: this model has layers 0..{n - 1}")
        return layer % n

    def count(self, attribute: str) -> int:
        """The config's ``attribute`` as a count (of a row's leading positions or
        trailing streams)."""
        value = getattr(self.model.text_config, attribute, None)
        if value is None:
            raise PlaceUnavailable(f"the config has no {attribute!r} to count positions by")
        return int(value)

    def scale(self, attribute: str | float) -> float:
        """The factor a row's scale names: a config attribute, or a number the block's
        arithmetic fixes (AltUp's 1/sqrt(2) on the mid-stream)."""
        if isinstance(attribute, (int, float)):
            return float(attribute)
        config = self.model.text_config
        value = getattr(config, attribute, None)
        if value is None:
            raise PlaceUnavailable(f"the config has no {attribute!r} to scale by")
        return float(value)

    def refusal_text(self, name: str, layer: int | None, reason: str) -> str:
        where = f"model.internals[{name!r}]" + (f"[{layer}]" if layer is not None else "()")
        families = ", ".join(self.model.families) or "no family file"
        return (
            f"{where} is not available on {self.model_class} (block "
            f"{self.model.block_structure!r}, family {families}): {reason}"
        )

    def layers_run_on_text(self) -> tuple[int, ...]:
        """The layers the model runs on a text-only input, in order: every layer but
        those of a kind it skips without an image (``skipped_on_text_input`` in
        block_structures.yaml). transformers' per-layer outputs (output_hidden_states,
        output_attentions) list these layers only."""
        skipped = [name for name, spec in LAYER_KINDS.items() if spec.skipped_on_text_input]
        return tuple(
            layer
            for layer in range(self.num_layers)
            if not any(self.layer_kind_matches(kind, layer) for kind in skipped)
        )

    def layer_kind_matches(self, kind: str, layer: int) -> bool:
        key = (kind, layer)
        if key not in self._kinds:
            spec = LAYER_KINDS[kind]
            envoy = self.model.layers[layer]
            present = not spec.present or any(child(envoy, p) is not None for p in spec.present)
            absent = all(child(envoy, p) is None for p in spec.absent)
            self._kinds[key] = present and absent
        return self._kinds[key]

    def reason_at(self, name: str, row: Address, layer: int | None) -> str | None:
        """Why ``row`` does not exist at ``layer`` (None where it does)."""
        outside = outside_versions(row.versions)
        if outside is not None:
            package, spec, installed = outside
            return (
                f"{name}'s row holds for {package} {spec}, and {package} {installed} is "
                "installed: update the row (its needles) for this version, or install a "
                "version in that range"
            )
        for item in row.unavailable:
            cond = item.when
            if cond.kind == "always":
                hit = True
            elif cond.kind == "attention_probs_disabled":
                hit = not self.model.attention_probs_enabled
            elif cond.kind == "structure_unknown":
                hit = self.model.block_structure is None
            elif cond.kind == "layer_kind":
                assert cond.layer_kind is not None
                hit = layer is not None and self.layer_kind_matches(cond.layer_kind, layer)
            else:
                hit = cond.holds_for_config(layer_config(self.model.text_config, layer))
            if hit:
                if cond.kind == "structure_unknown":
                    known = self._structure_unknown(name)
                    if known is not None:
                        return known
                return str(item.message(name))
        _, reason = self.resolve_row(name, row, layer)
        said: str | None = reason
        return said

    def _structure_unknown(self, name: str) -> str | None:
        """Where no block structure applies to the model, the reason its family gives
        (its structure_unknown_reason, {place} filled in), else None."""
        if self.model.block_structure is not None:
            return None
        for family in families_of(self.model):
            if family.structure_unknown is not None:
                return str(family.structure_unknown).replace("{place}", name)
        return None

    def resolve_row(
        self, name: str, row: Address, layer: int | None
    ) -> tuple[Address | None, str | None]:
        """Resolve ``{name}`` and check the module exists: (address, None) or (None, reason)."""
        key = (name, -1 if layer is None else layer)
        if key in self._resolved:
            return self._resolved[key]
        base = self.row_base(row, layer)
        result: tuple[Address | None, str | None]
        if base is None:
            result = (
                None,
                f"{name} reads the list {row.layer_list!r}, which the model does not have "
                "(or not at this layer's index)",
            )
        elif row.is_structural:
            result = self._structural(name, row, base)
        elif row.module and child(base, row.module) is None:
            where = "the layer" if row.per_layer else "the model"
            result = (
                None,
                (
                    f"{name} reads {row.module!r}, which {where} does not have (its children: "
                    f"{', '.join(child_names(base, 1))}). A family file or "
                    f"RenameConfig(addresses={{{name!r}: Address(...)}}) says where it is"
                ),
            )
        else:
            result = (row, None)
        if base is not None and result[0] is not None and result[0].module:
            shared = shared_on(base, result[0].module)
            if shared is not None:
                result = (None, shared_reason(name, result[0].module, shared))
        if base is not None and result[0] is not None and result[0].heads_through:
            result = (result[0], self._computed_refusal(name, result[0], base, layer))
            if result[1] is not None:
                result = (None, result[1])
        self._resolved[key] = result
        return result

    def _computed_refusal(
        self, name: str, row: Address, base: Any, layer: int | None
    ) -> str | None:
        """Why a computed row (``heads_through``) is refused at ``layer``: the row it is
        computed from is refused there, or reads another module or side, or the
        module's weight has no stated orientation; None where it is available."""
        from .heads import projection_weight

        source = row.heads_through
        assert source is not None
        if source not in self:
            return f"{name} is computed from {source}, which this model has no row for"
        reason = self[source].unavailable_on(layer)
        if reason is not None:
            return f"{name} is computed from {source}, which is refused here: {reason}"
        other = self[source].address_at(layer)
        if (other.module, other.io) != (row.module, row.io) or other.source or other.select:
            return (
                f"{name} is computed at {row.module}.{row.io.value}, and {source} reads "
                f"{other.describe()}: they must be one tensor. A family file says where "
                f"{name} is (or refuses it)"
            )
        envoy = child(base, row.module)
        if envoy is None:
            return f"{name} reads {row.module!r}, which the layer does not have"
        # a computed place needs a weight whose orientation is stated
        return projection_weight(envoy._module, name)[1]

    def _structural(
        self, name: str, row: Address, layer_envoy: Any
    ) -> tuple[Address | None, str | None]:
        structure = self.model.block_structure
        per_structure = STRUCTURAL_ADDRESSES.get(name, {})
        entry: StructuralEntry | None = per_structure.get(structure) if structure else None
        if entry is None:
            known = self._structure_unknown(name)
            if known is not None:
                return None, known
            return None, (
                f"{name} depends on the block structure, and {NO_STRUCTURE_RULE} "
                f"matches {self.model_class} (model_type "
                f"{self.model.model_type!r}): add a rule naming its structure"
            )
        if entry.reason is not None:
            return None, entry.reason.replace("{place}", name)
        found = [c for c in entry.candidates if child(layer_envoy, c) is not None]
        if len(found) == 1:
            return dataclasses.replace(row, module=row.module.replace("{name}", found[0])), None
        children = ", ".join(child_names(layer_envoy))
        fix = (
            f'Say which with RenameConfig(addresses={{{name!r}: Address("<child>", '
            f"IOType.{row.io.name}, order={row.order})}}) or a family file"
        )
        if not found:
            return None, (
                f"{name} is none of the candidates for a {structure!r} block "
                f"({', '.join(entry.candidates)}): the layer has {children}. {fix}"
            )
        return None, (
            f"{name} is ambiguous on this {structure!r} block: {', '.join(found)} all exist "
            f"(candidates {', '.join(entry.candidates)}). {fix}"
        )


# the names other modules and research code import from here (errors, tree and
# versions are their own modules; these stay where they have been found)
__all__ = [
    "NO_STRUCTURE_RULE",
    "Internals",
    "LayerTokens",
    "Place",
    "PlaceUnavailable",
    "RenameError",
    "WriteRefused",
    "boundary",
    "check_value",
    "child",
    "child_names",
    "has_attr",
    "layer_config",
    "outside_versions",
]
