"""What an attention forward's source says about an interior taken at one call and
read again at a later one (interiors.yaml, ``reaches``): whether the call runs on this
layer, and whether what it returns is what the later call receives, unchanged.

The pre-rotary query and key are the arguments of the family's rotary call
(``query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos,
sin)``); they are the place the rotary of which is ``attention_query`` only where

- the layer makes the call: a call on a branch (``if self.sliding_window is not
  None:``) is made on the layers whose condition holds, and a trace cannot wait on a
  call that never comes. A condition on the attention module alone (``self.…``) is
  decided per layer on the layer's own module; one on what the forward is given
  (``position_embeddings is not None``) cannot be decided before the forward runs;
- the call hands its i-th argument back rotated as element i of the tuple it assigns
  (a call that rotates the query alone, ``query_states = apply_rotary_pos_emb(
  query_states, cos, sin)``, has no key argument);
- the attention function receives that name, and nothing between the two calls
  assigns it again (a q/k norm after the rotary, kv heads tiled with ``.repeat``); the
  cache's ``update``, which on a forward with no earlier keys hands back the key it is
  given, is not such an assignment.

Each rule reads the source of the module class's forward (the function nnsight parses)
with :mod:`ast`; a forward whose source cannot be read, or where a needle names no
single call, is left to the operation lookup, which refuses with its own reason.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["FlowRefusal", "calls_by_layer", "flow_refusal"]


@dataclass(frozen=True)
class FlowRefusal:
    """Why the place is not on this layer (``per_layer``) or on any layer."""

    reason: str
    per_layer: bool


def _forward_tree(module: Any) -> tuple[str, ast.FunctionDef] | None:
    forward = inspect.unwrap(type(module).forward)
    try:
        source = textwrap.dedent(inspect.getsource(forward))
    except (OSError, TypeError):
        return None
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    fn = tree.body[0] if tree.body else None
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    return source, fn  # type: ignore[return-value]


def _flat(text: str) -> str:
    """A call's text on one line, no space after an opening parenthesis."""
    return re.sub(r"\(\s+", "(", re.sub(r"\s+", " ", text))


def _calls_of(source: str, fn: ast.AST, needle: str) -> list[ast.Call]:
    hits = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            text = ast.get_source_segment(source, node) or ""
            if _flat(text).startswith(needle):
                hits.append(node)
    return hits


def _parents(fn: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(fn) for child in ast.iter_child_nodes(node)}


def _conditions(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> list[tuple[ast.expr, bool]]:
    """The tests of the ``if`` statements and conditional expressions ``node`` sits
    under, each with whether ``node`` is on its true side, innermost first."""
    out: list[tuple[ast.expr, bool]] = []
    while node in parents:
        parent = parents[node]
        if isinstance(parent, (ast.If, ast.IfExp)) and node is not parent.test:
            body = parent.body if isinstance(parent, ast.If) else [parent.body]
            out.append((parent.test, any(node is n for n in body)))
        node = parent
    return out


def _decide(test: ast.expr, module: Any) -> bool | None:
    """The test's value on ``module`` where it names nothing but ``self`` (the
    attention module's attributes and its config); None where it names anything else
    (what the forward is given, a local)."""
    names = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
    if names - {"self"}:
        return None
    if any(isinstance(n, (ast.Call, ast.Lambda, ast.NamedExpr)) for n in ast.walk(test)):
        return None
    try:
        code = compile(ast.Expression(body=test), "<condition>", "eval")
        return bool(eval(code, {"__builtins__": {}}, {"self": module}))
    except Exception:
        return None


def _branch(
    test: ast.expr,
    side: bool,
    module: Any,
    needle: str,
    layer: int,
    ran: Callable[[], bool | None] | None,
) -> FlowRefusal | None:
    text = ast.unparse(test)
    said = f"`if {text}`" + ("" if side else " (its else branch)")
    value = _decide(test, module)
    measured = ran() if value is None and ran is not None else None
    if measured is True:
        return None  # the layer made the call on a forward (calls_by_layer)
    if measured is False:
        return FlowRefusal(
            f"layer {layer}'s attention made no call {needle}...) on a forward of a short "
            f"text: it is under {said}, which the forward decides per layer (a layer given "
            "no position embeddings, such as a no-position or full-attention layer, "
            "skips it)",
            per_layer=True,
        )
    if value is None:
        names = sorted({n.id for n in ast.walk(test) if isinstance(n, ast.Name)} - {"self"})
        return FlowRefusal(
            f"its attention's forward makes the call {needle}...) only under {said}, "
            f"which depends on {', '.join(names) or 'a call'} (what the forward is given or "
            "computes, not the attention module's own attributes), so whether a layer makes "
            "the call is decided only while the layer runs (a layer given no position "
            "embeddings skips it), and a trace cannot wait on a call that may never come",
            per_layer=False,
        )
    if value != side:
        return FlowRefusal(
            f"layer {layer}'s attention skips its call {needle}...): {said} is "
            f"{not side} on this layer's module (a layer with no rotary embedding, such "
            "as a sliding-window or no-position layer)",
            per_layer=True,
        )
    return None


def _assigned(stmt: ast.stmt) -> set[str]:
    targets: list[ast.expr] = []
    if isinstance(stmt, ast.Assign):
        targets = list(stmt.targets)
    elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign)):
        targets = [stmt.target]
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _is_cache_update(stmt: ast.stmt) -> bool:
    value = getattr(stmt, "value", None)
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr == "update"
    )


