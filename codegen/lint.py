"""`registry lint`: the schema pass, then the cross-row pass (codegen/rules/), then frozen
typed rows (codegen/model.py).

Every error is collected (never only the first); a file that fails its schema is
left out of the cross-row pass so one mistake is not reported five times.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import rules
from .cache import Entry, LintCache
from .diagnostics import Diagnostic
from .loader import JsonPath, Loaded, load_text
from .model import Registry
from .rules import Context

if TYPE_CHECKING:  # imported where a file is checked: a cached run never needs them
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import ValidationError

SCHEMA_VERSION = 1

# registry file -> schema file
FILES: dict[str, str] = {
    "places.yaml": "places.schema.json",
    "block_structures.yaml": "block_structures.schema.json",
    "structural.yaml": "structural.schema.json",
    "interiors.yaml": "interiors.schema.json",
    "components.yaml": "components.schema.json",
}
# registry files a registry may hold, and their schemas (tiny-checkpoint settings: the
# package's registry has it; a registry of one's own rows need not)
OPTIONAL_FILES: dict[str, str] = {
    "tiny.yaml": "tiny.schema.json",
    "transformer_lens.yaml": "transformer_lens.schema.json",
}
FAMILY_SCHEMA = "family.schema.json"
# the definitions the file schemas share, referenced as common.schema.json#/$defs/<name>
COMMON_SCHEMA = "common.schema.json"


def default_registry() -> Path:
    """The registry directory shipped with the package."""
    return Path(str(resources.files("causalab_mini.registry")))


@cache
def load_schema(name: str) -> dict[str, Any]:
    text = resources.files("causalab_mini.schema").joinpath(name).read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


@cache
def _validator(name: str) -> Draft202012Validator:
    """A validator of the file schema ``name`` whose references to the common schema
    resolve offline: the file schemas carry no ``$id``, so a reference is relative to
    the schema's own path (as an editor resolves it) and names a resource of this
    registry; any other reference is an error, never a download."""
    from jsonschema import Draft202012Validator
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT202012

    common = Resource.from_contents(load_schema(COMMON_SCHEMA), default_specification=DRAFT202012)
    resources_ = Registry().with_resource(COMMON_SCHEMA, common)
    return Draft202012Validator(load_schema(name), registry=resources_)


def _ref_target(ref: str) -> Any:
    """The subschema a ``$ref`` of a file schema or of the common schema names (every
    reference with a target lands in the common schema)."""
    document, _, pointer = ref.partition("#")
    node: Any = load_schema(document or COMMON_SCHEMA)
    for part in pointer.strip("/").split("/") if pointer.strip("/") else ():
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def _known_keys(schema: Any) -> set[str]:
    """The keys an object schema knows: its ``properties`` and those of the schemas it
    references (a row schema adds its own keys to the common Address fields)."""
    if not isinstance(schema, dict):
        return set()
    keys = set(schema.get("properties", {}))
    ref = schema.get("$ref")
    if isinstance(ref, str):
        keys |= _known_keys(_ref_target(ref))
    return keys


# ---------------------------------------------------------------- schema pass


def _label(loaded: Loaded, path: JsonPath) -> str:
    """The row an error belongs to, for the ``[row]`` part of a diagnostic."""
    data = loaded.data
    if not isinstance(data, dict) or not path:
        return "-"
    head = path[0]
    if head in ("places", "interiors", "components") and len(path) > 1:
        items = data.get(head)
        if isinstance(items, list) and isinstance(path[1], int) and path[1] < len(items):
            item = items[path[1]]
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                return str(item["name"])
            return f"{head}[{path[1]}]"
    if head == "addresses" and len(path) > 1:
        family = data.get("family")
        return f"{family}:{path[1]}" if isinstance(family, str) else str(path[1])
    if head == "structures" and len(path) > 3 and path[2] == "places":
        structure = data.get("structures", {}).get(path[1])
        items = structure.get("places") if isinstance(structure, dict) else None
        index = path[3]
        if isinstance(items, list) and isinstance(index, int) and index < len(items):
            item = items[index]
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                return str(item["name"])
        return f"{path[1]}:places[{index}]"
    if head in ("structures", "layer_kinds") and len(path) > 1:
        return str(path[1])
    if head == "places" and len(path) > 1:  # structural.yaml
        return str(path[1])
    if head == "rules" and len(path) > 1:
        return f"rules[{path[1]}]"
    if head == "hooks" and len(path) > 1:  # transformer_lens.yaml
        return _hook_label(data, path)
    tiny_rows = (
        "overrides",
        "not_buildable",
        "build_from",
        "saved_by",
        "builds_with",
        "checkpoint_files",
        "side_inputs",
        "groups",
        "tokenizers",
        "chat_templates",
    )  # tiny.yaml
    if head in tiny_rows and len(path) > 1:
        return str(path[1])
    if head in ("sizes", "generic", "keep_off", "vision_extra", "tokenizer_default", "moved"):
        return str(head)
    if head in ("family", "match", "rename", "doc"):
        family = data.get("family")
        return str(family) if isinstance(family, str) else "-"
    return "-"


def _hook_label(data: dict[str, Any], path: JsonPath) -> str:
    """The hook name a transformer_lens.yaml error is about (``hooks[i]`` without one)."""
    items = data.get("hooks")
    if isinstance(items, list) and isinstance(path[1], int) and path[1] < len(items):
        item = items[path[1]]
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            return str(item["name"])
    return f"hooks[{path[1]}]"


def _leaf_errors(error: ValidationError) -> Iterator[ValidationError]:
    """Descend oneOf/anyOf to the sub-error that explains the failure best."""
    from jsonschema.exceptions import best_match

    if error.validator in ("oneOf", "anyOf") and error.context:
        # A oneOf over an object shape: prefer the branch whose required keys fit.
        best = best_match(error.context)
        if best is not None and best.validator not in ("oneOf", "anyOf"):
            yield best
            return
        if best is not None:
            yield from _leaf_errors(best)
            return
    yield error


def _schema_diagnostics(loaded: Loaded, display: str, schema: str) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    for top in sorted(
        _validator(schema).iter_errors(loaded.data), key=lambda e: list(map(str, e.absolute_path))
    ):
        for error in _leaf_errors(top):
            out.extend(_one_schema_error(loaded, display, error))
    return out


def _one_schema_error(loaded: Loaded, display: str, error: ValidationError) -> list[Diagnostic]:
    path: JsonPath = tuple(error.absolute_path)
    row = _label(loaded, path)
    line, col = loaded.where(path)
    where = _where(path)
    kind = error.validator
    if kind in ("additionalProperties", "unevaluatedProperties") and isinstance(
        error.instance, dict
    ):
        allowed = sorted(_known_keys(error.schema))
        out = []
        for key in error.instance:
            if key not in allowed:
                kline, kcol = loaded.where((*path, key), key=True)
                hint = (
                    f"allowed here: {', '.join(allowed)}" if allowed else "no keys are allowed here"
                )
                out.append(
                    Diagnostic(
                        display, kline, kcol, "S001", row, f"unknown key {key!r} in {where}; {hint}"
                    )
                )
        if out:
            return out
    if kind == "required":
        missing = error.message.split("'")[1] if "'" in error.message else error.message
        return [
            Diagnostic(
                display,
                line,
                col,
                "S002",
                row,
                f"{where} lacks the required key {missing!r}; add it",
            )
        ]
    if kind == "type":
        expected = error.validator_value
        given = type(error.instance).__name__ if error.instance is not None else "null"
        return [
            Diagnostic(
                display,
                line,
                col,
                "S003",
                row,
                f"{where} must be {_types(expected)}, not {given} ({_short(error.instance)})",
            )
        ]
    if kind == "const" and path == ("schema_version",):
        return [
            Diagnostic(
                display,
                line,
                col,
                "S005",
                row,
                f"schema_version is {_short(error.instance)}; this tool reads version {SCHEMA_VERSION}. "
                f"Write schema_version: {SCHEMA_VERSION} and the fields of that version",
            )
        ]
    if kind == "propertyNames":
        return [
            Diagnostic(
                display,
                *loaded.where(path),
                "S004",
                row,
                f"a key in {where} is not a lower_snake_case name: {error.message}",
            )
        ]
    return [Diagnostic(display, line, col, "S004", row, f"{where}: {_explain(error)}")]


def _where(path: JsonPath) -> str:
    """The part of the path below the row the error belongs to."""
    if len(path) >= 4 and path[0] == "structures" and path[2] == "places":
        rest = path[4:]
        return ".".join(str(p) for p in rest) if rest else "the row"
    if len(path) >= 2 and path[0] in (
        "places",
        "interiors",
        "components",
        "addresses",
        "structures",
        "layer_kinds",
        "rules",
    ):
        rest = path[2:]
        return ".".join(str(p) for p in rest) if rest else "the row"
    return ".".join(str(p) for p in path) or "the file"


def _types(expected: Any) -> str:
    names = {
        "string": "a string",
        "integer": "an integer",
        "number": "a number",
        "boolean": "true or false",
        "null": "null",
        "object": "a mapping",
        "array": "a list",
    }
    if isinstance(expected, list):
        return " or ".join(names.get(str(t), str(t)) for t in expected)
    return names.get(str(expected), str(expected))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _explain(error: ValidationError) -> str:
    kind, value = error.validator, error.validator_value
    if kind == "enum" and isinstance(value, list):
        return f"{_short(error.instance)} is not one of {', '.join(map(repr, value))}"
    if kind == "const":
        return f"{_short(error.instance)} must be {value!r}"
    if kind == "pattern":
        return f"{_short(error.instance)} does not have the form {value!r}"
    if kind in ("minLength", "minItems", "minProperties"):
        return f"{_short(error.instance)} is too short (at least {value})"
    if kind == "minimum":
        return f"{_short(error.instance)} is below the minimum {value}"
    if kind in ("oneOf", "anyOf"):
        return f"{_short(error.instance)} matches none of the allowed forms"
    return str(error.message)


def lint(root: Path | None = None) -> tuple[Registry, list[Diagnostic]]:
    """Lint the registry at ``root``; return the typed rows and every diagnostic."""
    root = Path(root) if root is not None else default_registry()
    registry = Registry(root=root)
    diags: list[Diagnostic] = []
    if not root.is_dir():
        return registry, [
            Diagnostic(
                str(root),
                1,
                1,
                "F001",
                "-",
                "the registry directory does not exist; pass --registry DIR "
                "naming a directory that holds places.yaml",
            )
        ]

    def disp(rel: str) -> str:
        return str(root / rel)

    # (relative path, path, schema) of every registry file there is, in lint order
    files: list[tuple[str, Path, str]] = []
    for name, schema in FILES.items():
        path = root / name
        if not path.is_file():
            diags.append(
                Diagnostic(
                    disp(name),
                    1,
                    1,
                    "F001",
                    "-",
                    f"{name} is missing from the registry; every registry holds "
                    f"{', '.join(FILES)} (copy it from the package's registry/)",
                )
            )
            continue
        files.append((name, path, schema))
    for name, schema in OPTIONAL_FILES.items():
        if (root / name).is_file():
            files.append((name, root / name, schema))
    for path in sorted(root.glob("*.yaml")) + sorted(root.glob("*.yml")):
        if path.name not in FILES and path.name not in OPTIONAL_FILES:
            diags.append(
                Diagnostic(
                    disp(path.name),
                    1,
                    1,
                    "F002",
                    "-",
                    f"{path.name} is not a registry file; the registry holds "
                    f"{', '.join(FILES)} and families/*.yaml. Move or rename it",
                )
            )
    fam_dir = root / "families"
    if fam_dir.is_dir():
        for path in sorted(fam_dir.iterdir()):
            rel = f"families/{path.name}"
            if path.suffix == ".yml":
                diags.append(
                    Diagnostic(disp(rel), 1, 1, "F002", "-", "family files end in .yaml; rename it")
                )
                continue
            if path.suffix == ".yaml":
                files.append((rel, path, FAMILY_SCHEMA))

    entries = _parse_and_check(files, registry, diags, disp)
    loaded: dict[str, Loaded] = {}
    fam_loaded: list[tuple[str, Loaded]] = []
    for rel, _, _ in files:
        entry = entries.get(rel)
        if entry is None:
            continue
        diags.extend(entry.diagnostics(disp(rel)))
        if entry.passed and (rel in FILES or rel in OPTIONAL_FILES):
            loaded[rel] = entry.loaded
        elif entry.passed:
            fam_loaded.append((rel, entry.loaded))

    ctx = Context(registry, loaded, fam_loaded, disp)
    rules.run(ctx)
    diags.extend(ctx.out)
    return registry, sorted(
        set(diags), key=lambda d: (d.path, d.line, d.col, d.code, d.message, d.row)
    )


def _parse_and_check(
    files: list[tuple[str, Path, str]],
    registry: Registry,
    diags: list[Diagnostic],
    disp: Any,
) -> dict[str, Entry]:
    """Each file's parse and schema pass, from the content-keyed cache where it holds
    them (codegen/cache.py), else computed and stored. A file that cannot be read is an
    F003 and has no entry."""
    cache = LintCache()
    keys: dict[str, str] = {}
    texts: dict[str, str] = {}
    paths = {rel: path for rel, path, _ in files}
    for rel, path, schema in files:
        try:
            content = path.read_bytes()
        except OSError as exc:
            diags.append(Diagnostic(disp(rel), 1, 1, "F003", "-", f"cannot read the file: {exc}"))
            continue
        registry.sources[rel] = content
        try:
            texts[rel] = content.decode("utf-8")
        except UnicodeDecodeError as exc:
            diags.append(Diagnostic(disp(rel), 1, 1, "F003", "-", f"cannot read the file: {exc}"))
            continue
        keys[rel] = cache.key(schema, content)
    entries = cache.lookup(keys, paths) if keys else {}
    if len(entries) == len(keys):
        return entries
    for rel, path, schema in files:
        if rel not in keys or rel in entries:
            continue
        data, errs = load_text(texts[rel], disp(rel), Loaded(path=path))
        if not errs:
            errs = _schema_diagnostics(data, disp(rel), schema)
        entries[rel] = Entry.of(data, errs, passed=not errs)
        cache.store(keys[rel], entries[rel])
    cache.store_registry(keys, entries)
    return entries
