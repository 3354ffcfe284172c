"""What a write does to the tensor at a place: intervention mechanisms as pure data.

A mechanism is a frozen dataclass, like an address: it pickles, prints and compares
(tensors by ``torch.equal``). Each has one pure-torch ``apply(current)``, what the
tensor at the place (as a read hands it on: one head, the selected tokens) becomes,
and ``lowered()``, the same edit as a plain tuple (``("add", v)``, ``("lerp", v,
alpha)``, ...) that ``causalab_mini.plain.edited`` applies inside a run, on either
engine and on a server. ``tests/test_mechanisms.py`` holds the two equal.

    Plan.of(writes=[(locate(model, "block_output", 3, position={"index": -1}), Add(v))])

A bare tensor in a write stays what it was (``Set``: exactly the place's shape).

**How a value broadcasts.** ``Set`` takes exactly the shape a read hands out (the
write contract: nothing broadcast or cast). ``Add``, ``Lerp``, ``Mean``,
``Renormalize`` and tensor factors and bounds of ``Scale`` and ``Clamp`` broadcast: a
vector of the place's width d over every selected token, or a tensor of one row's
shape (tokens, d) over the rows, or the exact shape. ``ProjectOut`` takes a direction
of width d. Nothing is cast: a value's dtype is the place's.

Every value is checked before anything runs (``check``, called when a plan is lowered):
its width against the component table's width at the address, its dtype against the
model's, NaN and inf, a mean harvested on another model or place; each refusal names the
place, what was given and what to write instead (``MechanismRefused``)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from .errors import WriteRefused


class MechanismRefused(WriteRefused):
    """A mechanism's value that does not fit its place (width, dtype, NaN/inf, a mean
    harvested elsewhere), refused before anything runs."""


def _same(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and bool(torch.equal(a, b))
        )
    return bool(a == b)


def _shown(value: Any) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    return repr(value)


@dataclass(frozen=True, eq=False, repr=False)
class Mechanism:
    """The base of every mechanism: equality by fields (tensors by ``torch.equal``),
    a hash by kind, a short print."""

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(_same(getattr(self, f.name), getattr(other, f.name)) for f in fields(self))

    def __hash__(self) -> int:
        return hash(type(self).__name__)

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={_shown(getattr(self, f.name))}" for f in fields(self))
        return f"{type(self).__name__}({shown})"

    def apply(self, current: Any) -> Any:  # pragma: no cover - every subclass has one
        raise NotImplementedError

    def lowered(self) -> Any:  # pragma: no cover - every subclass has one
        raise NotImplementedError

    def lowered_at(self, model: Any, address: Any) -> Any:
        """This mechanism written at ``address`` on ``model``, checked (``check``) and
        lowered to its plain edit (what ``causalab_mini.lower`` puts in a step)."""
        check(self, str(address), address.width, model_dtype(model), model=model, address=address)
        return self.lowered()

    def applied(self, where: str, current: Any) -> Any:
        """What the tensor ``current`` at ``where`` becomes, checked first against its
        width and dtype (a hand-written trace: ``model.layers_mid[1] = Add(v)``)."""
        check(self, where, int(current.shape[-1]), current.dtype)
        return self.apply(current)

    def tensors(self) -> dict[str, Any]:
        """The mechanism's tensor values by field (what ``check`` looks at)."""
        import torch

        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }


def _spread(value: Any, current: Any) -> Any:
    """``value`` broadcast to ``current``'s shape where the mechanism lets it: a vector
    of the last axis's width, one row's shape, or exactly the shape."""
    return value.expand(current.shape) if value.shape != current.shape else value


@dataclass(frozen=True, eq=False, repr=False)
class Set(Mechanism):
    """Replace the tensor by ``value``, exactly the shape a read hands out (a bare
    tensor in a write means this)."""

    value: Any

    def apply(self, current: Any) -> Any:
        return self.value

    def lowered(self) -> Any:
        return self.value  # a bare tensor: the write as it always was


@dataclass(frozen=True, eq=False, repr=False)
class Add(Mechanism):
    """x + value (a steering vector of width d adds to every selected token)."""

    value: Any

    def apply(self, current: Any) -> Any:
        return current + self.value

    def lowered(self) -> Any:
        return ("add", self.value)


