"""A compiled plan as plain nnsight module accesses: the code a server runs.

``causalab_mini.remote`` lowers a ``Plan`` on the client to a *program*: a tuple of
steps that hold only nnsight Envoys, strings, numbers and tensors (see ``lower`` there).
The functions here run such a program inside a trace. They are shipped to an NDIF
server by value (their source travels in the request), so a server without
causalab_mini runs them; that is why this module is self-contained:

- it imports nothing at module level and nothing of causalab_mini;
- the only names a function may use are builtins, its parameters, and the other
  functions of this module (``remote.shipped()`` runs this file's source in a fresh
  namespace, and cloudpickle sends each function with the globals it names);
- annotations are never evaluated (nnsight rebuilds a function from its source
  without running its ``def``), so ``Any`` is imported for type checkers only.

What a step means is the same as on the client: ``Place.get``/``Place.set`` for a row
(module side, ``.source`` operations, select, snapshot, scale, in-place writes) and
``components.read``/``write`` for a component address (interiors, flattened heads,
one head's slice). ``tests/test_remote.py`` runs every component of several families
both ways and compares them, so the two cannot drift apart unnoticed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, Protocol, TypedDict

    class Step(TypedDict):
        """One read or write of a lowered program, as plain data (``causalab_mini.steps``
        makes a place's, ``causalab_mini.lower`` a component's). At run time a step is a
        plain ``dict`` (this module ships to a server by value and imports nothing);
        type checkers hold every builder and reader of a step to these fields."""

        write: bool
        value: Any  # the tensor a write puts (None for a read, or where ``edit`` makes it)
        held: bool  # a read hands the whole tensor as the model holds it
        where: str  # the place or component as messages name it
        # the target: an Envoy (None: the model itself), the operations under it by
        # needle (``op``: the first one's name where the client resolved it), its side
        envoy: Any
        ops: tuple[str, ...]
        op: str | None
        take: tuple[str, int] | None  # ("arg", i) or ("return", i) of an operation's call
        attr: str
        select: tuple[Any, ...] | None
        io_module: bool
        # how the place means the tensor there
        unflatten: bool
        unmerge: int | None
        unmerge_kind: str
        unmerge_heads_are: str
        views: tuple[tuple[Any, ...], ...]
        copy: bool
        scale: float | None
        heads_through: Callable[[Any], Any] | None
        in_place: bool
        snapshot: bool
        edit_copy: bool
        first_input_via: str | None
        # how a component hands it on
        layout: str | None
        per_head: bool
        heads: tuple[str | None, int | None, int | None, int | None]
        head: int | None
        stream: tuple[int, int, int | None] | None
        index: Any  # a (batch, n) token index, or None for every position
        axis: int | None
        # names for messages and the client's bookkeeping
        place: str | None
        layer: int | None
        row: str
        module_path: str
        component: str
        nested: list[tuple[Any, str, str | None]]
        # local engines only (never sent): a write's value made of the place's handed
        # tensor (an interchange's patch), and what a read is cut to where it is made
        edit: Callable[[Any], Any] | None
        then: Callable[[Any], Any] | None

    class Env(Protocol):
        """What the client's ``model.internals`` serves the executor (on a server there
        is none: the steps' needles and this module's own errors stand in)."""

        @property
        def write_error(self) -> type[Exception]: ...

        def refusal(self, kind: str, step: Step, reason: str) -> Exception: ...

        def operation(self, step: Step, target: Any) -> Any: ...

        def fetch(self, step: Step, target: Any) -> Any: ...

        def flat_view(self, step: Step, raw: Any) -> Any: ...

        def handed(self, step: Step, value: Any, target: Any, raw: Any) -> Any: ...


def check_server(model: Any, expected: dict[str, Any]) -> None:
    """Refuse to run on a model other than the one the client compiled for: another
    attention implementation or dtype, or a forward whose operations differ (another
    transformers: a needle that names another call there)."""
    module = model._module
    config = module.config
    found = getattr(config, "_attn_implementation", None) or "eager"
    want = expected["attn_implementation"]
    if found != want:
        raise RuntimeError(
            f"causalab_mini: this server runs {found!r} attention and the request was made "
            f"for {want!r}. Load the client model with attn_implementation={found!r} (or "
            f"run on a deployment loaded with attn_implementation={want!r})"
        )
    dtype = None
    for parameter in module.parameters():
        dtype = str(parameter.dtype)
        break
    if dtype is not None and dtype != expected["dtype"]:
        raise RuntimeError(
            f"causalab_mini: this server holds the model in {dtype} and the client model is "
            f"{expected['dtype']}: load the client model with dtype={dtype} so that reads and "
            "writes mean the same tensors"
        )


def _parsed(source: Any) -> tuple[str, dict[str, int], Any]:
    """A parsed forward's text, each operation's line (an index into its lines), and
    what lists its operations (``causalab_mini.compat.parsed_source``, inline): nnsight
    0.8 keeps it on ``Source.compiled`` (``.lines`` 1-based), 0.7 on an accessor and
    0.6 on the source envoy (``.line_numbers``, counted after the ``def`` line)."""
    compiled = getattr(source, "__dict__", {}).get("compiled")
    if compiled is not None:
        return compiled.source, {n: compiled.lines[n] - 1 for n in compiled.names}, source
    accessor = getattr(source, "accessor", source)
    lines = {name: number + 1 for name, number in accessor.line_numbers.items()}
    return accessor.source, lines, accessor


def _calls(text: str, needle: str) -> bool:
    """Whether ``text`` holds the call ``needle``: not a longer name ending in it, and,
    where the needle names the first argument, not a longer argument starting with it
    (``causalab_mini.ops._calls``, without ``re``)."""
    start = text.find(needle)
    while start >= 0:
        before = text[:start]
        after = text[start + len(needle) :]
        ok = not (before and (before[-1].isalnum() or before[-1] in "_."))
        if ok and not needle.endswith("("):
            ok = not (after and (after[0].isalnum() or after[0] == "_"))
        if ok:
            return True
        start = text.find(needle, start + 1)
    return False


def _stems(needle: str) -> tuple[str, ...]:
    """The name stems nnsight gives the operations ``needle`` names, as
    ``causalab_mini.ops.needle_prefix`` (without ``re``) plus "_": ".sigmoid(" (a method
    on an expression's result) by the method alone, "nn.Softmax(dim=-1)(" (a call of
    what a call returns) by nnsight's "call" (0.8) or "unknown" (0.6/0.7; the server's
    release is not known here, and the needle's line decides)."""
    if needle.endswith(")(") and needle.count("(") == 2 == needle.count(")") + 1:
        return ("call_", "unknown_")
    return (needle.split("(", 1)[0].removeprefix(".").replace(".", "_") + "_",)


