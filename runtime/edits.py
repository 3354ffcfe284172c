"""In-place edits of a read: what a read of a place hands out inside a trace.

A read at a place the row copies (``snapshot``, ``write: in_place``, a scale) is a
copy, so a value saved before a write keeps its value, and an in-place edit of a copy
would change nothing in the model. So a read hands out an ``EditableRead``: the
place's tensor as read (that copy, or the model's tensor) whose in-place operations
(``x[:, 2] += v``, ``x[:, 2] = v``, ``x.mul_(2)``, ``x.zero_()``, ``out=x``,
``inplace=True``), on it or on a view of it, are the write of the place: the edit is
made on the read and the whole read is then written with the place's own write
(``model.internals[name][layer] = x``, the same checks, the same snapshot contract).
Where that write cannot happen (the trace ran past the place, another invoke or trace
is running, the place is read-only) the edit raises and says the assignment to write.

Outside the trace body that read it (after the trace, or in the model's own forward)
the tensor is a plain tensor: operations on it are torch's, results are plain tensors.

A read's gradient is the place's (``Gradient``): ``x.grad`` inside nnsight's ``with
loss.backward():``, or after ``x.retain_grad()`` and a plain backward, is the
gradient of the model's tensor the read was made of, said as the place means it; a
spelling that cannot give it (a part of the read, a bare ``x.grad`` that torch would
leave None, a read of another invoke) raises ``GradientRefused`` with one that does.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from . import compat
from .errors import CausalabError, GradientRefused

# in-place methods that change no value of the tensor (autograd and memory
# bookkeeping): never a write
_NOT_EDITS = frozenset(
    {"requires_grad_", "retain_grad", "share_memory_", "detach_", "record_stream", "pin_memory"}
)
_DUNDER_EDITS = frozenset(
    {
        "__setitem__",
        "__iadd__",
        "__isub__",
        "__imul__",
        "__itruediv__",
        "__ifloordiv__",
        "__imod__",
        "__ipow__",
        "__imatmul__",
        "__iand__",
        "__ior__",
        "__ixor__",
        "__ilshift__",
        "__irshift__",
    }
)


def _out_of_order_base() -> type[Exception]:
    error = compat.out_of_order_error()
    return error if error is not None and issubclass(error, Exception) else LookupError


class PlaceOutOfOrder(CausalabError, _out_of_order_base()):  # type: ignore[misc]
    """nnsight's OutOfOrderError said in places: a place asked for after the trace had
    passed it (which place, which later place, both ranks, and the fix)."""


class EditRefused(CausalabError, RuntimeError):
    """An in-place edit of a read that cannot reach the model, with the assignment to
    write instead."""


def edit_runner() -> Any:
    """The trace body running now (its nnsight mediator, ``compat.running_body``): None
    in the model's forward and outside any trace, on every nnsight release."""
    return compat.running_body()


def visits_of(runner: Any, location: str | None) -> int | None:
    """How many times the model has reached ``location`` in ``runner``'s run (nnsight
    0.8 counts a visit once it is over); None where this nnsight does not say."""
    if location is None or not hasattr(runner, "occurrence"):
        return None
    try:
        return int(runner.occurrence(location))
    except Exception:
        return None


