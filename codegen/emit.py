"""Python source for registry data, laid out as ``ruff format`` lays it out.

`registry gen` does not run a formatter: the emitter writes each table statement in
the layout ruff's (black-style) rules give it at line length 100, so the committed
modules pass ``ruff format --check`` as they come out (a test holds that), and ruff
is only a tool of the developers, not a dependency of the package.

The rules, for an expression at an indentation, with the text before it on its line
(``"name": ``, ``key=``, an assignment's target) and after it (``,``):

1. it fits in 100 columns: one line;
2. a bracket (a call, tuple or mapping) that does not fit opens on the first line and
   closes on its own line, and between them
   - a sole element (not a one-tuple) is laid out by these rules at one indent more,
     with no comma after it;
   - otherwise a call's arguments all on one line, if that fits, with no comma after
     the last (a tuple's or a mapping's elements never share a line once split);
   - otherwise one element a line, each with a comma after it (the magic trailing
     comma, which tells ruff to keep them apart);
3. a string or a name that does not fit stays as it is (ruff never splits one).

Strings take double quotes unless that needs more escapes (ruff's preference); every
string is ``repr()``-escaped, so no registry text becomes code.
"""

from __future__ import annotations

import dataclasses
import math
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from functools import cache, cached_property
from typing import Any

from causalab_mini.errors import CausalabError

LINE_LENGTH = 100
INDENT = "    "

__all__ = [
    "LINE_LENGTH",
    "Atom",
    "Bracket",
    "EmitError",
    "assign",
    "call",
    "flat",
    "layout",
    "mapping",
    "node",
    "proxy",
    "py_str",
    "ref",
    "tuple_of",
]


class EmitError(CausalabError):  # type: ignore[misc]  # Any to mypy
    """A value the emitter cannot write as data."""


@dataclass(frozen=True)
class Atom:
    """Source text that is never split: a literal, a name, a subscript."""

    text: str

    @property
    def flat(self) -> str:
        return self.text


@dataclass(frozen=True)
class Bracket:
    """``head`` then ``open`` elements ``close``: a call (head is the callable), a
    tuple or a mapping. Each element is (the text before it, its node)."""

    open: str
    close: str
    items: tuple[tuple[str, Node], ...]
    head: str = ""
    one_tuple: bool = False

    @cached_property
    def flat(self) -> str:
        """On one line (computed once: layout asks at every depth)."""
        inner = ", ".join(before + child.flat for before, child in self.items)
        if self.one_tuple:
            inner += ","
        return f"{self.head}{self.open}{inner}{self.close}"


Node = Atom | Bracket


# ------------------------------------------------------------------ leaves


def py_str(text: str) -> str:
    """A string literal as ruff writes it: ``repr()``'s escapes, double quotes unless
    the text holds more double quotes than single ones."""
    if "'" not in text and '"' not in text:
        return '"' + repr(text)[1:-1] + '"'  # repr chose ', and escaped nothing else
    quote = "'" if text.count('"') > text.count("'") else '"'
    out = [quote]
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch == quote:
            out.append("\\" + ch)
        elif ch in "'\"":
            out.append(ch)
        else:
            out.append(repr(ch)[1:-1])
    out.append(quote)
    return "".join(out)


def _number(value: int | float) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return 'float("nan")'
        if math.isinf(value):
            return 'float("inf")' if value > 0 else 'float("-inf")'
    return repr(value)


# ------------------------------------------------------------------ data -> nodes