def _find(source: Any, needle: str, where: str) -> Any:
    """The operation of ``source`` that the call-shaped ``needle`` names, resolved as
    ``causalab_mini.ops.find_op`` resolves it: a name ``<callable>_<n>`` whose source
    line holds the call. None or several is refused with the operation list."""
    text_of, line_of, accessor = _parsed(source)
    stems = _stems(needle)
    lines = text_of.split("\n")
    hits = []
    for name, index in line_of.items():
        if not any(name.startswith(s) and name[len(s) :].isdigit() for s in stems):
            continue
        text = lines[index] if 0 <= index < len(lines) else ""
        if _calls(text, needle):
            hits.append(name)
    if len(hits) != 1:
        raise RuntimeError(
            f"causalab_mini: the forward of {where} on this server calls {needle!r} at "
            f"{len(hits)} operations ({', '.join(hits)}), where the client found one: the "
            "server runs another transformers version; install the client's there. Its "
            f"operations are:\n{accessor}"
        )
    return getattr(source, hits[0])


def check_value(where: str, value: Any, current: Any, error: Any = None) -> None:
    """Refuse to write ``value`` at ``where`` (a place or component, with its layer)
    unless it is a tensor of exactly ``current``'s shape, dtype and device. Nothing is
    broadcast or cast: a user who means it says so (``v.expand_as(x)``, ``v.to(x)``).
    Every spelling of a write checks with this one function (``errors.check_value``
    raises WriteRefused through it), so they refuse alike; on a server, ValueError."""
    if error is None:
        error = _server_write_error
    shape = getattr(value, "shape", None)
    want = tuple(current.shape)
    if shape is None:
        raise error(
            f"cannot write a {type(value).__name__} to {where}, which holds a tensor of "
            f"shape {want}; write a tensor of that shape (e.g. torch.full_like(x, value))"
        )
    got = tuple(shape)
    if got != want:
        raise error(
            f"cannot write a tensor of shape {got} to {where}, which has shape {want}; "
            "nothing is broadcast (say v.expand_as(x) if that is what you mean)"
        )
    if getattr(value, "dtype", None) != current.dtype:
        raise error(
            f"{where} holds {current.dtype}; the value is {value.dtype}. Nothing is cast: "
            f"write v.to({current.dtype})"
        )
    if getattr(value, "device", None) != current.device:
        raise error(
            f"{where} is on {current.device}; the value is on {value.device}: write "
            f"v.to('{current.device}')"
        )


