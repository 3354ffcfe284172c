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
    from typing import Any


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


def _find(source: Any, needle: str, where: str) -> Any:
    """The operation of ``source`` that the call-shaped ``needle`` names, resolved as
    ``causalab_mini.ops.find_op`` resolves it: a name ``<callable>_<n>`` whose source
    line holds the call. None or several is refused with the operation list."""
    text_of, line_of, accessor = _parsed(source)
    stem = needle.split("(", 1)[0].replace(".", "_") + "_"
    lines = text_of.split("\n")
    hits = []
    for name, index in line_of.items():
        if not name.startswith(stem) or not name[len(stem) :].isdigit():
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


def _target(model: Any, step: dict[str, Any]) -> Any:
    """The Envoy (module or operation) whose boundary a step reads or writes; a step
    at the model itself holds no Envoy (the model it names is the one running)."""
    target = model if step["envoy"] is None else step["envoy"]
    for needle in step["ops"]:
        target = _find(target.source, needle, step["where"])
    return target


def _select_get(value: Any, select: Any) -> Any:
    if select is None:
        return value
    if select[0] == "first":
        return value[0] if isinstance(value, (tuple, list)) else value
    return value[select[1]]


def _replace_part(value: Any, key: Any, new: Any) -> Any:
    from collections.abc import Mapping

    if isinstance(value, tuple):
        items = list(value)
        items[key] = new
        if hasattr(value, "_fields"):
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
    raise TypeError(f"cannot replace part {key!r} of a {type(value).__name__}")


def _select_put(value: Any, select: Any, new: Any) -> Any:
    if select is None:
        return new
    if select[0] == "first":
        return _replace_part(value, 0, new) if isinstance(value, (tuple, list)) else new
    return _replace_part(value, select[1], new)


def _whole(model: Any, step: dict[str, Any]) -> Any:
    """The tensor at the step's place as the model holds it (all heads)."""
    target = _target(model, step)
    if step["take"] is not None:
        what, index = step["take"]
        if what == "arg":
            return target.inputs[0][index]
        value = target.output
        return value[index] if isinstance(value, (tuple, list)) else value
    value = _select_get(getattr(target, step["attr"]), step["select"])
    if step["copy"]:
        value = value.clone()
    if step["scale"] is not None:
        value = value * step["scale"]
    return value


def _flat(layout: Any, native: Any) -> Any:
    # several residual streams (streams_<layout>): handed on (batch, seq, n x hidden)
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


def _head(step: dict[str, Any]) -> tuple[Any, ...]:
    what, start, size = step["head"]
    if what == "axis1":
        return (slice(None), start)
    return (Ellipsis, slice(start, start + size))


def _put(model: Any, step: dict[str, Any], value: Any) -> None:
    """Hand the model ``value`` (as it holds it) at the step's place."""
    target = _target(model, step)
    if step["take"] is not None:
        what, index = step["take"]
        if what == "arg":
            args, kwargs = target.inputs
            target.inputs = ((*args[:index], value, *args[index + 1 :]), kwargs)
        else:
            out = target.output
            if isinstance(out, (tuple, list)):
                target.output = _replace_part(out, index, value)
            else:
                target.output = value
        return
    if step["scale"] is not None:
        value = value / step["scale"]
    attr = step["attr"]
    if step["in_place"]:
        current = _select_get(getattr(target, attr), step["select"])
        current[...] = value
        return
    if step["snapshot"]:
        # the forward modifies this tensor in place after the place: the model gets a
        # copy, so the value handed in (perhaps a saved read) keeps what it holds
        value = value.clone()
    if step["select"] is not None:
        value = _select_put(getattr(target, attr), step["select"], value)
    setattr(target, attr, value)


def _write(model: Any, step: dict[str, Any]) -> None:
    native = _whole(model, step)
    flat = _flat(step["layout"], native)
    value = step["value"]
    part = flat
    if step["index"] is not None:
        part = take_positions(flat, step["index"], step["axis"])
    want = part[_head(step)] if step["head"] is not None else part
    if tuple(value.shape) != tuple(want.shape):
        raise ValueError(
            f"causalab_mini: write refused: cannot write a tensor of shape "
            f"{tuple(value.shape)} to {step['where']}, which has shape {tuple(want.shape)}; "
            "nothing is broadcast"
        )
    if value.dtype != want.dtype:
        raise ValueError(
            f"causalab_mini: write refused: {step['where']} holds {want.dtype}; the value "
            f"is {value.dtype}"
        )
    # the value crossed the wire on the CPU; the server's model may sit elsewhere
    value = value.to(want.device)
    if step["head"] is not None:
        whole = part.clone()
        whole[_head(step)] = value
        value = whole
    if step["index"] is not None:
        value = put_positions(flat, step["index"], step["axis"], value)
    value = _native(step["layout"], value, native)
    if native.is_contiguous() and not value.is_contiguous():
        value = value.contiguous()  # laid out as the model's own (a forward may .view it)
    _put(model, step, value)


def _open_sources(step: dict[str, Any]) -> None:
    """Open the ``.source`` of the operations the client says to open at this step
    (before any of the module's operations is read on nnsight 0.6/0.7, after the
    operation's inputs on 0.8: see ``causalab_mini.plan._nested_sources_due``)."""
    for envoy, needle in step["nested"]:
        _find(envoy.source, needle, step["where"]).source  # noqa: B018


def run(model: Any, program: tuple[Any, ...], expected: dict[str, Any]) -> list[Any]:
    """Run ``program`` in the current trace of ``model``; return the reads, in order."""
    check_server(model, expected)
    reads = []
    for step in program:
        _open_sources(step)
        if step["write"]:
            _write(model, step)
            continue
        value = _whole(model, step)
        if not step["held"]:
            value = _flat(step["layout"], value)
            if step["index"] is not None:
                value = take_positions(value, step["index"], step["axis"])
            if step["head"] is not None:
                value = value[_head(step)]
        reads.append(value)
    return reads
