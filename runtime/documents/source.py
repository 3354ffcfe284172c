"""A document's text read as data, with the line and column of every key and value.

YAML and JSON alike go through ruamel.yaml's safe round-trip loader (JSON is YAML):
no tag constructs an object, so a document cannot run code by being read. The values
come back as plain dicts, lists and scalars, and beside them a map from each value's
path (a tuple of keys and indices) to where it is written (1-based line and column).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CausalabError

Path_ = tuple[str | int, ...]


class DocumentError(CausalabError, ValueError):
    """A document that cannot be run as written: every problem found, each as
    ``path:line:col: CODE message``."""

    def __init__(self, issues: list[Issue]) -> None:
        self.issues = list(issues)
        super().__init__("\n".join(str(i) for i in self.issues))


@dataclass(frozen=True)
class Issue:
    """One problem of a document, where it is written."""

    file: str
    line: int
    col: int
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}: {self.code} {self.message}"


@dataclass
class Source:
    """A loaded document: its values, where each is written, its file and bytes."""

    data: Any
    places: dict[Path_, tuple[int, int]] = field(default_factory=dict)
    path: Path = Path("<document>")
    raw: bytes = b""

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.raw).hexdigest()

    @property
    def folder(self) -> Path:
        return self.path.resolve().parent

    def where(self, path: Path_) -> tuple[int, int]:
        """The line and column of the value at ``path``, or of its nearest parent."""
        while path and path not in self.places:
            path = path[:-1]
        return self.places.get(path, (1, 1))

    def issue(self, path: Path_, code: str, message: str) -> Issue:
        line, col = self.where(path)
        return Issue(str(self.path), line, col, code, message)


def _plain(node: Any, path: Path_, places: dict[Path_, tuple[int, int]]) -> Any:
    """``node`` as plain Python, recording where each key's value is written."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    if isinstance(node, CommentedMap):
        out: dict[Any, Any] = {}
        for key, value in node.items():
            line, col = node.lc.key(key)
            places[(*path, str(key))] = (line + 1, col + 1)
            out[str(key)] = _plain(value, (*path, str(key)), places)
        return out
    if isinstance(node, CommentedSeq):
        items = []
        for i, value in enumerate(node):
            line, col = node.lc.item(i)
            places[(*path, i)] = (line + 1, col + 1)
            items.append(_plain(value, (*path, i), places))
        return items
    if isinstance(node, str):
        return str(node)
    if isinstance(node, bool) or node is None:
        return node
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    return node


def load(path: str | Path) -> Source:
    """Read the document at ``path`` (YAML or JSON); an unreadable or malformed file is
    a ``DocumentError`` (D001) at the line the parser stopped on."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import MarkedYAMLError

    file = Path(path)
    try:
        raw = file.read_bytes()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise DocumentError(
            [Issue(str(file), 1, 1, "D001", f"cannot read the document: {reason}")]
        ) from None
    try:
        node = YAML(typ="rt", pure=True).load(raw.decode("utf-8"))
    except (MarkedYAMLError, UnicodeDecodeError) as exc:
        mark = getattr(exc, "problem_mark", None)
        line, col = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise DocumentError(
            [Issue(str(file), line, col, "D001", f"not YAML or JSON: {problem}")]
        ) from None
    places: dict[Path_, tuple[int, int]] = {}
    data = _plain(node, (), places)
    if not isinstance(data, dict):
        raise DocumentError(
            [Issue(str(file), 1, 1, "D001", "a document is a mapping (document: 1, name: ...)")]
        )
    return Source(data, places, file, raw)


__all__ = ["DocumentError", "Issue", "Source", "load"]