class Edit:
    """What an in-place edit of a read does: who read it, where, and the write; and
    where its gradient comes from (``Gradient``)."""

    __slots__ = (
        "_gradient",
        "_storage",
        "location",
        "ran_past",
        "root",
        "runner",
        "visits",
        "where",
        "write",
    )

    def __init__(
        self,
        where: str,
        write: Callable[[Any], None],
        root: Any,
        location: str | None,
        ran_past: Callable[[], bool] | None,
        gradient: Gradient | Callable[[], Gradient] | None,
        reader: weakref.ref[Any] | None,
        visits: int | None,
    ) -> None:
        # a Gradient, or what makes it when first asked (a read's gradient is asked
        # for far less often than it is read)
        self._gradient = gradient
        self.where = where  # "layers_mid[1]", as the assignment names it
        self.write = write  # the place's write, given the whole edited copy
        self.root = root  # the copy the read handed out, as a plain tensor
        self._storage: int | None = None
        # the trace body that made the read, weakly: a value saved past its trace does
        # not keep the trace alive
        self.runner = reader
        self.location = location
        # how many times that body had visited ``location`` when the read was made
        # (``visits_of``; None where nnsight does not count them, 0.6/0.7) and, there,
        # whether the body has since read a place later in the forward (the client's
        # internals say)
        self.visits = visits
        self.ran_past = ran_past

    @property
    def gradient(self) -> Gradient | None:
        """Where the read's gradient comes from (``Gradient``), made when first asked."""
        made = self._gradient
        if made is None or isinstance(made, Gradient):
            return made
        self._gradient = made = made()
        return made

    @property
    def storage(self) -> int:
        """The data pointer of the read's storage (a tensor viewing it is its view)."""
        if self._storage is None:
            self._storage = _storage(self.root)
        return self._storage

    def reader(self) -> Any:
        """The trace body that made the read (None once it is gone, or outside one)."""
        return self.runner() if self.runner is not None else None

    def live(self) -> bool:
        """Whether an edit now is made inside a trace body (any), where it must reach
        the model or raise; False in the model's forward or outside a trace."""
        return edit_runner() is not None

    def refusal(self) -> str | None:
        """Why an edit now cannot be the write of the place (None where it can)."""
        now = edit_runner()
        fix = f"write model.{self.where} = x (x edited, at the place)"
        if now is not self.reader():
            return (
                f"this tensor was read at {self.where} in another invoke or trace than the "
                f"one running, and an in-place edit of it would reach neither: {fix} in the "
                "invoke that should see it, or edit a copy (x.clone()) that is yours"
            )
        if (self.visits is not None and visits_of(now, self.location) != self.visits) or (
            self.visits is None and self.ran_past is not None and self.ran_past()
        ):
            return (
                f"the trace has run past {self.where} since it was read, so an in-place "
                f"edit of the read cannot reach the model: edit it before reading a later "
                f"place, or {fix} before the later read; to compute with it after, edit a "
                "copy (x.clone())"
            )
        return None


def _torch_grad() -> Any:
    """``torch.Tensor.grad`` as a descriptor: torch's, or nnsight's property while its
    backward trace runs."""
    import inspect

    return inspect.getattr_static(torch.Tensor, "grad")


# what ``Gradient.of`` answers where torch's own ``.grad`` of the tensor is the answer
_TORCH = object()

_ELSEWHERE = (
    "take it inside the trace as x.grad in `with loss.backward():` (x read before the "
    "backward), or call x.retain_grad() on the read before the backward and read x.grad "
    "after it; without a trace, causalab_mini.attribution.gradients(model, "
    "[locate(model, component, layer)], inputs, metric)"
)


