"""A document's rows: written inline, or read from a local JSONL, CSV or JSON file.

A data file is parsed as data (``json``, ``csv``), never imported or executed; a path
is taken relative to the document and must name a file. ``fields`` maps a role
(``base``, ``source``, ``answer``, ...) to the column that holds it, so a file written
for another tool is read as it is.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from dataclasses import dataclass
from typing import Any

from .source import Issue, Source

FORMATS = {".jsonl": "jsonl", ".csv": "csv", ".json": "json"}


@dataclass(frozen=True)
class Rows:
    """The rows a run evaluates (its split), each a mapping role -> text (``source``:
    a list of texts), and the digest of what they were read from."""

    rows: tuple[dict[str, Any], ...]
    digest: str
    origin: str  # "inline" or the file's path relative to the document


def _file_rows(text: str, fmt: str) -> list[Any]:
    if fmt == "jsonl":
        out = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except ValueError as exc:
                    raise ValueError(f"line {n} is not JSON: {exc}") from None
        return out
    if fmt == "csv":
        return list(csv.DictReader(io.StringIO(text)))
    loaded = json.loads(text)
    if not isinstance(loaded, list):
        raise ValueError("a JSON data file holds a list of rows (objects)")
    return loaded


def _mapped(raw: Any, n: int, fields: dict[str, str]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ValueError(f"row {n} is a {type(raw).__name__}, not an object of named fields")
    row: dict[str, Any] = {}
    for role, column in {**{k: k for k in raw if k not in fields.values()}, **fields}.items():
        if column not in raw:
            raise ValueError(
                f"row {n} has no field {column!r} (for {role}); its fields are {sorted(raw)}"
            )
        value = raw[column]
        if role == "source" and isinstance(value, list):
            value = [str(v) for v in value]
        elif not isinstance(value, str):
            value = str(value)
        row[role] = value
    if not row.get("base"):
        raise ValueError(f"row {n} has no base text (give fields: {{base: <column>}})")
    return row


def read_file(source: Source, data: dict[str, Any]) -> tuple[list[dict[str, Any]], str, str]:
    """The file's rows (roles mapped), its digest and its path as written; raises
    ``ValueError`` with what is wrong."""
    written = str(data["file"])
    path = source.folder / written
    if not path.is_file():
        raise FileNotFoundError(f"data file {written!r} ({path}) does not exist or is not a file")
    fmt = data.get("format") or FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ValueError(
            f"data file {written!r}: say its format (format: jsonl | csv | json); its suffix "
            f"{path.suffix!r} names none"
        )
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"data file {written!r} is not UTF-8 text: {exc}") from None
    try:
        loaded = _file_rows(text, fmt)
    except (ValueError, csv.Error) as exc:
        raise ValueError(f"data file {written!r} is not {fmt}: {exc}") from None
    if not loaded:
        raise ValueError(f"data file {written!r} holds no rows")
    fields = dict(data.get("fields") or {})
    rows = [_mapped(r, n, fields) for n, r in enumerate(loaded)]
    return rows, "sha256:" + hashlib.sha256(raw).hexdigest(), written


def _read(source: Source) -> tuple[Rows | None, list[Issue]]:
    """Every row of the data section (no split taken), or the issues found."""
    data = source.data.get("data")
    if not isinstance(data, dict):
        return None, []
    try:
        if "file" in data:
            rows, digest, origin = read_file(source, data)
        else:
            rows = [_mapped(r, n, {}) for n, r in enumerate(data.get("rows") or [])]
            canonical = json.dumps(rows, sort_keys=True, ensure_ascii=False).encode()
            digest, origin = "sha256:" + hashlib.sha256(canonical).hexdigest(), "inline"
    except FileNotFoundError as exc:
        return None, [source.issue(("data", "file"), "D030", str(exc))]
    except ValueError as exc:
        return None, [source.issue(("data",), "D031", str(exc))]
    return Rows(tuple(rows), digest, origin), []


def split_rows(source: Source, name: str, path: Any) -> tuple[Rows | None, list[Issue]]:
    """The rows of the split ``name`` (the issue at ``path`` where the data has no
    such split, or fewer rows than it names)."""
    everything, issues = _read(source)
    if everything is None:
        return None, issues
    splits = (source.data.get("data") or {}).get("splits") or {}
    if name not in splits:
        return None, [
            source.issue(path, "D032", f"split {name!r} is not among the splits {sorted(splits)}")
        ]
    start, stop = splits[name]
    if not start < stop <= len(everything.rows):
        return None, [
            source.issue(
                ("data", "splits", name),
                "D032",
                f"split {name!r} is rows [{start}, {stop}) and the data has "
                f"{len(everything.rows)} rows",
            )
        ]
    return Rows(everything.rows[start:stop], everything.digest, everything.origin), []


def rows_of(source: Source) -> tuple[Rows | None, list[Issue]]:
    """The rows of the document's data section (its split), or the issues found."""
    data = source.data.get("data")
    if isinstance(data, dict) and data.get("split") is not None:
        return split_rows(source, data["split"], ("data", "split"))
    return _read(source)


__all__ = ["Rows", "read_file", "rows_of", "split_rows"]