def _server_write_error(message: str) -> Exception:
    return ValueError(f"causalab_mini: write refused: {message}")


def _refused(env: Env | None, kind: str, step: Step, reason: str) -> Exception:
    """The refusal ``reason`` at ``step`` (``kind``: a place's view, a component's
    heads or streams): the error the client's internals make of it (``env``), or on a
    server a RuntimeError naming the step."""
    if env is not None:
        return env.refusal(kind, step, reason)
    return RuntimeError(f"causalab_mini: {step['where']}: {reason}")


def target_of(model: Any, step: Step, env: Env | None = None) -> Any:
    """The Envoy (module or operation) whose boundary a step reads or writes; a step
    at the model itself holds no Envoy (the model it names is the one running). On
    the client (``env``) the operations are found as the rows name them, with the
    client's errors; on a server by their needles (``_find``)."""
    target = model if step["envoy"] is None else step["envoy"]
    if not step["ops"]:
        return target
    if env is not None:
        return env.operation(step, target)
    for needle in step["ops"]:
        target = _find(target.source, needle, step["where"])
    return target


def _fetch(step: Step, target: Any, env: Env | None) -> Any:
    """The target's boundary in the running trace (on the client through its
    internals, which say nnsight's out-of-order error in places)."""
    if env is not None:
        return env.fetch(step, target)
    return getattr(target, step["attr"])


def _select_get(value: Any, select: Any) -> Any:
    if select is None:
        return value
    if select[0] == "first":
        return value[0] if isinstance(value, (tuple, list)) else value
    return value[select[1]]


def replace_part(value: Any, key: Any, new: Any) -> Any:
    """Rebuild ``value`` with the part at ``key`` replaced by ``new``: tuples (named
    ones too), lists, plain mappings and transformers' ``ModelOutput`` (an ordered
    mapping whose constructor takes its fields) come back as the same type (the
    address rows' selects put with this function too)."""
    from collections.abc import Mapping

    if isinstance(value, (tuple, list)) and not isinstance(key, int):
        raise TypeError(f"a {type(value).__name__} is indexed by position, not by {key!r}")
    if isinstance(value, tuple):
        items = list(value)
        items[key] = new
        if hasattr(value, "_fields"):  # a named tuple
            return type(value)(*items)
        return tuple(items)
    if isinstance(value, list):
        items = list(value)
        items[key] = new
        return items
    if isinstance(value, Mapping):
        if key not in value:
            raise KeyError(f"{key!r} is not a field of this {type(value).__name__}")
        fields = dict(value)
        fields[key] = new
        return type(value)(**fields) if type(value) is not dict else fields
    raise TypeError(
        f"cannot replace part {key!r} of a {type(value).__name__}: expected a tuple, "
        "list or mapping"
    )


def _select_put(value: Any, select: Any, new: Any) -> Any:
    if select is None:
        return new
    if select[0] == "first":
        return replace_part(value, 0, new) if isinstance(value, (tuple, list)) else new
    return replace_part(value, select[1], new)