class Gradient:
    """Where the gradient of a read of a place comes from. A read is a copy or a view of
    the model's tensor there (``source``), never itself on autograd's path to the
    output, so torch would leave its ``.grad`` None: its gradient is that of the
    model's tensor, said as the place means the tensor (``to_read``: viewed as the read
    is, divided by the read's scale, as a write at the place divides). ``version``: the
    tensor's version when read; a tensor the forward edits in place after the place has
    another by the backward, and its gradient is then the edited tensor's."""

    __slots__ = ("isolate", "kept", "narrowed", "source", "to_read", "version", "where")

    def __init__(
        self,
        where: str,
        source: Any,
        to_read: Callable[[Any], Any],
        isolate: Callable[[], Any] | None = None,
        narrowed: bool = False,
        version: int | None = None,
    ) -> None:
        self.where = where
        self.source = source
        self.to_read = to_read
        # (given where the Gradient is made after the read: the version then)
        self.version = int(source._version) if version is None else version
        self.kept: list[Any] | None = None  # [gradient] once retain_grad() was called
        # at a module's input, where the tensor may feed other modules too (the
        # residual stream, a parallel block): the tensor's gradient is theirs as well,
        # so the place's is taken from a view of its own the module is handed (made by
        # ``isolate``, a write of the place, at retain_grad() right after the read)
        self.isolate = isolate
        # an invoke's rows cut off the batch's tensor, which the forward does not go on
        # with (``compat.invokes_narrowed_off_the_graph``): no backward reaches them
        self.narrowed = narrowed

    def _whole(self, read: Any, root: Any, spelling: str) -> None:
        with torch._C.DisableTorchFunctionSubclass():
            same = (
                read.data_ptr() == root.data_ptr()
                and read.shape == root.shape
                and read.stride() == root.stride()
            )
        if not same:
            raise GradientRefused(
                f"{spelling} of a part of the read at {self.where}: take {spelling} of the "
                "whole read (x = model.<place>[layer]) and index the gradient as you "
                "indexed the read"
            )

    def _unedited(self, spelling: str) -> None:
        if int(self.source._version) != self.version:
            raise GradientRefused(
                f"{spelling} at {self.where}: the forward edits the model's tensor there in "
                "place after the place (its reads are copies), so autograd's gradient of "
                "that tensor is the edited one's, not the place's: call x.retain_grad() "
                "right after reading it (before the forward goes on), or use "
                "causalab_mini.attribution.gradients(model, [locate(model, component, "
                "layer)], inputs, metric)"
            )

    def of(self, read: Any, root: Any, reader: Any) -> Any:
        """``read.grad``: inside nnsight's backward, the gradient of the model's tensor
        as autograd reaches it, as the read's; after ``retain_grad()``, the one kept; a
        refusal for a read on autograd's graph otherwise (torch would say None).
        ``reader``: the trace body that made the read."""
        if compat.backward_running():
            self._whole(read, root, "x.grad")
            self._unedited("x.grad")
            if self.narrowed:
                raise GradientRefused(
                    f"x.grad at {self.where} inside `with loss.backward():`: this trace "
                    f"batches several invokes, and under nnsight {compat.nnsight_version()} "
                    "an invoke's read is its rows cut off the batch's tensor, which the "
                    "backward never reaches (nnsight would wait for it forever): call "
                    "x.retain_grad() right after reading it and read x.grad after a plain "
                    "loss.backward(), trace one invoke (the prompts in one input, a "
                    "list), or install nnsight>=0.8"
                )
            if self.isolate is not None:
                raise GradientRefused(
                    f"x.grad at {self.where}: the place is a module's input, whose tensor "
                    "may feed other modules too (the residual stream, a parallel block), "
                    "and its gradient is theirs as well as this place's: call "
                    "x.retain_grad() right after reading it (the module is then handed a "
                    "view of its own) and read x.grad after the backward, or use "
                    "causalab_mini.attribution.gradients(model, [locate(model, component, "
                    "layer)], inputs, metric)"
                )
            opener = compat.backward_opener()
            if opener is not None and reader is not None and opener is not reader:
                raise GradientRefused(
                    f"x.grad of the read at {self.where}, made in another invoke than the "
                    "one that opened `with loss.backward():`, which nnsight's backward does "
                    "not serve: open the backward in the invoke that read it, or call "
                    "x.retain_grad() there and read x.grad after a plain loss.backward()"
                )
            return self.to_read(self.source.grad)
        if self.kept is not None:
            self._whole(read, root, "x.grad")
            return self.kept[0]
        with torch._C.DisableTorchFunctionSubclass():
            on_graph = bool(read.requires_grad)
        if on_graph:
            raise GradientRefused(
                f"x.grad of the read at {self.where} is left None by torch: the read is a "
                f"copy of the model's tensor, off autograd's path to the output; {_ELSEWHERE}"
            )
        return _TORCH

    def track(self, requires_grad: bool) -> None:
        """``read.requires_grad_()``: the model's tensor made to require grad where it is
        a leaf (nothing before it does); where it is on the graph already, as it is."""
        source = self.source
        if source.grad_fn is None:
            source.requires_grad_(requires_grad)
        elif not requires_grad:
            raise GradientRefused(
                f"x.requires_grad_(False) at {self.where}: the model's tensor there is on "
                "autograd's graph (computed from tensors that require grad); read "
                "x.detach() for a value off the graph"
            )

    def retain(self, read: Any, root: Any) -> None:
        """``read.retain_grad()``: keep the model's tensor's gradient, as the read's,
        when a backward reaches it (a hook on the tensor, registered now: a tensor the
        forward edits in place later still hands it the gradient of its value here)."""
        self._whole(read, root, "x.retain_grad()")
        self._unedited("x.retain_grad()")
        kept: list[Any] = [None]
        source, to_read = self.source, self.to_read
        if self.isolate is not None:
            own = self.isolate()  # the place's value, as the read, the module's own
            own.register_hook(lambda grad: kept.__setitem__(0, grad))
            self.kept = kept
            return
        self.kept = kept

        def keep(grad: Any) -> None:
            kept[0] = to_read(grad)

        if (getattr(source, "_nnsight_batch", False) or self.narrowed) and source._base is not None:
            # an invoke's rows of the batch (marked by 0.8; on 0.6/0.7 the trace
            # batches several invokes): the batch's tensor is on the graph
            geometry = (source.shape, source.stride(), source.storage_offset())
            source._base.register_hook(lambda grad: keep(grad.as_strided(*geometry)))
        else:
            source.register_hook(keep)


