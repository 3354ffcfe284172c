"""Resolve a call-shaped needle to the one nnsight operation it names.

nnsight names an operation ``{callable}_{occurrence}``; which occurrence a call gets
depends on the installed nnsight (0.8 also counts assignments). So a row never names
an operation: it names a call site (``"attention_interface("``), and ``find_op``
finds the operation whose name has that callable's prefix *and* whose source line
holds the call. Zero or several matches are refused with the forward's whole
operation list.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Sequence
from typing import Any

from .compat import call_of_result_name, forward_key, parsed_source, source_identity
from .errors import CausalabError

# a needle naming the call of a call's result: a callable, its whole argument list,
# then "(" (``nn.Softmax(dim=-1)(``)
CALL_OF_RESULT = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*\([^()]*\)\($")


class OperationNotFound(CausalabError, LookupError):
    """A row's needle matches no operation, or several, in a forward's source."""


def needle_prefix(needle: str) -> str:
    """``nn.functional.softmax(`` -> ``nn_functional_softmax`` (nnsight's name stem);
    ``.sigmoid(``, a tensor method called on an expression's result (a call's or a
    subscript's, which has no name), -> ``sigmoid``: nnsight names it by the method;
    a call of what a call returns, ``nn.Softmax(dim=-1)(`` (a module built and called
    in one expression), -> ``call``: nnsight 0.8 names that second call ``call_<n>``,
    0.6/0.7 ``unknown_<n>`` (``compat.call_of_result_name``)."""
    if CALL_OF_RESULT.match(needle):
        return call_of_result_name()
    return needle.split("(", 1)[0].removeprefix(".").replace(".", "_")


def candidates(accessor: Any, needle: str) -> list[str]:
    """Operation names of ``accessor`` (a parsed forward: nnsight 0.8's ``Source``, 0.7's
    ``SourceAccessor``, 0.6's source envoy) that ``needle`` hits."""
    stem = re.compile(rf"^{re.escape(needle_prefix(needle))}_\d+$")
    source, line_of = parsed_source(accessor)
    lines = source.split("\n")
    hits = []
    for name, index in line_of.items():
        if not stem.match(name):
            continue
        text = lines[index] if 0 <= index < len(lines) else ""
        if _calls(text, needle):
            hits.append(name)
    return hits


def _calls(text: str, needle: str) -> bool:
    """Whether ``text`` holds the call ``needle``: not a longer name ending in it, and,
    where the needle names the first argument, not a longer argument starting with it.
    A needle with a leading "." is a method called on an expression's result, a call's
    or a subscript's (``x.view(...).transpose(``, ``g[..., 0].sigmoid(``), which has no
    name: it holds only right after a closing parenthesis or bracket."""
    for match in re.finditer(re.escape(needle), text):
        before = text[: match.start()]
        after = text[match.end() :]
        if needle.startswith("."):
            if not before.endswith((")", "]")):
                continue
        elif before and (before[-1].isalnum() or before[-1] in "_."):
            continue
        if not needle.endswith("(") and after and (after[0].isalnum() or after[0] == "_"):
            continue
        return True
    return False


def op_path(op: Any) -> str:
    """An operation's dotted path (``.path`` in nnsight 0.7 and 0.8, ``.name`` in 0.6)."""
    return str(getattr(op, "path", None) or op.name)


# Operation names by parsed forward (what nnsight hands out: 0.6/0.7's accessor, the
# code object of 0.8's compiled forward), held weakly: an entry lives exactly as long
# as its parsed forward, so a new one can never be handed the name another forward's
# needle resolved to (an ``id()`` key could be, once the old one is collected and its
# address reused).
_CACHE: weakref.WeakKeyDictionary[Any, dict[str, str]] = weakref.WeakKeyDictionary()


def find_op(
    source_envoy: Any,
    needle: str,
    *,
    row: str,
    module: str,
    model_class: str,
) -> Any:
    """The OperationEnvoy of ``source_envoy`` that ``needle`` names, or a refusal."""
    # nnsight 0.8 keeps the parsed forward on .compiled (a new Source per read), 0.7
    # on an accessor, 0.6 on the source envoy
    accessor = getattr(source_envoy, "accessor", source_envoy)
    try:
        names = _CACHE.setdefault(source_identity(source_envoy), {})
    except TypeError:  # not weakly referenceable or not hashable: resolve every time
        names = {}
    name = names.get(needle)
    if name is None:
        hits = candidates(accessor, needle)
        if len(hits) != 1:
            raise OperationNotFound(_message(accessor, needle, hits, row, module, model_class))
        name = hits[0]
        names[needle] = name
    return getattr(source_envoy, name)


def inner_op(op: Any, needles: Sequence[str], *, row: str, module: str, model_class: str) -> Any:
    """The operation ``needles`` name one inside another, starting in the forward of
    ``op`` (an operation of ``module``'s forward): each needle after a row's first."""
    for needle in needles:
        module = f"{module}.{op_path(op).split('.')[-1]}"
        op = find_op(op.source, needle, row=row, module=module, model_class=model_class)
    return op


# Operation names by (the module's true forward, needle): every module whose forward
# is the same function has the same operations under the same names. The key holds
# the function itself (a class's function, alive as long as its class), never its id.
_OP_NAMES: dict[tuple[Any, str], str] = {}


def op_name(envoy: Any, needle: str, *, row: str, module: str, model_class: str) -> str:
    """The name of the operation ``needle`` names in the forward of ``envoy``'s module.

    Resolved once per forward function: the layers of one class share it, so
    resolving layer 79 neither opens that layer's ``.source`` (nnsight parses and
    rewrites the forward for every module it opens) nor searches it again.
    """
    forward = forward_key(envoy._module)
    key = (forward, needle)
    name = _OP_NAMES.get(key) if forward is not None else None
    if name is None:
        op = find_op(envoy.source, needle, row=row, module=module, model_class=model_class)
        name = op_path(op).split(".")[-1]
        if forward is not None:
            _OP_NAMES[key] = name
    return name


def _message(
    accessor: Any, needle: str, hits: list[str], row: str, module: str, model_class: str
) -> str:
    import transformers

    version = transformers.__version__
    if hits:
        what = (
            f"calls {needle!r} at {len(hits)} operations ({', '.join(hits)}), so the needle "
            "does not say which; make it name one call site"
        )
    else:
        what = f"has no operation called as {needle!r}"
    listing = "\n".join("    " + line for line in str(accessor).split("\n"))
    return (
        f"{row}: the forward of {module} {what} with transformers {version} on {model_class}. "
        f"Fix the row's needle (registry/places.yaml, a family file, or interiors.yaml). "
        f"Its operations are:\n{listing}"
    )