@dataclass(frozen=True, eq=False, repr=False)
class Scale(Mechanism):
    """x * factor (a number, or a tensor that broadcasts as ``Add``'s value)."""

    factor: Any

    def apply(self, current: Any) -> Any:
        return current * self.factor

    def lowered(self) -> Any:
        return ("scale", self.factor)


@dataclass(frozen=True, eq=False, repr=False)
class Lerp(Mechanism):
    """x + alpha (value - x), as ``torch.lerp`` computes it: exactly x at alpha 0 and
    exactly value at alpha 1."""

    value: Any
    alpha: float

    def apply(self, current: Any) -> Any:
        import torch

        return torch.lerp(current, _spread(self.value, current), float(self.alpha))

    def lowered(self) -> Any:
        return ("lerp", self.value, float(self.alpha))


@dataclass(frozen=True, eq=False, repr=False)
class Zero(Mechanism):
    """Zeros of the place's shape and dtype (a zero ablation)."""

    def apply(self, current: Any) -> Any:
        import torch

        return torch.zeros_like(current)

    def lowered(self) -> Any:
        return ("zero",)


@dataclass(frozen=True, eq=False, repr=False)
class Mean(Mechanism):
    """The tensor replaced by a mean (a mean ablation): ``value`` of width d for every
    selected token, or of one row's shape (tokens, d) for every row.
    ``harvest_means`` makes one with ``harvested``: where it was taken (checkpoint,
    place, width), so that it is refused on another model or place."""

    value: Any
    harvested: tuple[str, str, int] | None = None

    def apply(self, current: Any) -> Any:
        return _spread(self.value, current).clone()

    def lowered(self) -> Any:
        return ("fill", self.value)


@dataclass(frozen=True, eq=False, repr=False)
class Resample(Mechanism):
    """Each row's tensor replaced by another row's: row i takes row ``rows[i]`` of the
    batch itself, or of ``reference`` ((rows, ...) as a read at the same address hands
    it out) where given."""

    rows: tuple[int, ...]
    reference: Any = None

    def apply(self, current: Any) -> Any:
        import torch

        index = torch.tensor(self.rows, dtype=torch.long, device=current.device)
        source = current if self.reference is None else self.reference
        return source.index_select(0, index)

    def lowered(self) -> Any:
        return ("resample", tuple(int(r) for r in self.rows), self.reference)


@dataclass(frozen=True, eq=False, repr=False)
class Clamp(Mechanism):
    """Every element held within [low, high] (numbers, or tensors that broadcast as
    ``Add``'s value; None: no bound on that side)."""

    low: Any = None
    high: Any = None

    def apply(self, current: Any) -> Any:
        import torch

        return torch.clamp(current, min=self.low, max=self.high)

    def lowered(self) -> Any:
        return ("clamp", self.low, self.high)


@dataclass(frozen=True, eq=False, repr=False)
class ProjectOut(Mechanism):
    """x - (x . u) u, u the unit vector along ``direction`` (width d): each token's
    component along the direction removed."""

    direction: Any

    def unit(self) -> Any:
        return self.direction / self.direction.norm()

    def apply(self, current: Any) -> Any:
        u = self.unit()
        return current - (current @ u).unsqueeze(-1) * u

    def lowered(self) -> Any:
        return ("project_out", self.unit())


@dataclass(frozen=True, eq=False, repr=False)
class Renormalize(Mechanism):
    """x + value, then each token rescaled to the norm x had (steering that keeps the
    stream's scale)."""

    value: Any

    def apply(self, current: Any) -> Any:
        moved = current + self.value
        return moved * (current.norm(dim=-1, keepdim=True) / moved.norm(dim=-1, keepdim=True))

    def lowered(self) -> Any:
        return ("renormalize", self.value)


MECHANISMS: tuple[type[Mechanism], ...] = (
    Set,
    Add,
    Scale,
    Lerp,
    Zero,
    Mean,
    Resample,
    Clamp,
    ProjectOut,
    Renormalize,
)