class NoGradient(Gradient):
    """The gradient of a computed place's read (each head's term of the output
    projection, made from the projection's input and weight): no tensor the forward
    runs through, so autograd has none; every spelling is refused with ``why`` (where
    the gradient is), never torch's silent None."""

    __slots__ = ("why",)

    def __init__(self, where: str, source: Any, why: str) -> None:
        super().__init__(where, source, lambda grad: grad)
        self.why = why

    def of(self, read: Any, root: Any, reader: Any) -> Any:
        raise GradientRefused(f"x.grad at {self.where}: {self.why}")

    def track(self, requires_grad: bool) -> None:
        raise GradientRefused(f"x.requires_grad_() at {self.where}: {self.why}")

    def retain(self, read: Any, root: Any) -> None:
        raise GradientRefused(f"x.retain_grad() at {self.where}: {self.why}")


def _target(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The tensor ``func`` edits in place, or None where it edits none."""
    name = getattr(func, "__name__", "")
    if name in _DUNDER_EDITS or (
        name.endswith("_") and not name.startswith("_") and name not in _NOT_EDITS
    ):
        return args[0] if args else None
    if kwargs.get("inplace") is True:
        return args[0] if args else kwargs.get("input")
    out = kwargs.get("out")
    if isinstance(out, (tuple, list)):
        return next((o for o in out if isinstance(o, EditableRead)), None)
    return out


def _storage(t: Any) -> int:
    with torch._C.DisableTorchFunctionSubclass():
        return int(t.untyped_storage().data_ptr())


def _writes_back(func: Any, args: tuple[Any, ...], edit: Edit) -> bool:
    """Whether ``func`` is the store that ends an augmented assignment of a view,
    ``x[key] += v`` (``x[key]`` edited in place, then stored back where it is): the
    edit of the view was written already."""
    if getattr(func, "__name__", "") != "__setitem__" or len(args) < 3:
        return False
    value = args[2]
    if not isinstance(value, EditableRead) or edit_of(value) is not edit:
        return False
    with torch._C.DisableTorchFunctionSubclass():
        there = torch.Tensor.__getitem__(args[0].as_subclass(torch.Tensor), args[1])
        return bool(
            isinstance(there, torch.Tensor)
            and there.data_ptr() == value.data_ptr()
            and there.shape == value.shape
            and there.stride() == value.stride()
        )


class EditableRead(torch.Tensor):
    """A read of a place, inside the trace body that read it: a copy whose in-place
    edits are the write of the place (see the module doc)."""

    _edit: Edit

    @classmethod
    def __torch_function__(
        cls, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        target = _target(func, args, kwargs)
        edit = edit_of(target) if isinstance(target, EditableRead) else None
        if edit is not None and edit.live():
            refused = edit.refusal()
            if refused is not None:
                raise EditRefused(f"an in-place edit of {edit.where} is not made: {refused}")
            with torch._C.DisableTorchFunctionSubclass():
                result = func(*args, **kwargs)
            if not _writes_back(func, args, edit):
                edit.write(edit.root)
            return result
        with torch._C.DisableTorchFunctionSubclass():
            result = func(*args, **kwargs)
        if edit_runner() is None:
            return result  # after the trace, or in the model's forward: plain tensors
        return _keep_views(result, args)

    def __repr__(self, **kwargs: Any) -> str:  # type: ignore[override]
        with torch._C.DisableTorchFunctionSubclass():
            return repr(self.as_subclass(torch.Tensor))

    @property
    def grad(self) -> Any:
        """The place's gradient as this read means it (``Gradient.of``): inside nnsight's
        ``with loss.backward():``, or after ``retain_grad()``; torch's own elsewhere."""
        edit = edit_of(self)
        if edit is not None and edit.gradient is not None:
            got = edit.gradient.of(self, edit.root, edit.reader())
            if got is not _TORCH:
                return got
        return _torch_grad().__get__(self, torch.Tensor)

    @grad.setter
    def grad(self, value: Any) -> None:
        edit = edit_of(self)
        if edit is not None and edit.gradient is not None and compat.backward_running():
            raise GradientRefused(
                f"x.grad = g at {edit.where}: a place's read is a copy, and its gradient "
                "is not replaced through it; replace the gradient of the module's own "
                "tensor (nnsight: t = model.<module path>.output before the backward, "
                "t.grad = g inside it)"
            )
        _torch_grad().__set__(self, value)

    def requires_grad_(self, requires_grad: bool = True) -> Any:
        """Where the model's tensor the read was made of is off autograd's graph (a
        frozen model: NDIF's), that tensor is made to require grad (a read is a copy,
        and the forward goes on with the model's tensor), so ``.grad`` of the read
        inside ``with loss.backward():`` has a gradient to give."""
        edit = edit_of(self)
        if edit is not None and edit.gradient is not None:
            edit.gradient.track(requires_grad)
            return self
        with torch._C.DisableTorchFunctionSubclass():
            torch.Tensor.requires_grad_(self, requires_grad)
        return self

    def retain_grad(self) -> None:
        """Keep the place's gradient for ``.grad`` after a backward (``Gradient.retain``)."""
        edit = edit_of(self)
        if edit is not None and edit.gradient is not None:
            edit.gradient.retain(self, edit.root)
            return
        with torch._C.DisableTorchFunctionSubclass():
            torch.Tensor.retain_grad(self)

    def __reduce_ex__(self, protocol: Any) -> Any:
        # pickles (a remote result, torch.save) as the plain tensor it holds
        with torch._C.DisableTorchFunctionSubclass():
            return self.as_subclass(torch.Tensor).__reduce_ex__(protocol)  # type: ignore[no-untyped-call]

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        with torch._C.DisableTorchFunctionSubclass():
            return self.as_subclass(torch.Tensor).clone()


def _keep_views(result: Any, args: tuple[Any, ...]) -> Any:
    """``result`` with each tensor that views an editable read's storage handed out
    editable too (so ``x[:, 2].zero_()`` is an edit of ``x``); every other result
    plain."""
    edits = [e for e in (edit_of(a) for a in args if isinstance(a, EditableRead)) if e is not None]
    if not edits:
        return result
    if isinstance(result, torch.Tensor) and not isinstance(result, EditableRead):
        return _viewed(result, edits)
    if isinstance(result, tuple) and any(isinstance(r, torch.Tensor) for r in result):
        return tuple(_viewed(r, edits) if isinstance(r, torch.Tensor) else r for r in result)
    return result


def _viewed(t: torch.Tensor, edits: list[Edit]) -> Any:
    if t.numel() == 0:
        return t
    ptr = _storage(t)
    for edit in edits:
        if edit.storage == ptr:
            return hand_out(t, edit)
    return t


def hand_out(t: torch.Tensor, edit: Edit | tuple[Any, ...], owned: bool = False) -> EditableRead:
    """``t`` (a plain tensor) handed out inside a trace body as a read whose in-place
    edits are ``edit``'s (the one place a read is made editable). ``edit`` may be a
    record ``(make, *arguments)`` whose ``make(read, *arguments)`` is the ``Edit``,
    made when first asked (``edit_of``): a read is edited and asked for its gradient
    far less often than it is made. ``owned``: ``t`` is a copy made for this read that
    nothing else holds, handed out itself (made an ``EditableRead`` in place) rather
    than through a second tensor viewing it."""
    if owned:
        t.__class__ = EditableRead
        out: Any = t
    else:
        out = t.as_subclass(EditableRead)
    out.__dict__["_edit"] = edit
    return out  # type: ignore[no-any-return]


def edit_of(t: EditableRead) -> Edit | None:
    """The ``Edit`` of an editable read (made from its record where it is one, then
    kept: every view of the read shares it); None where it has none."""
    kept = t.__dict__.get("_edit")
    if type(kept) is tuple:
        kept = t.__dict__["_edit"] = kept[0](t, *kept[1:])
    return kept


def plain(value: Any) -> Any:
    """``value`` as the model may hold it: an editable read as the plain tensor of the
    same storage, anything else as it is."""
    if isinstance(value, EditableRead):
        with torch._C.DisableTorchFunctionSubclass():
            return value.as_subclass(torch.Tensor)
    return value


def handed_back(value: Any) -> Any:
    """A read as an engine hands it back after its trace: the tensor the read was made
    of (the model's own where the place holds it as is, as the hooks engine hands it,
    so that autograd reaches it); anything else as ``plain`` makes it."""
    if isinstance(value, EditableRead):
        edit = edit_of(value)
        root = edit.root if edit is not None else None
        with torch._C.DisableTorchFunctionSubclass():
            whole = (
                root is not None
                and value.data_ptr() == root.data_ptr()
                and value.shape == root.shape
                and value.stride() == root.stride()
            )
        if whole:
            return root
    return plain(value)


def editable(
    value: Any,
    where: str,
    write: Callable[[Any], None],
    location: str | None,
    copy: bool,
    ran_past: Callable[[], bool] | None = None,
    gradient: Gradient | Callable[[], Gradient] | None = None,
) -> Any:
    """``value`` (a read of the place ``where``) as handed out inside a trace body: a
    tensor whose in-place edits call ``write`` with the edited tensor (a copy of it
    first where ``copy``); anything else, or anything outside a trace body, as it is.
    ``ran_past``: whether the trace has since passed the place, asked where nnsight
    does not count a location's visits (0.6/0.7). ``gradient``: where the read's
    gradient comes from (``Gradient``, or a function that makes it when first asked)."""
    runner = edit_runner() if isinstance(value, torch.Tensor) else None
    if runner is None:
        return value
    value = plain(value)
    if copy:
        value = value.clone()
    reader = weakref.ref(runner)
    edit = Edit(
        where, write, value, location, ran_past, gradient, reader, visits_of(runner, location)
    )
    return hand_out(value, edit)


__all__ = [
    "Edit",
    "EditRefused",
    "EditableRead",
    "Gradient",
    "PlaceOutOfOrder",
    "edit_of",
    "editable",
    "hand_out",
    "handed_back",
    "plain",
    "visits_of",
]
