"""Read registry YAML into plain data, keeping the position of every node.

The file is *composed* (parsed to a node graph) and never *constructed*: no tag can
make the loader build a Python object. Scalars are resolved by their YAML 1.2 core
tag only; any other tag is an error. Positions are 1-based (line, column).

The composer is ruamel's pure-Python one. libyaml's (ruamel.yaml.clib) is about six
times faster and keeps line and column, but it is not the same YAML: it accepts block
scalars and flow text the pure composer refuses, marks an empty value elsewhere, and
reads YAML 1.1 (``\x85`` and ``\u2028`` break lines); the lint cache makes the parse
rare instead (`codegen/cache.py`). ruamel is imported only when a file is parsed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from causalab_mini.errors import CausalabError

from .diagnostics import Diagnostic

if TYPE_CHECKING:
    from ruamel.yaml.nodes import Node, ScalarNode

JsonPath = tuple[str | int, ...]

_CORE = "tag:yaml.org,2002:"


@dataclass
class Loaded:
    """One file's data with the position of each value and mapping key."""

    path: Path
    data: Any = None
    values: dict[JsonPath, tuple[int, int]] = field(default_factory=dict)
    keys: dict[JsonPath, tuple[int, int]] = field(default_factory=dict)

    def where(self, path: JsonPath, *, key: bool = False) -> tuple[int, int]:
        """The closest known position of ``path`` (its key's, if ``key``)."""
        if key and path in self.keys:
            return self.keys[path]
        probe = tuple(path)
        while probe:
            if probe in self.values:
                return self.values[probe]
            probe = probe[:-1]
        return self.values.get((), (1, 1))


class _Invalid(CausalabError):  # type: ignore[misc]  # Any to mypy
    def __init__(self, node: Node, code: str, message: str) -> None:
        super().__init__(message)
        self.node = node
        self.code = code
        self.message = message


def _pos(node: Node) -> tuple[int, int]:
    mark = node.start_mark
    return (mark.line + 1, mark.column + 1)


def _tag(node: Node) -> str:
    tag = node.tag
    value = getattr(tag, "value", tag)
    return str(value)


def _scalar(node: ScalarNode) -> Any:
    tag = _tag(node)
    text = node.value
    if tag == _CORE + "str":
        # a round-trip parser marks where a folded (>) scalar was folded with BEL
        return text.replace("\a", "") if node.style == ">" else text
    if tag == _CORE + "null":
        return None
    if tag == _CORE + "bool":
        return text.lower() == "true"
    if tag == _CORE + "int":
        cleaned = text.replace("_", "")
        try:
            return int(cleaned, 0)
        except ValueError:
            pass
        try:
            return int(cleaned, 10)
        except ValueError:
            return text  # the resolver's pattern is looser than a number ('0x_'): text
    if tag == _CORE + "float":
        lowered = text.lower().replace("_", "")
        if lowered in (".inf", "+.inf"):
            return math.inf
        if lowered == "-.inf":
            return -math.inf
        if lowered == ".nan":
            return math.nan
        try:
            return float(lowered)
        except ValueError:
            return text  # as for ints ('._')
    shown = "!!" + tag[len(_CORE) :] if tag.startswith(_CORE) else tag
    raise _Invalid(
        node,
        "Y002",
        f"the tag {shown!r} is not allowed: registry files hold plain strings, numbers, "
        "booleans, null, lists and mappings. Remove the tag.",
    )


def _convert(node: Node, path: JsonPath, out: Loaded, depth: int = 0) -> Any:
    from ruamel.yaml.nodes import MappingNode, ScalarNode, SequenceNode

    if depth > 64:
        raise _Invalid(node, "Y004", "nesting deeper than 64 levels; flatten the file")
    out.values[path] = _pos(node)
    if isinstance(node, ScalarNode):
        return _scalar(node)
    tag = _tag(node)
    if isinstance(node, SequenceNode):
        if tag != _CORE + "seq":
            raise _Invalid(node, "Y002", f"the tag {tag!r} is not allowed on a list; remove it.")
        return [_convert(item, (*path, i), out, depth + 1) for i, item in enumerate(node.value)]
    if isinstance(node, MappingNode):
        if tag != _CORE + "map":
            raise _Invalid(node, "Y002", f"the tag {tag!r} is not allowed on a mapping; remove it.")
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode):
                raise _Invalid(key_node, "Y005", "a mapping key must be a plain string")
            key = _scalar(key_node)
            if isinstance(key, bool) or key is None or isinstance(key, float):
                raise _Invalid(
                    key_node,
                    "Y005",
                    f"the key {key_node.value!r} is read as {type(key).__name__}; "
                    "quote it to make it a string",
                )
            key = str(key)
            if key in result:
                raise _Invalid(
                    key_node,
                    "Y003",
                    f"the key {key!r} appears twice in this mapping; keep one",
                )
            out.keys[(*path, key)] = _pos(key_node)
            result[key] = _convert(value_node, (*path, key), out, depth + 1)
        return result
    raise _Invalid(node, "Y001", "unexpected YAML node")


def load_file(path: Path, display: str) -> tuple[Loaded, list[Diagnostic]]:
    """Load ``path``; ``display`` is how diagnostics name it."""
    out = Loaded(path=path)
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return out, [Diagnostic(display, 1, 1, "F003", "-", f"cannot read the file: {exc}")]
    return load_text(text, display, out)


def load_text(
    text: str, display: str, out: Loaded | None = None
) -> tuple[Loaded, list[Diagnostic]]:
    out = out if out is not None else Loaded(path=Path(display))
    from ruamel.yaml import YAML
    from ruamel.yaml.error import MarkedYAMLError, YAMLError

    # the safe composer: the same YAML 1.2 nodes and marks as the round-trip one, without
    # gathering comments (which took a third of `registry lint`)
    yaml = YAML(typ="safe", pure=True)
    try:
        node = yaml.compose(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
        problem = exc.problem or exc.context or "invalid YAML"
        return out, [Diagnostic(display, line, col, "Y001", "-", f"YAML syntax error: {problem}")]
    except (YAMLError, ValueError, TypeError, RecursionError) as exc:
        return out, [Diagnostic(display, 1, 1, "Y001", "-", f"YAML syntax error: {exc}")]
    if node is None:
        out.data = None
        out.values[()] = (1, 1)
        return out, []
    try:
        out.data = _convert(node, (), out)
    except _Invalid as exc:
        line, col = _pos(exc.node)
        return out, [Diagnostic(display, line, col, exc.code, "-", exc.message)]
    except RecursionError:
        return out, [Diagnostic(display, 1, 1, "Y004", "-", "nesting too deep; flatten the file")]
    return out, []
