"""A cache of parsed and schema-checked registry files, keyed by their content.

`registry lint` (and `gen`, which lints first) spends most of its time parsing YAML in
pure Python and validating it against the schemas. Both depend only on the bytes of a
file, the schema it is checked against, and the code and libraries that parse and
check. So the result of one file — its data, the position of every value and key, and
its load and schema diagnostics (without the path, which is added when read back) — is
stored under the sha256 of exactly those, and nothing else:

    key(file) = sha256(tool key, schema name, file bytes)
    tool key  = sha256(causalab-mini's and Python's versions, the loader's, the schema
                pass's and the schemas' own bytes, the versions of ruamel.yaml,
                jsonschema and referencing)

A changed byte in a file, a schema, the code or a library gives another key: a stale
entry is never read, it is only left behind (and pruned). The cross-row rules always
run on what the entries hold. A whole registry's entries are also stored together,
under the hash of all its files' keys, so a run where nothing changed reads one file.

Entries live in ``$CAUSALAB_MINI_CACHE/lint`` (default ``~/.cache/causalab_mini/lint``);
``CAUSALAB_MINI_LINT_CACHE=0`` turns the cache off. An entry that cannot be read or
written is a miss, never an error.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

from .diagnostics import Diagnostic
from .loader import JsonPath, Loaded

FORMAT = 1
# how many whole-registry entries and single-file entries to keep
KEEP_REGISTRIES = 16
KEEP_FILES = 4096

__all__ = ["Entry", "LintCache", "RenderCache", "cache_dir", "render_key", "tool_key"]


def cache_dir() -> Path | None:
    """Where entries live, or None when the cache is off."""
    if os.environ.get("CAUSALAB_MINI_LINT_CACHE", "1").lower() in ("0", "off", "false", "no"):
        return None
    root = os.environ.get("CAUSALAB_MINI_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "causalab_mini"
    return base / "lint"


def _distribution_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "?"


def _hash_files(h: Any, paths: list[Path]) -> None:
    for path in paths:
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")


@cache
def tool_key() -> str:
    """The sha256 of everything besides a file that decides what parsing and checking
    it gives."""
    from causalab_mini import __version__

    here = Path(__file__).resolve().parent
    python = "{}.{}".format(*sys.version_info[:2])  # unicodedata and re versions
    h = hashlib.sha256(f"causalab-mini lint cache {FORMAT} {__version__} {python}\0".encode())
    code = [here / "loader.py", here / "lint.py", here / "diagnostics.py", here / "cache.py"]
    schemas = (
        sorted((here.parent / "schema").glob("*.json")) if (here.parent / "schema").is_dir() else []
    )
    if not schemas:  # an installed package: the schemas are package data
        from importlib import resources

        folder = Path(str(resources.files("causalab_mini.schema")))
        schemas = sorted(folder.glob("*.json"))
    _hash_files(h, [*code, *schemas])
    for dist in ("ruamel.yaml", "jsonschema", "referencing"):
        h.update(f"{dist} {_distribution_version(dist)}\0".encode())
    return h.hexdigest()


class Entry:
    """One file's parse and schema pass: the data and positions (``loaded``), the
    diagnostics as (line, col, code, row, message), and whether it passed."""

    __slots__ = ("diags", "loaded", "passed")

    def __init__(self, loaded: Loaded, diags: list[tuple[int, int, str, str, str]], passed: bool):
        self.loaded = loaded
        self.diags = diags
        self.passed = passed

    @classmethod
    def of(cls, loaded: Loaded, diags: list[Diagnostic], passed: bool) -> Entry:
        return cls(loaded, [(d.line, d.col, d.code, d.row, d.message) for d in diags], passed)

    def diagnostics(self, display: str) -> list[Diagnostic]:
        return [Diagnostic(display, *d) for d in self.diags]

    def to_json(self) -> dict[str, Any]:
        return {
            "data": self.loaded.data,
            "values": [[list(p), line, col] for p, (line, col) in self.loaded.values.items()],
            "keys": [[list(p), line, col] for p, (line, col) in self.loaded.keys.items()],
            "diags": [list(d) for d in self.diags],
            "passed": self.passed,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any], path: Path) -> Entry:
        def positions(items: list[Any]) -> dict[JsonPath, tuple[int, int]]:
            return {tuple(p): (line, col) for p, line, col in items}

        loaded = Loaded(path, raw["data"], positions(raw["values"]), positions(raw["keys"]))
        diags = [(d[0], d[1], d[2], d[3], d[4]) for d in raw["diags"]]
        return cls(loaded, diags, bool(raw["passed"]))


class Store:
    """JSON entries in one directory, written whole or not at all."""

    def __init__(self, directory: Path | None = None) -> None:
        self.dir = directory if directory is not None else cache_dir()

    def read(self, name: str) -> Any:
        if self.dir is None:
            return None
        try:
            raw = json.loads((self.dir / name).read_bytes())
        except (OSError, ValueError):
            return None
        return raw if isinstance(raw, dict) and raw.get("format") == FORMAT else None

    def write(self, name: str, payload: dict[str, Any]) -> None:
        if self.dir is None:
            return
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=self.dir)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    json.dump({"format": FORMAT, **payload}, handle, separators=(",", ":"))
                os.replace(tmp, self.dir / name)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except (OSError, ValueError, TypeError):
            pass

    def prune(self, prefix: str, keep: int) -> None:
        """Keep the newest ``keep`` entries named ``prefix...`` (down to half of them
        once there are more, so pruning is rare)."""
        if self.dir is None:
            return
        try:
            found = [p for p in self.dir.iterdir() if p.name.startswith(prefix)]
            if len(found) <= keep:
                return
            found.sort(key=lambda p: p.stat().st_mtime, reverse=True)
            for stale in found[max(1, keep // 2) :]:
                stale.unlink(missing_ok=True)
        except OSError:
            pass


class LintCache(Store):
    """The entries of one lint run: looked up all at once, stored as they are made."""

    @staticmethod
    def key(schema: str, content: bytes) -> str:
        h = hashlib.sha256(f"{tool_key()}\0{schema}\0".encode())
        h.update(content)
        return h.hexdigest()

    @staticmethod
    def registry_key(keys: dict[str, str]) -> str:
        joined = "\0".join(f"{rel}\0{key}" for rel, key in sorted(keys.items()))
        return hashlib.sha256(joined.encode()).hexdigest()

    def lookup(self, keys: dict[str, str], paths: dict[str, Path]) -> dict[str, Entry]:
        """The entries there are for ``keys`` (relative path -> key)."""
        found: dict[str, Entry] = {}
        whole = self.read(f"registry-{self.registry_key(keys)}.json")
        if whole is not None:
            try:
                entries = whole["entries"]
                return {rel: Entry.from_json(entries[rel], paths[rel]) for rel in keys}
            except (KeyError, TypeError, ValueError, IndexError):
                pass
        for rel, key in keys.items():
            raw = self.read(f"file-{key}.json")
            if raw is None:
                continue
            try:
                found[rel] = Entry.from_json(raw["entry"], paths[rel])
            except (KeyError, TypeError, ValueError, IndexError):
                continue
        return found

    def store(self, key: str, entry: Entry) -> None:
        self.write(f"file-{key}.json", {"entry": entry.to_json()})

    def store_registry(self, keys: dict[str, str], entries: dict[str, Entry]) -> None:
        payload = {"entries": {rel: entries[rel].to_json() for rel in keys}}
        self.write(f"registry-{self.registry_key(keys)}.json", payload)
        self.prune("registry-", KEEP_REGISTRIES)
        self.prune("file-", KEEP_FILES)


def render_key(sources: dict[str, bytes], what: str) -> str:
    """The key of `registry gen`'s output for these registry files: the files, and
    everything that turns them into text (the lint cache's tool key, all of codegen
    with its rules and templates, the row types, jinja2's version); ``what`` says
    which outputs (modules, and docs or not)."""
    import causalab_mini.address as address

    here = Path(__file__).resolve().parent
    h = hashlib.sha256(f"{tool_key()}\0render\0{what}\0".encode())
    code = sorted(here.glob("*.py")) + sorted(here.glob("rules/*.py"))
    _hash_files(h, [*code, *sorted(here.glob("templates/*.j2")), Path(address.__file__)])
    h.update(f"jinja2 {_distribution_version('jinja2')}\0".encode())
    for rel in sorted(sources):
        h.update(f"{rel}\0{hashlib.sha256(sources[rel]).hexdigest()}\0".encode())
    return h.hexdigest()


class RenderCache(Store):
    """`registry gen`'s rendered files (name -> text, by group), under ``render_key``."""

    def get(self, key: str) -> dict[str, dict[str, str]] | None:
        raw = self.read(f"render-{key}.json")
        if raw is None or not isinstance(raw.get("outputs"), dict):
            return None
        outputs: dict[str, dict[str, str]] = raw["outputs"]
        return outputs

    def put(self, key: str, outputs: dict[str, dict[str, str]]) -> None:
        self.write(f"render-{key}.json", {"outputs": outputs})
        self.prune("render-", KEEP_REGISTRIES)