# the fields whose tensors broadcast as a steering vector (width d, one row, or exact)
_BROADCASTS = {
    "Add": ("value",),
    "Scale": ("factor",),
    "Lerp": ("value",),
    "Mean": ("value",),
    "Clamp": ("low", "high"),
    "ProjectOut": ("direction",),
    "Renormalize": ("value",),
}


# ---------------------------------------------------------------------- checks


def place_key(address: Any) -> str:
    """The place an address names, as text that is the same for the same place on any
    model (what a harvested mean remembers)."""
    where = address.component if address.layer is None else f"{address.component}[{address.layer}]"
    if address.head is not None:
        where += f".head[{address.head}]"
    if address.stream is not None:
        where += f".stream[{address.stream}]"
    if address.position:
        specs = [p.spec() for p in address.position]
        where += f" at {specs[0] if len(specs) == 1 else specs}"
    return where


def checkpoint_of(model: Any) -> str:
    """The checkpoint a loaded model came from (its hub id or directory)."""
    inner = getattr(model, "_model", model)
    name = getattr(getattr(inner, "config", None), "_name_or_path", "") or ""
    return str(getattr(model, "repo_id", None) or name)


def model_dtype(model: Any) -> Any:
    """The one floating dtype of the model's parameters (None where it mixes several:
    then the run itself checks each write's dtype)."""
    import torch

    seen = set()
    for parameter in getattr(model, "_model", model).parameters():
        if parameter.is_floating_point():
            seen.add(parameter.dtype)
        if len(seen) > 1:
            return None
    return seen.pop() if seen else torch.get_default_dtype()


def check(
    mechanism: Mechanism,
    where: str,
    width: int | None,
    dtype: Any,
    *,
    what: str = "the place",
    model: Any = None,
    address: Any = None,
) -> None:
    """Refuse ``mechanism`` at ``where`` (``width`` wide as handed on, holding ``dtype``;
    either None where not known) before anything runs: NaN or inf in a value, a value
    of another width or dtype, an empty or zero direction, a mean harvested elsewhere."""
    _check_values(mechanism, where, width, dtype, what)
    _check_arguments(mechanism, where, width)
    if isinstance(mechanism, Mean) and mechanism.harvested is not None and address is not None:
        _check_harvested(mechanism, where, width, model, address)