def _token_view(value: Any, views: Any) -> Any:
    """The tokens' own positions of ``value``, batch first (a view: writing into it
    writes ``value``): ``seq_first`` swaps (seq, batch); ``lead`` leaves out the first
    ``count`` positions of each axis; ``trail`` keeps the first of ``1 + count``
    equal blocks."""
    for view in views:
        if view[0] == "seq_first":
            value = value.transpose(0, 1)
        elif view[0] == "lead":
            for axis in view[1]:
                value = value.narrow(axis, view[2], value.shape[axis] - view[2])
        else:
            for axis in view[1]:
                value = value.narrow(axis, 0, value.shape[axis] // (1 + view[2]))
    return value


def _viewed(step: Step, raw: Any, env: Env | None) -> Any:
    """The model's tensor at a step as its place means it: a flat (tokens, ...) tensor
    viewed as (batch, seq, ...) with the layer's input's batch and sequence (recorded
    on the client only), (batch*heads, ...) viewed as (batch, heads, ...), and the
    tokens' own positions where the forward adds others."""
    if step["unflatten"]:
        if env is None:
            raise _refused(env, "place", step, "a flat place is viewed back on the client only")
        raw = env.flat_view(step, raw)
    heads = step["unmerge"]
    if heads is not None:
        dims = tuple(getattr(raw, "shape", ()))
        if not dims or dims[0] % heads:
            raise _refused(
                env,
                step["unmerge_kind"],
                step,
                f"it is held with batch and heads merged, {dims}, and its first axis is no "
                f"multiple of the {heads} heads {step['unmerge_heads_are']}",
            )
        raw = raw.view(dims[0] // heads, heads, *dims[1:])
    if step["views"]:
        raw = _token_view(raw, step["views"])
    return raw


def _raw(model: Any, step: Step, env: Env | None) -> tuple[Any, Any, Any]:
    """(the target, the value at its boundary, the tensor the step's select picks)."""
    target = target_of(model, step, env)
    if step["take"] is not None:
        what, index = step["take"]
        if what == "arg":
            return target, None, target.inputs[0][index]
        value = target.output
        # a call may return a tuple or a list (GPT-1's _attn returns [z, ...])
        return target, value, value[index] if isinstance(value, (tuple, list)) else value
    whole = _fetch(step, target, env)
    return target, whole, _select_get(whole, step["select"])


def _meant(step: Step, raw: Any, env: Env | None) -> Any:
    """The model's tensor ``raw`` as the step's place means it: viewed, a copy where
    the tensor changes in place later, scaled where the row says."""
    value = _viewed(step, raw, env)
    if step["copy"]:
        value = value.clone()
    if step["scale"] is not None:
        value = value * step["scale"]
    if step["heads_through"] is not None:  # a computed place: each head's term
        value = step["heads_through"](value)
    return value


def meant_gradient(step: Step, grad: Any, env: Env | None = None) -> Any:
    """A gradient at the model's tensor of a step (``raw``) as the gradient at the place
    as its row means the tensor (the one a zero added there by a write gets): viewed as
    a read is, and divided by the read's scale, since a write divides by it."""
    value = _viewed(step, grad, env)
    if step["scale"] is not None:
        value = value / step["scale"]
    return value


def whole_value(model: Any, step: Step, env: Env | None = None, edit: bool = False) -> Any:
    """The tensor at the step's place as its place means it (all heads): viewed, a
    copy where the tensor changes in place later, scaled where the row says. With
    ``edit`` (a read handed to the user on the client), its in-place edits are the
    place's write (``causalab_mini.edits``)."""
    target, _, raw = _raw(model, step, env)
    return held_value(step, target, raw, env, edit)


def held_value(
    step: Step, target: Any, raw: Any, env: Env | None = None, edit: bool = False
) -> Any:
    """``raw`` (what the step's select picks of ``target``'s boundary, read) as the
    step's place means it, as ``whole_value`` hands it out."""
    value = _meant(step, raw, env)
    if edit and env is not None and step["take"] is None:
        value = env.handed(step, value, target, raw)
    return value


def _put_raw(step: Step, target: Any, whole: Any, raw: Any, value: Any, env: Env | None) -> None:
    """Hand the model ``value`` (as the place means it, as ``_whole`` reads it) at the
    step's target, whose boundary holds ``whole`` and the select of it ``raw``."""
    if step["take"] is not None:
        if step["unmerge"] is not None:  # back through the view: (batch*heads, ...)
            value = value.reshape(-1, *value.shape[2:])
        what, index = step["take"]
        if what == "arg":
            args, kwargs = target.inputs
            target.inputs = ((*args[:index], value, *args[index + 1 :]), kwargs)
        elif isinstance(whole, (tuple, list)):
            target.output = replace_part(whole, index, value)
        else:
            target.output = value
        return
    current = raw
    if step["unflatten"] or step["unmerge"] is not None:
        value = value.reshape(raw.shape)  # written through the view
    elif step["views"]:
        current = _token_view(raw, step["views"])
    if step["scale"] is not None:
        value = value / step["scale"]
    if step["in_place"]:
        current[...] = value
        return
    if step["views"]:
        # the model's own other positions, the tokens' ones replaced
        merged = raw.clone()
        _token_view(merged, step["views"])[...] = value
        value = merged
    if step["snapshot"]:
        # the forward modifies this tensor in place after the place: the model gets a
        # copy, so the value handed in (perhaps a saved read) keeps what it holds
        value = value.clone()
    if step["select"] is not None:
        value = _select_put(whole, step["select"], value)
    if step["first_input_via"] is not None:
        _put_first_input(target, step["first_input_via"], value)
        return
    setattr(target, step["attr"], value)


def _put_first_input(target: Any, attr: str, value: Any) -> None:
    """Replace the first argument of the call at ``target`` through its whole
    ``(args, kwargs)`` (read and written as ``attr``): the first positional one, or the
    first keyword one of a call made with keywords only (as nnsight 0.8's ``input``
    setter does; 0.6/0.7's would add a positional argument beside the keyword)."""
    args, kwargs = getattr(target, attr)
    if args or not kwargs:
        setattr(target, attr, ((value, *tuple(args)[1:]), kwargs))
        return
    key = next(iter(kwargs))
    setattr(target, attr, (tuple(args), {**kwargs, key: value}))


def put(model: Any, step: Step, value: Any, env: Env | None = None) -> None:
    """Write ``value`` at a place's step as the place means it, after checking that it
    is a tensor of the place's shape, dtype and device (``model.internals[name][i] =
    value``)."""
    target, whole, raw = _raw(model, step, env)
    check_value(step["where"], value, _viewed(step, raw, env), env and env.write_error)
    _put_raw(step, target, whole, raw, value, env)


def _flat(layout: Any, native: Any) -> Any:
    """The tensor as components hand it on: a place held per head (bhsd, bhds, bshd)
    becomes (batch, seq, heads x head_dim), a place of several residual streams
    (streams_<layout>) (batch, seq, n x hidden)."""
    if layout == "streams_bsnh":
        return native.flatten(2)
    if layout == "streams_nbsh":
        return native.permute(1, 2, 0, 3).flatten(2)
    if layout == "bhsd":
        return native.transpose(1, 2).flatten(2)
    if layout == "bhds":  # a key transposed for the product
        return native.permute(0, 3, 1, 2).flatten(2)
    if layout == "bshd":
        return native.flatten(2)
    return native


def _native(layout: Any, flat: Any, like: Any) -> Any:
    """Back to how the model holds it (the inverse of ``_flat``), shaped like ``like``."""
    if layout == "streams_bsnh":
        return flat.reshape(like.shape)
    if layout == "streams_nbsh":
        n, b, s, h = like.shape
        return flat.reshape(b, s, n, h).permute(2, 0, 1, 3)
    if layout == "bhsd":
        b, h, s, d = like.shape
        return flat.reshape(b, s, h, d).transpose(1, 2)
    if layout == "bhds":
        b, h, d, s = like.shape
        return flat.reshape(b, s, h, d).permute(0, 2, 3, 1)
    if layout == "bshd":
        return flat.reshape(like.shape)
    return flat


def take_positions(value: Any, index: Any, axis: int) -> Any:
    """The tokens ``index`` (batch, n) of ``value`` along its sequence ``axis``, each row
    its own: (batch, ..., n, ...). (``causalab_mini.positions.take`` is this function.)"""
    moved = value.movedim(axis, 1)
    index = index.to(moved.device)
    if index.shape[0] != moved.shape[0]:
        raise ValueError(
            f"causalab_mini: the positions were resolved for {index.shape[0]} rows and the "
            f"tensor has {moved.shape[0]}: resolve them on the batch the trace runs"
        )
    shape = (index.shape[0], index.shape[1], *moved.shape[2:])
    wide = index.reshape(index.shape[0], index.shape[1], *([1] * (moved.dim() - 2)))
    return moved.gather(1, wide.expand(shape)).movedim(1, axis)


def put_positions(value: Any, index: Any, axis: int, new: Any) -> Any:
    """A copy of ``value`` whose tokens ``index`` along ``axis`` hold ``new`` (shaped as
    ``take_positions`` hands them out), every other position as it was."""
    out = value.clone()
    moved = out.movedim(axis, 1)  # a view: scattering into it writes ``out``
    index = index.to(moved.device)
    shape = (index.shape[0], index.shape[1], *moved.shape[2:])
    wide = index.reshape(index.shape[0], index.shape[1], *([1] * (moved.dim() - 2)))
    moved.scatter_(1, wide.expand(shape), new.movedim(axis, 1).to(moved.dtype))
    return out


def layout_mismatch(step: Step, held: Any) -> str | None:
    """Why the tensor a per-head component holds (shape ``held``, before it is handed on
    flat) does not have the heads and head size its address states (None where it
    does, or where the component is not per head). bhsd, bhds and bshd hold the head
    axis and the head size themselves, bsf heads x head size on its last axis, bhsk the
    heads on axis 1."""
    layout, heads_stated, head_dim, width = step["heads"]
    if not step["per_head"] or layout is None:
        return None
    shape = tuple(int(n) for n in held)
    where = step["where"]
    axes = {"bhsd": (1, 3), "bshd": (2, 3), "bhds": (1, 2), "bhsk": (1, None)}
    if layout in axes:
        if len(shape) != 4:
            return f"{where} is held as {shape}, which has not the 4 axes of {layout}"
        h_axis, d_axis = axes[layout]
        heads = shape[h_axis]
        if heads != heads_stated:
            return (
                f"{where} holds {heads} heads on axis {h_axis} of {shape}, and the address "
                f"states {heads_stated}"
            )
        if d_axis is None or head_dim is None:
            return None
        size = shape[d_axis]
        if size != head_dim:
            return (
                f"{where} holds heads of size {size} ({layout} {shape}), and the "
                f"address states a head size of {head_dim}"
            )
        flat = heads * size
    else:  # bsf: the heads and their size concatenated on the last axis
        if head_dim is None or heads_stated is None:
            return None
        flat = shape[-1]
        if flat != heads_stated * head_dim:
            return (
                f"{where} is {flat} wide on its last axis, and the address states "
                f"{heads_stated} heads x {head_dim} = {heads_stated * head_dim}"
            )
    if step["head"] is None and width is not None and width != flat:
        return f"{where} is {flat} wide as handed on, and the address states width {width}"
    return None


def _axis(step: Step) -> int:
    axis = step["axis"]
    if axis is None:
        raise _refused(None, "component", step, "it has no sequence axis to take positions on")
    return axis


def head_slice(step: Step) -> tuple[Any, ...]:
    head = step["head"]
    layout, _, head_dim, _ = step["heads"]
    if layout == "bhsk":
        return (slice(None), head)
    assert head is not None and head_dim is not None, "a head of a step with no head size"
    return (Ellipsis, slice(head * head_dim, (head + 1) * head_dim))


def _heads_checked(step: Step, native: Any, env: Env | None) -> None:
    """Refuse one head of a tensor whose heads are not what the address states: a
    slice by a wrong head size would be a plausible, wrong tensor."""
    reason = layout_mismatch(step, native.shape)
    if reason is not None:
        raise _refused(env, "component", step, f"head {step['head']} is not sliced out: {reason}")


def stream_slice(step: Step, flat: Any, env: Env | None) -> tuple[Any, ...]:
    """Stream i of a tensor handed on flat (its hidden-wide slice); refused where the
    last axis is not n streams of equal width."""
    assert step["stream"] is not None, "a stream of a step with no streams"
    stream, streams, width = step["stream"]
    total = int(flat.shape[-1])
    if total % streams or (width is not None and width * streams != total):
        raise _refused(
            env,
            "component",
            step,
            f"stream {stream} is not sliced out: {total} wide as handed on, which is "
            f"not {streams} streams of width {width}",
        )
    size = total // streams
    return (Ellipsis, slice(stream * size, (stream + 1) * size))


def read(model: Any, step: Step, env: Env | None = None) -> Any:
    """The tensor at a step as components hand it on: flat per-head places, only the
    step's positions (``index``) along its sequence axis, one head's or one stream's
    slice; with ``held``, the whole tensor as the model holds it."""
    native = whole_value(model, step, env, edit=True)
    if step["held"]:
        return native
    value = _flat(step["layout"], native)
    if step["index"] is not None:
        value = take_positions(value, step["index"], _axis(step))
    if step["head"] is not None:
        _heads_checked(step, native, env)
        value = value[head_slice(step)]
    if step["stream"] is not None:
        value = value[stream_slice(step, value, env)]
    if _on_the_path(step, native, env):
        # a part of the place, cut off the tensor the forward goes on with, is off the
        # autograd path; the forward goes on with the place rebuilt from the part
        # (the same values), so a gradient with respect to the read is the place's
        # there
        rebuilt = step.copy()
        rebuilt["value"] = value
        write(model, rebuilt, env)
    return value


def _on_the_path(step: Step, native: Any, env: Env | None) -> bool:
    """Whether a read cut to positions, a head or a stream is put back into the
    forward: on a client engine, where autograd records the forward (a gradient is
    wanted, the place's tensor requires one) and the place is the model's own tensor
    (not a computed one)."""
    if env is None or step["heads_through"] is not None:
        return False
    if step["index"] is None and step["head"] is None and step["stream"] is None:
        return False
    import torch

    return bool(torch.is_grad_enabled() and getattr(native, "requires_grad", False))


def write(model: Any, step: Step, env: Env | None = None) -> None:
    """Write the step's value (as ``read`` hands it on) after checking that it fits: a
    head's or a stream's write replaces that slice only, a write at positions those
    tokens only, every other position as the model computed it."""
    target, whole, raw = _raw(model, step, env)
    native = _meant(step, raw, env)
    flat = _flat(step["layout"], native)
    if step["head"] is not None:
        _heads_checked(step, native, env)
    where = step["where"]
    part = flat
    if step["index"] is not None:
        part = take_positions(flat, step["index"], _axis(step))
    want = part
    if step["head"] is not None:
        where = f"head {step['head']} of {where}"
        want = part[head_slice(step)]
    if step["stream"] is not None:
        where = f"stream {step['stream'][0]} of {where}"
        want = part[stream_slice(step, part, env)]
    value = step["value"]
    if isinstance(value, tuple):  # a mechanism's edit (causalab_mini.mechanisms)
        value = edited(value, want, env is None, where, env and env.write_error)
    elif env is None:
        # the value crossed the wire on the CPU; the server's model may sit elsewhere
        value = value.to(want.device) if hasattr(value, "to") else value
    check_value(where, value, want, env and env.write_error)
    if step["head"] is not None or step["stream"] is not None:
        assembled = part.clone()
        slot = head_slice(step) if step["head"] is not None else stream_slice(step, part, env)
        assembled[slot] = value
        value = assembled
    if step["index"] is not None:
        value = put_positions(flat, step["index"], _axis(step), value)
    value = _native(step["layout"], value, native)
    if native.is_contiguous() and not value.is_contiguous():
        # laid out as the model's own tensor was: a forward may .view() it (GPT-NeoX-
        # Japanese's _attn views the query it is given)
        value = value.contiguous()
    _put_raw(step, target, whole, raw, value, env)


def edited(
    edit: tuple[Any, ...], current: Any, move: bool = False, where: str = "", error: Any = None
) -> Any:
    """What the tensor ``current`` (as a read hands it on) becomes under a mechanism's
    plain edit (``causalab_mini.mechanisms``: each mechanism's ``lowered()``, its
    ``apply`` said in plain data); ``move``: tensors that crossed the wire go to
    ``current``'s device. A value broadcasts where the mechanism says (a vector of the
    last axis's width, one row's shape), else is refused (``error``); the write's checks
    then hold for the result."""
    kind = edit[0]
    args = [a.to(current.device) if move and hasattr(a, "to") else a for a in edit[1:]]
    fits = (tuple(current.shape[-1:]), tuple(current.shape[1:]), tuple(current.shape))
    for a in args if kind != "resample" else ():
        shape = tuple(getattr(a, "shape", ()))
        if shape and shape not in fits:
            raise (error or _server_write_error)(
                f"a {kind} value of shape {shape} does not broadcast to {where}, which is "
                f"{tuple(current.shape)} here: give a vector of width {current.shape[-1]}, one "
                f"row's shape {tuple(current.shape[1:])}, or the exact shape"
            )
    if kind == "resample":
        rows, reference = args
        shape = tuple(getattr(reference, "shape", current.shape))
        if len(rows) != int(current.shape[0]) or shape[1:] != tuple(current.shape[1:]):
            raise (error or _server_write_error)(
                f"Resample gives {len(rows)} rows of {shape[1:]} and {where} holds "
                f"{tuple(current.shape)} here: give one row index per row of the batch, from "
                "a reference read at the same address"
            )
    if kind == "add":
        return current + args[0]
    if kind == "scale":
        return current * args[0]
    if kind == "lerp":
        value = args[0]
        value = value.expand(current.shape) if value.shape != current.shape else value
        return current.lerp(value, args[1])
    if kind == "zero":
        return current.new_zeros(current.shape)
    if kind == "fill":
        value = args[0]
        return (value.expand(current.shape) if value.shape != current.shape else value).clone()
    if kind == "resample":
        rows, reference = args
        source = current if reference is None else reference
        index = [int(r) for r in rows]
        return source[index]
    if kind == "clamp":
        return current.clamp(min=args[0], max=args[1])
    if kind == "project_out":
        unit = args[0]
        return current - (current @ unit).unsqueeze(-1) * unit
    if kind == "renormalize":
        moved = current + args[0]
        return moved * (current.norm(dim=-1, keepdim=True) / moved.norm(dim=-1, keepdim=True))
    raise ValueError(f"causalab_mini: unknown edit {kind!r} in a write step")


def _open_sources(step: Step, env: Env | None) -> None:
    """Open the ``.source`` of the operations the client says to open at this step
    (before any of the module's operations is read on nnsight 0.6/0.7, after the
    operation's inputs on 0.8: see ``causalab_mini.lower._nested_sources_due``); on the
    client by the operation's name, on a server by its needle."""
    for envoy, needle, name in step["nested"]:
        if env is not None and name is not None:
            getattr(envoy.source, name).source  # noqa: B018
        else:
            _find(envoy.source, needle, step["where"]).source  # noqa: B018


def run(
    model: Any, program: tuple[Step, ...], expected: dict[str, Any] | None, env: Env | None = None
) -> list[Any]:
    """Run ``program`` in the current trace of ``model``; return the reads, in order.
    ``expected`` (what the client compiled for) is checked first on a server; ``env``
    is the client's ``model.internals`` where the program runs on the client."""
    if expected is not None:
        check_server(model, expected)
    reads = []
    for step in program:
        _open_sources(step, env)
        edit, then = step.get("edit"), step.get("then")
        if step["write"] and edit is not None:
            # the value made of the place's own tensor, as a read hands it on
            made = step.copy()
            made["value"] = edit(read(model, step, env))
            write(model, made, env)
        elif step["write"]:
            write(model, step, env)
        else:
            value = read(model, step, env)
            reads.append(then(value) if then is not None else value)
    return reads