def flow_refusal(
    module: Any,
    needle: str,
    index: int,
    reaches_needle: str,
    reaches_arg: int,
    layer: int,
    ran: Callable[[], bool | None] | None = None,
) -> FlowRefusal | None:
    """Why argument ``index`` of the call ``needle`` in ``module``'s forward is not,
    on ``layer``, the place whose call's result the call ``reaches_needle`` receives
    as its argument ``reaches_arg``; None where it is (or the source cannot say).
    ``ran()`` says whether this layer made the call on a forward (``calls_by_layer``),
    asked only where a branch names what the forward is given; None where no forward
    could say."""
    parsed = _forward_tree(module)
    if parsed is None:
        return None
    source, fn = parsed
    calls, later = _calls_of(source, fn, needle), _calls_of(source, fn, reaches_needle)
    if len(calls) != 1 or len(later) != 1:
        return None
    call, receiving = calls[0], later[0]
    parents = _parents(fn)
    for test, side in _conditions(call, parents):
        branch = _branch(test, side, module, needle, layer, ran)
        if branch is not None:
            return branch
    stmt = parents.get(call)
    target = _assigned_element(stmt, index)
    if target is None:
        text = _flat(ast.get_source_segment(source, stmt or call) or "")
        return FlowRefusal(
            f"its attention's forward does not take argument {index} of the rotary call "
            f"back as element {index} of what it assigns (`{text}`): it rotates one "
            "tensor per call, or hands back something else",
            per_layer=False,
        )
    if reaches_arg >= len(receiving.args):
        return None
    given = receiving.args[reaches_arg]
    if not (isinstance(given, ast.Name) and given.id == target):
        return FlowRefusal(
            f"the attention function receives `{ast.unparse(given)}`, not `{target}`, "
            f"which the call {needle}...) assigns",
            per_layer=False,
        )
    start = getattr(stmt, "end_lineno", None) or call.lineno
    return _changed_between(source, fn, parents, module, target, start, receiving.lineno)


def _assigned_element(stmt: Any, index: int) -> str | None:
    """The name element ``index`` of a tuple assignment ``stmt`` binds, or None."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        names = stmt.targets[0]
        if isinstance(names, ast.Tuple) and index < len(names.elts):
            element = names.elts[index]
            return element.id if isinstance(element, ast.Name) else None
    return None


def _changed_between(
    source: str, fn: Any, parents: Any, module: Any, target: str, start: int, end: int
) -> FlowRefusal | None:
    """Why ``target`` is not what it was at line ``start`` when line ``end`` runs: an
    assignment to it between the two on a branch this module takes (a cache update and
    a name assigned to itself aside); None where there is none."""
    for node in ast.walk(fn):
        if not isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            continue
        if not start < node.lineno < end or target not in _assigned(node):
            continue
        if _is_cache_update(node):
            continue
        value = getattr(node, "value", None)
        if isinstance(node, ast.Assign) and isinstance(value, ast.Name) and value.id == target:
            continue  # `query_states = query_states` (T5Gemma-2) changes nothing
        skipped = any(
            _decide(test, module) is (not side) for test, side in _conditions(node, parents)
        )
        if skipped:
            continue  # on a branch this layer does not take
        text = _flat(ast.get_source_segment(source, node) or ast.unparse(node))
        return FlowRefusal(
            f"its attention's forward changes `{target}` after the rotary and before the "
            f"attention function receives it (`{text}`), so the attention's tensor is not "
            "the rotary of this one",
            per_layer=False,
        )
    return None


def calls_by_layer(root: Any, attentions: dict[int, Any], function: Any, inputs: Any) -> set[int]:
    """The layers whose attention module (``attentions``: layer -> module) runs
    ``function`` (its code object: however a forward reaches it, its module's global or
    a copy nnsight's rewritten forward holds) on one plain forward of ``root`` on
    ``inputs``: a profile function notes each call and each attention's pre-hook says
    which layer runs. Raises what the forward raises."""
    import sys

    import torch

    # a function, or a module whose forward it is (transformers' hub-kernel wrapper)
    inner = inspect.unwrap(getattr(function, "forward", function))
    code = getattr(inspect.unwrap(function), "__code__", None) or getattr(inner, "__code__", None)
    if code is None:
        raise TypeError(f"{function!r} is not a Python function")
    current: list[int | None] = [None]
    hits: set[int] = set()

    def profile(frame: Any, event: str, _arg: Any) -> None:
        if event == "call" and frame.f_code is code and current[0] is not None:
            hits.add(current[0])

    handles = []
    for layer, module in attentions.items():

        def enter(_module: Any, _args: Any, _layer: int = layer) -> None:
            current[0] = _layer

        def leave(_module: Any, _args: Any, _out: Any) -> None:
            current[0] = None

        handles.append(module.register_forward_pre_hook(enter))
        handles.append(module.register_forward_hook(leave))
    before = sys.getprofile()
    try:
        sys.setprofile(profile)
        with torch.no_grad():
            root(**inputs)
    finally:
        sys.setprofile(before)
        for handle in handles:
            handle.remove()
    return hits