def _check_values(
    mechanism: Mechanism, where: str, width: int | None, dtype: Any, what: str
) -> None:
    """The tensors' dtype, finiteness and width, and the numbers' finiteness."""
    import torch

    kind = type(mechanism).__name__
    for name, value in mechanism.tensors().items():
        if not value.is_floating_point() and name != "rows":
            raise MechanismRefused(
                f"{where}: {kind}.{name} is a {_shown(value)}, and {what} holds floating "
                f"values: give a floating tensor (v.to({dtype or 'torch.float32'}))"
            )
        if not bool(torch.isfinite(value).all()):
            raise MechanismRefused(
                f"{where}: {kind}.{name} holds NaN or inf ({_shown(value)}): give finite values"
            )
        if dtype is not None and value.dtype != dtype:
            raise MechanismRefused(
                f"{where}: {kind}.{name} is {_shown(value)}, and {what} holds {dtype}; nothing "
                f"is cast: write {kind}(v.to({dtype}), ...)"
            )
        if width is not None and value.dim() > 0 and int(value.shape[-1]) != width:
            spread = name in _BROADCASTS.get(kind, ())
            shape = f"a vector of width {width}" if spread else "the exact shape a read hands out"
            raise MechanismRefused(
                f"{where}: {kind}.{name} is {_shown(value)}, {int(value.shape[-1])} wide, and "
                f"{what} is {width} wide: give {shape} (last axis {width})"
            )
    for name in ("factor", "alpha", "low", "high"):
        value = getattr(mechanism, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise MechanismRefused(f"{where}: {kind}.{name} is {value}: give a finite number")


def _check_arguments(mechanism: Mechanism, where: str, width: int | None) -> None:
    """What each kind needs of its arguments: a bound, a direction, rows."""
    if isinstance(mechanism, Clamp) and mechanism.low is None and mechanism.high is None:
        raise MechanismRefused(f"{where}: Clamp() bounds nothing: give low=, high= or both")
    if isinstance(mechanism, Clamp) and all(
        isinstance(b, (int, float)) for b in (mechanism.low, mechanism.high)
    ):
        if mechanism.low > mechanism.high:
            raise MechanismRefused(
                f"{where}: Clamp({mechanism.low}, {mechanism.high}) has low above high: give "
                "low <= high"
            )
    if isinstance(mechanism, ProjectOut):
        if mechanism.direction.dim() != 1 or not bool(mechanism.direction.norm() > 0):
            raise MechanismRefused(
                f"{where}: ProjectOut.direction is {_shown(mechanism.direction)}: give one "
                f"non-zero vector of width {width if width is not None else 'd'}"
            )
    if isinstance(mechanism, Resample):
        if not mechanism.rows or any(
            isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in mechanism.rows
        ):
            raise MechanismRefused(
                f"{where}: Resample.rows is {mechanism.rows!r}: give one non-negative row "
                "index per row of the batch"
            )
        ref = mechanism.reference
        if ref is not None and max(mechanism.rows) >= int(ref.shape[0]):
            raise MechanismRefused(
                f"{where}: Resample takes row {max(mechanism.rows)} of a reference of "
                f"{int(ref.shape[0])} rows: give rows within 0..{int(ref.shape[0]) - 1}"
            )


def _check_harvested(
    mechanism: Mean, where: str, width: int | None, model: Any, address: Any
) -> None:
    """A harvested mean is written on the model and at the place it was taken at."""
    assert mechanism.harvested is not None
    checkpoint, place, harvested_width = mechanism.harvested
    here = place_key(address)
    if model is not None and checkpoint != checkpoint_of(model):
        raise MechanismRefused(
            f"{where}: this Mean was harvested on {checkpoint!r}, and the model is "
            f"{checkpoint_of(model)!r}: harvest it on this model "
            "(harvest_means(model, [address], texts))"
        )
    if place != here or (width is not None and harvested_width != width):
        raise MechanismRefused(
            f"{where}: this Mean was harvested at {place} ({harvested_width} wide), not "
            f"here ({here}, {width} wide): harvest it at this address "
            "(harvest_means(model, [address], texts))"
        )


# ---------------------------------------------------------------------- means


def harvest_means(
    model: Any,
    addresses: Iterable[Any],
    texts: Sequence[str] | str,
    *,
    engine: str = "nnsight",
    frame: str = "plain",
) -> dict[Any, Mean]:
    """Each address's mean over a reference set of ``texts``, as a ``Mean`` that
    remembers where it was taken: at an address with positions, the mean over the rows
    of what a read there returns (one row's shape, (tokens, d)); at one without, the
    mean over every content token of every row (width d: padding and the tokens a
    tokenizer adds are left out)."""
    import torch

    from .plan import Plan
    from .positions import encode, trace_inputs

    addresses = list(addresses)
    encoded = encode(model, [texts] if isinstance(texts, str) else list(texts), frame)
    positioned = [a for a in addresses if a.position]
    whole = [a for a in addresses if not a.position]
    out: dict[Any, Mean] = {}
    checkpoint = checkpoint_of(model)
    if positioned:
        values = Plan.of(reads=positioned).run(model, encoded, frame=frame, engine=engine)
        for a in positioned:
            out[a] = Mean(values[a].mean(0), (checkpoint, place_key(a), int(values[a].shape[-1])))
    if whole:
        values = Plan.of(reads=whole).run(model, trace_inputs(model, encoded), engine=engine)
        for a in whole:
            v = values[a]
            axis = a.sequence_axis if a.sequence_axis is not None else 1
            tokens = torch.cat(
                [v[r].movedim(axis - 1, 0)[list(fr.content)] for r, fr in enumerate(encoded.frames)]
            )
            out[a] = Mean(tokens.mean(0), (checkpoint, place_key(a), int(v.shape[-1])))
    return {a: out[a] for a in addresses}


__all__ = [
    "MECHANISMS",
    "Add",
    "Clamp",
    "Lerp",
    "Mean",
    "Mechanism",
    "MechanismRefused",
    "ProjectOut",
    "Renormalize",
    "Resample",
    "Scale",
    "Set",
    "Zero",
    "check",
    "harvest_means",
]