def node(value: Any) -> Node:
    """The node of a registry value: None, booleans, numbers, strings, enums, tuples,
    mappings (as ``MappingProxyType``) and the frozen row types (as constructor calls
    that leave out fields at their defaults, but keep a non-empty ``doc``)."""
    if isinstance(value, (Atom, Bracket)):
        return value
    if value is None or isinstance(value, bool):
        return Atom(repr(value))
    if isinstance(value, Enum):
        return Atom(f"{type(value).__name__}.{value.name}")
    if isinstance(value, (int, float)):
        return Atom(_number(value))
    if isinstance(value, str):
        return Atom(py_str(value))
    if isinstance(value, tuple):
        return tuple_of(value)
    if isinstance(value, Mapping):
        return proxy(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        kwargs: dict[str, Any] = {}
        for name, default in _fields(type(value)):
            current = getattr(value, name)
            if default is not dataclasses.MISSING and current == default:
                if not (name == "doc" and current):
                    continue
            kwargs[name] = current
        return call(type(value).__name__, **kwargs)
    raise EmitError(f"cannot emit a value of type {type(value).__name__}: {value!r}")


@cache
def _fields(kind: type) -> tuple[tuple[str, Any], ...]:
    """A dataclass's fields and their defaults (MISSING where there is none)."""
    out = []
    for f in dataclasses.fields(kind):
        default = f.default
        if default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        out.append((f.name, default))
    return tuple(out)


def call(head: str, *args: Any, **kwargs: Any) -> Bracket:
    """``head(args..., key=value...)``."""
    items = [("", node(a)) for a in args] + [(f"{k}=", node(v)) for k, v in kwargs.items()]
    return Bracket("(", ")", tuple(items), head=head)


def tuple_of(values: Any) -> Bracket:
    items = tuple(("", node(v)) for v in values)
    return Bracket("(", ")", items, one_tuple=len(items) == 1)


def mapping(values: Mapping[str, Any]) -> Bracket:
    """A dict display ``{key: value, ...}`` (string keys)."""
    return Bracket("{", "}", tuple((f"{py_str(k)}: ", node(v)) for k, v in values.items()))


def proxy(values: Mapping[str, Any]) -> Bracket:
    """``MappingProxyType({...})``: a read-only mapping."""
    return Bracket("(", ")", (("", mapping(values)),), head="MappingProxyType")


def ref(table: str, key: str) -> Atom:
    """``table["key"]``: an entry of a table emitted earlier."""
    return Atom(f"{table}[{py_str(key)}]")


# ------------------------------------------------------------------ layout


def _width(text: str) -> int:
    """Columns ``text`` takes, as ruff counts them (wide East Asian characters take
    two, combining marks none)."""
    if text.isascii():
        return len(text)
    total = 0
    for ch in text:
        if unicodedata.combining(ch):
            continue
        total += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
    return total


def flat(item: Node) -> str:
    """The node on one line."""
    return item.flat


def _fits(depth: int, text: str) -> bool:
    return len(INDENT) * depth + _width(text) <= LINE_LENGTH


def layout(item: Node, depth: int = 0, before: str = "", after: str = "") -> list[str]:
    """The lines of ``before + item + after`` at ``depth`` indents, laid out by the
    rules in this module's docstring."""
    pad = INDENT * depth
    one_line = before + item.flat + after
    if isinstance(item, Atom) or not item.items or _fits(depth, one_line):
        return [pad + one_line]
    lines = [pad + before + item.head + item.open]
    if len(item.items) == 1 and not item.one_tuple:
        ((child_before, child),) = item.items
        lines += layout(child, depth + 1, child_before)
    else:
        joined = ", ".join(b + c.flat for b, c in item.items)
        if item.head and _fits(depth + 1, joined):  # a call's arguments may share a line
            lines.append(pad + INDENT + joined)
        else:
            for child_before, child in item.items:
                lines += layout(child, depth + 1, child_before, ",")
    lines.append(pad + item.close + after)
    return lines


def assign(target: str, value: Any) -> str:
    """A module-level statement ``target = value``, laid out (no trailing newline).

    A value that cannot be split (a long string) and does not fit goes inside
    parentheses on a line of its own where ruff puts it there: after an annotated
    target always, after a plain one where that makes it fit."""
    item = node(value)
    before = f"{target} = "
    if (
        isinstance(item, Atom)
        and not _fits(0, before + item.text)
        and (":" in target or _fits(1, item.text))
    ):
        return f"{before}(\n{INDENT}{item.text}\n)"
    return "\n".join(layout(item, 0, before))
